package daemon

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
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
	fc := FileConfig{ID: "from-flag", GRPC: node.DefaultGRPCAddr, DRAM: "1G", Disk: "0", DeadGrace: "30s", RaftRemoveAfter: "1m", RPCTimeout: "10s", LogLevel: "info"}
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
	if _, err := (FileConfig{ID: "x", LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RaftRemoveAfter: "1m", Bootstrap: true, RPCTimeout: "1s"}).Config(io.Discard); err == nil {
		t.Fatal("missing data dir accepted")
	}
}

// The rebalance knobs reach replication's settings; "off" and defaults
// map to its conventions (negative: unlimited, zero: its default).
func TestRebalanceFlags(t *testing.T) {
	base := FileConfig{ID: "x", DataDir: t.TempDir(), LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RaftRemoveAfter: "1m", Bootstrap: true, RPCTimeout: "1s"}
	for _, tc := range []struct {
		name                  string
		rate, recvRate, yield string
		streams               int
		ok                    bool
		wantRate, wantRecv    int64
		wantYield             time.Duration
		wantStreams           int
	}{
		{"defaults of the flags", "64M", "off", "100ms", 1, true, 64 << 20, 0, 100 * time.Millisecond, 1},
		{"unset (file without them)", "", "", "", 0, true, 0, 0, 0, 0},
		{"unlimited, capped receiver, no yield", "off", "200M", "off", 1, true, -1, 200 << 20, -1, 1},
		{"zero rate", "0", "", "", 0, false, 0, 0, 0, 0},
		{"bad rate", "fast", "", "", 0, false, 0, 0, 0, 0},
		{"bad receiver rate", "", "-1M", "", 0, false, 0, 0, 0, 0},
		{"bad yield", "", "", "-5ms", 0, false, 0, 0, 0, 0},
		{"negative streams", "", "", "", -1, false, 0, 0, 0, 0},
		{"too many streams", "", "", "", 1 << 20, false, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := base
			fc.RebalanceRate, fc.RebalanceRecvRate, fc.RebalanceYield, fc.RebalanceRecvStreams = tc.rate, tc.recvRate, tc.yield, tc.streams
			cfg, err := fc.Config(io.Discard)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok {
				return
			}
			rc := cfg.Replication
			if rc.RebalanceBytesPerSec != tc.wantRate || rc.IncomingRebalanceBytesPerSec != tc.wantRecv ||
				rc.ServingYield != tc.wantYield || rc.IncomingRebalanceStreams != tc.wantStreams {
				t.Fatalf("replication config %+v", rc)
			}
		})
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "kvmeshd.json")
	file := `{"rebalance_rate": "8M", "rebalance_recv_streams": 3, "rebalance_recv_rate": "off", "rebalance_yield": "20ms"}`
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	fc := base
	fc.RebalanceRate, fc.RebalanceRecvStreams = "16M", 2
	if err := mergeFile(path, &fc, map[string]bool{"rebalance-rate": true}); err != nil {
		t.Fatal(err)
	}
	if fc.RebalanceRate != "16M" || fc.RebalanceRecvStreams != 3 || fc.RebalanceYield != "20ms" {
		t.Fatalf("merged %+v: the flag wins, the file fills the rest", fc)
	}
}

// TestDaemonRefillFlags: -anti-entropy and -startup-pull (or the file's
// anti_entropy and startup_pull) reach the node configuration.
func TestDaemonRefillFlags(t *testing.T) {
	dir := t.TempDir()
	no, yes := false, true
	base := FileConfig{ID: "x", DataDir: dir, LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RaftRemoveAfter: "1m", Bootstrap: true, RPCTimeout: "1s"}
	tests := []struct {
		name        string
		ae          string
		pull        *bool
		wantAE      time.Duration
		wantNoPull  bool
		wantFailure bool
	}{
		{"defaults", "", nil, 0, false, false},
		{"interval", "30s", &yes, 30 * time.Second, false, false},
		{"off", "off", &no, -1, true, false},
		{"negative", "-1s", nil, 0, false, true},
		{"garbage", "soon", nil, 0, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fc := base
			fc.AntiEntropy, fc.StartupPull = tc.ae, tc.pull
			cfg, err := fc.Config(io.Discard)
			if tc.wantFailure {
				if err == nil {
					t.Fatal("accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Replication.AntiEntropyInterval != tc.wantAE || cfg.NoStartupPull != tc.wantNoPull {
				t.Fatalf("anti-entropy %v, no startup pull %v", cfg.Replication.AntiEntropyInterval, cfg.NoStartupPull)
			}
		})
	}
	path := filepath.Join(dir, "kvmeshd.json")
	if err := os.WriteFile(path, []byte(`{"anti_entropy": "1m", "startup_pull": false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fc := base
	fc.AntiEntropy, fc.StartupPull = "5m", &yes
	if err := mergeFile(path, &fc, map[string]bool{"anti-entropy": true}); err != nil {
		t.Fatal(err)
	}
	if fc.AntiEntropy != "5m" || fc.StartupPull == nil || *fc.StartupPull {
		t.Fatalf("merged anti-entropy %q startup pull %v", fc.AntiEntropy, fc.StartupPull)
	}
}

// TestPeerLinkRateFlag: -peer-link-rate (or the file's peer_link_rate)
// reaches node.Config.PeerLinkBytesPerSec; "off", the default, is no
// pacing.
func TestPeerLinkRateFlag(t *testing.T) {
	dir := t.TempDir()
	base := FileConfig{ID: "x", DataDir: dir, LogLevel: "info", DRAM: "1G", Disk: "0", DeadGrace: "1s", RaftRemoveAfter: "1m", Bootstrap: true, RPCTimeout: "1s"}
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{{"", 0, true}, {"off", 0, true}, {"125000000", 125000000, true}, {"1G", 1 << 30, true}, {"0", 0, false}, {"fast", 0, false}} {
		t.Run(tc.in, func(t *testing.T) {
			fc := base
			fc.PeerLinkRate = tc.in
			cfg, err := fc.Config(io.Discard)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && cfg.PeerLinkBytesPerSec != tc.want {
				t.Fatalf("PeerLinkBytesPerSec %d, want %d", cfg.PeerLinkBytesPerSec, tc.want)
			}
		})
	}
	path := filepath.Join(dir, "kvmeshd.json")
	if err := os.WriteFile(path, []byte(`{"peer_link_rate": "10M"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fc := base
	fc.PeerLinkRate = "off"
	if err := mergeFile(path, &fc, map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	if fc.PeerLinkRate != "10M" {
		t.Fatalf("merged peer link rate %q, want the file's 10M", fc.PeerLinkRate)
	}
}

// TestRun starts the daemon as kvmeshd does, reads its ready line and
// stops it by cancelling (what SIGTERM does in main).
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"-id", "d1", "-data-dir", t.TempDir(), "-bootstrap", "-grpc", "127.0.0.1:0", "-local-timing", "-dram", "16M", "-log-level", "error", "-insecure"}, pw, io.Discard)
		pw.Close()
	}()
	// A lone node bootstraps, leads and has nothing to pull: "listening"
	// comes first, then "ready", with the same addresses.
	br := bufio.NewReader(pr)
	for _, word := range []string{"kvmeshd listening", "kvmeshd ready"} {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		for _, field := range []string{word, "node=d1", "grpc=127.0.0.1:", "gossip=127.0.0.1:", "raft=127.0.0.1:", "http=127.0.0.1:"} {
			if !strings.Contains(line, field) {
				t.Fatalf("line %q lacks %q", line, field)
			}
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
