//go:build !unix

package daemon

import "errors"

// freeBytes is not known off unix: "auto" then fails, and -disk must be
// given as a size.
func freeBytes(string) (int64, error) {
	return 0, errors.New("free space unknown on this system")
}
