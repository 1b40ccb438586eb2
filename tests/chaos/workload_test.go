package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func baseSpec() chunk.ModelSpec {
	return chunk.ModelSpec{Family: "qwen2", Layers: 4, KVHeads: 2, HeadDim: 32, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 1e6, TokenizerID: "chaos"}
}

// variantBase + i indexes key i's variant: the same tokens encoded in a
// window context (lossless codec, other bytes), written for every
// variantEvery-th key, so that a content has two contexts and injections
// can be EXACT for either and APPROXIMATE with the other.
const (
	variantBase  = 1 << 20
	variantEvery = 3
	windowW      = 8 // the window context's W
)

// entryFor is key i's entry: the same bytes for the same seed and index,
// so the checker knows exactly what any read of that key may return.
// Negative indexes are never written (lookups of absent content);
// variantBase+i is key i's window-context variant.
func entryFor(seed uint64, i int) (chunk.Key, []byte, error) {
	e, codec := entryOf(seed, i)
	blob, err := chunk.Encode(nil, e, codec)
	return e.Key, blob, err
}

func entryOf(seed uint64, i int) (*chunk.Entry, chunk.Codec) {
	spec := baseSpec()
	base := i
	if i >= variantBase {
		base = i - variantBase
	}
	rng := rand.New(rand.NewPCG(seed, uint64(int64(base))^0x9e3779b97f4a7c15))
	tokens := testutil.Tokens(rng, 4+rng.IntN(13))
	if i < variantBase {
		// The cluster's default codec, so that the bytes read back are
		// those sent (a raw entry would be stored transcoded).
		return testutil.NewEntry(rng, spec, tokens, chunk.StandaloneContext()), chunk.CodecLossless
	}
	rng = rand.New(rand.NewPCG(seed, uint64(int64(base))^0x5bd1e9955bd1e995))
	cx := chunk.WindowContext(spec.Fingerprint(), windowW, windowOf(rng))
	return testutil.NewEntry(rng, spec, tokens, cx), chunk.CodecLossless
}

// windowOf draws windowW tokens: the text before a chunk in some prompt.
func windowOf(rng *rand.Rand) []uint32 {
	w := make([]uint32, windowW)
	for j := range w {
		w[j] = rng.Uint32N(150000)
	}
	return w
}

