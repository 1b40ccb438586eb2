package replication

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/kvtier"
)

// The replication paths over real kvtier stores: quorum writes with a node
// down, hints, eviction under capacity followed by a read that refetches.
func TestOverKVTier(t *testing.T) {
	ctx := context.Background()
	net := newNetwork(7)
	c := &cluster{t: t, net: net, r: 3, w: 2}
	c.setRing("a", "b", "c")
	stores := map[string]*kvtier.Store{}
	reps := map[string]*Replicator{}
	for _, id := range []string{"a", "b", "c"} {
		s, err := kvtier.Open(kvtier.Config{DRAMBytes: 4 << 20, PageSize: 64 << 10,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		stores[id] = s
		r, err := New(Config{
			NodeID: id, Store: NewKVTierStore(s), Transport: &transport{n: net, from: id},
			Placement: PlacementFunc(c.ring), DataDir: t.TempDir(),
			HintInterval: -1, RingCheckInterval: -1, AntiEntropyInterval: -1, ReadRepairChance: -1,
			CallTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		reps[id] = r
		net.register(id, r)
	}
	t.Cleanup(func() {
		for id := range reps {
			reps[id].Close()
			stores[id].Close()
		}
	})

	net.setDown("c", true)
	blob, key := makeSizedBlob(t, 1, 0, 64, 4)
	res, err := reps["a"].Write(ctx, blob)
	if err != nil || len(res.StoredOn) < 2 {
		t.Fatalf("write: %+v, %v", res, err)
	}
	waitFor(t, func() bool { n, _ := reps["a"].HintsPending(); return n == 1 })
	net.setDown("c", false)
	if n, err := reps["a"].DeliverHints(ctx); n != 1 || err != nil {
		t.Fatalf("hints delivered %d, %v", n, err)
	}
	if !stores["c"].Contains(key) {
		t.Fatal("hint not delivered into c's kvtier store")
	}

	// Eviction on b (a delete at the store, as kvtier's policy does it) is
	// repaired on the next read through b.
	if err := stores["b"].Delete(key); err != nil {
		t.Fatal(err)
	}
	rr, err := reps["b"].Read(ctx, key)
	if err != nil || !bytes.Equal(rr.Blob.Bytes(), blob) {
		t.Fatalf("read after eviction: %v", err)
	}
	rr.Blob.Release()
	waitFor(t, func() bool { return stores["b"].Contains(key) })

	other, _ := makeSizedBlob(t, 1, 1, 64, 4)
	if err := reps["b"].ServeReplicate(ctx, other, ReplicateOptions{Kind: KindWrite}); !errors.Is(err, ErrConflict) || !errors.Is(err, ErrRejected) {
		t.Fatalf("conflicting write into kvtier: %v", err)
	}
	if _, err := reps["a"].Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := reps["c"].Read(ctx, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read after delete: %v", err)
	}
}

// A join over kvtier stores: presence checks go through Contains (kvtier
// has no Stat), and every chunk ends on exactly its new replicas.
func TestJoinOverKVTier(t *testing.T) {
	ctx := context.Background()
	net := newNetwork(9)
	c := &cluster{t: t, net: net, r: 3, w: 2}
	c.setRing("a", "b", "c")
	stores := map[string]*kvtier.Store{}
	reps := map[string]*Replicator{}
	open := func(id string) {
		s, err := kvtier.Open(kvtier.Config{DRAMBytes: 8 << 20, PageSize: 64 << 10,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		stores[id] = s
		r, err := New(Config{
			NodeID: id, Store: NewKVTierStore(s), Transport: &transport{n: net, from: id},
			Placement: PlacementFunc(c.ring), HintInterval: -1, RingCheckInterval: -1,
			AntiEntropyInterval: -1, ReadRepairChance: -1,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		reps[id] = r
		net.register(id, r)
	}
	for _, id := range []string{"a", "b", "c"} {
		open(id)
	}
	t.Cleanup(func() {
		for id := range reps {
			reps[id].Close()
			stores[id].Close()
		}
	})
	var keys []chunk.Key
	for i := range 30 {
		blob, key := makeSizedBlob(t, i, 0, 64, 4)
		if _, err := reps["a"].Write(ctx, blob); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	waitFor(t, func() bool {
		for _, k := range keys {
			if !stores["a"].Contains(k) || !stores["b"].Contains(k) || !stores["c"].Contains(k) {
				return false
			}
		}
		return true
	})
	for _, id := range []string{"a", "b", "c"} {
		reps[id].Rebalance(ctx)
	}
	open("d")
	c.setRing("a", "b", "c", "d")
	for _, id := range []string{"a", "b", "c", "d"} {
		if st, err := reps[id].Rebalance(ctx); err != nil || st.Pending != 0 {
			t.Fatalf("%s: %+v, %v", id, st, err)
		}
	}
	for _, k := range keys {
		for _, id := range []string{"a", "b", "c", "d"} {
			if want := c.ring().IsReplica(k.Content, id, 3); stores[id].Contains(k) != want {
				t.Fatalf("%v on %s: held=%v, replica=%v", k, id, !want, want)
			}
		}
	}
}
