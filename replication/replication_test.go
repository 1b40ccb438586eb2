package replication

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestWriteQuorum(t *testing.T) {
	for _, tc := range []struct {
		name       string
		r, w       int
		down       []string
		wantErr    error
		wantStored int // at least
		wantHinted int // after stragglers finish
	}{
		{name: "all up", r: 3, w: 2, wantStored: 2},
		{name: "one down", r: 3, w: 2, down: []string{"c"}, wantStored: 2, wantHinted: 1},
		{name: "two down", r: 3, w: 2, down: []string{"b", "c"}, wantErr: ErrQuorum, wantStored: 1, wantHinted: 2},
		{name: "R=1", r: 1, w: 1, wantStored: 1},
		{name: "W capped at R", r: 2, w: 5, wantStored: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, []string{"a", "b", "c"}, nil)
			c.r, c.w = tc.r, tc.w
			for _, id := range tc.down {
				c.net.SetDown(id, true)
			}
			blob, key := makeBlob(t, 1, 0)
			res, err := c.reps["a"].Write(t.Context(), blob)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Write error %v, want %v", err, tc.wantErr)
			}
			if res.Key != key || len(res.StoredOn) < tc.wantStored {
				t.Fatalf("result %+v, want key %v and >= %d stored", res, key, tc.wantStored)
			}
			for _, id := range res.StoredOn {
				if !c.stores[id].Has(key) {
					t.Errorf("%s acknowledged but does not hold the chunk", id)
				}
			}
			c.reps["a"].Close() // waits for stragglers
			if n, _ := c.reps["a"].HintsPending(); n != tc.wantHinted {
				t.Errorf("%d hints, want %d", n, tc.wantHinted)
			}
		})
	}
}

func TestWriteRejectsBadBlob(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	blob, _ := makeBlob(t, 1, 0)
	bad := slices.Clone(blob)
	bad[10] ^= 1 // header checksum breaks
	if _, err := c.reps["a"].Write(t.Context(), bad); !errors.Is(err, chunk.ErrCorrupt) {
		t.Fatalf("corrupt blob: %v", err)
	}
	if _, err := serveReceived(t.Context(), c.reps["b"], bad, ReplicateOptions{Kind: KindWrite}); !errors.Is(err, ErrRejected) {
		t.Fatalf("a corrupt blob received: %v, want ErrRejected", err)
	}
	if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
		t.Fatal(err)
	}
	// Same key, other bytes (a second honest producer): not an error;
	// every replica keeps the version that Wins.
	other, key := makeBlob(t, 1, 1)
	if _, err := c.reps["a"].Write(t.Context(), other); err != nil {
		t.Fatalf("second write of a key: %v", err)
	}
	want := winner(t, blob, other)
	testutil.WaitFor(t, "every replica holding the winner", func() bool { // the last replica write may still be in flight
		for _, id := range c.replicaIDs(key) {
			if sum, ok := c.stores[id].Checksum(key); !ok || sum != want {
				return false
			}
		}
		return true
	})
	c.reps["a"].Close()
	if n, _ := c.reps["a"].HintsPending(); n != 0 {
		t.Fatalf("a refused write left %d hints", n)
	}
}

