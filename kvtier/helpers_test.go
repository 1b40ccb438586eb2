package kvtier

import (
	"encoding/binary"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

var testStandalone = chunk.StandaloneContext()

// testSpec is the small model the tests store; testFP its fingerprint.
var testSpec = chunk.ModelSpec{Family: "llama", Layers: 2, KVHeads: 2, HeadDim: 16, DType: chunk.BF16,
	RopeStyle: chunk.RopeNeoX, RopeTheta: 10000}

var testFP = testSpec.Fingerprint()

// makeBlob encodes (raw) an entry of tokens random tokens and random KV
// bytes (1 KiB of KV per 8 tokens with the test model) of a model of
// layers layers under fingerprint fp, for content seed and context ctx.
func makeBlob(t testing.TB, fp chunk.Fingerprint, seed uint64, tokens int, ctx chunk.Context, layers int) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, uint64(tokens)))
	spec := testutil.Spec()
	spec.Layers = layers
	e := testutil.EntryOf(spec, testutil.Tokens(rng, tokens), ctx, testutil.RandomKV(rng))
	e.Key.Fingerprint, e.Key.Content = fp, chunk.ContentID(fp, e.Tokens)
	return testutil.Encode(t, e, chunk.CodecRaw)
}

func keyOf(t testing.TB, blob []byte) chunk.Key {
	t.Helper()
	hd, err := chunk.ParseHeader(blob, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return hd.Key
}

func openTest(t testing.TB, cfg Config) *Store {
	t.Helper()
	if cfg.PageSize == 0 {
		cfg.PageSize = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// checkBudgets fails if any tier holds more than its budget, or if the
// entry and byte counts Stats keeps differ from a walk of the index.
func checkBudgets(t testing.TB, s *Store) Stats {
	t.Helper()
	st := s.Stats()
	for _, ts := range st.Tiers {
		if ts.Bytes > ts.Budget || ts.Bytes < 0 {
			t.Fatalf("tier %v: %d bytes charged, budget %d", ts.Tier, ts.Bytes, ts.Budget)
		}
	}
	checkCounts(t, s)
	return st
}

// checkCounts compares the counts recount keeps with a walk of the index,
// under the exclusive lock so that nothing moves in between.
func checkCounts(t testing.TB, s *Store) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	entries, stored := s.walkStats()
	for tier := range s.tiers {
		ts := &s.tiers[tier]
		if ts.entries != entries[tier] || ts.stored != stored[tier] {
			t.Fatalf("tier %v: counts say %d entries of %d bytes, the index %d of %d",
				Tier(tier), ts.entries, ts.stored, entries[tier], stored[tier])
		}
	}
}

// walkStats is the per-tier entry and byte counts recomputed from the
// index, for tests to check recount against. mu held.
func (s *Store) walkStats() (entries [numTiers]int, stored [numTiers]int64) {
	for _, e := range s.index {
		if e.loading {
			continue
		}
		entries[e.tier()]++
		stored[e.tier()] += int64(e.size)
	}
	return entries, stored
}

// bigBlob encodes (raw) one entry of a realistic model (32 layers, 8 KV
// heads, head dim 128, bf16: 128 KiB per token) with the given token
// count and testutil.PatternKV's bytes.
func bigBlob(t testing.TB, tokens int) []byte {
	t.Helper()
	spec := chunk.ModelSpec{Family: "llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: chunk.BF16, RopeStyle: chunk.RopeNeoX, RopeTheta: 500000}
	toks := make([]uint32, tokens)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	return testutil.Encode(t, testutil.EntryOf(spec, toks, testStandalone, testutil.PatternKV), chunk.CodecRaw)
}

// rekey gives blob, in place, the tokens of entry i (its first two tokens
// hold i) with their content ID and a header checksum to match, so one
// buffer serves as many distinct entries.
func rekey(t testing.TB, blob []byte, i uint64) chunk.Key {
	hd, err := chunk.ParseHeader(blob, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	tokAt := hd.PayloadStart - 8 - 4*len(hd.Tokens)
	hd.Tokens[0], hd.Tokens[1] = uint32(i), uint32(i>>32)
	binary.LittleEndian.PutUint32(blob[tokAt:], hd.Tokens[0])
	binary.LittleEndian.PutUint32(blob[tokAt+4:], hd.Tokens[1])
	hd.Key.Content = chunk.ContentID(hd.Key.Fingerprint, hd.Tokens)
	binary.LittleEndian.PutUint64(blob[24:], hd.Key.Content.Lo)
	binary.LittleEndian.PutUint64(blob[32:], hd.Key.Content.Hi)
	sumAt := hd.PayloadStart - 8
	binary.LittleEndian.PutUint64(blob[sumAt:], xxhash.Sum64(blob[:sumAt]))
	return hd.Key
}

func keysAt(keys []any, i int) chunk.Key { return keys[i%len(keys)].(chunk.Key) }
