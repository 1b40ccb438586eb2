package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// lostEntries counts the written entries that no read returns with the
// bytes that were put.
func (rc *restartCluster) lostEntries(ctx context.Context) int {
	lost := 0
	for i, k := range rc.Keys {
		b, err := rc.c.Get(ctx, k)
		if err != nil || string(b) != string(rc.Blobs[i]) {
			lost++
		}
	}
	return lost
}

// ringWeights is each member's ring weight as the client sees it.
func (rc *restartCluster) ringWeights(t *testing.T, ctx context.Context) (map[string]float64, uint64) {
	t.Helper()
	if err := rc.c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	r := rc.c.Ring()
	w := make(map[string]float64)
	for _, m := range r.Members() {
		w[m.ID] = m.EffectiveWeight()
	}
	return w, r.Epoch()
}

// TestFullRestartTightFilesystems: three nodes, each on its own 160 MiB
// file system (a tmpfs) with the default -disk auto (80 MiB), hold 62 MiB each
// (R=3) mostly on disk; SIGTERM all, start all. Every acknowledged entry
// must be read back, and the ring must keep its weights and its epoch:
// the disk budget chosen at the first start is the one used after it,
// though the tier's own files now take most of the free space it was
// computed from.
func TestFullRestartTightFilesystems(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	hosts := []string{"127.0.0.37", "127.0.0.38", "127.0.0.39"}
	dirs := make([]string, len(hosts))
	for i := range dirs {
		dirs[i] = filepath.Join(testutil.Tmpfs(t, 160<<20), "data")
	}
	const n = 1000 // 62.5 MiB of 64 KiB entries: under the 80 MiB budget
	rc := startRestartClusterOn(t, ctx, hosts, dirs, n, 3, "-dram", "16M")
	for _, p := range rc.procs {
		testutil.WaitFor(t, fmt.Sprintf("%s holding %d entries", p.ID(), n), func() bool {
			st, err := rc.c.Stats(ctx, p.Addr("grpc"))
			return err == nil && st.Entries >= n
		})
	}
	before, epoch := rc.ringWeights(t, ctx)
	for _, p := range rc.procs {
		if err := p.Terminate(30 * time.Second); err != nil {
			t.Fatalf("%s after SIGTERM: %v", p.ID(), err)
		}
	}
	for _, p := range rc.procs {
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range rc.procs {
		waitReady(t, ctx, p)
	}
	if lost := rc.lostEntries(ctx); lost > 0 {
		t.Fatalf("%d of %d acknowledged entries lost in a full SIGTERM restart", lost, n)
	}
	after, epoch2 := rc.ringWeights(t, ctx)
	for id, w := range before {
		if after[id] != w {
			t.Errorf("%s: ring weight %v before the restart, %v after", id, w, after[id])
		}
	}
	if epoch2 != epoch {
		t.Errorf("ring epoch %d before the restart, %d after: a restart alone re-weighted the ring", epoch, epoch2)
	}
}
