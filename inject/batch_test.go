package inject

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/kvtier"
)

// lockedRemote is fakeRemote safe for FetchBatch's concurrent reads, and
// a BatchRemote when batch is set.
type lockedRemote struct {
	mu      sync.Mutex
	r       *fakeRemote
	bests   atomic.Int64 // Best calls
	batches atomic.Int64 // BestBatch calls
}

func (l *lockedRemote) Best(ctx context.Context, fp chunk.Fingerprint, content chunk.ID, want chunk.Context) (chunk.Key, chunk.Match, error) {
	l.bests.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Best(ctx, fp, content, want)
}

func (l *lockedRemote) Get(ctx context.Context, key chunk.Key) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Get(ctx, key)
}

type batchingRemote struct{ *lockedRemote }

func (b batchingRemote) BestBatch(ctx context.Context, keys []chunk.Key) []Found {
	b.batches.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Found, len(keys))
	for i, k := range keys {
		out[i].Key, out[i].Match, out[i].Err = b.r.Best(ctx, k.Fingerprint, k.Content, k.Context)
	}
	return out
}

// TestFetchBatch: FetchBatch answers every key as Fetch does (local exact
// first, remote exact over local approximate, the better approximate as
// chunk.Better ranks them, misses), once per key, with one BestBatch for all
// the keys without a local exact entry when the Remote batches, and one
// Best per such key when it does not.
func TestFetchBatch(t *testing.T) {
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(8, 8))
	spec := testSpec(chunk.BF16)
	fp := spec.Fingerprint()
	want := chunk.PrefixContext(chunk.ID{Lo: 9})
	window := chunk.WindowContext(fp, 8, []uint32{1})
	type item struct {
		local, remote []chunk.Context // contexts stored locally, on replicas
		match         chunk.Match
		from          string // "local", "remote" or ""
	}
	items := []item{
		{local: []chunk.Context{want}, remote: []chunk.Context{want}, match: chunk.MatchExact, from: "local"},
		{local: []chunk.Context{window}, remote: []chunk.Context{want}, match: chunk.MatchExact, from: "remote"},
		{local: []chunk.Context{window}, remote: []chunk.Context{chunk.StandaloneContext()}, match: chunk.MatchApproximate, from: "local"},
		{remote: []chunk.Context{chunk.StandaloneContext()}, match: chunk.MatchApproximate, from: "remote"},
		{local: []chunk.Context{chunk.StandaloneContext()}, remote: []chunk.Context{window}, match: chunk.MatchApproximate, from: "remote"},
		{match: chunk.MatchMiss},
		{local: []chunk.Context{want}, match: chunk.MatchExact, from: "local"},
	}
	st, err := kvtier.Open(kvtier.Config{DRAMBytes: 8 << 20, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fr := &fakeRemote{blobs: map[chunk.Key][]byte{}}
	var keys []chunk.Key
	blobs := map[chunk.Key][]byte{}
	for _, it := range items {
		toks := randTokens(rng, 6)
		content := chunk.ContentID(fp, toks)
		for _, cx := range append(append([]chunk.Context(nil), it.local...), it.remote...) {
			k := chunk.Key{Fingerprint: fp, Content: content, Context: cx}
			if blobs[k] == nil {
				blobs[k] = encode(t, synthEntry(rng, spec, toks, cx), chunk.CodecRaw)
			}
		}
		for _, cx := range it.local {
			if _, err := st.Put(ctx, blobs[chunk.Key{Fingerprint: fp, Content: content, Context: cx}], kvtier.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, cx := range it.remote {
			k := chunk.Key{Fingerprint: fp, Content: content, Context: cx}
			fr.blobs[k] = blobs[k]
		}
		keys = append(keys, chunk.Key{Fingerprint: fp, Content: content, Context: want})
	}
	for _, tc := range []struct {
		name  string
		batch bool
		rerr  error
	}{{"batch-remote", true, nil}, {"plain-remote", false, nil}, {"remote-down", true, errors.New("down")}} {
		t.Run(tc.name, func(t *testing.T) {
			fr.err = tc.rerr
			lr := &lockedRemote{r: fr}
			f := TierFetcher{Local: st, Remote: lr, Parallel: 2}
			if tc.batch {
				f.Remote = batchingRemote{lr}
			}
			var mu sync.Mutex
			calls := make([]int, len(keys))
			got := make([]Fetched, len(keys))
			errs := make([]error, len(keys))
			f.FetchBatch(ctx, keys, func(i int, g Fetched, err error) {
				mu.Lock()
				defer mu.Unlock()
				calls[i]++
				got[i], errs[i] = g, err
			})
			for i, it := range items {
				if calls[i] != 1 {
					t.Fatalf("key %d answered %d times", i, calls[i])
				}
				wantMatch, from := it.match, it.from
				if tc.rerr != nil && from != "local" && len(it.local) > 0 {
					wantMatch, from = chunk.MatchApproximate, "local" // the replicas' exact is out of reach
				} else if tc.rerr != nil && from != "local" {
					wantMatch, from = chunk.MatchMiss, ""
					if errs[i] == nil {
						t.Errorf("key %d: no error with the replicas down", i)
					}
				} else if errs[i] != nil {
					t.Errorf("key %d: %v", i, errs[i])
				}
				if got[i].Match != wantMatch || (from == "local") != got[i].Local || (from == "") != (got[i].Blob.Len() == 0) {
					t.Errorf("key %d: %v from local %v (%d bytes), want %v from %q", i, got[i].Match, got[i].Local, got[i].Blob.Len(), wantMatch, from)
				}
				// The same answer as Fetch.
				one, err := f.Fetch(ctx, keys[i])
				if (err != nil) != (errs[i] != nil) || one.Match != got[i].Match || !bytes.Equal(one.Blob.Bytes(), got[i].Blob.Bytes()) {
					t.Errorf("key %d: Fetch answers %v (%v), FetchBatch %v (%v)", i, one.Match, err, got[i].Match, errs[i])
				}
				one.Blob.Release()
				got[i].Blob.Release()
			}
			// Keys 0 and 5 are local exact: the other four go to the replicas.
			if tc.batch {
				if n := lr.batches.Load(); n != 1 {
					t.Errorf("%d BestBatch calls, want 1", n)
				}
			}
			if pinned := st.Stats().Tiers[kvtier.TierDRAM].PinnedBytes; pinned != 0 {
				t.Errorf("%d bytes still pinned", pinned)
			}
		})
	}
}

// batchFetcher is memFetcher with FetchBatch, answering in reverse order
// from several goroutines, and (dup) answering key 0 twice.
type batchFetcher struct {
	*memFetcher
	dup     bool
	batches atomic.Int64
}

func (b *batchFetcher) FetchBatch(ctx context.Context, keys []chunk.Key, found func(int, Fetched, error)) {
	b.batches.Add(1)
	var wg sync.WaitGroup
	for i := len(keys) - 1; i >= 0; i-- {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := b.Fetch(ctx, keys[i])
			found(i, got, err)
		}()
	}
	wg.Wait()
	if b.dup && len(keys) > 0 {
		got, err := b.Fetch(ctx, keys[0])
		found(0, got, err)
	}
}

// TestServiceBatchFetcher: a BatchFetcher is asked once per request, and
// the cache ends as with per-chunk fetches; an answer given twice is
// dropped and released.
func TestServiceBatchFetcher(t *testing.T) {
	for _, dup := range []bool{false, true} {
		px := newPipeFixture(t, 3, 9, chunk.CodecRaw, nil)
		bf := &batchFetcher{memFetcher: px.f, dup: dup}
		px.s.cfg.Fetcher = bf
		resp, err := px.s.Inject(t.Context(), px.req)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range resp.Results {
			if r.Match != chunk.MatchExact {
				t.Fatalf("chunk %d: %v (%v)", i, r.Match, r.Reason)
			}
		}
		equalLayers(t, "cache", px.mem, px.want)
		if n := bf.batches.Load(); n != 1 {
			t.Errorf("%d FetchBatch calls, want 1", n)
		}
		if out := px.f.out.Load(); out != 0 {
			t.Errorf("dup %v: %d blobs not released", dup, out)
		}
	}
}

// TestOnPlan: the plan comes once, before any layer is written, and
// answers as the Response does.
func TestOnPlan(t *testing.T) {
	px := newPipeFixture(t, 4, 6, chunk.CodecLossless, nil)
	// Chunk 2 is not stored: a planned MISS.
	px.f.mu.Lock()
	for k := range px.f.blobs {
		if k.Content == chunk.ContentID(k.Fingerprint, px.req.Chunks[2].Tokens) {
			delete(px.f.blobs, k)
		}
	}
	px.f.mu.Unlock()
	var plan []Result
	layers := 0
	px.req.OnPlan = func(res []Result) {
		if plan != nil || layers != 0 {
			t.Errorf("plan again or after %d layers", layers)
		}
		plan = append([]Result(nil), res...)
		equalLayers(t, "cache at plan", px.mem, px.before)
	}
	px.req.OnLayer = func(int) { layers++ }
	resp, err := px.s.Inject(t.Context(), px.req)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != len(resp.Results) || layers != 4 {
		t.Fatalf("plan of %d, %d layers", len(plan), layers)
	}
	for i := range plan {
		if plan[i].Match != resp.Results[i].Match || plan[i].Context != resp.Results[i].Context {
			t.Errorf("chunk %d: planned %v, answered %v", i, plan[i].Match, resp.Results[i].Match)
		}
	}
	if plan[2].Match != chunk.MatchMiss || plan[0].Match != chunk.MatchExact {
		t.Errorf("plan %v %v", plan[0].Match, plan[2].Match)
	}
}