// Kill one of 3 replicas (down, its memory wiped) in the middle of a write
// stream: every acknowledged chunk stays readable, with its bytes, and the
// cluster returns to 3 copies once the node is back.
func TestKillReplicaDuringWriteStream(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	const total = 300
	type acked struct {
		key  chunk.Key
		blob []byte
	}
	var mu sync.Mutex
	var acks []acked
	var wg sync.WaitGroup
	for w, coord := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += 2 {
				if i == total/2 {
					c.net.SetDown("c", true)
					c.stores["c"].Wipe()
				}
				blob, key := makeBlob(t, i, 0)
				if _, err := c.reps[coord].Write(t.Context(), blob); err != nil {
					continue
				}
				mu.Lock()
				acks = append(acks, acked{key, blob})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(acks) != total {
		t.Fatalf("%d of %d writes acknowledged with 2 of 3 replicas up", len(acks), total)
	}
	for _, a := range acks {
		for _, via := range []string{"a", "b"} {
			rr, err := c.reps[via].Read(t.Context(), a.key)
			if err != nil {
				t.Fatalf("acknowledged %v lost: %v", a.key, err)
			}
			if !bytes.Equal(rr.Blob.Bytes(), a.blob) {
				t.Fatalf("read of %v via %s returned other bytes", a.key, via)
			}
			rr.Blob.Release()
		}
	}
	// c returns empty; hints and anti-entropy bring it back to 3 copies.
	c.net.SetDown("c", false)
	for _, id := range []string{"a", "b"} {
		if _, err := c.reps[id].DeliverHints(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := c.reps[id].AntiEntropy(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range acks {
		if h := c.holders(a.key); len(h) != 3 {
			t.Fatalf("%v on %v after recovery, want all 3", a.key, h)
		}
	}
}

// A node down during writes gets its hints when it returns, also when the
// hint holder restarted in between; delivered hints are deleted.
func TestHintedHandoff(t *testing.T) {
	for _, tc := range []struct {
		name       string
		restart    bool
		background bool
	}{
		{name: "direct"},
		{name: "holder restarted", restart: true},
		{name: "background loop", background: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
					if tc.background {
						cfg.HintInterval = 5 * time.Millisecond
						cfg.MaxHintBackoff = 20 * time.Millisecond
					}
				})
				c.net.SetDown("c", true)
				const n = 40
				var keys []chunk.Key
				for i := range n {
					blob, key := makeBlob(t, i, 0)
					res, err := c.reps["a"].Write(t.Context(), blob)
					if err != nil {
						t.Fatal(err)
					}
					if len(res.StoredOn) < 2 {
						t.Fatalf("stored on %v", res.StoredOn)
					}
					keys = append(keys, key)
				}
				// Let stragglers (the hint writes) finish.
				testutil.WaitFor(t, "the hint writes to finish", func() bool { n2, _ := c.reps["a"].HintsPending(); return n2 == n })
				if tc.restart {
					c.stop("a")
					c.net.SetDown("a", false)
					c.start("a")
					if got, _ := c.reps["a"].HintsPending(); got != n {
						t.Fatalf("%d hints after restart, want %d", got, n)
					}
				}
				c.net.SetDown("c", false)
				if tc.background {
					c.reps["a"].Kick()
					testutil.WaitFor(t, "the hints to be delivered", func() bool { got, _ := c.reps["a"].HintsPending(); return got == 0 })
				} else {
					got, err := c.reps["a"].DeliverHints(t.Context())
					if err != nil || got != n {
						t.Fatalf("delivered %d (%v), want %d", got, err, n)
					}
				}
				for _, k := range keys {
					if !c.stores["c"].Has(k) {
						t.Fatalf("%v not delivered to c", k)
					}
				}
				files, _ := os.ReadDir(filepath.Join(c.dirs["a"], "hints"))
				if len(files) != 0 {
					t.Fatalf("%d hint files left after delivery", len(files))
				}
			})
		})
	}
}

func TestHintBounds(t *testing.T) {
	blob, _ := makeBlob(t, 0, 0)
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
		cfg.MaxHintBytes = int64(3*len(blob) + 1)
	})
	c.net.SetDown("c", true)
	for i := range 10 {
		b, _ := makeBlob(t, i, 0)
		if _, err := c.reps["a"].Write(t.Context(), b); err != nil {
			t.Fatal(err)
		}
	}
	c.reps["a"].Close()
	n, size := c.reps["a"].HintsPending()
	if n != 3 || size > int64(3*len(blob)+1) {
		t.Fatalf("%d hints of %d bytes, want 3 within the bound", n, size)
	}
	if m := c.reps["a"].Metrics(); m.HintsRefused != 7 {
		t.Fatalf("%d hints refused, want 7", m.HintsRefused)
	}
}

// writeAll writes chunks [from, to) through coordinator and returns their
// keys and sizes.
func writeAll(t *testing.T, c *cluster, coord string, from, to int) ([]chunk.Key, map[chunk.Key]int) {
	t.Helper()
	var keys []chunk.Key
	sizes := map[chunk.Key]int{}
	for i := from; i < to; i++ {
		blob, key := makeBlob(t, i, 0)
		if _, err := c.reps[coord].Write(t.Context(), blob); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
		sizes[key] = len(blob)
	}
	for _, r := range c.reps {
		r.Close() // stragglers done; reopen below
	}
	for id := range c.reps {
		c.start(id)
	}
	return keys, sizes
}

