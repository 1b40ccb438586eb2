package replication

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pinned"
)

// pinStore is an InmemStore that counts the pins its Gets hand out (a Get's
// bytes held until release, as kvtier's arena pins them) and the pins held
// when each Get begins.
type pinStore struct {
	*InmemStore
	mu       sync.Mutex
	held     int
	maxAtGet int
	gets     map[chunk.Key]int
}

func (s *pinStore) Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error) {
	s.mu.Lock()
	s.maxAtGet = max(s.maxAtGet, s.held)
	s.gets[key]++
	s.mu.Unlock()
	b, err := s.InmemStore.Get(ctx, key)
	if err != nil {
		return pinned.Bytes{}, err
	}
	s.mu.Lock()
	s.held++
	s.mu.Unlock()
	var once sync.Once
	return b.Then(pinned.ReleaseFunc(func() {
		once.Do(func() {
			s.mu.Lock()
			s.held--
			s.mu.Unlock()
		})
	})), nil
}

func (s *pinStore) stats(key chunk.Key) (gets, held, maxAtGet int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[key], s.held, s.maxAtGet
}

// A rebalance transfer that a busy receiver pushes back holds no pin on
// the sender while it backs off: each attempt reads the key again (with
// no pin held from the one before). A key deleted during the back-off is
// then not sent (the pass completes: nothing to move); a key whose bytes
// changed stays pending, and the next pass sends the new bytes.
func TestRebalanceBackoffReleasesPin(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, s *InmemStore, key chunk.Key, i int)
	}{
		{"gone", func(t *testing.T, s *InmemStore, key chunk.Key, _ int) {
			if err := s.Delete(key); err != nil {
				t.Fatal(err)
			}
		}},
		{"changed", func(t *testing.T, s *InmemStore, key chunk.Key, i int) {
			blob, _ := makeBlob(t, i, 1) // same key, other bytes
			hd, err := chunk.ParseHeader(blob, chunk.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			// In one step: a retry must not find the key gone between.
			s.Overwrite(key, blob, hd.Checksum)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := &pinStore{gets: map[chunk.Key]int{}}
			recv := newGatedStore()
			c := newCluster(t, []string{"a"}, func(id string, conf *Config) {
				switch id {
				case "a":
					ps.InmemStore = conf.Store.(*InmemStore)
					conf.Store = ps
					conf.RebalanceConcurrency = 1
				case "d":
					conf.Store = recv
					conf.IncomingRebalanceStreams = 1
					conf.IncomingRebalanceWait = 1 // a held slot refuses at once
					conf.ServingYield = -1
				}
			})
			c.r, c.w = 1, 1
			i, key := writeChunkMovingTo(t, c, "d")
			c.setRing("a", "d")
			c.stores["d"], c.dirs["d"] = recv.InmemStore, t.TempDir()
			d := c.start("d")

			held := holdOnlySlot(t, d, recv)

			type result struct {
				st  RebalanceStats
				err error
			}
			done := make(chan result, 1)
			go func() {
				st, err := c.reps["a"].Rebalance(t.Context())
				done <- result{st, err}
			}()
			// Pushed back, backing off, and reading again each time.
			testutil.WaitFor(t, "three reads of the pushed-back key", func() bool { g, _, _ := ps.stats(key); return g >= 3 })
			if _, _, maxAtGet := ps.stats(key); maxAtGet != 0 {
				t.Fatalf("%d pins held when a retry read the key: the back-off kept its pin", maxAtGet)
			}
			tc.change(t, c.stores["a"], key, i)
			// The slot stays held until the pass has ended by itself (the
			// next retry reads the key: gone, nil; changed, errChanged): a
			// retry that read the old bytes before the change would
			// otherwise reach d's inboxSlot after the slot frees, and d would
			// take them.
			res := <-done
			recv.release()
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			if _, pins, _ := ps.stats(key); pins != 0 {
				t.Fatalf("%d pins left after the pass", pins)
			}
			if m := c.reps["a"].Metrics(); m.RebalanceBusy < 2 {
				t.Fatalf("%d busy refusals counted, want >= 2", m.RebalanceBusy)
			}
			switch tc.name {
			case "gone":
				if res.err != nil || res.st.Pending != 0 || res.st.KeysMoved != 0 || recv.Has(key) {
					t.Fatalf("pass %+v, %v; d holds it: %v: want done, nothing moved", res.st, res.err, recv.Has(key))
				}
			case "changed":
				if !errors.Is(res.err, errChanged) || res.st.Pending != 1 || recv.Has(key) {
					t.Fatalf("pass %+v, %v; d holds it: %v: want it pending", res.st, res.err, recv.Has(key))
				}
				st, err := c.reps["a"].Rebalance(t.Context())
				if err != nil || st.Pending != 0 || st.KeysMoved != 1 {
					t.Fatalf("second pass %+v, %v", st, err)
				}
				want, _ := makeBlob(t, i, 1)
				hd, _ := chunk.ParseHeader(want, chunk.Limits{})
				if sum, ok := recv.Checksum(key); !ok || sum != hd.Checksum {
					t.Fatalf("d holds %v (%x), want the new bytes (%x)", ok, sum, hd.Checksum)
				}
			}
		})
	}
}

