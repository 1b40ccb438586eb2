package harness

import "syscall"

// procAttr makes the kernel kill a node when the process that started it
// dies, so a test killed by its timeout leaves no node behind; with
// cgroupFD >= 0 the node starts inside that cgroup (clone3), so that even
// its first socket is matched by the firewall's cgroup rules; ownGroup
// gives it its own process group.
func procAttr(cgroupFD int, ownGroup bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: ownGroup}
	if cgroupFD >= 0 {
		a.UseCgroupFD, a.CgroupFD = true, cgroupFD
	}
	return a
}