// A joining node ends with its share, each chunk crosses the network once,
// and the old owners drop theirs only after the new owners hold them.
func TestJoinRebalance(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	keys, sizes := writeAll(t, c, "a", 0, 200)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := c.reps[id].Rebalance(t.Context()); err != nil {
			t.Fatal(err) // the first pass records the ring
		}
	}
	c.start("d")
	c.setRing("a", "b", "c", "d")

	// d is unreachable: nothing moves, nothing is dropped.
	c.net.SetDown("d", true)
	for _, id := range []string{"a", "b", "c"} {
		st, _ := c.reps[id].Rebalance(t.Context())
		if st.KeysDropped != 0 {
			t.Fatalf("%s dropped %d keys while their new owner was down", id, st.KeysDropped)
		}
	}
	for _, k := range keys {
		if h := c.holders(k); len(h) != 3 {
			t.Fatalf("%v on %v with d down, want its 3 old holders", k, h)
		}
	}

	c.net.SetDown("d", false)
	var moved int64
	for _, id := range []string{"a", "b", "c", "d"} {
		st, err := c.reps[id].Rebalance(t.Context())
		if err != nil || st.Pending != 0 {
			t.Fatalf("%s: %+v, %v", id, st, err)
		}
		moved += st.BytesMoved
	}
	var want, total int64
	dKeys := 0
	for _, k := range keys {
		if h, r := c.holders(k), c.replicaIDs(k); !slices.Equal(h, r) {
			t.Fatalf("%v held by %v, replicas are %v", k, h, r)
		}
		total += 3 * int64(sizes[k])
		if c.ring().IsReplica(k.Content, "d", 3) {
			want += int64(sizes[k])
			dKeys++
		}
	}
	if moved != want {
		t.Fatalf("moved %d bytes, d's share is %d: some chunks crossed twice or not at all", moved, want)
	}
	if dKeys == 0 || dKeys == len(keys) {
		t.Fatalf("d owns %d of %d keys", dKeys, len(keys))
	}
	t.Logf("moved %d bytes; ideal quarter %d (ratio %.3f)", moved, total/4, float64(moved)/float64(total/4))
	if m := c.reps["a"].Metrics(); m.RebalanceKeys == 0 || m.RebalanceDropped == 0 {
		t.Fatalf("metrics %+v show no progress", m)
	}
}

// The background loop rebalances on an epoch change by itself.
func TestRebalanceLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
			cfg.RingCheckInterval = 5 * time.Millisecond
			cfg.RebalanceRetry = 10 * time.Millisecond
			cfg.RebalanceBytesPerSec = 4 << 20
		})
		keys, _ := writeAll(t, c, "b", 0, 60)
		c.start("d")
		c.setRing("a", "b", "c", "d")
		for _, r := range c.reps {
			r.Kick()
		}
		testutil.WaitFor(t, "every key on exactly its replicas", func() bool {
			for _, k := range keys {
				if !slices.Equal(c.holders(k), c.replicaIDs(k)) {
					return false
				}
			}
			return true
		})
	})
}

// Replicas that missed writes during a partition converge by anti-entropy:
// equal tables afterwards, and a second round finds nothing to do.
func TestAntiEntropyPartitionHeals(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c", "d"}, func(id string, cfg *Config) {
		cfg.MaxHintBytes = 1 // no hints: anti-entropy must do it
	})
	old, _ := writeAll(t, c, "a", 0, 50)
	c.net.Partition([]string{"c"}, []string{"a", "b", "d"}, true)
	fresh, _ := writeAll(t, c, "a", 50, 150)
	var deleted []chunk.Key
	for _, k := range old[:10] {
		if _, err := c.reps["a"].Delete(t.Context(), k); err != nil && !c.ring().IsReplica(k.Content, "c", 3) {
			t.Fatal(err)
		}
		deleted = append(deleted, k)
	}
	c.net.Partition([]string{"c"}, []string{"a", "b", "d"}, false)

	differ := 0
	for _, id := range []string{"a", "b", "c", "d"} {
		st, err := c.reps[id].AntiEntropy(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		differ += st.BucketsDiffer
	}
	if differ == 0 {
		t.Fatal("no bucket differed after the partition")
	}
	for _, a := range []string{"a", "b", "c", "d"} {
		for _, b := range []string{"a", "b", "c", "d"} {
			if a != b && !slices.Equal(c.reps[a].PeerTable(b), c.reps[b].PeerTable(a)) {
				t.Fatalf("tables of %s and %s differ after a round", a, b)
			}
		}
	}
	for _, k := range append(old[10:], fresh...) {
		if h, r := c.holders(k), c.replicaIDs(k); !slices.Equal(h, r) {
			t.Fatalf("%v held by %v, replicas %v", k, h, r)
		}
	}
	for _, k := range deleted {
		if h := c.holders(k); len(h) != 0 {
			t.Fatalf("deleted %v resurrected on %v", k, h)
		}
	}
	before := c.net.Stats().Replicates
	for _, id := range []string{"a", "b", "c", "d"} {
		st, err := c.reps[id].AntiEntropy(t.Context())
		if err != nil || st.BucketsDiffer != 0 || st.ItemsListed != 0 {
			t.Fatalf("second round on %s: %+v, %v", id, st, err)
		}
	}
	if n := c.net.Stats().Replicates - before; n != 0 {
		t.Fatalf("converged round sent %d blobs", n)
	}
}

