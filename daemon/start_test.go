package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
)

// TestListenAddrs: each listener defaults to the -grpc host with its own
// fixed port, or to port 0 when -grpc has port 0; given addresses and
// "off" stay.
func TestListenAddrs(t *testing.T) {
	for _, tc := range []struct {
		in   FileConfig
		want listeners
	}{
		{FileConfig{}, listeners{"127.0.0.1:7400", "127.0.0.1:7401", "127.0.0.1:7402", "127.0.0.1:7403"}},
		{FileConfig{GRPC: "10.1.2.3:7400"}, listeners{"10.1.2.3:7400", "10.1.2.3:7401", "10.1.2.3:7402", "10.1.2.3:7403"}},
		{FileConfig{GRPC: "10.1.2.3:9000", HTTP: "off"}, listeners{"10.1.2.3:9000", "10.1.2.3:7401", "10.1.2.3:7402", "off"}},
		{FileConfig{GRPC: "127.0.0.5:0"}, listeners{"127.0.0.5:0", "127.0.0.5:0", "127.0.0.5:0", "127.0.0.5:0"}},
		{FileConfig{GRPC: "127.0.0.5:0", Gossip: "127.0.0.5:8301"}, listeners{"127.0.0.5:0", "127.0.0.5:8301", "127.0.0.5:0", "127.0.0.5:0"}},
	} {
		got, err := tc.in.listenAddrs()
		if err != nil || got != tc.want {
			t.Errorf("%+v: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	fc, err := parseArgs([]string{"-bootstrap"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if fc.GRPC != "127.0.0.1:7400" {
		t.Fatalf("-grpc default %q", fc.GRPC)
	}
}

// TestStartModes: -bootstrap, -bootstrap-expect and -join reach the node
// as BootstrapExpect 1, N and 0; -raft-remove-after reaches it with its
// default or the file's value.
func TestStartModes(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		wantExpect int
		wantSeeds  int
	}{
		{[]string{"-bootstrap"}, 1, 0},
		{[]string{"-bootstrap-expect", "3"}, 3, 0},
		{[]string{"-bootstrap-expect", "3", "-join", "a:7401"}, 3, 1},
		{[]string{"-join", "a:7401, b:7401"}, 0, 2},
	} {
		fc, err := parseArgs(append([]string{"-id", "x", "-data-dir", t.TempDir(), "-insecure"}, tc.args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := fc.Config(io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if cfg.BootstrapExpect != tc.wantExpect || len(cfg.Seeds) != tc.wantSeeds || cfg.RaftRemoveAfter != 15*time.Minute {
			t.Errorf("%q: BootstrapExpect %d, seeds %q, RaftRemoveAfter %v", tc.args, cfg.BootstrapExpect, cfg.Seeds, cfg.RaftRemoveAfter)
		}
	}
	path := filepath.Join(t.TempDir(), "kvmeshd.json")
	if err := os.WriteFile(path, []byte(`{"bootstrap": true, "raft_remove_after": "2h"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fc, err := parseArgs([]string{"-id", "x", "-data-dir", t.TempDir(), "-insecure", "-config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := fc.Config(io.Discard)
	if err != nil || cfg.BootstrapExpect != 1 || cfg.RaftRemoveAfter != 2*time.Hour {
		t.Fatalf("from the file: %v, BootstrapExpect %d, RaftRemoveAfter %v", err, cfg.BootstrapExpect, cfg.RaftRemoveAfter)
	}
}

// TestExitCode: the exit status of each kind of error.
func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{fmt.Errorf("%w: x", ErrUsage), ExitUsage},
		{errNoStart, ExitUsage},
		{errors.Join(fmt.Errorf("start: %w", node.ErrLeftCluster), errors.New("close")), ExitLeft},
		{node.ErrNodeIDMismatch, ExitError},
		{errors.New("bind: address in use"), ExitError},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// runDaemon runs Run with args in the background and returns its output
// and a function that stops it and returns Run's error.
func runDaemon(t *testing.T, args ...string) (stdout, stderr *testutil.LogBuffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	stdout, stderr = new(testutil.LogBuffer), new(testutil.LogBuffer)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, args, stdout, stderr) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stdout, stderr, stop
}

// TestDataDirRefusals: a data directory refuses another node ID (exit 1,
// naming both IDs) and, once its node left the cluster, any start without
// -rejoin (exit 3, which a supervisor is told not to restart).
func TestDataDirRefusals(t *testing.T) {
	dir := t.TempDir()
	args := func(id string) []string {
		return []string{"-id", id, "-data-dir", dir, "-bootstrap", "-grpc", "127.0.0.1:0", "-http", "off",
			"-local-timing", "-dram", "16M", "-log-level", "error", "-insecure"}
	}
	stdout, _, stop := runDaemon(t, args("d1")...)
	testutil.WaitFor(t, "d1 listening", func() bool { return strings.Contains(stdout.String(), "kvmeshd listening") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "NODE_ID")); err != nil || string(b) != "d1\n" {
		t.Fatalf("NODE_ID: %q, %v", b, err)
	}

	err := Run(t.Context(), args("d2"), io.Discard, io.Discard)
	if !errors.Is(err, node.ErrNodeIDMismatch) || ExitCode(err) != ExitError ||
		!strings.Contains(err.Error(), `"d1"`) || !strings.Contains(err.Error(), `"d2"`) {
		t.Fatalf("restart as d2: %v (exit %d), want ErrNodeIDMismatch naming d1 and d2, exit %d", err, ExitCode(err), ExitError)
	}

	// What a drain leaves behind (node writes it once the leave commits).
	left := `{"node_id":"d1","incarnation":1,"at":"2026-01-02T03:04:05Z"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "LEFT"), []byte(left), 0o644); err != nil {
		t.Fatal(err)
	}
	err = Run(t.Context(), args("d1"), io.Discard, io.Discard)
	if !errors.Is(err, node.ErrLeftCluster) || ExitCode(err) != ExitLeft || !strings.Contains(err.Error(), "-rejoin") {
		t.Fatalf("restart after the leave: %v (exit %d), want ErrLeftCluster naming -rejoin, exit %d", err, ExitCode(err), ExitLeft)
	}
}

// TestJoinUnreachable: a node told to join seeds that do not answer logs
// so, naming them, keeps retrying, and never reports ready.
func TestJoinUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seed := l.Addr().String()
	l.Close() // nothing listens there now
	stdout, stderr, stop := runDaemon(t, "-id", "j1", "-data-dir", t.TempDir(), "-join", seed, "-grpc", "127.0.0.1:0", "-http", "off",
		"-local-timing", "-dram", "16M", "-log-level", "warn", "-insecure")
	testutil.WaitFor(t, "a failed join, named, and a retry that failed too", func() bool {
		s := stderr.String()
		return strings.Contains(s, "no seed answered") && strings.Contains(s, seed) && strings.Contains(s, "join failed; will retry")
	})
	if out := stdout.String(); !strings.Contains(out, "kvmeshd listening") || strings.Contains(out, "kvmeshd ready") {
		t.Fatalf("stdout %q: want listening, never ready", out)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// fieldOf returns the value of key=VALUE in the first line of out that
// starts with prefix ("" if none).
func fieldOf(out, prefix, key string) string {
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				return v
			}
		}
	}
	return ""
}

// TestDrainedDaemonExits: once a drain has taken its node out of the
// cluster, Run returns nil by itself (kvmeshd exits 0), while the other
// node keeps running.
func TestDrainedDaemonExits(t *testing.T) {
	testutil.SkipIfShort(t, "a two-node cluster and a drain")
	common := []string{"-grpc", "127.0.0.1:0", "-http", "off", "-local-timing", "-dram", "16M", "-disk", "0", "-log-level", "error", "-insecure"}
	out1, _, stop1 := runDaemon(t, append([]string{"-id", "d1", "-data-dir", t.TempDir(), "-bootstrap-expect", "2"}, common...)...)
	testutil.WaitFor(t, "d1 listening", func() bool { return fieldOf(out1.String(), "kvmeshd listening", "gossip") != "" })
	seed := fieldOf(out1.String(), "kvmeshd listening", "gossip")

	ctx, cancel := context.WithCancel(t.Context())
	out2 := new(testutil.LogBuffer)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, append([]string{"-id", "d2", "-data-dir", t.TempDir(), "-bootstrap-expect", "2", "-join", seed}, common...), out2, io.Discard)
	}()
	defer func() {
		cancel()
		<-done
	}()
	testutil.WaitFor(t, "both ready", func() bool {
		return strings.Contains(out1.String(), "kvmeshd ready") && strings.Contains(out2.String(), "kvmeshd ready")
	})
	c, err := client.New(t.Context(), client.Config{Seeds: []string{fieldOf(out1.String(), "kvmeshd ready", "grpc")}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	last, err := c.Drain(t.Context(), fieldOf(out2.String(), "kvmeshd ready", "grpc"), false, nil)
	if err != nil || !last.Left {
		t.Fatalf("drain of d2: %v, %v", last, err)
	}
	select {
	case err := <-done:
		done <- err // for the deferred wait
		if err != nil || ExitCode(err) != ExitOK {
			t.Fatalf("d2's Run after its drain: %v (exit %d), want nil (exit 0)", err, ExitCode(err))
		}
	case <-time.After(testutil.WaitTimeout):
		t.Fatal("d2 still runs after it left the cluster")
	}
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
}
