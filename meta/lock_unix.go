//go:build unix

package meta

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrDataDirLocked is returned by Open when another Store (in this or
// another process) has the data directory open.
var ErrDataDirLocked = errors.New("meta: data dir in use")

// lockDir takes an exclusive, non-blocking flock on dir/LOCK. Without it a
// second Open would block forever inside bbolt's own lock.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(dir+"/LOCK", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("meta: lock data dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrDataDirLocked, dir)
		}
		return nil, fmt.Errorf("meta: lock data dir: %w", err)
	}
	return f, nil
}
