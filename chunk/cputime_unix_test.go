//go:build unix

package chunk

import (
	"syscall"
	"time"
)

// cpuTime is the user and system CPU time this process has used. Benchmarks
// report throughput per CPU-second next to wall-clock throughput, because
// the shared 2-core machines they run on are often oversubscribed.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
