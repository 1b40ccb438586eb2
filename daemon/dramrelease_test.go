package daemon

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/kvtier"
)

// TestDRAMReleaseFlags: -dram-release reaches kvtier's ReleaseBytes, "off"
// as never (negative) and unset as kvtier's default (zero).
func TestDRAMReleaseFlags(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", 0, true},
		{"off", -1, true},
		{"16M", 16 << 20, true},
		{" 1G ", 1 << 30, true},
		{"0", 0, false},
		{"-1M", 0, false},
		{"lots", 0, false},
	} {
		fc := FileConfig{ID: "x", DataDir: t.TempDir(), LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RaftRemoveAfter: "1m", Bootstrap: true,
			RPCTimeout: "1s", DRAMRelease: tc.in}
		cfg, err := fc.Config(io.Discard)
		if (err == nil) != tc.ok {
			t.Fatalf("-dram-release %q: err %v, want ok %v", tc.in, err, tc.ok)
		}
		if err == nil && cfg.DRAMReleaseBytes != tc.want {
			t.Fatalf("-dram-release %q: %d bytes, want %d", tc.in, cfg.DRAMReleaseBytes, tc.want)
		}
	}
}

// The file's dram_release applies unless the flag was given.
func TestDRAMReleaseFileAndFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvmeshd.json")
	if err := os.WriteFile(path, []byte(`{"dram_release": "off"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flag string
		set  bool
		want string
	}{
		{"", false, "off"},
		{"8M", true, "8M"},
	} {
		fc := FileConfig{DRAMRelease: tc.flag}
		if err := mergeFile(path, &fc, map[string]bool{"dram-release": tc.set}); err != nil {
			t.Fatal(err)
		}
		if fc.DRAMRelease != tc.want {
			t.Fatalf("flag %q (set %v) with the file's \"off\": %q, want %q", tc.flag, tc.set, fc.DRAMRelease, tc.want)
		}
	}
}

// TestAdmissionFlag: -admission reaches node.Config.Admission; unset is
// kvtier.AdmitAll.
func TestAdmissionFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want kvtier.Admission
	}{
		{"", kvtier.AdmitAll},
		{"all", kvtier.AdmitAll},
		{"reuse", kvtier.AdmitReuse},
	} {
		fc := FileConfig{ID: "x", DataDir: t.TempDir(), LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RaftRemoveAfter: "1m", Bootstrap: true,
			RPCTimeout: "1s", Admission: tc.in}
		cfg, err := fc.Config(io.Discard)
		if err != nil {
			t.Fatalf("-admission %q: %v", tc.in, err)
		}
		if cfg.Admission != tc.want {
			t.Fatalf("-admission %q: %v, want %v", tc.in, cfg.Admission, tc.want)
		}
	}
}
