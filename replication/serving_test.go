package replication

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/ring"
)

// gatedStore is an InmemStore whose Puts of KindRebalance-sized work can be
// held: while closed is true, Put blocks until open.
type gatedStore struct {
	*InmemStore
	mu      sync.Mutex
	closed  bool
	open    chan struct{}
	puts    atomic.Int64
	blocked atomic.Int64
	// onPut, when set, runs at the start of every Put.
	onPut func()
}

func newGatedStore() *gatedStore {
	return &gatedStore{InmemStore: NewInmemStore(), open: make(chan struct{})}
}

func (s *gatedStore) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed, s.open = true, make(chan struct{})
}

func (s *gatedStore) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.closed = false
		close(s.open)
	}
}

func (s *gatedStore) Put(ctx context.Context, blob []byte) (chunk.Header, error) {
	if s.onPut != nil {
		s.onPut()
	}
	s.mu.Lock()
	closed, open := s.closed, s.open
	s.mu.Unlock()
	if closed {
		s.blocked.Add(1)
		select {
		case <-open:
		case <-ctx.Done():
			s.blocked.Add(-1)
			return chunk.Header{}, ctx.Err()
		}
		s.blocked.Add(-1)
	}
	s.puts.Add(1)
	return s.InmemStore.Put(ctx, blob)
}

// hookTransport runs onFetch before each Fetch it passes on.
type hookTransport struct {
	Transport
	onFetch func(node string, key chunk.Key)
}

func (h *hookTransport) Fetch(ctx context.Context, node string, key chunk.Key) ([]byte, error) {
	h.onFetch(node, key)
	return h.Transport.Fetch(ctx, node, key)
}

// joinWithoutHistory builds a cluster a, b, c at replication factor rf
// holding chunks [0, 60), and a fourth node d that starts with the ring
// already including it: d's Replicator never saw the 3-member ring. With
// emptyFirst, d's first view is the empty ring a node has before it joins,
// and it completes a rebalance pass on it. d's settings go through cfg.
func joinWithoutHistory(t *testing.T, rf int, emptyFirst bool, cfg func(c *Config)) (*cluster, []chunk.Key) {
	t.Helper()
	var joined atomic.Bool
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, conf *Config) {
		if id != "d" {
			return
		}
		full := conf.Placement
		conf.Placement = PlacementFunc(func() *ring.Ring {
			if emptyFirst && !joined.Load() {
				return ring.New(0, nil)
			}
			return full.Ring()
		})
		if cfg != nil {
			cfg(conf)
		}
	})
	c.r, c.w = rf, 1
	keys, _ := writeAll(t, c, "a", 0, 60)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := c.reps[id].Rebalance(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	c.setRing("a", "b", "c", "d")
	c.start("d")
	if emptyFirst {
		if _, err := c.reps["d"].Rebalance(t.Context()); err != nil {
			t.Fatal(err)
		}
		joined.Store(true)
	}
	if _, err := c.reps["d"].Rebalance(t.Context()); err != nil {
		t.Fatal(err) // d has nothing to move; its pass completes at once
	}
	return c, keys
}

