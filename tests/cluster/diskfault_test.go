package cluster

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// tierFiles lists the disk tier's entry files under dataDir.
func tierFiles(t *testing.T, dataDir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(dataDir, "tier"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".kvc") {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// flipByte flips one bit near the end of file p (in the payload).
func flipByte(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-100] ^= 0x10
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// damagedTotal is a node's kvtier_damaged_total{tier="disk"}.
func damagedTotal(t *testing.T, ctx context.Context, p *harness.Proc) float64 {
	t.Helper()
	m, err := harness.Scrape(ctx, p.Addr("http"))
	if err != nil {
		t.Fatal(err)
	}
	return m[`kvtier_damaged_total{tier="disk"}`]
}

// directGetCode is the gRPC code of a Get of key answered by the node at
// addr alone.
func directGetCode(ctx context.Context, c api.ClientClient, key chunk.Key) codes.Code {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := c.Get(ctx, &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_ENTRY, Direct: true})
	if err != nil {
		return status.Code(err)
	}
	var hdr api.GetHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		return status.Code(err)
	}
	data := make([]byte, hdr.TotalBytes)
	return status.Code(api.RecvBody(st, data))
}

// TestDamagedTierFiles: tier files damaged while a node was down (a bit
// flip, a truncation) are dropped at its start, counted in
// kvtier_damaged_total, and pulled back before the node says it is ready;
// a file damaged while it runs is answered to a direct reader as DataLoss
// (the store's copy is bad, not the request), counted, and a normal read
// still returns the right bytes from another replica.
func TestDamagedTierFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	hosts := []string{"127.0.0.26", "127.0.0.27", "127.0.0.28"}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	const n = 120
	rc := startRestartClusterOn(t, ctx, hosts, dirs, n, 4, "-disk", "64M")
	for _, p := range rc.procs {
		testutil.WaitFor(t, fmt.Sprintf("%s holding %d entries", p.ID(), n), func() bool {
			st, err := rc.c.Stats(ctx, p.Addr("grpc"))
			return err == nil && st.Entries >= n
		})
	}
	p := rc.procs[0]
	if err := p.Terminate(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	files := tierFiles(t, dirs[0])
	if len(files) < n {
		t.Fatalf("%d tier files after the spill, want %d", len(files), n)
	}
	flipByte(t, files[0])
	if err := os.Truncate(files[1], 1000); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ctx, p)
	st, err := rc.c.Stats(ctx, p.Addr("grpc"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries < n {
		t.Fatalf("%s ready holding %d of %d entries after two tier files were dropped", p.ID(), st.Entries, n)
	}
	if d := damagedTotal(t, ctx, p); d != 2 {
		t.Fatalf("kvtier_damaged_total after two damaged files: %v", d)
	}

	// Damage while it runs: every entry is on disk now (recovered or
	// pulled and not read since, or pulled into DRAM: flip only files).
	files = tierFiles(t, dirs[0])
	if len(files) == 0 {
		t.Fatal("no tier files")
	}
	for _, f := range files {
		flipByte(t, f)
	}
	cc, err := grpc.NewClient(p.Addr("grpc"), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec()), grpc.MaxCallRecvMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	direct := api.NewClientClient(cc)
	got := map[codes.Code]int{}
	for _, k := range rc.keys {
		got[directGetCode(ctx, direct, k)]++
	}
	if got[codes.DataLoss] != len(files) || got[codes.InvalidArgument] != 0 {
		t.Fatalf("direct reads of %d damaged files answered %v", len(files), got)
	}
	if d := damagedTotal(t, ctx, p); d != float64(2+len(files)) {
		t.Fatalf("kvtier_damaged_total after %d more damaged files: %v", len(files), d)
	}
	rc.checkEntries(t, ctx, "after tier files were damaged")
}

// TestRestoreOnEmptyDataDirWaitsForPull: a node started under its ID on
// an empty data directory (the documented restore) says it is ready only
// once it holds every entry again, so that a rolling operation paced by
// /readyz never takes away the last copies it has not pulled back yet.
// Its links are paced so that the pull takes seconds.
func TestRestoreOnEmptyDataDirWaitsForPull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	hosts := []string{"127.0.0.29", "127.0.0.30", "127.0.0.40"}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	const n = 160 // 10 MiB
	rc := startRestartClusterOn(t, ctx, hosts, dirs, n, 5, "-peer-link-rate", "4000000")
	for _, p := range rc.procs {
		testutil.WaitFor(t, fmt.Sprintf("%s holding %d entries", p.ID(), n), func() bool {
			st, err := rc.c.Stats(ctx, p.Addr("grpc"))
			return err == nil && st.Entries >= n
		})
	}
	p := rc.procs[2]
	p.Kill()
	ents, err := os.ReadDir(dirs[2])
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dirs[2], e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	first := waitReady(t, ctx, p)
	st, err := rc.c.Stats(ctx, p.Addr("grpc"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries < n {
		t.Fatalf("%s restored on an empty data directory said ready holding %d of %d entries (first /readyz answer %q)", p.ID(), st.Entries, n, first)
	}
}