// An evicted replica is refetched on demand and repaired; a full store is
// not refilled (repair never evicts); a deleted chunk does not come back
// through anti-entropy or a late hint; a write after a delete survives
// the older tombstone.
func TestEvictionAndDeletes(t *testing.T) {
	ctx := t.Context()
	t.Run("evicted replica refetched and repaired", func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, nil)
		keys, _ := writeAll(t, c, "a", 0, 5)
		k := keys[0]
		c.stores["b"].Delete(k) // eviction
		rr, err := c.reps["b"].Read(ctx, k)
		if err != nil || rr.From == "b" {
			t.Fatalf("read after eviction: from %q, %v", rr.From, err)
		}
		rr.Blob.Release()
		c.waitRepairs()
		if !c.stores["b"].Has(k) {
			t.Fatal("evicted replica not repaired after a read")
		}
	})
	t.Run("full store not refilled", func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, nil)
		keys, _ := writeAll(t, c, "a", 0, 5)
		c.stores["b"].Delete(keys[0])
		c.stores["b"].SetCapacity(c.stores["b"].Bytes())
		st, err := c.reps["a"].AntiEntropy(ctx)
		if err != nil || st.Refused == 0 || c.stores["b"].Has(keys[0]) {
			t.Fatalf("anti-entropy into a full store: %+v, %v, refilled=%v", st, err, c.stores["b"].Has(keys[0]))
		}
		if c.stores["b"].Len() != 4 {
			t.Fatalf("full store holds %d entries, want its 4", c.stores["b"].Len())
		}
	})
	t.Run("delete while a replica is down", func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, nil)
		keys, _ := writeAll(t, c, "a", 0, 5)
		k := keys[0]
		c.net.SetDown("c", true)
		if _, err := c.reps["a"].Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
		c.net.SetDown("c", false)
		for _, id := range []string{"c", "a", "b"} {
			if _, err := c.reps[id].AntiEntropy(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if h := c.holders(k); len(h) != 0 {
			t.Fatalf("deleted chunk resurrected on %v", h)
		}
		if _, err := c.reps["c"].Read(ctx, k); !errors.Is(err, ErrNotFound) {
			t.Fatalf("read of a deleted chunk: %v", err)
		}
	})
	t.Run("late hint after delete", func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, nil)
		c.net.SetDown("c", true)
		blob, k := makeBlob(t, 7, 0)
		if _, err := c.reps["a"].Write(ctx, blob); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "one hint", func() bool { n, _ := c.reps["a"].HintsPending(); return n == 1 })
		// The delete is coordinated by b, so a's hint survives until
		// delivery, where a's own tombstone or c's must stop it.
		if _, err := c.reps["b"].Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
		c.net.SetDown("c", false)
		c.reps["a"].DeliverHints(ctx)
		if c.stores["c"].Has(k) {
			t.Fatal("a hint older than the delete resurrected the chunk")
		}
	})
	t.Run("write after delete", func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, nil)
		keys, _ := writeAll(t, c, "a", 0, 3)
		k := keys[0]
		if _, err := c.reps["a"].Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
		c.net.SetDown("c", true) // c keeps the old tombstone
		blob, _ := makeBlob(t, 0, 0)
		if _, err := c.reps["a"].Write(ctx, blob); err != nil {
			t.Fatal(err)
		}
		c.net.SetDown("c", false)
		for _, id := range []string{"c", "a", "b"} {
			if _, err := c.reps[id].AntiEntropy(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if h := c.holders(k); len(h) != 3 {
			t.Fatalf("rewritten chunk on %v, want all 3", h)
		}
	})
}