// A node that joins with the ring already including it (it
// never saw the earlier ring, e.g. it got the ring from a Raft snapshot)
// must still answer reads of the chunks it now owns but has not received
// yet, from their previous owners. Without the fall-back past the replicas
// (RebalanceSettle off) it answers NotFound at R=1.
func TestNewOwnerWithoutEarlierRingReadsPreviousOwners(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rf         int
		emptyFirst bool
		settle     time.Duration
		wantFound  bool
	}{
		{"R=1 ring already includes it", 1, false, 0, true},
		{"R=1 first view empty", 1, true, 0, true},
		{"R=1 no fall-back: the gap", 1, false, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, keys := joinWithoutHistory(t, tc.rf, tc.emptyFirst, func(conf *Config) { conf.RebalanceSettle = tc.settle })
			d := c.reps["d"]
			waiting := 0
			for _, k := range keys {
				if !c.ring().IsReplica(k.Content, "d", tc.rf) || c.stores["d"].Has(k) {
					continue
				}
				// Keys whose other new replicas hold them are found
				// anyway; the gap is keys only previous owners hold.
				onlyOld := true
				for _, m := range c.ring().Replicas(k.Content, tc.rf) {
					if m.ID != "d" && c.stores[m.ID].Has(k) {
						onlyOld = false
					}
				}
				if !onlyOld {
					continue
				}
				waiting++
				before := c.net.Stats().Fetches
				rr, err := d.Read(t.Context(), k)
				if tc.wantFound {
					if err != nil {
						t.Fatalf("%v unreadable on its new owner mid-rebalance: %v", k, err)
					}
					rr.Blob.Release()
				} else if !errors.Is(err, ErrNotFound) {
					t.Fatalf("%v: got %v, want ErrNotFound without the fall-back", k, err)
				}
				// The replicas, then at most rf more members.
				if n := c.net.Stats().Fetches - before; n > int64(2*tc.rf) {
					t.Fatalf("%d fetches for one read at R=%d", n, tc.rf)
				}
			}
			if waiting == 0 {
				t.Fatal("no chunk held only by previous owners; the test proves nothing")
			}
			if m := d.Metrics(); tc.wantFound && m.MissFallbacks == 0 {
				t.Fatalf("metrics %+v count no fall-back", m)
			}
		})
	}
}

// The fall-back past the replicas lasts RebalanceSettle after the last
// sign of a rebalance: later, a read of an absent key costs only its
// replicas.
func TestMissFallbackSettles(t *testing.T) {
	var offset atomic.Int64
	c, _ := joinWithoutHistory(t, 1, false, func(conf *Config) {
		conf.RebalanceSettle = time.Minute
		conf.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	})
	d := c.reps["d"]
	var absent chunk.Key
	for i := 1000; ; i++ {
		_, absent = makeBlob(t, i, 0)
		if c.ring().IsReplica(absent.Content, "d", 1) {
			break
		}
	}
	for _, tc := range []struct {
		name        string
		advance     time.Duration
		wantFetches int64
	}{
		{"settling", 0, 1}, // the next-ranked member
		{"settled", 2 * time.Minute, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			offset.Add(int64(tc.advance))
			before := c.net.Stats().Fetches
			if _, err := d.Read(t.Context(), absent); !errors.Is(err, ErrNotFound) {
				t.Fatalf("absent key: %v", err)
			}
			if got := c.net.Stats().Fetches - before; got != tc.wantFetches {
				t.Fatalf("%d fetches, want %d", got, tc.wantFetches)
			}
		})
	}
}

// A new owner that misses a key locally, while the old owner hands it over
// and drops it during the read, answers from its own store rather than
// NotFound.
func TestReadRechecksLocalAfterHandoff(t *testing.T) {
	var c *cluster
	var handoff atomic.Bool
	c = newCluster(t, []string{"a", "b", "c"}, func(id string, conf *Config) {
		if id != "d" {
			return
		}
		conf.Transport = &hookTransport{Transport: conf.Transport, onFetch: func(node string, key chunk.Key) {
			if !handoff.Load() {
				return
			}
			// The old owner's rebalance completes now: d gets the key,
			// the old owner deletes it.
			blob, err := c.stores[node].Get(t.Context(), key)
			if err != nil {
				return
			}
			_, perr := c.stores["d"].Put(t.Context(), blob.Bytes())
			blob.Release()
			if perr == nil {
				c.stores[node].Delete(key)
			}
		}}
	})
	c.r, c.w = 1, 1
	keys, _ := writeAll(t, c, "a", 0, 60)
	for _, id := range []string{"a", "b", "c"} {
		c.reps[id].Rebalance(t.Context())
	}
	c.setRing("a", "b", "c", "d")
	c.start("d")
	c.reps["d"].Rebalance(t.Context())
	handoff.Store(true)
	n := 0
	for _, k := range keys {
		if !c.ring().IsReplica(k.Content, "d", 1) {
			continue
		}
		n++
		rr, err := c.reps["d"].Read(t.Context(), k)
		if err != nil {
			t.Fatalf("%v lost between the old owner's drop and d's local miss: %v", k, err)
		}
		if rr.From != "d" {
			t.Fatalf("%v served by %s, want d's own copy", k, rr.From)
		}
		rr.Blob.Release()
	}
	if n == 0 {
		t.Fatal("d owns no key")
	}
}