// workload runs client operations from a few workers until stopped or
// bounded out, recording each in the history.
type workload struct {
	r       *run
	nextKey atomic.Int64
	models  atomic.Int64
	ops     atomic.Int64
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func (r *run) startWorkload(workers int) *workload {
	if rig, err := newInjectRig(r.procs); err != nil {
		r.injWhy = err.Error()
		r.t.Logf("chaos: injections will SKIP: %v", err)
	} else {
		r.inj = rig
		r.t.Cleanup(rig.close) // after the workers and the final pass
	}
	w := &workload{r: r, stop: make(chan struct{})}
	for i := range workers {
		w.wg.Add(1)
		go w.worker(i)
	}
	return w
}

func (w *workload) halt() {
	w.once.Do(func() { close(w.stop) })
	w.wg.Wait()
}

func (w *workload) worker(id int) {
	defer w.wg.Done()
	rng := rand.New(rand.NewPCG(w.r.seed, uint64(id)+1))
	for w.ops.Add(1) <= maxOps {
		select {
		case <-w.stop:
			return
		case <-time.After(opPause):
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		switch x := rng.IntN(100); {
		case x < 36:
			w.put(ctx, id)
		case x < 70:
			w.get(ctx, id, rng)
		case x < 84:
			w.lookup(ctx, id, rng)
		case x < 96:
			w.inject(ctx, id, rng)
		default:
			w.register(ctx, id)
		}
		cancel()
	}
}

func (w *workload) put(ctx context.Context, id int) {
	i := int(w.nextKey.Add(1) - 1)
	if i >= maxKeys {
		return
	}
	w.putKey(ctx, id, i)
	if i%variantEvery == 0 {
		w.putKey(ctx, id, variantBase+i)
	}
}

// putKey writes key i (or a variant) and records it.
func (w *workload) putKey(ctx context.Context, id, i int) {
	h := w.r.h
	key, blob, err := entryFor(w.r.seed, i)
	if err != nil {
		w.r.t.Errorf("entry %d: %v", i, err)
		return
	}
	h.Attempt(i, key, blob)
	gen := h.Generations()
	op := Op{Start: h.Since(), Worker: id, Kind: "put", Key: i}
	res, err := w.r.cl.Put(ctx, blob)
	op.End = h.Since()
	if err != nil {
		op.Err = err.Error()
		op.StoredOn = res.StoredOn
	} else {
		op.OK, op.StoredOn = true, res.StoredOn
		h.Acked(i, res.StoredOn, gen)
	}
	h.Record(op)
}

func (w *workload) get(ctx context.Context, id int, rng *rand.Rand) {
	h := w.r.h
	i := h.RandomKey(rng)
	if i < 0 {
		return
	}
	key, blob, _ := h.Key(i)
	op := Op{Start: h.Since(), Worker: id, Kind: "get", Key: i}
	got, err := w.r.cl.Get(ctx, key)
	op.End = h.Since()
	switch {
	case err == nil && bytes.Equal(got, blob):
		op.OK = true
	case err == nil:
		op.Wrong = true
		op.Detail = fmt.Sprintf("read %d bytes, written %d (first difference at %d)", len(got), len(blob), firstDiff(got, blob))
	case errors.Is(err, client.ErrNotFound):
		op.OK = true // absent is allowed while faults last; the final check is stricter
		op.Detail = "not found"
	default:
		op.Err = err.Error()
	}
	h.Record(op)
}

func (w *workload) lookup(ctx context.Context, id int, rng *rand.Rand) {
	h := w.r.h
	var items []client.LookupItem
	var idx []int
	for range 3 {
		if i := h.RandomKey(rng); i >= 0 {
			key, _, _ := h.Key(i)
			items = append(items, client.LookupItem{Content: key.Content, Want: chunk.StandaloneContext()})
			idx = append(idx, i)
		}
	}
	ghost := -1 - rng.IntN(1<<20)
	gkey, _, err := entryFor(w.r.seed, ghost)
	if err != nil {
		return
	}
	items = append(items, client.LookupItem{Content: gkey.Content, Want: chunk.StandaloneContext()})
	idx = append(idx, ghost)
	op := Op{Start: h.Since(), Worker: id, Kind: "lookup", Key: idx[0]}
	res, err := w.r.cl.Lookup(ctx, baseSpec().Fingerprint(), items)
	op.End = h.Since()
	if err != nil {
		op.Err = err.Error()
		h.Record(op)
		return
	}
	op.OK = true
	for j, lr := range res {
		if lr.Match == chunk.MatchMiss {
			continue
		}
		if idx[j] < 0 {
			op.Wrong = true
			op.Detail += fmt.Sprintf("never-written content %v answered %v; ", items[j].Content, lr.Match)
			continue
		}
		key, _, _ := h.Key(idx[j])
		if lr.Match == chunk.MatchExact && lr.Key != key {
			op.Wrong = true
			op.Detail += fmt.Sprintf("key %d: EXACT with key %v, written %v; ", idx[j], lr.Key, key)
		}
	}
	h.Record(op)
}

// modelSpacing spreads the model registrations over the run (at most one
// per spacing on average), so that they meet every kind of fault rather
// than only the first scenarios.
const modelSpacing = 4 * time.Second

func (w *workload) register(ctx context.Context, id int) {
	if time.Duration(w.models.Load())*modelSpacing > w.r.h.Since() {
		return
	}
	j := w.models.Add(1)
	if j > maxModels {
		return
	}
	h := w.r.h
	spec := baseSpec()
	spec.Salt = fmt.Sprintf("chaos-%d-%d", w.r.seed, j)
	op := Op{Start: h.Since(), Worker: id, Kind: "register", Key: -1, Detail: spec.Fingerprint().String()}
	fp, err := w.r.cl.RegisterModel(ctx, spec)
	op.End = h.Since()
	if err != nil {
		op.Err = err.Error()
	} else {
		op.OK = true
		h.ModelAcked(fp.String())
	}
	h.Record(op)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
