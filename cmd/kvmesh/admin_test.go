package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/daemon"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestAdminCommands runs `kvmesh token` and `kvmesh gossip-key` against an
// in-process node with tokens and an encrypted gossip keyring: the first
// admin token made offline (-records) and stored as kvmeshd -tokens-file
// would, then create, list, revoke over the API, and a whole live key
// rotation that the node's keyring file follows.
func TestAdminCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	keys := filepath.Join(dir, "gossip.keys")
	run1 := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(ctx, args, &out, &errOut)
		return out.String(), err
	}
	if _, err := run1("gossip-key", "new", keys); err != nil {
		t.Fatal(err)
	}
	kr, err := gossipkey.LoadFile(keys)
	if err != nil {
		t.Fatal(err)
	}
	nd := nodetest.Start(t, 1, nodetest.Config{Node: func(_ int, cfg *node.Config) {
		cfg.Tokens, cfg.GossipKeyring, cfg.GossipKeyringFile = true, kr, keys
	}}).Nodes[0]

	records := filepath.Join(dir, "tokens.jsonl")
	out, err := run1("token", "create", "-records", records, "-name", "root", "-scopes", "read,write,admin")
	if err != nil {
		t.Fatal(err)
	}
	root := strings.TrimSpace(out)
	f, err := os.Open(records)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := daemon.ReadTokenRecords(f)
	_ = f.Close()
	if err != nil || len(recs) != 1 {
		t.Fatalf("records: %v %v", recs, err)
	}
	if err := nd.Meta().PutToken(ctx, recs[0]); err != nil {
		t.Fatal(err)
	}
	admin := []string{"-addr", nd.GRPCAddr(), "-insecure", "-token", root}

	if _, err := run1("-addr", nd.GRPCAddr(), "token", "list"); err == nil || !strings.Contains(err.Error(), "Unauthenticated") {
		t.Errorf("token list without a token: %v", err)
	}
	out, err = run1(append(admin, "token", "create", "-name", "reader", "-scopes", "read", "-expires", "1h")...)
	if err != nil {
		t.Fatal(err)
	}
	reader := strings.TrimSpace(out)
	id, _, _ := strings.Cut(reader, ".")
	out, err = run1(append(admin, "token", "list")...)
	if err != nil || !strings.Contains(out, id) || !strings.Contains(out, "reader") || strings.Contains(out, reader) {
		t.Fatalf("token list (err %v):\n%s", err, out)
	}
	if _, err := run1("-addr", nd.GRPCAddr(), "-insecure", "-token", reader, "token", "create"); err == nil {
		t.Error("a read token created a token")
	}
	if out, err = run1(append(admin, "token", "revoke", reader)...); err != nil || !strings.Contains(out, "revoked "+id) {
		t.Fatalf("token revoke: %v %s", err, out)
	}
	if out, err = run1(append(admin, "token", "list")...); err != nil || strings.Contains(out, id) {
		t.Fatalf("token list after revoke (err %v):\n%s", err, out)
	}
	if _, err := run1("-addr", nd.GRPCAddr(), "-insecure", "-token", reader, "status"); err == nil {
		t.Error("a revoked token still works")
	}

	// Live rotation to a new key, step by step.
	next := filepath.Join(dir, "next.keys")
	if _, err := run1("gossip-key", "new", next); err != nil {
		t.Fatal(err)
	}
	if _, err := run1(append(admin, "gossip-key", "use", "@"+next)...); err == nil {
		t.Error("use before install succeeded")
	}
	for _, step := range [][]string{{"install", "@" + next}, {"use", "@" + next}} {
		if out, err := run1(append(admin, append([]string{"gossip-key"}, step...)...)...); err != nil {
			t.Fatalf("gossip-key %s: %v\n%s", step[0], err, out)
		}
	}
	newKey, err := readGossipKey("@" + next)
	if err != nil {
		t.Fatal(err)
	}
	_, all, err := gossipkey.ParseKeyring(mustReadFile(t, keys))
	if err != nil || len(all) != 2 || !bytes.Equal(all[0], newKey) {
		t.Fatalf("keyring file after use: %d keys, err %v", len(all), err)
	}
	old := gossipkey.Encode(all[1])
	if _, err := run1(append(admin, "gossip-key", "remove", gossipkey.Encode(newKey))...); err == nil {
		t.Error("removed the primary key")
	}
	if out, err := run1(append(admin, "gossip-key", "remove", old)...); err != nil {
		t.Fatalf("gossip-key remove: %v\n%s", err, out)
	}
	out, err = run1(append(admin, "gossip-key", "list")...)
	if err != nil || !strings.Contains(out, "n1") {
		t.Fatalf("gossip-key list: %v\n%s", err, out)
	}
	if _, all, err = gossipkey.ParseKeyring(mustReadFile(t, keys)); err != nil || len(all) != 1 || !bytes.Equal(all[0], newKey) {
		t.Fatalf("keyring file after remove: %d keys, err %v", len(all), err)
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
