//go:build !unix

package kvtier

import "errors"

// FSSpace is not known off unix.
func FSSpace(string) (size, free int64, err error) {
	return 0, 0, errors.New("file system space unknown on this system")
}
