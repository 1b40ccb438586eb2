//go:build !linux

package harness

import "syscall"

func procAttr(_ int, ownGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: ownGroup}
}
