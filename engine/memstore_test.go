package engine

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvtier"
)

// MemStore picks the encoding chunk.Better ranks first: the exact one, then
// other prefixes, then windows (widest first), then standalone; ties to the
// smaller ID.
func TestMemStoreRanking(t *testing.T) {
	ctx := t.Context()
	spec := testutil.Spec()
	fp := spec.Fingerprint()
	toks := []uint32{1, 2, 3}
	want := chunk.PrefixContext(chunk.ID{Lo: 7})
	w8 := chunk.WindowContext(fp, 8, []uint32{9})
	w20 := chunk.WindowContext(fp, 20, []uint32{9, 9})
	pA := chunk.PrefixContext(chunk.ID{Lo: 3})
	pB := chunk.PrefixContext(chunk.ID{Lo: 5})
	sa := chunk.StandaloneContext()
	tests := []struct {
		name string
		have []chunk.Context
		best chunk.Context
	}{
		{"exact over everything", []chunk.Context{sa, w20, pA, want}, want},
		{"prefix over window", []chunk.Context{pA, w8, sa}, pA},
		{"window over standalone", []chunk.Context{sa, w8}, w8},
		{"wider window", []chunk.Context{w8, w20, sa}, w20},
		{"prefix over standalone", []chunk.Context{sa, pB}, pB},
		{"prefix over standalone, other order", []chunk.Context{pB, sa}, pB},
		{"prefix tie to smaller ID", []chunk.Context{pB, pA, sa}, pA},
		{"standalone alone", []chunk.Context{sa}, sa},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMemStore(0)
			for _, cx := range tc.have {
				if err := m.Put(ctx, testutil.NewEntry(rand.New(rand.NewPCG(1, 1)), spec, toks, cx)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := m.Lookup(ctx, []LookupRequest{{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: want}, Tokens: toks}})
			if err != nil {
				t.Fatal(err)
			}
			if got[0] == nil || got[0].Key.Context != tc.best {
				t.Fatalf("got %v, want %v", got[0], tc.best)
			}
		})
	}
}

// Property: for random sets of encodings, MemStore picks what the node's
// store (kvtier.Store.Best) picks, whatever the order of the puts, so that
// the engine's tests and benchmarks rank as a cluster does.
func TestMemStoreRankingMatchesNode(t *testing.T) {
	ctx := t.Context()
	spec := testutil.Spec()
	fp := spec.Fingerprint()
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		toks := []uint32{uint32(trial), 1, 2}
		want := chunk.PrefixContext(chunk.ID{Lo: r.Uint64(), Hi: r.Uint64()})
		var have []chunk.Context
		for range 1 + r.IntN(6) {
			switch r.IntN(4) {
			case 0:
				have = append(have, chunk.StandaloneContext())
			case 1:
				w := 1 + r.IntN(3)
				have = append(have, chunk.WindowContext(fp, w*8, []uint32{uint32(r.IntN(4))}))
			case 2:
				have = append(have, chunk.PrefixContext(chunk.ID{Lo: uint64(r.IntN(4))}))
			default:
				if r.IntN(4) == 0 {
					have = append(have, want)
				} else {
					have = append(have, chunk.PrefixContext(chunk.ID{Lo: r.Uint64(), Hi: 1}))
				}
			}
		}
		node, err := kvtier.Open(kvtier.Config{DRAMBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		m := NewMemStore(0)
		for _, i := range r.Perm(len(have)) {
			// The same bytes for every encoding: a key put twice (the
			// same context drawn twice) must hold the same bytes.
			ent := testutil.NewEntry(rand.New(rand.NewPCG(1, 1)), spec, toks, have[i])
			blob := testutil.Encode(t, ent, chunk.CodecRaw)
			if _, err := node.Put(ctx, blob, kvtier.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := m.Put(ctx, ent); err != nil {
				t.Fatal(err)
			}
		}
		key, match, err := node.Best(fp, chunk.ContentID(fp, toks), want)
		node.Close()
		if err != nil || match == chunk.MatchMiss {
			t.Fatalf("trial %d: node best %v %v", trial, match, err)
		}
		got, err := m.Lookup(ctx, []LookupRequest{{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: want}, Tokens: toks}})
		if err != nil {
			t.Fatal(err)
		}
		if got[0] == nil || got[0].Key != key {
			t.Fatalf("trial %d: have %v: memstore chose %v, node %v", trial, have, got[0], key)
		}
	}
}