// A replica holding other bytes under a key is repaired to the copy of the
// best-ranked replica.
func TestReadRepairChecksumMismatch(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) { cfg.ReadRepairChance = 1 })
	blob, k := makeBlob(t, 3, 0)
	if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the key on three replicas", func() bool { return len(c.holders(k)) == 3 })
	reps := c.ring().Replicas(k.Content, 3)
	odd := reps[2].ID // the worst-ranked replica holds other bytes
	other, _ := makeBlob(t, 3, 1)
	c.stores[odd].Delete(k)
	if _, err := c.stores[odd].Put(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	rr, err := c.reps[odd].Read(t.Context(), k)
	if err != nil {
		t.Fatal(err)
	}
	rr.Blob.Release()
	c.waitRepairs()
	want, _ := c.stores[reps[0].ID].Checksum(k)
	for _, id := range []string{"a", "b", "c"} {
		if got, _ := c.stores[id].Checksum(k); got != want {
			t.Fatalf("%s holds checksum %x, owner %x", id, got, want)
		}
	}
}

func TestDrain(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c", "d"}, nil)
	keys, _ := writeAll(t, c, "a", 0, 80)
	st, err := c.reps["d"].Drain(t.Context())
	if err != nil || st.Pending != 0 || st.KeysMoved == 0 {
		t.Fatalf("drain: %+v, %v", st, err)
	}
	c.setRing("a", "b", "c")
	for _, k := range keys {
		for _, id := range c.replicaIDs(k) {
			if !c.stores[id].Has(k) {
				t.Fatalf("%v missing on %s after d drained", k, id)
			}
		}
	}
	if m := c.reps["d"].Metrics(); m.DrainKeys != int64(st.KeysMoved) || m.DrainPending != 0 {
		t.Fatalf("drain metrics %+v", m)
	}
}

func TestTombstonesSurviveRestart(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	keys, _ := writeAll(t, c, "a", 0, 3)
	if _, err := c.reps["a"].Delete(t.Context(), keys[1]); err != nil {
		t.Fatal(err)
	}
	c.stop("b")
	c.net.SetDown("b", false)
	r := c.start("b")
	if _, err := serveReceived(t.Context(), r, mustBlob(t, 1), ReplicateOptions{Kind: KindRepair}); !errors.Is(err, ErrTombstoned) {
		t.Fatalf("repair of a deleted key after restart: %v, want ErrTombstoned", err)
	}
}

func mustBlob(t *testing.T, i int) []byte {
	b, _ := makeBlob(t, i, 0)
	return b
}

