//go:build unix

package kvtier

import "golang.org/x/sys/unix"

// FSSpace is the size of dir's file system and the space an unprivileged
// process may still use on it.
func FSSpace(dir string) (size, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks) * int64(st.Bsize), int64(st.Bavail) * int64(st.Bsize), nil
}
