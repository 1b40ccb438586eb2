//go:build !linux

package harness

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