// A read that fetched a chunk its node should hold stores that copy here
// in the background, without fetching it a second time.
func TestReadRepairHereUsesFetchedBlob(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	blob, key := makeBlob(t, 3, 0)
	if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the key on three replicas", func() bool { return len(c.holders(key)) == 3 })
	c.stores["b"].Delete(key) // evicted on b
	before := c.net.Stats().Fetches
	rr, err := c.reps["b"].Read(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	rr.Blob.Release()
	c.waitRepairs()
	if !c.stores["b"].Has(key) {
		t.Fatal("b not repaired")
	}
	if got := c.net.Stats().Fetches - before; got != 1 {
		t.Fatalf("%d fetches for a read and its repair here, want 1", got)
	}
}

// The receiver's budget: one store slot; a blob that finds it taken waits
// (back-pressure) or is refused with ErrBusy (not a refusal for good) when
// its call cannot wait or too many bytes already wait; writes are not
// gated.
func TestIncomingRebalanceBudget(t *testing.T) {
	st := newGatedStore()
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, conf *Config) {
		if id == "d" {
			conf.Store = st
			conf.IncomingRebalanceStreams = 1
			conf.IncomingRebalanceWait = time.Hour
			conf.IncomingRebalanceQueueBytes = 1
			conf.ServingYield = -1
		}
	})
	c.stores["d"], c.dirs["d"] = st.InmemStore, t.TempDir()
	d := c.start("d")
	reb := ReplicateOptions{Kind: KindRebalance}
	blobs := make([][]byte, 5)
	keys := make([]chunk.Key, 5)
	for i := range blobs {
		blobs[i], keys[i] = makeBlob(t, 100+i, 0)
	}

	st.close()
	first := make(chan error, 1)
	go func() { _, err := serveReceived(t.Context(), d, blobs[0], reb); first <- err }()
	testutil.WaitFor(t, "the first store to hold the slot", func() bool { return st.blocked.Load() == 1 }) // holds the slot

	// A call whose deadline leaves no time to wait is pushed back at once.
	short, cancel := context.WithTimeout(t.Context(), callMargin/2)
	_, err := serveReceived(short, d, blobs[1], reb)
	cancel()
	if !errors.Is(err, ErrBusy) || errors.Is(err, ErrRejected) {
		t.Fatalf("no time to wait: %v, want ErrBusy and no refusal", err)
	}
	// One waits for the slot...
	second := make(chan error, 1)
	go func() { _, err := serveReceived(t.Context(), d, blobs[2], reb); second <- err }()
	testutil.WaitFor(t, "one blob waiting for the slot", func() bool { return d.Metrics().IncomingWaiting == 1 })
	// ...and the next finds the waiting bytes at their bound.
	if _, err := serveReceived(t.Context(), d, blobs[3], reb); !errors.Is(err, ErrBusy) {
		t.Fatalf("queue full: %v, want ErrBusy", err)
	}
	// Writes are serving: they do not take the rebalance budget.
	wrote := make(chan error, 1)
	go func() {
		_, err := serveReceived(t.Context(), d, blobs[4], ReplicateOptions{Kind: KindWrite, At: 1})
		wrote <- err
	}()
	testutil.WaitFor(t, "the write to store without a slot", func() bool { return st.blocked.Load() == 2 })
	if m := d.Metrics(); m.IncomingWaiting != 1 {
		t.Fatalf("%d blobs wait, want 1: the write took no slot", m.IncomingWaiting)
	}

	st.release()
	for _, ch := range []chan error{first, second, wrote} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []bool{true, false, true, false, true} {
		if st.Has(keys[i]) != want {
			t.Fatalf("blob %d stored %v, want %v", i, !want, want)
		}
	}
	if m := d.Metrics(); m.IncomingBusy != 2 || m.IncomingWaiting != 0 {
		t.Fatalf("metrics %+v: want 2 busy, 0 waiting", m)
	}
}

