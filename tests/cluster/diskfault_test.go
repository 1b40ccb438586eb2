package cluster

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
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
	"github.com/kvmesh/kvmesh/kvtier"
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
	for _, k := range rc.Keys {
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

// TestDiskFull: a node whose -disk exceeds its file system (200M on a
// 96 MiB tmpfs) says so and clamps the budget at start; once something
// else fills that file system, its demotions hit ENOSPC: the budget drops
// to what the tier holds (logged once, not per entry), the metrics and
// the alert's inputs show it, the tier keeps taking demotions by evicting
// older disk entries, and every acknowledged entry still reads back (R=3:
// the other nodes hold them).
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	hosts := []string{"127.0.0.44", "127.0.0.45", "127.0.0.46"}
	mnt := testutil.Tmpfs(t, 96<<20)
	dirs := []string{filepath.Join(mnt, "data"), t.TempDir(), t.TempDir()}
	rc := startRestartClusterOn(t, ctx, hosts, dirs, 0, 6, "-dram", "16M", "-disk", "200M")
	p := rc.procs[0]
	if b, _ := os.ReadFile(p.LogPath()); !strings.Contains(string(b), "clamping") {
		t.Fatal("-disk 200M on a 96 MiB file system started without a clamping warning")
	}
	// Something else takes all but 8 MiB of the file system.
	_, free := fsFree(t, mnt)
	if err := os.WriteFile(filepath.Join(mnt, "filler"), make([]byte, free-8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	rc.putMore(t, ctx, 600, 7) // 37.5 MiB: DRAM 16M demotes the rest
	m, err := harness.Scrape(ctx, p.Addr("http"))
	if err != nil {
		t.Fatal(err)
	}
	noSpace, budget, bytes := m[`kvtier_no_space_errors_total{tier="disk"}`], m[`kvtier_budget_bytes{tier="disk"}`], m[`kvtier_bytes{tier="disk"}`]
	if noSpace == 0 || budget > 16<<20 || bytes > budget || m[`kvtier_fs_free_bytes{tier="disk"}`] > 4<<20 {
		t.Fatalf("disk full: no_space_errors %v, budget %v, bytes %v, fs free %v", noSpace, budget, bytes, m[`kvtier_fs_free_bytes{tier="disk"}`])
	}
	if m[`kvtier_demotions_total{tier="dram"}`] < 100 || m[`kvtier_evictions_total{tier="disk"}`] == 0 {
		t.Fatalf("the full disk tier stopped taking demotions: %v demotions, %v disk evictions",
			m[`kvtier_demotions_total{tier="dram"}`], m[`kvtier_evictions_total{tier="disk"}`])
	}
	b, _ := os.ReadFile(p.LogPath())
	if n := strings.Count(string(b), "out of space"); n == 0 || float64(n) > noSpace || n > 10 {
		t.Fatalf("%d out-of-space log lines for %v ENOSPC failures", n, noSpace)
	}
	rc.checkEntries(t, ctx, "with a full disk on one node")
}

// fsFree is the size and free bytes of dir's file system.
func fsFree(t *testing.T, dir string) (size, free int64) {
	t.Helper()
	size, free, err := kvtier.FSSpace(dir)
	if err != nil {
		t.Fatal(err)
	}
	return size, free
}

// putMore writes n more entries of 64 KiB drawn from seed.
func (rc *restartCluster) putMore(t *testing.T, ctx context.Context, n int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(22, seed))
	spec := testutil.Spec()
	for i := range n {
		k, blob := testutil.StandaloneBlob(t, rng, spec, 128)
		if _, err := rc.c.Put(ctx, blob); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		rc.Keys, rc.Blobs = append(rc.Keys, k), append(rc.Blobs, blob)
	}
}
