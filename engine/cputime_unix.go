//go:build unix

package engine

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) the process has used, over all
// threads. On a shared machine it measures the work a request costs, which
// wall time does not.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
