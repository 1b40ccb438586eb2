package meta

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// fakePeers is a gossip view shared by every node of a test cluster: a node
// is alive while it is in the map.
type fakePeers struct {
	mu    sync.Mutex
	nodes map[string]gossip.NodeMeta
}

func newFakePeers() *fakePeers { return &fakePeers{nodes: make(map[string]gossip.NodeMeta)} }

func (p *fakePeers) Members() []gossip.NodeMeta {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Values(p.nodes))
}

func (p *fakePeers) set(m gossip.NodeMeta) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nodes[m.ID] = m
}

func (p *fakePeers) remove(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.nodes, id)
}

// fakeForwarder plays node's gRPC forwarding: it calls ApplyForwarded on
// the store listening on the gRPC address, or fails like an unreachable
// node.
type fakeForwarder struct {
	mu     sync.Mutex
	stores map[string]*Store // by gRPC address
	calls  int
}

func newFakeForwarder() *fakeForwarder { return &fakeForwarder{stores: make(map[string]*Store)} }

func (f *fakeForwarder) Apply(ctx context.Context, addr string, cmd []byte) error {
	f.mu.Lock()
	s := f.stores[addr]
	f.calls++
	f.mu.Unlock()
	if s == nil {
		return fmt.Errorf("forward to %s: unavailable", addr)
	}
	return s.ApplyForwarded(ctx, cmd)
}

func (f *fakeForwarder) set(addr string, s *Store) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s == nil {
		delete(f.stores, addr)
	} else {
		f.stores[addr] = s
	}
}

func (f *fakeForwarder) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func testLogger() *slog.Logger {
	if os.Getenv("KVMESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
}

// fastConfig has raft timings short enough for tests and loose enough not
// to flap on 2 busy cores under -race.
func fastConfig(id, dir string) Config {
	return Config{
		NodeID:             id,
		RaftBind:           "127.0.0.1:0",
		DataDir:            dir,
		GRPCAddr:           "grpc-" + id,
		DeadGrace:          500 * time.Millisecond,
		RaftRemoveAfter:    500 * time.Millisecond,
		ReconcileInterval:  50 * time.Millisecond,
		ApplyTimeout:       5 * time.Second,
		HeartbeatTimeout:   300 * time.Millisecond,
		ElectionTimeout:    300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond,
		CommitTimeout:      5 * time.Millisecond,
		Logger:             testLogger(),
	}
}

// waitTimeout bounds every wait of these tests; it is a failure bound, not
// a timing assertion.
const waitTimeout = testutil.WaitTimeout

// cluster runs Stores in-process over real TCP on 127.0.0.1.
type cluster struct {
	t      testing.TB
	expect int
	peers  *fakePeers
	fwd    *fakeForwarder
	mu     sync.Mutex
	nodes  map[string]*Store
	dirs   map[string]string
	addrs  map[string]string // raft address, reused on restart
	tweak  func(*Config)
}

func newCluster(t testing.TB, expect int) *cluster {
	c := &cluster{
		t: t, expect: expect, peers: newFakePeers(), fwd: newFakeForwarder(),
		nodes: make(map[string]*Store), dirs: make(map[string]string), addrs: make(map[string]string),
	}
	t.Cleanup(func() {
		for _, id := range c.running() {
			c.stop(id)
		}
	})
	return c
}

func nodeID(i int) string { return fmt.Sprintf("n%02d", i) }

// start opens node id (from its old DataDir and address on a restart) and
// makes it alive in gossip.
func (c *cluster) start(id string) *Store {
	c.t.Helper()
	if c.dirs[id] == "" {
		c.dirs[id] = c.t.TempDir()
	}
	cfg := fastConfig(id, c.dirs[id])
	cfg.BootstrapExpect = c.expect
	cfg.Peers = c.peers
	cfg.Forward = c.fwd
	if a := c.addrs[id]; a != "" {
		cfg.RaftBind = a
	}
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var s *Store
	var err error
	// A restarted node rebinds its old port; retry briefly in case the
	// kernel has not released it yet.
	for range 50 {
		if s, err = Open(ctx, cfg); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("open %s: %v", id, err)
	}
	c.mu.Lock()
	c.nodes[id] = s
	c.addrs[id] = s.RaftAddr()
	c.mu.Unlock()
	c.fwd.set(cfg.GRPCAddr, s)
	c.peers.set(gossip.NodeMeta{ID: id, GRPCAddr: cfg.GRPCAddr, RaftAddr: s.RaftAddr(), Incarnation: cfg.Incarnation})
	return s
}

// stop stops node id like a crash (no snapshot on the way out) and takes it
// out of gossip.
func (c *cluster) stop(id string) { c.stopWith(id, false) }

// stopGraceful is stop with Close's snapshot.
func (c *cluster) stopGraceful(id string) { c.stopWith(id, true) }

func (c *cluster) stopWith(id string, graceful bool) {
	c.t.Helper()
	c.mu.Lock()
	s := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if s == nil {
		return
	}
	c.peers.remove(id)
	c.fwd.set("grpc-"+id, nil)
	if err := s.close(graceful); err != nil {
		c.t.Errorf("close %s: %v", id, err)
	}
}

func (c *cluster) running() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.nodes))
}

