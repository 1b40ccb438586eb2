//go:build linux

package node

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// unixPeer reads c's peer credentials (SO_PEERCRED).
func unixPeer(c *net.UnixConn) (peerCred, error) {
	sc, err := c.SyscallConn()
	if err != nil {
		return peerCred{}, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := sc.Control(func(fd uintptr) { cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return peerCred{}, err
	}
	if gerr != nil {
		return peerCred{}, gerr
	}
	return peerCred{pid: cred.Pid, uid: cred.Uid, gid: cred.Gid}, nil
}

// heldByThisProcess reports whether f is a file this process has open
// under another descriptor or maps (/proc/self/fd, /proc/self/maps):
// the same device and inode.
func heldByThisProcess(f *os.File) (bool, error) {
	var st unix.Stat_t
	if err := fstatFile(f, &st); err != nil {
		return false, err
	}
	own := int(f.Fd())
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return false, err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd == own {
			continue
		}
		var o unix.Stat_t
		if unix.Fstat(fd, &o) == nil && o.Dev == st.Dev && o.Ino == st.Ino {
			return true, nil
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return false, err
	}
	dev := fmt.Sprintf("%02x:%02x", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)))
	ino := strconv.FormatUint(st.Ino, 10)
	sc := bufio.NewScanner(bytes.NewReader(maps))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// address perms offset dev inode [path]
		fs := bytes.Fields(sc.Bytes())
		if len(fs) >= 5 && string(fs[3]) == dev && string(fs[4]) == ino {
			return true, nil
		}
	}
	return false, sc.Err()
}

func fstatFile(f *os.File, st *unix.Stat_t) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := sc.Control(func(fd uintptr) { ferr = unix.Fstat(int(fd), st) }); err != nil {
		return err
	}
	return ferr
}
