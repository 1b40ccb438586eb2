package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pinned"
	"github.com/kvmesh/kvmesh/ring"
)

// memStore is an in-memory Store with an optional byte capacity (for
// RoomChecker) and Stat.
type memStore struct {
	mu       sync.Mutex
	m        map[chunk.Key]memEntry
	capacity int // 0: unbounded
	used     int
}

type memEntry struct {
	blob []byte
	sum  uint64
}

func newMemStore() *memStore { return &memStore{m: make(map[chunk.Key]memEntry)} }

func (s *memStore) Put(_ context.Context, blob []byte) (chunk.Header, error) {
	hd, err := chunk.Verify(blob, chunk.Limits{})
	if err != nil {
		return hd, err
	}
	cp := slices.Clone(blob) // outside the lock, as kvtier copies
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[hd.Key]; ok {
		if e.sum != hd.Checksum {
			return hd, fmt.Errorf("%w: %v", ErrConflict, hd.Key)
		}
		return hd, nil
	}
	s.m[hd.Key] = memEntry{cp, hd.Checksum}
	s.used += len(blob)
	return hd, nil
}

func (s *memStore) Get(_ context.Context, key chunk.Key) (pinned.Bytes, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return pinned.Bytes{}, fmt.Errorf("%w: %v", ErrNotFound, key)
	}
	return pinned.Owned(e.blob), nil
}

func (s *memStore) Delete(key chunk.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return ErrNotFound
	}
	delete(s.m, key)
	s.used -= len(e.blob)
	return nil
}

func (s *memStore) DeleteIf(key chunk.Key, checksum uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return ErrNotFound
	}
	if e.sum != checksum {
		return ErrConflict
	}
	delete(s.m, key)
	s.used -= len(e.blob)
	return nil
}

func (s *memStore) Scan(fn func(chunk.Key, uint64, int) bool) {
	s.mu.Lock()
	type it struct {
		k    chunk.Key
		sum  uint64
		size int
	}
	items := make([]it, 0, len(s.m))
	for k, e := range s.m {
		items = append(items, it{k, e.sum, len(e.blob)})
	}
	s.mu.Unlock()
	for _, i := range items {
		if !fn(i.k, i.sum, i.size) {
			return
		}
	}
}

func (s *memStore) Stat(key chunk.Key) (uint64, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return 0, 0, ErrNotFound
	}
	return e.sum, len(e.blob), nil
}

func (s *memStore) HasRoom(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capacity == 0 || s.used+n <= s.capacity
}

func (s *memStore) has(key chunk.Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[key]
	return ok
}

func (s *memStore) checksum(key chunk.Key) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	return e.sum, ok
}

func (s *memStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

func (s *memStore) bytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

func (s *memStore) wipe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m = make(map[chunk.Key]memEntry)
	s.used = 0
}

var errUnreachable = errors.New("test network: node unreachable")

// network connects Replicators in-process, with fault hooks: nodes down,
// links cut, calls dropped at random, calls delayed.
type network struct {
	mu    sync.Mutex
	nodes map[string]*Replicator
	down  map[string]bool
	cut   map[[2]string]bool
	drop  float64
	rng   *rand.Rand
	delay time.Duration

	replicates, fetches, digests, deletes atomic.Int64
	bytes                                 atomic.Int64
}

func newNetwork(seed uint64) *network {
	return &network{nodes: map[string]*Replicator{}, down: map[string]bool{}, cut: map[[2]string]bool{},
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (n *network) register(id string, r *Replicator) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[id] = r
}

func (n *network) setDown(id string, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down[id] = down
}

// partition cuts (or heals) every link between group a and group b.
func (n *network) partition(a, b []string, cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			n.cut[[2]string{x, y}] = cut
			n.cut[[2]string{y, x}] = cut
		}
	}
}

func (n *network) setDrop(p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drop = p
}

// route returns the target Replicator or an unreachable error.
func (n *network) route(ctx context.Context, from, to string) (*Replicator, error) {
	n.mu.Lock()
	r := n.nodes[to]
	bad := n.down[from] || n.down[to] || n.cut[[2]string{from, to}] || r == nil
	if !bad && n.drop > 0 && n.rng.Float64() < n.drop {
		bad = true
	}
	delay := n.delay
	n.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if bad {
		return nil, fmt.Errorf("%s -> %s: %w", from, to, errUnreachable)
	}
	return r, nil
}

// transport is one node's view of the network.
type transport struct {
	n    *network
	from string
}

func (t *transport) Replicate(ctx context.Context, node string, blob []byte, opts ReplicateOptions) (uint64, error) {
	t.n.replicates.Add(1)
	r, err := t.n.route(ctx, t.from, node)
	if err != nil {
		return 0, err
	}
	t.n.bytes.Add(int64(len(blob)))
	return r.ServeReplicate(ctx, slices.Clone(blob), opts) // a copy, as on a wire
}

func (t *transport) Fetch(ctx context.Context, node string, key chunk.Key) ([]byte, error) {
	t.n.fetches.Add(1)
	r, err := t.n.route(ctx, t.from, node)
	if err != nil {
		return nil, err
	}
	b, err := r.ServeFetch(ctx, key)
	if err != nil {
		return nil, err
	}
	defer b.Release()
	t.n.bytes.Add(int64(b.Len()))
	return slices.Clone(b.Bytes()), nil
}

func (t *transport) Digest(ctx context.Context, node string, req DigestRequest) (DigestResponse, error) {
	t.n.digests.Add(1)
	r, err := t.n.route(ctx, t.from, node)
	if err != nil {
		return DigestResponse{}, err
	}
	return r.ServeDigest(ctx, req)
}

func (t *transport) Delete(ctx context.Context, node string, key chunk.Key, at int64) error {
	t.n.deletes.Add(1)
	r, err := t.n.route(ctx, t.from, node)
	if err != nil {
		return err
	}
	return r.ServeDelete(ctx, key, at)
}

// cluster is N Replicators over one network and one shared ring.
type cluster struct {
	t      testing.TB
	net    *network
	rg     atomic.Pointer[ring.Ring]
	stores map[string]*memStore
	reps   map[string]*Replicator
	dirs   map[string]string
	cfg    func(id string, c *Config)
	r, w   int
}

func newCluster(t testing.TB, ids []string, cfg func(id string, c *Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, net: newNetwork(1), stores: map[string]*memStore{}, reps: map[string]*Replicator{},
		dirs: map[string]string{}, cfg: cfg, r: 3, w: 2}
	c.setRing(ids...)
	for _, id := range ids {
		c.stores[id] = newMemStore()
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
		c.stores[id] = newMemStore()
		c.dirs[id] = c.t.TempDir()
	}
	cfg := Config{
		NodeID:               id,
		Store:                c.stores[id],
		Transport:            &transport{n: c.net, from: id},
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
	c.net.register(id, r)
	return r
}

// stop closes node id's Replicator (a process exit; its store and data
// dir stay).
func (c *cluster) stop(id string) {
	c.reps[id].Close()
	c.net.setDown(id, true)
}

// holders returns the nodes whose store holds key.
func (c *cluster) holders(key chunk.Key) []string {
	var out []string
	for id, s := range c.stores {
		if s.has(key) {
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
