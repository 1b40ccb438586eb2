package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestForwardSeqsBitExact: sequences of different lengths prefilled and
// decoded in one pass each get the logits a pass of their own gives, bit
// for bit, whatever else is in the batch.
func TestForwardSeqsBitExact(t *testing.T) {
	ctx := t.Context()
	for name, c := range map[string]ModelConfig{"llama": tinyConfig(), "qwen3": variants()["qwen3-qknorm"]} {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t, c, 5)
			r := rand.New(rand.NewPCG(5, 6))
			prompts := [][]uint32{randTokens(r, 1, c.VocabSize), randTokens(r, 37, c.VocabSize), randTokens(r, 9, c.VocabSize), randTokens(r, 70, c.VocabSize)}
			// Alone: prefill, then two decode steps of fixed tokens.
			steps := [][]uint32{{3}, {17}}
			want := make([][][]float32, len(prompts))
			for i, p := range prompts {
				s, err := e.NewSequence(i * 3)
				if err != nil {
					t.Fatal(err)
				}
				lg, err := s.Append(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				want[i] = append(want[i], lg)
				for _, st := range steps {
					if lg, err = s.Append(ctx, st); err != nil {
						t.Fatal(err)
					}
					want[i] = append(want[i], lg)
				}
				s.Release()
			}
			// Together: the prefills in one pass, then each decode step in
			// one pass; the third sequence joins late, prefilling beside
			// the others' decode steps.
			seqs := make([]*Sequence, len(prompts))
			for i := range seqs {
				var err error
				if seqs[i], err = e.NewSequence(i * 3); err != nil {
					t.Fatal(err)
				}
				defer seqs[i].Release()
			}
			pass := func(idx []int, toks [][]uint32) [][]float32 {
				t.Helper()
				e.mu.Lock()
				defer e.mu.Unlock()
				fs := make([]fwdSeq, len(idx))
				for k, i := range idx {
					first := seqs[i].Len()
					if err := seqs[i].grow(toks[k]); err != nil {
						t.Fatal(err)
					}
					fs[k] = fwdSeq{s: seqs[i], active: slices.Clone(e.sc.indices(first, seqs[i].Len())), logits: make([]float32, c.VocabSize)}
				}
				if _, err := e.forwardSeqs(ctx, fs, fwdPlan{}); err != nil {
					t.Fatal(err)
				}
				out := make([][]float32, len(fs))
				for k := range fs {
					out[k] = fs[k].logits
				}
				return out
			}
			got := make([][][]float32, len(prompts))
			add := func(idx []int, lg [][]float32) {
				for k, i := range idx {
					got[i] = append(got[i], lg[k])
				}
			}
			add([]int{0, 1, 3}, pass([]int{0, 1, 3}, [][]uint32{prompts[0], prompts[1], prompts[3]}))
			add([]int{0, 2, 1, 3}, pass([]int{0, 2, 1, 3}, [][]uint32{steps[0], prompts[2], steps[0], steps[0]}))
			add([]int{3, 1, 2, 0}, pass([]int{3, 1, 2, 0}, [][]uint32{steps[1], steps[1], steps[0], steps[1]}))
			add([]int{2}, pass([]int{2}, [][]uint32{steps[1]}))
			for i := range prompts {
				for k := range want[i] {
					if !slices.Equal(got[i][k], want[i][k]) {
						t.Errorf("sequence %d step %d: batched logits differ from alone (max |diff| %g)", i, k, maxAbsDiff(got[i][k], want[i][k]))
					}
				}
			}
		})
	}
}

