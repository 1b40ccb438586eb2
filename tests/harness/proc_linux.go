package harness

import "syscall"

// procAttr makes the kernel kill a node when the process that started it
// dies, so a test killed by its timeout leaves no node behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
