package kvtier

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

// tierOf is where key lives now (ok false: not in the index).
func tierOf(s *Store, key chunk.Key) (Tier, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.index[key]
	if e == nil || e.loading {
		return 0, false
	}
	return e.tier(), true
}

// TestCountsAfterMixedMoves drives entries through every move between the
// three tiers (demotion to disk on DRAM pressure, promotion from disk on a
// read, promotion to the device and demotion from it, deletes in each
// tier, a delete of a pinned entry, a TTL expiry, a restart that rebuilds
// the index from disk) and checks, after each step, that the per-tier
// counts Stats keeps (recount, through the setters) equal a walk of the
// index, that the total is the entries the test knows are live, and that
// the entry a step moved is where the step put it.
func TestCountsAfterMixedMoves(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	var now atomic.Int64
	now.Store(time.Unix(1e9, 0).UnixNano())
	cfg := Config{DRAMBytes: 8 * 4096, PageSize: 4096, DiskDir: dir, DiskBytes: 1 << 20, GPU: NewHostDevice(10000),
		Now: func() time.Time { return time.Unix(0, now.Load()) }, Logger: slog.New(slog.DiscardHandler)}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	bs := blobs(t, 14, 12) // one 4 KiB page each: DRAM holds 8, the device 3
	keys := make([]chunk.Key, len(bs))
	live := map[chunk.Key]bool{}
	check := func(step string, moved chunk.Key, want Tier) {
		t.Helper()
		checkCounts(t, s)
		if st := s.Stats(); st.Entries != len(live) {
			t.Fatalf("%s: Stats counts %d entries, %d live", step, st.Entries, len(live))
		}
		if moved == (chunk.Key{}) {
			return
		}
		got, ok := tierOf(s, moved)
		if !ok || got != want {
			t.Fatalf("%s: entry in %v (present %v), want %v", step, got, ok, want)
		}
	}
	put := func(i int, opts PutOptions) {
		t.Helper()
		if _, err := s.Put(ctx, bs[i], opts); err != nil {
			t.Fatal(err)
		}
		keys[i] = keyOf(t, bs[i])
		live[keys[i]] = true
	}
	del := func(step string, i int) {
		t.Helper()
		if err := s.Delete(keys[i]); err != nil {
			t.Fatal(err)
		}
		delete(live, keys[i])
		check(step, chunk.Key{}, 0)
		if _, ok := tierOf(s, keys[i]); ok {
			t.Fatalf("%s: entry still indexed", step)
		}
	}
	find := func(tier Tier) int {
		t.Helper()
		for i, k := range keys {
			if got, ok := tierOf(s, k); ok && got == tier {
				return i
			}
		}
		t.Fatalf("no entry in %v", tier)
		return -1
	}

	for i := range 12 {
		put(i, PutOptions{})
		check("put", keys[i], TierDRAM)
	}
	if st := s.Stats(); st.Tiers[TierDRAM].Entries != 8 || st.Tiers[TierDisk].Entries != 4 {
		t.Fatalf("after 12 puts into 8 DRAM pages: %d in DRAM, %d on disk", st.Tiers[TierDRAM].Entries, st.Tiers[TierDisk].Entries)
	}
	// A read of a disk entry promotes it (and demotes a DRAM victim).
	d := find(TierDisk)
	h, tier, err := s.get(ctx, keys[d])
	if err != nil || tier != TierDisk {
		t.Fatalf("get of a disk entry: %v, tier %v", err, tier)
	}
	h.Release()
	check("promote from disk", keys[d], TierDRAM)
	// Through the device: its victims go back to DRAM, DRAM's to disk.
	var onDev []int
	for _, i := range []int{0, 1, 2, 3, 9} {
		dh, err := s.GetDevice(ctx, keys[i])
		if err != nil {
			t.Fatal(err)
		}
		dh.Release()
		check("promote to the device", keys[i], TierGPU)
		onDev = append(onDev, i)
	}
	if st := s.Stats(); st.Tiers[TierGPU].Entries != 3 || st.Tiers[TierGPU].Demotions != 2 {
		t.Fatalf("device: %d entries, %d demotions; want 3 and 2", st.Tiers[TierGPU].Entries, st.Tiers[TierGPU].Demotions)
	}
	check("demoted from the device", keys[onDev[0]], TierDRAM)
	// A host read of a device entry copies it and leaves it there.
	h, tier, err = s.get(ctx, keys[9])
	if err != nil || tier != TierGPU {
		t.Fatalf("host read of a device entry: %v, tier %v", err, tier)
	}
	h.Release()
	check("host read of a device entry", keys[9], TierGPU)

	for _, tier := range []Tier{TierGPU, TierDRAM, TierDisk} {
		del("delete in "+tier.String(), find(tier))
	}
	// A pinned DRAM entry leaves the counts when deleted, not at release.
	p := find(TierDRAM)
	h, err = s.Get(ctx, keys[p])
	if err != nil {
		t.Fatal(err)
	}
	del("delete of a pinned entry", p)
	h.Release()
	check("release of a deleted entry", chunk.Key{}, 0)

	// An expired entry leaves the counts when it is found expired.
	put(12, PutOptions{TTL: time.Minute})
	check("put with a TTL", keys[12], TierDRAM)
	now.Add(int64(2 * time.Minute))
	if s.Contains(keys[12]) {
		t.Fatal("expired entry still found")
	}
	delete(live, keys[12])
	check("expiry", chunk.Key{}, 0)

	// A restart keeps what was on disk; DRAM and the device come back empty.
	onDisk := map[chunk.Key]bool{}
	for k := range live {
		if tier, _ := tierOf(s, k); tier == TierDisk {
			onDisk[k] = true
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	live = onDisk
	for k := range live {
		check("recovered from disk", k, TierDisk)
	}
	put(13, PutOptions{})
	check("put after the restart", keys[13], TierDRAM)
}
