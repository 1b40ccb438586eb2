//go:build !linux

package cluster

import "syscall"

// procAttr: only Linux has a parent-death signal; elsewhere the test's
// cleanup alone kills the nodes.
func procAttr() *syscall.SysProcAttr { return nil }
