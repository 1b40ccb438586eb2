//go:build unix

package workload

import (
	"syscall"
	"time"
)

// processCPU is the process's user+system CPU time, all threads (the
// engine's workers and the in-process nodes serving it alike).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
