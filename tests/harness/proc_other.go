//go:build !linux

package harness

import "syscall"

func procAttr(int) *syscall.SysProcAttr { return nil }
