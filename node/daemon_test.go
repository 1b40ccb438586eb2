package node

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"123", 123, true}, {"1K", 1 << 10, true}, {"64M", 64 << 20, true}, {"2GiB", 2 << 30, true},
		{"1gb", 1 << 30, true}, {"3T", 3 << 40, true}, {"", 0, false}, {"-1", 0, false}, {"1X", 0, false}, {"M", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseBytes(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseBytes(%q) = %d, %v", tt.in, got, err)
		}
	}
}

func TestConfigFileAndFlags(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kvmeshd.json")
	file := `{"id": "from-file", "data_dir": "` + dir + `", "dram": "128M", "join": ["a:1", "b:2"], "dead_grace": "5s", "local_timing": true}`
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	fc := FileConfig{ID: "from-flag", GRPC: DefaultGRPCAddr, DRAM: "1G", Disk: "0", DeadGrace: "30s", RPCTimeout: "10s", LogLevel: "info"}
	if err := mergeFile(path, &fc, map[string]bool{"id": true}); err != nil {
		t.Fatal(err)
	}
	cfg, err := fc.Config(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeID != "from-flag" || cfg.DataDir != dir || cfg.DRAMBytes != 128<<20 || len(cfg.Seeds) != 2 ||
		cfg.DeadGrace != 5*time.Second || !cfg.LocalTiming {
		t.Fatalf("merged config %+v", cfg)
	}
	if err := os.WriteFile(path, []byte(`{"nope": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := mergeFile(path, &fc, nil); err == nil {
		t.Fatal("unknown field accepted")
	}
	if _, err := (FileConfig{ID: "x", LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RPCTimeout: "1s"}).Config(io.Discard); err == nil {
		t.Fatal("missing data dir accepted")
	}
}

// TestRunDaemon starts the daemon as kvmeshd does, reads its ready line and
// stops it by cancelling (what SIGTERM does in main).
func TestRunDaemon(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- RunDaemon(ctx, []string{"-id", "d1", "-data-dir", t.TempDir(), "-local-timing", "-dram", "16M", "-log-level", "error", "-insecure"}, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"kvmeshd ready", "node=d1", "grpc=127.0.0.1:", "gossip=127.0.0.1:", "raft=127.0.0.1:", "http=127.0.0.1:"} {
		if !strings.Contains(line, field) {
			t.Fatalf("ready line %q lacks %q", line, field)
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not stop")
	}
}
