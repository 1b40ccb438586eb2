package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestMain fails the package's tests if they leave goroutines running.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// TestVersionCommit builds kvmeshd as `make build` does, with the commit
// passed to the linker and without Go's VCS stamp, and checks that
// `kvmeshd version` prints it. It also checks the exit status of a
// command line that starts nothing.
func TestVersionCommit(t *testing.T) {
	testutil.SkipIfShort(t, "builds kvmeshd")
	const pkg = "github.com/kvmesh/kvmesh/internal/buildinfo"
	dir := t.TempDir()
	build := func(name, ldflags string) string {
		t.Helper()
		bin := filepath.Join(dir, name)
		cmd := exec.CommandContext(t.Context(), "go", "build", "-buildvcs=false", "-ldflags", ldflags, "-o", bin, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return bin
	}
	bin := build("kvmeshd", "-X "+pkg+".commit=0123456789abcdef -X "+pkg+".modified=true")
	out, err := exec.CommandContext(t.Context(), bin, "version").CombinedOutput()
	if want := "commit 0123456789abcdef+modified"; err != nil || !strings.HasPrefix(string(out), "kvmeshd ") || !strings.Contains(string(out), want) {
		t.Errorf("kvmeshd version: %q, %v; want %q", out, err, want)
	}

	// No -bootstrap, -bootstrap-expect or -join: exit 2 with the hint.
	out, err = exec.CommandContext(t.Context(), bin, "-id", "n1", "-data-dir", t.TempDir(), "-insecure").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "-bootstrap") {
		t.Fatalf("kvmeshd without a start mode: %v, %q; want exit 2 naming -bootstrap", err, out)
	}
}