// holdOnlySlot has another sender's rebalance blob take r's only incoming
// slot, its store held closed in gs, and returns that ServeReplicate's
// result, which comes once gs is released.
func holdOnlySlot(t *testing.T, r *Replicator, gs *gatedStore) <-chan error {
	t.Helper()
	gs.close()
	other, _ := makeBlob(t, 100000, 0)
	held := make(chan error, 1)
	go func() {
		_, err := serveReceived(t.Context(), r, other, ReplicateOptions{Kind: KindRebalance})
		held <- err
	}()
	testutil.WaitFor(t, "the rebalance store to hold its slot", func() bool { return gs.blocked.Load() == 1 })
	return held
}

// A restarted node's pull stores within its receiver budget, as rebalance
// and repair stores do: with its only slot held, the pull waits for the
// slot (its stores count as waiting) instead of storing beside it, and completes
// once the slot frees.
func TestStartupPullTakesReceiverBudget(t *testing.T) {
	var gs *gatedStore
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, conf *Config) {
		if id == "b" && gs != nil {
			conf.Store = gs
			conf.IncomingRebalanceStreams = 1
			conf.ServingYield = -1
		}
	})
	keys, _ := writeAll(t, c, "a", 0, 30)
	c.stop("b")
	c.stores["b"].Wipe()
	gs = newGatedStore()
	gs.InmemStore = c.stores["b"]
	c.net.SetDown("b", false)
	b := c.start("b")

	held := holdOnlySlot(t, b, gs)

	type result struct {
		st  AntiEntropyStats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := b.StartupPull(t.Context())
		done <- result{st, err}
	}()
	// The pull fetches several keys at once (pullItems); each waits.
	testutil.WaitFor(t, "the pull to wait for a slot", func() bool { return b.Metrics().IncomingWaiting >= 1 || gs.blocked.Load() > 1 })
	if m := b.Metrics(); m.IncomingWaiting < 1 || gs.blocked.Load() != 1 {
		t.Fatalf("pull: %d waiting for a slot, %d stores running: want it waiting, not storing", m.IncomingWaiting, gs.blocked.Load())
	}
	gs.release()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || res.st.Pulled != len(keys) {
		t.Fatalf("pull %+v, %v: want %d keys", res.st, res.err, len(keys))
	}
	for _, k := range keys {
		if !gs.Has(k) {
			t.Fatalf("b lacks %v after the pull", k)
		}
	}
	if m := b.Metrics(); m.IncomingWaiting != 0 {
		t.Fatalf("%d still waiting", m.IncomingWaiting)
	}
}