// Writes through flaky links (calls dropped at random, every call slowed)
// lose nothing acknowledged: after healing, hints and one anti-entropy
// round put every acknowledged chunk, with its bytes, on all its replicas.
func TestFlakyNetworkNoAckedLoss(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c", "d"}, func(id string, cfg *Config) { cfg.MaxHints = 25 })
	c.net.SetDrop(0.3)
	c.net.SetDelay(200 * time.Microsecond)
	acked := map[chunk.Key][]byte{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w, coord := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 240; i += 3 {
				blob, key := makeBlob(t, i, 0)
				if _, err := c.reps[coord].Write(t.Context(), blob); err == nil {
					mu.Lock()
					acked[key] = blob
					mu.Unlock()
				} else if !errors.Is(err, ErrQuorum) {
					t.Errorf("write: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("nothing acknowledged")
	}
	for _, r := range c.reps {
		r.Close()
	}
	c.net.SetDrop(0)
	for id := range c.reps {
		c.start(id)
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if _, err := c.reps[id].DeliverHints(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if _, err := c.reps[id].AntiEntropy(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for k, blob := range acked {
		for _, id := range c.replicaIDs(k) {
			rr, err := c.reps[id].Read(t.Context(), k)
			if err != nil || rr.From != id || !bytes.Equal(rr.Blob.Bytes(), blob) {
				t.Fatalf("%v on replica %s: from %q, %v", k, id, rr.From, err)
			}
			rr.Blob.Release()
		}
	}
	t.Logf("%d of 240 writes acknowledged at 30%% drops", len(acked))
}

func TestCollector(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	for i := range 3 {
		if _, err := c.reps["a"].Write(t.Context(), mustBlob(t, i)); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c.reps["a"].Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_replication_writes_total" {
			found = mf.GetMetric()[0].GetCounter().GetValue() == 3
		}
	}
	if len(mfs) != len(descs()) || !found {
		t.Fatalf("%d families (want %d), writes_total=3 found: %v", len(mfs), len(descs()), found)
	}
}

// Anti-entropy's cost follows the differences: with thousands of keys in
// sync and three missing on one replica, a round lists a handful of items
// and copies exactly the three.
func TestAntiEntropyCostFollowsDifferences(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	const n = 5000
	var keys []chunk.Key
	for i := range n {
		blob, key := makeSizedBlob(t, i, 0, 1, 1)
		for _, s := range c.stores {
			if _, err := s.Put(t.Context(), blob); err != nil {
				t.Fatal(err)
			}
		}
		keys = append(keys, key)
	}
	for _, k := range keys[:3] {
		c.stores["c"].Delete(k)
	}
	before := c.net.Stats().Replicates
	var listed, pushed int
	for _, id := range []string{"a", "b", "c"} {
		st, err := c.reps[id].AntiEntropy(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		listed += st.ItemsListed
		pushed += st.Pushed
	}
	if pushed != 3 || c.net.Stats().Replicates-before != 3 {
		t.Fatalf("pushed %d keys (%d calls), want 3", pushed, c.net.Stats().Replicates-before)
	}
	if listed > 12 {
		t.Fatalf("listed %d items to find 3 differences among %d keys", listed, n)
	}
	for _, k := range keys[:3] {
		if !c.stores["c"].Has(k) {
			t.Fatalf("%v not repaired", k)
		}
	}
}

// A node missing from the ring (removed while away) hands its chunks to
// their owners but keeps them: it will likely be added back.
func TestNonMemberKeepsCopies(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c", "d"}, nil)
	keys, _ := writeAll(t, c, "a", 0, 40)
	held := c.stores["d"].Len()
	c.setRing("a", "b", "c")
	st, err := c.reps["d"].Rebalance(t.Context())
	if err != nil || st.Pending != 0 || st.KeysDropped != 0 || c.stores["d"].Len() != held {
		t.Fatalf("non-member pass: %+v, %v; holds %d of %d", st, err, c.stores["d"].Len(), held)
	}
	for _, k := range keys {
		for _, id := range c.replicaIDs(k) {
			if !c.stores[id].Has(k) {
				t.Fatalf("%v missing on owner %s", k, id)
			}
		}
	}
}

// Hints expire after HintTTL, and hints for a node that left the ring are
// dropped (its ranges moved to others).
func TestHintExpiryAndDeparture(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	c := newCluster(t, []string{"a", "b", "c", "d"}, func(id string, cfg *Config) {
		cfg.Now = clock
		cfg.HintTTL = time.Hour
	})
	c.net.SetDown("c", true)
	c.net.SetDown("d", true)
	c.r, c.w = 4, 2
	for i := range 4 {
		if _, err := c.reps["a"].Write(t.Context(), mustBlob(t, i)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "eight hints", func() bool { n, _ := c.reps["a"].HintsPending(); return n == 8 })
	c.setRing("a", "b", "c") // d left
	mu.Lock()
	now = now.Add(2 * time.Hour) // c's hints expired
	mu.Unlock()
	c.net.SetDown("c", false)
	n, err := c.reps["a"].DeliverHints(t.Context())
	if err != nil || n != 0 {
		t.Fatalf("delivered %d, %v; want 0", n, err)
	}
	if got, _ := c.reps["a"].HintsPending(); got != 0 {
		t.Fatalf("%d hints left", got)
	}
	if m := c.reps["a"].Metrics(); m.HintsDropped != 8 {
		t.Fatalf("%d hints dropped, want 8", m.HintsDropped)
	}
}

// A drain that cannot reach a new owner keeps going until ctx ends and
// reports what is pending; it deletes nothing.
func TestDrainWithOwnerDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c", "d"}, func(id string, cfg *Config) {
			cfg.RebalanceRetry = 5 * time.Millisecond
		})
		writeAll(t, c, "a", 0, 40)
		held := c.stores["d"].Len()
		c.net.SetDown("a", true)
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		st, err := c.reps["d"].Drain(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || st.Pending == 0 {
			t.Fatalf("drain with an owner down: %+v, %v", st, err)
		}
		if c.stores["d"].Len() != held {
			t.Fatalf("drain deleted local chunks")
		}
	})
}

// With R=1 a chunk whose only replica moved is still read, from the
// previous ring's replica, before that replica's rebalance ran.
func TestReadFromPreviousRing(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	c.r, c.w = 1, 1
	keys, _ := writeAll(t, c, "a", 0, 60)
	for _, id := range []string{"a", "b", "c"} {
		c.reps[id].Rebalance(t.Context())
	}
	c.start("d")
	c.setRing("a", "b", "c", "d")
	if _, err := c.reps["b"].Rebalance(t.Context()); err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, k := range keys {
		if !c.ring().IsReplica(k.Content, "d", 1) || c.stores["d"].Has(k) {
			continue
		}
		found++
		rr, err := c.reps["b"].Read(t.Context(), k)
		if err != nil {
			t.Fatalf("%v unreadable mid-rebalance: %v", k, err)
		}
		rr.Blob.Release()
	}
	if found == 0 {
		t.Fatal("no chunk waiting to move to d; the test proves nothing")
	}
}

// The background anti-entropy loop converges replicas by itself.
func TestAntiEntropyLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
			cfg.AntiEntropyInterval = 5 * time.Millisecond
		})
		blob, key := makeBlob(t, 1, 0)
		if _, err := c.stores["a"].Put(t.Context(), blob); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the key on three replicas", func() bool { return len(c.holders(key)) == 3 })
	})
}

