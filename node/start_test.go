package node

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestStartFailureUnwinds: when a step of Start fails, what the earlier
// steps started is closed again: no goroutine of the node is left, the
// ports it bound are free, its data directory opens in the next start,
// and Close has nothing more to do.
func TestStartFailureUnwinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		// breakStep makes one step fail; fix undoes that.
		breakStep func(t *testing.T, cfg *Config) (fix func())
		want      string
	}{
		{
			// After the listeners, the store, the metadata (raft bound).
			name: "gossip address taken",
			breakStep: func(t *testing.T, cfg *Config) func() {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				cfg.GossipAddr = l.Addr().String()
				return func() { _ = l.Close(); cfg.GossipAddr = "" }
			},
			want: "node: start gossip",
		},
		{
			// After gossip too.
			name: "replication directory unusable",
			breakStep: func(t *testing.T, cfg *Config) func() {
				p := filepath.Join(cfg.DataDir, "replication")
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				return func() { _ = os.Remove(p) }
			},
			want: "node: start replication",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			cfg := Config{NodeID: "n1", DataDir: t.TempDir(), DRAMBytes: 16 << 20, LocalTiming: true, Insecure: true,
				Logger: slog.New(slog.DiscardHandler)}
			fix := tc.breakStep(t, &cfg)
			n, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err = n.Start(ctx)
			if err == nil {
				_ = n.Close()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start: %v, want %q", err, tc.want)
			}
			bound := []string{n.GRPCAddr(), n.HTTPAddr(), n.RaftAddr()}
			for _, addr := range bound {
				if addr == "" {
					t.Fatalf("an earlier step bound nothing (%q): the failure came too early to test the unwinding", bound)
				}
				l, err := net.Listen("tcp", addr)
				if err != nil {
					t.Fatalf("%s still bound after the failed start: %v", addr, err)
				}
				_ = l.Close()
			}
			testutil.WaitForWithin(t, 10*time.Second, "the node's goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
			if err := n.Close(); err != nil {
				t.Fatalf("Close after a failed Start: %v", err)
			}

			// The store and the metadata (raft's data-dir lock) were closed:
			// a node starts on the same directory and addresses.
			fix()
			cfg.GRPCAddr, cfg.RaftAddr = bound[0], bound[2]
			n, err = New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := n.Start(ctx); err != nil {
				t.Fatalf("Start after the failed one: %v", err)
			}
			if err := n.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			testutil.WaitForWithin(t, 10*time.Second, "the node's goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
		})
	}
}