// Senders that a busy receiver pushes back send again later: the
// rebalance completes with nothing pending and every chunk where it
// belongs.
func TestRebalanceThroughBusyReceiver(t *testing.T) {
	st := newGatedStore()
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, conf *Config) {
		if id == "d" {
			conf.Store = st
			conf.IncomingRebalanceStreams = 1
			conf.IncomingRebalanceWait = time.Millisecond
		}
	})
	c.r, c.w = 1, 1
	keys, _ := writeAll(t, c, "a", 0, 80)
	for _, id := range []string{"a", "b", "c"} {
		c.reps[id].Rebalance(t.Context())
	}
	c.setRing("a", "b", "c", "d")
	c.stores["d"], c.dirs["d"] = st.InmemStore, t.TempDir()
	c.start("d")

	st.close()
	var wg sync.WaitGroup
	stats := make([]RebalanceStats, 3)
	errs := make([]error, 3)
	for i, id := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stats[i], errs[i] = c.reps[id].Rebalance(t.Context())
		}()
	}
	busy := func() int64 {
		var n int64
		for _, id := range []string{"a", "b", "c"} {
			n += c.reps[id].Metrics().RebalanceBusy
		}
		return n
	}
	testutil.WaitFor(t, "a push-back while the slot is held", func() bool { return busy() > 0 }) // pushed back while the slot is held
	st.release()
	wg.Wait()
	for i := range stats {
		if errs[i] != nil || stats[i].Pending != 0 {
			t.Fatalf("sender %d: %+v, %v", i, stats[i], errs[i])
		}
	}
	for _, k := range keys {
		if h, r := c.holders(k), c.replicaIDs(k); len(h) != 1 || h[0] != r[0] {
			t.Fatalf("%v held by %v, owner %v", k, h, r)
		}
	}
	if m := c.reps["d"].Metrics(); m.IncomingBusy == 0 {
		t.Fatalf("receiver metrics %+v count no push-back", m)
	}
}

// Incoming rebalance work yields to serving: a store waits while a read
// is in flight here (ServingYield long), and goes on once it ends.
func TestRebalanceYieldsToServing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newGatedStore()
		var servingAtPut atomic.Int64
		servingAtPut.Store(-1)
		var d *Replicator
		c := newCluster(t, []string{"a", "b", "c"}, func(id string, conf *Config) {
			if id == "d" {
				conf.Store = st
				conf.ServingYield = time.Hour
			}
		})
		held, heldKey := makeBlob(t, 200, 0)
		if _, err := st.InmemStore.Put(t.Context(), held); err != nil {
			t.Fatal(err)
		}
		c.stores["d"], c.dirs["d"] = st.InmemStore, t.TempDir()
		d = c.start("d")
		st.onPut = func() { servingAtPut.Store(int64(d.serving.inFlight())) }

		rr, err := d.Read(t.Context(), heldKey) // a read in flight until Release
		if err != nil {
			t.Fatal(err)
		}
		blob, key := makeBlob(t, 201, 0)
		done := make(chan error, 1)
		go func() {
			_, err := serveReceived(t.Context(), d, blob, ReplicateOptions{Kind: KindRebalance})
			done <- err
		}()
		// Every goroutine of the bubble blocked: a store that did not yield
		// would have run by now.
		synctest.Wait()
		if st.Has(key) {
			t.Fatal("rebalance store ran while a read was in flight")
		}
		rr.Blob.Release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !st.Has(key) || servingAtPut.Load() != 0 {
			t.Fatalf("stored %v with %d serving calls in flight", st.Has(key), servingAtPut.Load())
		}
		if m := d.Metrics(); m.IncomingYields != 1 {
			t.Fatalf("%d yields counted, want 1", m.IncomingYields)
		}
	})
}