// Reads go to the nearest healthy replica: one that just failed is tried
// last.
func TestReadSkipsSuspectedReplica(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c", "d"}, nil)
	var key chunk.Key
	var blob []byte
	for i := 0; ; i++ {
		blob, key = makeBlob(t, i, 0)
		if !c.ring().IsReplica(key.Content, "d", 3) {
			break
		}
	}
	if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the key on three replicas", func() bool { return len(c.holders(key)) == 3 }) // the straggler too
	first := c.ring().Replicas(key.Content, 3)[0].ID
	c.net.SetDown(first, true)
	for _, wantFetches := range []int64{2, 1} {
		before := c.net.Stats().Fetches
		rr, err := c.reps["d"].Read(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		rr.Blob.Release()
		if got := c.net.Stats().Fetches - before; got != wantFetches {
			t.Fatalf("%d fetches, want %d", got, wantFetches)
		}
	}
}

// putHookStore runs after once a Put has stored its blob.
type putHookStore struct {
	*InmemStore
	after func()
}

func (s *putHookStore) Put(ctx context.Context, blob []byte) (chunk.Header, error) {
	hd, err := s.InmemStore.Put(ctx, blob)
	if err == nil && s.after != nil {
		s.after()
	}
	return hd, err
}

// writeChunkMovingTo writes, through a on a one-member ring (recorded by a
// rebalance pass), the first test chunk that to alone owns once the ring
// is {a, to} at R=1; it returns the chunk's makeBlob index and key.
func writeChunkMovingTo(t *testing.T, c *cluster, to string) (int, chunk.Key) {
	t.Helper()
	c.setRing("a", to)
	i := 0
	for ; !c.ring().IsReplica(func() chunk.Key { _, k := makeBlob(t, i, 0); return k }().Content, to, 1); i++ {
	}
	c.setRing("a")
	blob, key := makeBlob(t, i, 0)
	if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
		t.Fatal(err)
	}
	if _, err := c.reps["a"].Rebalance(t.Context()); err != nil {
		t.Fatal(err)
	}
	return i, key
}

