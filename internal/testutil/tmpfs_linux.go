package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// Tmpfs mounts a tmpfs of size bytes on a new directory and returns it;
// the test's cleanup unmounts it. A file system that small is how a test
// runs a node whose disk the tier nearly fills. It skips the test when
// the mount is not possible (not root, no mount command).
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	// Registered after TempDir's own cleanup, so it runs first: the
	// directory is unmounted before it is removed.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}
