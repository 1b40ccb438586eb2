//go:build !linux

package cputime

import (
	"errors"
	"time"
)

// Of is not measured here (it reads Linux's /proc).
func Of(pid int) (time.Duration, error) {
	return 0, errors.New("cputime: CPU time of another process is read on Linux only")
}