// A handoff drops its copy once the target acked it, but only the bytes it
// sent: a key whose bytes change here after the target stored it (before
// the drop) keeps the new bytes, which the target does not hold.
func TestHandoffKeepsBytesChangedAfterAck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change bool
	}{
		{"unchanged", false},
		{"changed after the ack", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv := &putHookStore{}
			c := newCluster(t, []string{"a"}, func(id string, conf *Config) {
				if id == "d" {
					conf.Store = recv
				}
			})
			c.r, c.w = 1, 1
			i, key := writeChunkMovingTo(t, c, "d")
			newer, _ := makeBlob(t, i, 1) // same key, other bytes
			nhd, err := chunk.ParseHeader(newer, chunk.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.change {
				a := c.stores["a"]
				recv.after = func() {
					a.Overwrite(key, newer, nhd.Checksum) // in one step, as a re-put after a delete
				}
			}
			c.setRing("a", "d")
			recv.InmemStore = NewInmemStore()
			c.stores["d"], c.dirs["d"] = recv.InmemStore, t.TempDir()
			c.start("d")

			st, err := c.reps["a"].Rebalance(t.Context())
			if err != nil || st.KeysMoved != 1 || st.Pending != 0 {
				t.Fatalf("pass %+v, %v: want the key moved", st, err)
			}
			if !recv.Has(key) {
				t.Fatal("d does not hold the key")
			}
			sum, ok := c.stores["a"].Checksum(key)
			switch {
			case !tc.change && (ok || st.KeysDropped != 1):
				t.Fatalf("a still holds it (%v), %d dropped: want the handoff dropped", ok, st.KeysDropped)
			case tc.change && (!ok || sum != nhd.Checksum || st.KeysDropped != 0):
				t.Fatalf("a holds %v (%x, want %x), %d dropped: want the new bytes kept", ok, sum, nhd.Checksum, st.KeysDropped)
			}
		})
	}
}

// winner is the checksum of whichever of two versions of a key Wins.
func winner(t testing.TB, a, b []byte) uint64 {
	t.Helper()
	ha, err := chunk.ParseHeader(a, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	hb, err := chunk.ParseHeader(b, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if ha.Key != hb.Key || ha.Checksum == hb.Checksum {
		t.Fatal("not two versions of one key")
	}
	if Wins(hb.Checksum, ha.Checksum) {
		return hb.Checksum
	}
	return ha.Checksum
}

// Replicas that took different first writes of one key (three versions on
// three replicas, the winner on the worst-ranked one) converge on the
// version that Wins: through anti-entropy rounds, and through a read's
// replica check.
func TestDivergedReplicasConverge(t *testing.T) {
	for _, via := range []string{"anti-entropy", "read repair"} {
		t.Run(via, func(t *testing.T) {
			c := newCluster(t, []string{"a", "b", "c"}, nil)
			var blobs [][]byte
			var key chunk.Key
			for v := range 3 {
				var b []byte
				b, key = makeBlob(t, 7, v)
				blobs = append(blobs, b)
			}
			want := winner(t, blobs[0], blobs[1])
			if w2 := winner(t, blobs[1], blobs[2]); Wins(w2, want) {
				want = w2
			}
			// The winner on the worst-ranked replica: rank is not the rule.
			for i, b := range blobs {
				if hd, _ := chunk.ParseHeader(b, chunk.Limits{}); hd.Checksum == want {
					blobs[i], blobs[2] = blobs[2], blobs[i]
					break
				}
			}
			for i, id := range c.replicaIDs(key) {
				if _, err := c.stores[id].Put(t.Context(), blobs[i]); err != nil {
					t.Fatal(err)
				}
			}
			converged := func() bool {
				for _, id := range c.replicaIDs(key) {
					if sum, ok := c.stores[id].Checksum(key); !ok || sum != want {
						return false
					}
				}
				return true
			}
			if converged() {
				t.Fatal("replicas start converged")
			}
			switch via {
			case "anti-entropy":
				for round := 0; round < 2 && !converged(); round++ {
					for _, id := range c.replicaIDs(key) {
						if _, err := c.reps[id].AntiEntropy(t.Context()); err != nil {
							t.Fatal(err)
						}
					}
				}
			case "read repair":
				if err := c.reps["a"].checkReplicas(t.Context(), key); err != nil {
					t.Fatal(err)
				}
			}
			if !converged() {
				for _, id := range c.replicaIDs(key) {
					sum, _ := c.stores[id].Checksum(key)
					t.Errorf("%s holds %016x", id, sum)
				}
				t.Fatalf("not converged on %016x", want)
			}
		})
	}
}
