package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestPutAlreadyStored: a put of a key the cluster holds with other bytes
// succeeds and says that the other version (the smaller checksum) is
// kept, in text and in JSON.
func TestPutAlreadyStored(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nd := nodetest.Start(t, 1, nodetest.Config{}).Nodes[0]
	spec := testutil.Spec()
	if _, err := nd.Meta().RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(16, 2))
	tokens := testutil.Tokens(rng, 4)
	dir := t.TempDir()
	var files [2]string
	var sums [2]uint64
	for i := range files {
		_, blob := testutil.Blob(t, rng, spec, tokens, chunk.StandaloneContext())
		hd, err := chunk.ParseHeader(blob, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		files[i], sums[i] = filepath.Join(dir, fmt.Sprintf("v%d.kv", i)), hd.Checksum
		if err := os.WriteFile(files[i], blob, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if sums[1] < sums[0] { // the smaller checksum first: the second put loses
		files[0], files[1], sums[0], sums[1] = files[1], files[0], sums[1], sums[0]
	}
	a := "-addr=" + nd.GRPCAddr()
	if out, errOut, code := runCLI(ctx, "put", files[0], a); code != 0 || !strings.Contains(out, " stored on n1") {
		t.Fatalf("first put: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code := runCLI(ctx, "put", files[1], a)
	if want := fmt.Sprintf("already stored with checksum %016x on n1", sums[0]); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("second put: exit %d, want a line with %q\n%s%s", code, want, out, errOut)
	}
	out, errOut, code = runCLI(ctx, "put", files[1], a, "-format", "json")
	var got []putOut
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got) != 1 {
		t.Fatalf("second put, json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if p := got[0]; !p.AlreadyStored || p.KeptChecksum != fmt.Sprintf("%016x", sums[0]) || p.Checksum != fmt.Sprintf("%016x", sums[1]) {
		t.Fatalf("second put, json: %+v, want already stored, kept %016x", p, sums[0])
	}
}
