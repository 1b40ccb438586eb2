package main

import (
	"context"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// TestEntryErrors: put, delete, then get and delete of the deleted key
// say "NotFound" in one line, not a chain of errors per replica.
func TestEntryErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	nd := nodetest.Start(t, 1, nodetest.Config{}).Nodes[0]
	if _, err := nd.Meta().RegisterModel(ctx, testutil.Spec()); err != nil {
		t.Fatal(err)
	}
	key, blob := testutil.StandaloneBlob(t, rand.New(rand.NewPCG(1, 2)), testutil.Spec(), 16)
	f := filepath.Join(t.TempDir(), "e.kv")
	if err := os.WriteFile(f, blob, 0o600); err != nil {
		t.Fatal(err)
	}
	a := "-addr=" + nd.GRPCAddr()
	if out, errOut, code := runCLI(ctx, "put", f, a, "-format", "json"); code != 0 || !strings.Contains(out, `"key": "`+key.String()) {
		t.Fatalf("put: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(ctx, "delete", key.String(), a); code != 0 {
		t.Fatalf("delete: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code := runCLI(ctx, "get", key.String(), a, "-o", filepath.Join(t.TempDir(), "out"))
	t.Logf("get of a deleted key: %s", errOut)
	if code != exitError || !strings.Contains(errOut, "NotFound") || strings.Count(errOut, "\n") > 3 || strings.Contains(errOut, "rpc error") || strings.Contains(errOut, "%!") {
		t.Errorf("get of a deleted key: exit %d\n%s", code, errOut)
	}
}

// TestHungSeed: an address that accepts connections and never answers
// costs -connect-timeout, then the next address is used.
func TestHungSeed(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	nd := nodetest.Start(t, 1, nodetest.Config{}).Nodes[0]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never answered
		}
	}()
	out, errOut, code := runCLI(ctx, "status", "-addr", ln.Addr().String()+","+nd.GRPCAddr(), "-connect-timeout", "300ms", "-timeout", "5s")
	_ = ln.Close()
	<-done
	for _, c := range conns {
		_ = c.Close()
	}
	if code != 0 || !strings.Contains(out, "leader n1") {
		t.Fatalf("status past a hung seed: exit %d\n%s%s", code, out, errOut)
	}
}

// TestTLSHint: a client without a certificate against a node that wants
// mutual TLS is told so, not "error reading server preface: EOF".
func TestTLSHint(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	if _, err := tlsconf.GenerateFiles(dir, tlsconf.CertRequest{Name: "n1", Hosts: []string{"127.0.0.1"}, Usage: tlsconf.UsageNode}); err != nil {
		t.Fatal(err)
	}
	cfg := nodetest.NodeConfig(t, "n1", nil)
	cfg.TLS = tlsconf.Config{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "n1.pem"), KeyFile: filepath.Join(dir, "n1-key.pem")}
	nd := nodetest.StartNode(t, cfg)
	_, errOut, code := runCLI(ctx, "status", "-addr", nd.GRPCAddr())
	t.Log(errOut)
	if code != exitError || !strings.Contains(errOut, "hint:") || !strings.Contains(errOut, "-cert") || strings.Contains(errOut, "server preface") {
		t.Errorf("status without a certificate: exit %d\n%s", code, errOut)
	}
}

// TestNoLeader: against a node that knows no leader (it waits to join a
// cluster that is not there), status says so and exits 1, and an admin
// write fails at once with the same words instead of waiting for one.
func TestNoLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cfg := nodetest.NodeConfig(t, "n1", []string{"127.0.0.1:1"})
	cfg.Insecure = true
	nd := nodetest.StartNode(t, cfg)
	a := "-addr=" + nd.GRPCAddr()
	out, errOut, code := runCLI(ctx, "status", a)
	if code != exitError || !strings.Contains(out, "leader NONE (no quorum)") || !strings.Contains(errOut, "no quorum") {
		t.Errorf("status without a leader: exit %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{{"settings", "set", "-r", "1"}, {"token", "create"}, {"token", "revoke", "abc"}} {
		_, errOut, code := runCLI(ctx, append(args, a, "-insecure")...)
		if code != exitError || !strings.Contains(errOut, "no leader") {
			t.Errorf("%q without a leader: exit %d\n%s", args, code, errOut)
		}
	}
}
