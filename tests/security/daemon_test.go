package security_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/daemon"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestDaemonConfigFile runs kvmeshd from a JSON config naming TLS files, a
// gossip keyring file and a tokens file, as docs/SECURITY.md describes:
// the token of the file's record works once the daemon stored it, and a
// call without it is refused.
func TestDaemonConfigFile(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	key, err := gossipkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "gossip.keys")
	if err := gossipkey.WriteFile(keyFile, key); err != nil {
		t.Fatal(err)
	}
	tok, rec, err := auth.NewToken("ops", auth.ScopeRead|auth.ScopeAdmin, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	line, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	tokensFile := filepath.Join(dir, "tokens.jsonl")
	if err := os.WriteFile(tokensFile, append([]byte("# records\n"), append(line, '\n')...), 0o600); err != nil {
		t.Fatal(err)
	}
	n1 := files(p.dir, "n1")
	conf := map[string]any{
		"id": "n1", "data_dir": filepath.Join(dir, "data"), "bootstrap": true, "grpc": "127.0.0.1:0", "dram": "16M", "local_timing": true, "http": "off",
		"log_level":           "error",
		"tls":                 map[string]string{"ca_file": n1.CAFile, "cert_file": n1.CertFile, "key_file": n1.KeyFile},
		"gossip_keyring_file": keyFile,
		"auth":                map[string]any{"tokens": true, "tokens_file": tokensFile, "max_streams_per_client": 8},
	}
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	confFile := filepath.Join(dir, "kvmeshd.json")
	if err := os.WriteFile(confFile, b, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, []string{"-config", confFile}, pw, io.Discard)
		_ = pw.Close()
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	}()
	sc := bufio.NewScanner(pr)
	var grpcAddr string
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if v, ok := strings.CutPrefix(f, "grpc="); ok {
				grpcAddr = v
			}
		}
		if grpcAddr != "" {
			break
		}
	}
	if grpcAddr == "" {
		t.Fatal("no ready line")
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	creds := tlsCreds(t, files(p.dir, "app"))
	wantCode(t, "no token", call(t, grpcAddr, creds, "", false), codes.Unauthenticated)
	testutil.WaitFor(t, "the tokens file's record", func() bool { return call(t, grpcAddr, creds, tok.String(), false) == nil })
}