// TestSchedulerMatchesAlone: requests served concurrently through the
// scheduler (prefills batched with each other and with decode steps, an
// APPROXIMATE one recomputing alone) get the first-token logits and the
// generated tokens of each request served alone.
func TestSchedulerMatchesAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	e := newTestEngine(t, tinyConfig(), 9)
	r := rand.New(rand.NewPCG(9, 10))
	store := NewMemStore(0)
	var chunks [][]uint32
	for i := 0; i < 6; i++ {
		ch := randTokens(r, 8+i, e.cfg.VocabSize)
		en, err := e.EncodeStandalone(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		store.Put(ctx, en)
		chunks = append(chunks, ch)
	}
	layout, layers := e.CacheMemory()
	inj := &storeInjector{t: t, store: store, rope: e.rope, layout: layout, layers: layers}
	var reqs []Request
	for i := 0; i < 8; i++ {
		var segs []Segment
		for _, j := range r.Perm(len(chunks))[:1+i%4] {
			segs = append(segs, Segment{Tokens: chunks[j], Chunk: true})
		}
		if i%3 == 2 {
			segs = append(segs, Segment{Tokens: randTokens(r, 7, e.cfg.VocabSize), Chunk: true}) // a miss
		}
		req := Request{StartPos: i, Segments: append(segs, Segment{Tokens: randTokens(r, 3+i, e.cfg.VocabSize)})}
		if i == 5 {
			req.Recompute = 0.3
		}
		reqs = append(reqs, req)
	}
	const generate = 5
	type result struct {
		logits []float32
		toks   []uint32
	}
	alone := func(inj CacheInjector, req Request) result {
		t.Helper()
		req.Keep = true
		var resp *Response
		var err error
		if inj == nil {
			resp, err = e.Run(ctx, nil, req)
		} else {
			resp, err = e.RunInjected(ctx, inj, req)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Seq.Release()
		res := result{logits: resp.Logits}
		lg := resp.Logits
		for len(res.toks) < generate {
			tok := uint32(Argmax(lg))
			res.toks = append(res.toks, tok)
			if len(res.toks) == generate {
				break
			}
			if lg, err = resp.Seq.Append(ctx, []uint32{tok}); err != nil {
				t.Fatal(err)
			}
		}
		return res
	}
	for _, withInj := range []bool{false, true} {
		var ci CacheInjector
		if withInj {
			ci = inj
		}
		want := make([]result, len(reqs))
		for i, req := range reqs {
			want[i] = alone(ci, req)
		}
		s := NewScheduler(e, SchedulerConfig{Injector: ci, MaxBatchTokens: 40, MaxInjecting: 2})
		got := make([]*Served, len(reqs))
		errs := make([]error, len(reqs))
		var wg sync.WaitGroup
		for i, req := range reqs {
			wg.Go(func() { got[i], errs[i] = s.Serve(ctx, req, generate) })
		}
		wg.Wait()
		s.Close()
		for i := range reqs {
			if errs[i] != nil {
				t.Fatalf("injector %v, request %d: %v", withInj, i, errs[i])
			}
			if !slices.Equal(got[i].Logits, want[i].logits) {
				t.Errorf("injector %v, request %d: first-token logits differ from alone", withInj, i)
			}
			if !slices.Equal(got[i].Generated, want[i].toks) {
				t.Errorf("injector %v, request %d: generated %v, alone %v", withInj, i, got[i].Generated, want[i].toks)
			}
			if withInj && got[i].Injected == 0 {
				t.Errorf("request %d: nothing injected", i)
			}
		}
	}
	if free := e.FreeTokens(); free != 2048 {
		t.Errorf("%d cache tokens free after the scheduler, want all 2048", free)
	}
}

// TestSchedulerQueuesForCache: more concurrent requests than the cache
// holds wait for slots instead of failing.
func TestSchedulerQueuesForCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	e := newTestEngine(t, tinyConfig(), 4)
	s := NewScheduler(e, SchedulerConfig{})
	defer s.Close()
	r := rand.New(rand.NewPCG(4, 5))
	const n = 8 // 8 x 600 tokens in a cache of 2048
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		prompt := randTokens(r, 600, e.cfg.VocabSize)
		wg.Go(func() {
			_, errs[i] = s.Serve(ctx, Request{Segments: []Segment{{Tokens: prompt}}}, 40)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if free := e.FreeTokens(); free != 2048 {
		t.Errorf("%d cache tokens free after the requests, want all 2048", free)
	}
}

// TestSchedulerClose: a closed scheduler refuses requests.
func TestSchedulerClose(t *testing.T) {
	e := newTestEngine(t, tinyConfig(), 3)
	s := NewScheduler(e, SchedulerConfig{})
	s.Close()
	if _, err := s.Serve(t.Context(), Request{Segments: []Segment{{Tokens: []uint32{1, 2}}}}, 2); err != ErrClosed {
		t.Fatalf("Serve after Close: %v, want ErrClosed", err)
	}
}
