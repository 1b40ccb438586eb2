package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/node/nodetest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// runCLI runs kvmesh in-process with an empty environment and returns
// its stdout, stderr and exit code.
func runCLI(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	err := runEnv(ctx, args, func(string) string { return "" }, &out, &errb)
	if err != nil {
		fmt.Fprintln(&errb, "kvmesh:", err)
	}
	return out.String(), errb.String(), exitCode(err)
}

// TestExitCodes: 0 ok (help included), 1 error, 2 usage; unknown
// commands, subcommands, flags and stray arguments are usage errors that
// touch nothing.
func TestExitCodes(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	t.Chdir(dir)
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout+stderr
	}{
		{nil, exitUsage, "no command"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"-bogus", "status"}, exitUsage, "-bogus"},
		{[]string{"status", "-bogus"}, exitUsage, "-bogus"},
		{[]string{"status", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"status", "-format", "yaml"}, exitUsage, `-format "yaml"`},
		{[]string{"gossip-key", "lsit"}, exitUsage, `unknown subcommand "lsit"`},
		{[]string{"gossip-key", "new"}, exitUsage, "missing argument"},
		{[]string{"token", "revoke"}, exitUsage, "missing argument"},
		{[]string{"token", "frob"}, exitUsage, `unknown subcommand "frob"`},
		{[]string{"settings", "set"}, exitUsage, "nothing to change"},
		{[]string{"settings", "put"}, exitUsage, `unknown subcommand "put"`},
		{[]string{"drain"}, exitUsage, "usage: kvmesh drain [-keep] NODE"},
		{[]string{"delete", "not-a-key"}, exitUsage, "FINGERPRINT/CONTENT/CONTEXT"},
		{[]string{"help", "nope"}, exitUsage, `unknown command "nope"`},
		{[]string{"help"}, exitOK, "exit codes: 0 ok, 1 error"},
		{[]string{"-h"}, exitOK, "KVMESH_ADDR"},
		{[]string{"help", "get"}, exitOK, "usage: kvmesh get [-o FILE]"},
		{[]string{"get", "-h"}, exitOK, "-layers"},
		{[]string{"token", "create", "-h"}, exitOK, "-records"},
		{[]string{"version"}, exitOK, "kvmesh "},
		{[]string{"status"}, exitError, "no cluster address: give -addr HOST:PORT or set KVMESH_ADDR"},
		{[]string{"status", "-addr", "127.0.0.1:1", "-connect-timeout", "2s"}, exitError, "connection refused"},
	} {
		out, errOut, code := runCLI(ctx, tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("kvmesh %q: exit %d, want %d; output lacks %q?\n%s%s", tc.args, code, tc.code, tc.want, out, errOut)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("usage errors wrote files: %v", ents)
	}
}

// TestGolden runs commands against one in-process node and compares what
// they print, text and JSON, and their exit codes with
// testdata/cli.golden (go test ./cmd/kvmesh -run TestGolden -update
// rewrites it). Addresses, epochs and versions are replaced by
// placeholders.
func TestGolden(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	nd := nodetest.Start(t, 1, nodetest.Config{}).Nodes[0]
	addr := nd.GRPCAddr()
	var got strings.Builder
	norm := strings.NewReplacer(addr, "ADDR", runtime.Version(), "GOVERSION")
	numbers := regexp.MustCompile(`("epoch": |epoch |"version": |version=)[0-9]+`)
	// Raft and gossip ports are random; tables align to their width.
	addrs := regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)
	spaces := regexp.MustCompile(`(\S)  +`)
	for _, args := range [][]string{
		{"status"},
		{"status", "-format", "json"},
		{"-format", "json", "ring"},
		{"ring"},
		{"models", "-format", "json"},
		{"settings", "get"},
		{"settings", "-format", "json"},
		{"token", "revoke", "0123456789abcdef"},
		{"version", "-format", "json"},
		{"register", "-dry-run", hfTestdata + "mistral-7b-instruct-v0.3.json", "-revision", "mistralai/Mistral-7B-Instruct-v0.3@e0bc86c"},
	} {
		out, errOut, code := runCLI(ctx, append(args, "-addr", addr)...)
		if args[0] == "version" {
			var v map[string]any
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatal(err)
			}
			out = fmt.Sprintf("fields: %d, go_version %v\n", len(v), v["go_version"])
		}
		fmt.Fprintf(&got, "$ kvmesh %s\n%s%s[exit %d]\n\n", strings.Join(args, " "), out, errOut, code)
	}
	// Text for states a single healthy node cannot show.
	var buf bytes.Buffer
	_ = printStatus(&buf, statusOut{Epoch: 7, Nodes: []nodeStatus{
		{ID: "n1", GRPC: "10.0.0.1:7000", HTTP: "10.0.0.1:7001", Up: true, State: "recovering", StateReason: "startup pull running", Entries: 3, Bytes: 3 << 20,
			Tiers: []tierStatus{{Name: "dram", Entries: 3, Bytes: 3 << 20, CapacityBytes: 1 << 30}}},
		{ID: "n2", GRPC: "10.0.0.2:7000", HTTP: "10.0.0.2:7001", State: stateUnreachable, Error: describe(status.Error(codes.Unavailable,
			`connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.2:7000: connect: connection refused"`))},
	}})
	fmt.Fprintf(&got, "$ (status text without a leader, one node down)\n%s\n", buf.String())
	buf.Reset()
	_ = printRing(&buf, ringOut{Epoch: 5, ReplicationFactor: 3, Samples: 100000, Members: []ringMember{
		{ID: "n1", GRPC: "10.0.0.1:7000", Raft: "10.0.0.1:7002", Gossip: "10.0.0.1:7001", Weight: 32.66, PrimaryPercent: 50, ReplicaPercent: 100, State: "ready"},
		{ID: "n2", GRPC: "10.0.0.2:7000", Raft: "10.0.0.2:7002", Gossip: "10.0.0.2:7001", Weight: 32.66, PrimaryPercent: 50, ReplicaPercent: 100, State: "recovering",
			StateReason: "ring differs from the leader's at the same epoch: epoch 5, leader n1: n2 has weight 72.66 here, 32.66 on the leader"},
	}})
	fmt.Fprintf(&got, "$ (ring text with a member whose ring differs from the leader's)\n%s\n", buf.String())
	text := numbers.ReplaceAllString(norm.Replace(got.String()), "${1}N")
	text = spaces.ReplaceAllString(addrs.ReplaceAllString(text, "HOST:PORT"), "${1}  ")
	path := filepath.Join("testdata", "cli.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./cmd/kvmesh -run TestGolden -update creates it)", err)
	}
	if text != string(want) {
		t.Errorf("output differs from %s (-update rewrites it):\n%s", path, text)
	}
}
