package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
)

// TestDiskAutoRemembered: -disk auto sizes the tier once and keeps the
// size in the data directory; later starts use it whatever the free space
// is then, so neither the budget nor the ring weight it sets follows the
// tier's own files.
func TestDiskAutoRemembered(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dir := filepath.Join(t.TempDir(), "data") // not created yet
	b, err := diskBudget(autoDisk, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("data directory created as %v (%v), want 0700 as node makes it", fi.Mode(), err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, diskBudgetFile))
	if err != nil || strings.TrimSpace(string(raw)) != itoa(b) {
		t.Fatalf("first start chose %d and remembered %q (%v)", b, raw, err)
	}
	const kept = 100 << 20
	if err := os.WriteFile(filepath.Join(dir, diskBudgetFile), []byte(itoa(kept)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := diskBudget(autoDisk, dir, log); err != nil || b != kept {
		t.Fatalf("with %d remembered, auto gave %d (%v)", kept, b, err)
	}
	if err := os.WriteFile(filepath.Join(dir, diskBudgetFile), []byte("lots"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := diskBudget(autoDisk, dir, log); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Fatalf("a damaged %s: %v", diskBudgetFile, err)
	}
}

// TestDiskAutoCountsTierFiles: on a small file system, the first auto
// sizing counts the tier's own files as room (a data directory whose
// budget file is gone), and a -disk larger than the file system is
// clamped with a warning.
func TestDiskAutoCountsTierFiles(t *testing.T) {
	dir := testutil.Tmpfs(t, 256<<20)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	empty, err := diskBudget(autoDisk, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if empty < 120<<20 || empty > 128<<20 {
		t.Fatalf("auto on an empty 256 MiB file system: %d", empty)
	}
	// The tier fills 100 MiB; the remembered size is lost.
	tier := filepath.Join(node.TierDir(dir), "00")
	if err := os.MkdirAll(tier, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tier, "a.kvc"), make([]byte, 100<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, diskBudgetFile)); err != nil {
		t.Fatal(err)
	}
	again, err := diskBudget(autoDisk, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if d := again - empty; d < -1<<20 || d > 1<<20 {
		t.Fatalf("auto with 100 MiB of tier files: %d, with none %d", again, empty)
	}
	logs.Reset()
	big, err := diskBudget("1T", dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if big >= 256<<20 || !strings.Contains(logs.String(), "clamping") {
		t.Fatalf("-disk 1T on a 256 MiB file system: %d; log %q", big, logs.String())
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
