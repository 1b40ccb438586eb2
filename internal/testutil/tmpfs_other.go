//go:build !linux

package testutil

import "testing"

// Tmpfs skips the test: tmpfs mounts are Linux only.
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	t.Skip("tmpfs mounts are Linux only")
	return ""
}