func (c *cluster) node(id string) *Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// leader waits until exactly one running node leads and every running node
// in its raft configuration knows it, and returns it. A node removed from
// raft (it left) knows no leader once its heartbeats stop.
func (c *cluster) leader() *Store {
	c.t.Helper()
	var l *Store
	testutil.WaitFor(c.t, "one leader known to all", func() bool {
		l = nil
		for _, id := range c.running() {
			s := c.node(id)
			if s.IsLeader() {
				if l != nil {
					return false
				}
				l = s
			}
		}
		if l == nil {
			return false
		}
		servers, err := l.Servers()
		if err != nil {
			return false
		}
		for _, id := range c.running() {
			if !slices.ContainsFunc(servers, func(sv Server) bool { return sv.ID == id }) {
				continue
			}
			if lid, _ := c.node(id).Leader(); lid != l.NodeID() {
				return false
			}
		}
		return true
	})
	return l
}

func (c *cluster) follower() *Store {
	c.t.Helper()
	l := c.leader()
	for _, id := range c.running() {
		if id != l.NodeID() {
			return c.node(id)
		}
	}
	c.t.Fatal("no follower")
	return nil
}

// withRoles runs step with the leader and a follower and fails the test
// with step's error. With these short raft timeouts an ordinary election
// on a busy machine can move leadership while step runs (a leader also
// steps down, in the same term, when its lease runs out); a failure then
// says nothing about the roles step was given, and step runs again with
// the roles of the moment. Steps must be safe to repeat.
func (c *cluster) withRoles(step func(l, f *Store) error) {
	c.t.Helper()
	var err error
	for range 10 {
		l := c.leader()
		f := c.follower()
		term := l.Stats().Term
		if f.Stats().Term != term {
			continue // f has not heard of l's term yet
		}
		if err = step(l, f); err == nil {
			return
		}
		if l.IsLeader() && l.Stats().Term == term && f.Stats().Term == term {
			c.t.Fatal(err) // l led and f followed for the whole step
		}
		c.t.Logf("leadership moved during a step that failed (%v); again with the new roles", err)
	}
	c.t.Fatalf("leadership kept moving; last step: %v", err)
}

// ringIDs is the sorted member IDs of s's ring.
func ringIDs(s *Store) []string {
	var ids []string
	for _, m := range s.Ring().Members() {
		ids = append(ids, m.ID)
	}
	return ids
}

// waitAgree waits until every node in ids has the ring with exactly ids at
// the same epoch and returns that epoch.
func (c *cluster) waitAgree(ids []string) uint64 {
	c.t.Helper()
	var epoch uint64
	testutil.WaitFor(c.t, fmt.Sprintf("every node's ring = %v", ids), func() bool {
		first := c.node(ids[0])
		if first == nil {
			return false
		}
		epoch = first.Ring().Epoch()
		for _, id := range ids {
			s := c.node(id)
			if s == nil {
				return false
			}
			if s.Ring().Epoch() != epoch || !slices.Equal(ringIDs(s), ids) {
				return false
			}
		}
		return true
	})
	return epoch
}

func testSpec(i int) chunk.ModelSpec {
	return chunk.ModelSpec{
		Family: "llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 500000,
		Scaling:         chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
		WeightsRevision: fmt.Sprintf("rev-%d", i),
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}
