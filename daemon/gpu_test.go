package daemon

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestGPUFlags: -gpu is a byte budget (0 or unset: no GPU tier) and
// -gpu-device an ordinal; both reach the node's config, from flags or
// from the file.
func TestGPUFlags(t *testing.T) {
	dir := t.TempDir()
	base := FileConfig{ID: "x", DataDir: dir, LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RaftRemoveAfter: "1m", Bootstrap: true, RPCTimeout: "1s"}
	for _, tc := range []struct {
		gpu    string
		device int
		want   int64
		ok     bool
	}{{"", 0, 0, true}, {"0", 0, 0, true}, {"8G", 1, 8 << 30, true}, {"lots", 0, 0, false}, {"-1G", 0, 0, false}, {"1G", -1, 0, false}} {
		t.Run(tc.gpu, func(t *testing.T) {
			fc := base
			fc.GPU, fc.GPUDevice = tc.gpu, tc.device
			cfg, err := fc.Config(io.Discard)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && (cfg.GPUBytes != tc.want || cfg.GPUDevice != tc.device) {
				t.Fatalf("GPUBytes %d GPUDevice %d, want %d and %d", cfg.GPUBytes, cfg.GPUDevice, tc.want, tc.device)
			}
		})
	}
	fs, err := parseArgs([]string{"-data-dir", dir, "-gpu", "2G", "-gpu-device", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if fs.GPU != "2G" || fs.GPUDevice != 3 {
		t.Fatalf("flags gave -gpu %q -gpu-device %d", fs.GPU, fs.GPUDevice)
	}
	path := filepath.Join(dir, "kvmeshd.json")
	if err := os.WriteFile(path, []byte(`{"gpu": "4G", "gpu_device": 2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fc := base
	if err := mergeFile(path, &fc, map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	if fc.GPU != "4G" || fc.GPUDevice != 2 {
		t.Fatalf("merged -gpu %q -gpu-device %d, want the file's 4G and 2", fc.GPU, fc.GPUDevice)
	}
}
