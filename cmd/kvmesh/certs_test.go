package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/daemon"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/tlsconf"
)

func TestCertRequests(t *testing.T) {
	for _, tc := range []struct {
		name           string
		nodes, clients []string
		want           int
		bad            bool
	}{
		{name: "node and client", nodes: []string{"n1=127.0.0.1,node1"}, clients: []string{"app"}, want: 2},
		{name: "node without hosts", nodes: []string{"n1"}, bad: true},
		{name: "node without name", nodes: []string{"=127.0.0.1"}, bad: true},
		{name: "client with slash", clients: []string{"a/b"}, bad: true},
		{name: "nothing", want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := certRequests(tc.nodes, tc.clients)
			if (err != nil) != tc.bad {
				t.Fatalf("err %v, bad %v", err, tc.bad)
			}
			if len(reqs) != tc.want {
				t.Fatalf("%d requests, want %d", len(reqs), tc.want)
			}
		})
	}
}

// TestCertsCommand runs `kvmesh certs` twice (the second reuses the CA)
// and loads what it wrote as node and client identities.
func TestCertsCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ctx := t.Context()
	var out strings.Builder
	if err := run(ctx, []string{"certs", "-dir", dir, "-node", "n1=127.0.0.1", "-client", "app"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, []string{"certs", "-dir", dir, "-node", "n2=127.0.0.1"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, []string{"certs", "-dir", dir, "-node", "n2=127.0.0.1"}, io.Discard, io.Discard); err == nil {
		t.Fatal("certs overwrote n2.pem")
	}
	for _, name := range []string{"n1", "n2", "app"} {
		tl, err := tlsconf.New(tlsconf.Config{CAFile: filepath.Join(dir, "ca.pem"),
			CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem")})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, want := tlsconf.IsNodeCert(tl.Leaf()), name != "app"; got != want {
			t.Errorf("%s: node certificate %v, want %v", name, got, want)
		}
	}
	kf := filepath.Join(t.TempDir(), "gossip.keys")
	if err := run(ctx, []string{"gossip-key", "new", kf}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := gossipkey.LoadFile(kf); err != nil {
		t.Fatal(err)
	}
}

func TestTokenCreate(t *testing.T) {
	recs := filepath.Join(t.TempDir(), "tokens.jsonl")
	var toks []string
	for _, scopes := range []string{"read", "read,write,admin"} {
		var out strings.Builder
		if err := run(t.Context(), []string{"token", "create", "-records", recs, "-name", "x", "-scopes", scopes, "-namespace", "ab"}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		toks = append(toks, strings.TrimSpace(out.String()))
	}
	if err := run(t.Context(), []string{"token", "create", "-records", recs, "-scopes", "root"}, io.Discard, io.Discard); err == nil {
		t.Fatal("unknown scope accepted")
	}
	f, err := os.Open(recs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := daemon.ReadTokenRecords(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(toks) {
		t.Fatalf("%d records, want %d", len(got), len(toks))
	}
	for i, s := range toks {
		tok, err := auth.ParseToken(s)
		if err != nil {
			t.Fatal(err)
		}
		if !got[i].Matches(tok) {
			t.Errorf("record %d does not match its token", i)
		}
	}
}
