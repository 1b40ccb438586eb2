//go:build !unix

package meta

import (
	"errors"
	"os"
)

// ErrDataDirLocked is returned by Open when another Store has the data
// directory open (detected on unix only).
var ErrDataDirLocked = errors.New("meta: data dir in use")

func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(dir+"/LOCK", os.O_CREATE|os.O_RDWR, 0o644)
}
