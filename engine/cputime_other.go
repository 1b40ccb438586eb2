//go:build !unix

package engine

import "time"

// processCPU is not available here; the bench reports zero CPU time.
func processCPU() time.Duration { return 0 }
