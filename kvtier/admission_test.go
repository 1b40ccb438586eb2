package kvtier

import (
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// AdmitReuse keeps encodings usable anywhere, windows and the first
// prefix-chained encoding of a content; another prefix copy only on its
// second put. (A chunk at the start of a prompt has one key, standalone.)
func TestAdmitReuse(t *testing.T) {
	s := openTest(t, Config{DRAMBytes: 1 << 20, Admission: AdmitReuse})
	ctx := t.Context()
	chainA := chunk.PrefixContext(chunk.ID{Lo: 1, Hi: 1})
	chainB := chunk.PrefixContext(chunk.ID{Lo: 2, Hi: 2})
	chainC := chunk.PrefixContext(chunk.ID{Lo: 3, Hi: 3})
	window := chunk.WindowContext(testFP, 8, []uint32{1, 2, 3})
	put := func(seed uint64, cx chunk.Context) (chunk.Key, bool) {
		t.Helper()
		b := makeBlob(t, testFP, seed, 16, cx, 2)
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
		k := keyOf(t, b)
		return k, s.Contains(k)
	}
	steps := []struct {
		name string
		seed uint64
		cx   chunk.Context
		kept bool
	}{
		{"passage standalone", 1, testStandalone, true},
		{"passage in a prompt: its first prefix encoding", 1, chainA, true},
		{"passage in a novel prompt", 1, chainB, false},
		{"the same prompt again", 1, chainB, true},
		{"passage in another novel prompt", 1, chainC, false},
		{"passage windowed", 1, window, true},
		{"chat turn: content seen nowhere", 2, chainA, true},
		{"system prompt at the start of a prompt: standalone", 3, testStandalone, true},
	}
	for _, st := range steps {
		if _, kept := put(st.seed, st.cx); kept != st.kept {
			t.Errorf("%s (%v): kept %v, want %v", st.name, st.cx, kept, st.kept)
		}
	}

	r := s.Stats().Reuse
	want := map[Reuse][2]uint64{ // admitted, refused
		ReuseStandalone: {2, 0},
		ReusePrefix:     {3, 2},
		ReuseWindow:     {1, 0},
	}
	for c, w := range want {
		got := [2]uint64{r[c].Admitted, r[c].Refused}
		if got != w {
			t.Errorf("%v: admitted/refused %v, want %v", c, got, w)
		}
	}
	// Held now: passage and system prompt standalone; three prefix
	// encodings (the first, the repeated prompt, the chat turn); a window.
	held := map[Reuse]int{ReuseStandalone: 2, ReusePrefix: 3, ReuseWindow: 1}
	for c, n := range held {
		if r[c].Entries != n {
			t.Errorf("%v: %d entries held, want %d", c, r[c].Entries, n)
		}
	}
}

// AdmitAll keeps every put, as before the policy existed.
func TestAdmitAllKeepsEverything(t *testing.T) {
	s := openTest(t, Config{DRAMBytes: 1 << 20})
	for i, cx := range []chunk.Context{testStandalone, chunk.PrefixContext(chunk.ID{Lo: 1}), chunk.PrefixContext(chunk.ID{Lo: 2})} {
		b := makeBlob(t, testFP, 1, 16, cx, 2)
		if _, err := s.Put(t.Context(), b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if !s.Contains(keyOf(t, b)) {
			t.Fatalf("put %d (%v) not kept", i, cx)
		}
	}
}

// Under the weighted S3-FIFO, entries never read leave prefix-chained
// first, then windows, then encodings usable anywhere; S3-FIFO alone
// evicts in insertion order.
func TestWeightedEvictionOrder(t *testing.T) {
	classes := []Reuse{ReuseStandalone, ReusePrefix, ReuseWindow, ReuseStandalone, ReusePrefix, ReuseStandalone, ReuseWindow, ReusePrefix}
	order := func(weighted bool) []Reuse {
		p := newS3FIFO(int64(10 * len(classes))) // full: evictions come when a tier is
		p.weighted = weighted
		for i, c := range classes {
			p.add(&pnode{cost: 10, key: chunk.Key{Content: chunk.ID{Lo: uint64(i)}}, reuse: c})
		}
		var out []Reuse
		for v := p.victim(nil); v != nil; v = p.victim(nil) {
			p.evict(v)
			out = append(out, v.reuse)
		}
		return out
	}
	rank := func(r Reuse) int { return int(r.weight()) }
	got := order(true)
	if len(got) != len(classes) {
		t.Fatalf("evicted %d of %d", len(got), len(classes))
	}
	for i := 1; i < len(got); i++ {
		if rank(got[i]) < rank(got[i-1]) {
			t.Fatalf("weighted eviction order %v: %v after %v", got, got[i], got[i-1])
		}
	}
	plain := order(false)
	for i := range plain {
		if plain[i] != classes[i] {
			t.Fatalf("unweighted eviction order %v, want insertion order %v", plain, classes)
		}
	}
}
