package cluster

import "syscall"

// procAttr makes the kernel kill a node when the test binary that started
// it dies.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
