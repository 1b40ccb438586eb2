package node

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDrainedNodeRestart: a node that left the cluster refuses to start
// again on its data directory (ErrLeftCluster, saying why and what to
// do), rather than rejoining silently; with Rejoin it starts, joins the
// ring again, and the record of the leave is gone (but not after a
// rejoin whose start failed).
func TestDrainedNodeRestart(t *testing.T) {
	var nodes []*Node
	var cfgs []Config
	var seeds []string
	for _, id := range []string{"n1", "n2", "n3"} {
		cfg := replConfig(t, id, seeds, 3)
		cfgs = append(cfgs, cfg)
		nodes = append(nodes, startConfigured(t, cfg))
		seeds = []string{nodes[0].GossipAddr()}
	}
	waitRing(t, nodes, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := nodes[2].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-nodes[2].Left():
		t.Fatal("Left closed by a Leave outside a drain")
	default:
	}
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	waitRing(t, nodes[:2], 2)

	cfg := cfgs[2]
	cfg.Seeds = seeds
	nd, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = nd.Start(ctx)
	_ = nd.Close()
	if !errors.Is(err, ErrLeftCluster) || !strings.Contains(err.Error(), "-rejoin") {
		t.Fatalf("restart of a node that left: %v, want ErrLeftCluster naming -rejoin", err)
	}
	if nodes[0].Meta().Ring().Contains("n3") {
		t.Fatal("the refused start still reached the cluster")
	}

	// A rejoin whose start fails (its gRPC address is taken) keeps the
	// marker: the next start without Rejoin still refuses.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	failing := cfg
	failing.Rejoin, failing.GRPCAddr = true, taken.Addr().String()
	nd, err = New(failing)
	if err != nil {
		t.Fatal(err)
	}
	err = nd.Start(ctx)
	_ = nd.Close()
	if err == nil {
		t.Fatal("a start on a taken gRPC address succeeded")
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, leftMarkerName)); err != nil {
		t.Fatalf("leave marker after a failed rejoin: %v", err)
	}

	cfg.Rejoin = true
	back := startConfigured(t, cfg)
	waitRing(t, []*Node{nodes[0], nodes[1], back}, 3)
	if _, err := os.Stat(filepath.Join(cfg.DataDir, leftMarkerName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leave marker after a rejoin: %v", err)
	}
}

// TestLeftMarker: the marker refuses a start whatever its content (it
// exists only because a leave committed), Rejoin lets the start go on
// and clearLeftMarker removes it, and a directory without it starts.
func TestLeftMarker(t *testing.T) {
	tests := []struct {
		name    string
		content string // "": no marker
		rejoin  bool
		wantErr bool
	}{
		{"no marker", "", false, false},
		{"marker", `{"node_id":"n3","incarnation":7,"at":"2026-11-29T17:00:00Z"}`, false, true},
		{"unreadable marker", "{garbage", false, true},
		{"marker with rejoin", `{"node_id":"n3","incarnation":7}`, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.content != "" {
				if err := os.WriteFile(filepath.Join(dir, leftMarkerName), []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m, err := checkLeftMarker(dir, tc.rejoin)
			if gotErr := errors.Is(err, ErrLeftCluster); gotErr != tc.wantErr || (err != nil && !tc.wantErr) {
				t.Fatalf("checkLeftMarker: %v, want error %v", err, tc.wantErr)
			}
			if (m != nil) != (tc.content != "") {
				t.Fatalf("marker %+v for content %q", m, tc.content)
			}
			// Only a successful start clears the marker.
			_, statErr := os.Stat(filepath.Join(dir, leftMarkerName))
			if kept := statErr == nil; kept != (tc.content != "") {
				t.Fatalf("marker kept %v after the check, want %v", kept, tc.content != "")
			}
			if err := clearLeftMarker(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, leftMarkerName)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("marker after clearLeftMarker: %v", err)
			}
		})
	}
	dir := t.TempDir()
	want := leftMarker{NodeID: "n9", Incarnation: 42, At: time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)}
	if err := writeLeftMarker(dir, want); err != nil {
		t.Fatal(err)
	}
	if m, err := checkLeftMarker(dir, false); !errors.Is(err, ErrLeftCluster) || m == nil || *m != want {
		t.Fatalf("written marker read back as %+v, %v", m, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("data dir holds %d entries after writing the marker, want 1 (no temporary left)", len(ents))
	}
}
