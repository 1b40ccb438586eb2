package replication

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/ring"
)

// cluster is N Replicators over one network and one shared ring.
type cluster struct {
	t      testing.TB
	net    *InmemNetwork
	rg     atomic.Pointer[ring.Ring]
	stores map[string]*InmemStore
	reps   map[string]*Replicator
	dirs   map[string]string
	cfg    func(id string, c *Config)
	r, w   int
}

func newCluster(t testing.TB, ids []string, cfg func(id string, c *Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, net: NewInmemNetwork(1), stores: map[string]*InmemStore{}, reps: map[string]*Replicator{},
		dirs: map[string]string{}, cfg: cfg, r: 3, w: 2}
	c.setRing(ids...)
	for _, id := range ids {
		c.stores[id] = NewInmemStore()
		c.dirs[id] = t.TempDir()
		c.start(id)
	}
	t.Cleanup(func() {
		for _, r := range c.reps {
			r.Close()
		}
	})
	return c
}

func (c *cluster) setRing(ids ...string) {
	var epoch uint64 = 1
	if old := c.rg.Load(); old != nil {
		epoch = old.Epoch() + 1
	}
	ms := make([]ring.Member, len(ids))
	for i, id := range ids {
		ms[i] = ring.Member{ID: id}
	}
	c.rg.Store(ring.New(epoch, ms))
}

func (c *cluster) ring() *ring.Ring { return c.rg.Load() }

// start opens (or reopens, after stop) node id's Replicator. Background
// loops are off unless cfg turns them on: tests drive the steps.
func (c *cluster) start(id string) *Replicator {
	c.t.Helper()
	if c.stores[id] == nil {
		c.stores[id] = NewInmemStore()
		c.dirs[id] = c.t.TempDir()
	}
	cfg := Config{
		NodeID:               id,
		Store:                c.stores[id],
		Transport:            c.net.Transport(id),
		Placement:            PlacementFunc(c.ring),
		Quorum:               func() (int, int) { return c.r, c.w },
		DataDir:              c.dirs[id],
		HintInterval:         -1,
		RingCheckInterval:    -1,
		AntiEntropyInterval:  -1,
		ReadRepairChance:     -1,
		RebalanceBytesPerSec: -1,
		CallTimeout:          5 * time.Second,
		Logger:               slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if c.cfg != nil {
		c.cfg(id, &cfg)
	}
	r, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.reps[id] = r
	c.net.Register(id, r)
	return r
}

// stop closes node id's Replicator (a process exit; its store and data
// dir stay).
func (c *cluster) stop(id string) {
	c.reps[id].Close()
	c.net.SetDown(id, true)
}

// holders returns the nodes whose store holds key.
func (c *cluster) holders(key chunk.Key) []string {
	var out []string
	for id, s := range c.stores {
		if s.Has(key) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (c *cluster) replicaIDs(key chunk.Key) []string {
	var out []string
	for _, m := range c.ring().Replicas(key.Content, c.r) {
		out = append(out, m.ID)
	}
	slices.Sort(out)
	return out
}

// waitRepairs waits for every node's repair queue to drain and the
// workers to finish.
func (c *cluster) waitRepairs() {
	c.t.Helper()
	testutil.WaitForWithin(c.t, 20*time.Second, "the repairs to finish", func() bool {
		for _, r := range c.reps {
			m := r.Metrics()
			if r.RepairsPending() > 0 || m.RepairsQueued != m.RepairsDone+m.RepairErrors {
				return false
			}
		}
		return true
	})
}

// makeBlob returns an encoded entry for chunk i (deterministic), with
// variant changing its bytes but not its key.
func makeBlob(t testing.TB, i, variant int) ([]byte, chunk.Key) {
	t.Helper()
	return makeSizedBlob(t, i, variant, 8, 2)
}

// makeSizedBlob is makeBlob with tokens tokens and layers layers of
// testutil.Spec's heads in f16.
func makeSizedBlob(t testing.TB, i, variant, tokens, layers int) ([]byte, chunk.Key) {
	t.Helper()
	toks := make([]uint32, tokens)
	for j := range toks {
		toks[j] = uint32(i*131 + j)
	}
	spec := testutil.Spec()
	spec.Layers, spec.KVHeads, spec.HeadDim, spec.DType = layers, 2, 8, chunk.F16
	key, blob := testutil.Blob(t, rand.New(rand.NewPCG(uint64(i), uint64(variant))), spec, toks, chunk.StandaloneContext())
	return blob, key
}
