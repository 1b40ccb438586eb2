package inject

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/pinned"
)

// testSpec is a small GQA model: 3 layers, 4 KV heads of 16 dims.
func testSpec(dt chunk.DType) chunk.ModelSpec {
	return chunk.ModelSpec{Family: "llama", Layers: 3, KVHeads: 4, HeadDim: 16, DType: dt,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 10000}
}

// randKV fills n elements of dt with values in [-2, 2).
func randKV(rng *rand.Rand, dt chunk.DType, n int) []byte {
	out := make([]byte, n*dt.Size())
	for i := 0; i < n; i++ {
		v := float32(rng.Float64()*4 - 2)
		switch dt {
		case chunk.F32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		case chunk.F16:
			binary.LittleEndian.PutUint16(out[2*i:], chunk.F32ToF16(v))
		case chunk.BF16:
			binary.LittleEndian.PutUint16(out[2*i:], chunk.F32ToBF16(v))
		}
	}
	return out
}

func randTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(32000))
	}
	return t
}

// synthEntry is a random entry of spec for tokens in context cx.
func synthEntry(rng *rand.Rand, spec chunk.ModelSpec, tokens []uint32, cx chunk.Context) *chunk.Entry {
	fp := spec.Fingerprint()
	e := &chunk.Entry{
		Key:   chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: cx},
		DType: spec.DType, Layers: spec.Layers, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim,
		Tokens: append([]uint32(nil), tokens...),
	}
	e.KV = randKV(rng, spec.DType, spec.Layers*2*len(tokens)*spec.KVHeads*spec.HeadDim)
	return e
}

func encode(t testing.TB, e *chunk.Entry, c chunk.Codec) []byte {
	t.Helper()
	b, err := chunk.Encode(nil, e, c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// memFetcher is a Fetcher over encoded blobs, choosing the exact context,
// else the lowest other context ID of the same content. It counts
// outstanding blobs so tests can check every one is released.
type memFetcher struct {
	mu       sync.Mutex
	blobs    map[chunk.Key][]byte
	errs     map[chunk.ID]error // content -> error to return
	out      atomic.Int64       // fetched, not yet released
	calls    atomic.Int64
	block    bool // block until ctx is done
	inFlight atomic.Int64
	maxIn    atomic.Int64
}

func newMemFetcher() *memFetcher {
	return &memFetcher{blobs: map[chunk.Key][]byte{}, errs: map[chunk.ID]error{}}
}

func (f *memFetcher) put(t testing.TB, e *chunk.Entry, c chunk.Codec) []byte {
	b := encode(t, e, c)
	f.mu.Lock()
	f.blobs[e.Key] = b
	f.mu.Unlock()
	return b
}

func (f *memFetcher) Fetch(ctx context.Context, key chunk.Key) (Fetched, error) {
	f.calls.Add(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxIn.Load()
		if n <= m || f.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	if f.block {
		<-ctx.Done()
		return Fetched{}, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errs[key.Content]; err != nil {
		return Fetched{}, err
	}
	match := chunk.MatchExact
	b, ok := f.blobs[key]
	if !ok {
		var others []chunk.Key
		for k := range f.blobs {
			if k.Fingerprint == key.Fingerprint && k.Content == key.Content {
				others = append(others, k)
			}
		}
		if len(others) == 0 {
			return Fetched{Match: chunk.MatchMiss}, nil
		}
		sort.Slice(others, func(i, j int) bool { return others[i].Context.ID.Less(others[j].Context.ID) })
		b, match = f.blobs[others[0]], chunk.MatchApproximate
	}
	f.out.Add(1)
	var once sync.Once
	return Fetched{Blob: pinned.NewFunc(b, func() { once.Do(func() { f.out.Add(-1) }) }), Match: match}, nil
}

// fixedModels resolves one spec.
type fixedModels struct{ spec chunk.ModelSpec }

var errNoModel = errors.New("no such model")

func (m fixedModels) Model(_ context.Context, fp chunk.Fingerprint) (chunk.ModelSpec, error) {
	if fp != m.spec.Fingerprint() {
		return chunk.ModelSpec{}, errNoModel
	}
	return m.spec, nil
}

func newService(t testing.TB, f Fetcher, spec chunk.ModelSpec, mod func(*Config)) *Service {
	t.Helper()
	cfg := Config{Fetcher: f, Models: fixedModels{spec}, Workers: 2, Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// layersOf allocates zeroed in-process layers for layouts.
func layersOf(layers int, lay pagedkv.CacheLayout) [][]byte {
	out := make([][]byte, layers)
	for l := range out {
		out[l] = make([]byte, lay.LayerBytes())
	}
	return out
}

func cloneLayers(ls [][]byte) [][]byte {
	out := make([][]byte, len(ls))
	for i, l := range ls {
		out[i] = append([]byte(nil), l...)
	}
	return out
}

// fillPattern writes a recognizable guard pattern.
func fillPattern(ls [][]byte, seed byte) {
	for i, l := range ls {
		for j := range l {
			l[j] = byte(j*7+i*13) ^ seed
		}
	}
}

// directInject is the reference: decode the blob whole and run cudakern's
// injector over every layer of dst with the head range.
func directInject(t testing.TB, inj *cudakern.Injector, rope *cudakern.RopeTable, blob []byte, lay pagedkv.CacheLayout,
	headLo, headHi, pos int, slots []int, dst [][]byte) {
	t.Helper()
	e, err := chunk.Decode(blob, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	j := cudakern.Job{Rope: rope, Src: e.KV, SrcDType: e.DType, Tokens: len(e.Tokens), SrcHeads: e.KVHeads,
		HeadLo: headLo, HeadHi: headHi, Pos: pos, Slots: slots, Layout: lay, Dst: dst}
	if err := inj.Inject(t.Context(), &j); err != nil {
		t.Fatal(err)
	}
}

// slotPlan hands out distinct random slots for chunks of n tokens, with
// some skipped (-1).
func slotPlan(rng *rand.Rand, total int, sizes []int, skip bool) [][]int {
	perm := rng.Perm(total)
	out := make([][]int, len(sizes))
	at := 0
	for i, n := range sizes {
		out[i] = make([]int, n)
		for t := range out[i] {
			out[i][t] = perm[at]
			at++
			if skip && rng.IntN(8) == 0 {
				out[i][t] = -1
			}
		}
	}
	return out
}

func equalLayers(t *testing.T, what string, got, want [][]byte) {
	t.Helper()
	for l := range want {
		if len(got[l]) != len(want[l]) {
			t.Fatalf("%s: layer %d of %d bytes, want %d", what, l, len(got[l]), len(want[l]))
		}
		if bytes.Equal(got[l], want[l]) {
			continue
		}
		for i := range want[l] {
			if got[l][i] != want[l][i] {
				t.Fatalf("%s: layer %d differs first at byte %d: %#x, want %#x", what, l, i, got[l][i], want[l][i])
			}
		}
	}
}
