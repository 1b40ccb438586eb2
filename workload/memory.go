package workload

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/kvmesh/kvmesh/chunk"

	"github.com/kvmesh/kvmesh/engine"
)

// MemoryConfig configures RunMemory. Zero fields take the defaults shown.
type MemoryConfig struct {
	Ks      []int // facts per prompt; {5, 10, 20, 50}
	Windows []int // context windows of the stored encodings; {0, 20} (0: standalone)
	// StoreFacts is the size of the per-user memory store; 2 x the
	// largest k.
	StoreFacts  int
	FactTokens  int // 24
	QueryTokens int // 16
	Prompts     int // prompts per (w, k); 6
	Recompute   float64
	Seed        uint64
	Progress    func(string)
}

func (c *MemoryConfig) defaults() {
	if len(c.Ks) == 0 {
		c.Ks = []int{5, 10, 20, 50}
	}
	if len(c.Windows) == 0 {
		c.Windows = []int{0, 20}
	}
	maxK := 0
	for _, k := range c.Ks {
		maxK = max(maxK, k)
	}
	if c.StoreFacts < maxK {
		c.StoreFacts = 2 * maxK
	}
	if c.FactTokens <= 0 {
		c.FactTokens = 24
	}
	if c.QueryTokens <= 0 {
		c.QueryTokens = 16
	}
	if c.Prompts <= 0 {
		c.Prompts = 6
	}
	if c.Recompute == 0 {
		c.Recompute = 0.15
	}
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
}

// MemoryPoint is one (w, k): prompt injection (full prefill), KV
// injection as stored (r = 0) and with recomputation (r = Recompute).
type MemoryPoint struct {
	Window, K               int
	Prefill, Inject, Repair Stats
}

// MemoryResult is what RunMemory measured.
type MemoryResult struct {
	Config MemoryConfig
	Points []MemoryPoint
}

// RunMemory is InferScale's memory-fact workload through store: for each
// window w, a per-user store of facts (a conversation's memory, in order)
// is encoded once, each fact after the w tokens before it in the stream
// (standalone when w = 0), and put in the store; then prompts of k facts
// drawn from it in relevance (random) order plus a query are served by
// prefill and by injection. Each w has its own facts, since a store
// returns one best encoding per content.
func RunMemory(ctx context.Context, e *engine.Engine, store engine.ChunkStore, cfg MemoryConfig) (*MemoryResult, error) {
	cfg.defaults()
	res := &MemoryResult{Config: cfg}
	vocab := e.Config().VocabSize
	for wi, w := range cfg.Windows {
		facts := Facts(cfg.Seed+uint64(wi)*104729, cfg.StoreFacts, cfg.FactTokens, vocab)
		var before []uint32
		for _, f := range facts {
			var err error
			var ent *chunk.Entry
			if w > 0 {
				ent, err = e.EncodeWindow(ctx, before, w, f)
			} else {
				ent, err = e.EncodeStandalone(ctx, f)
			}
			if err != nil {
				return nil, err
			}
			if err := store.Put(ctx, ent); err != nil {
				return nil, err
			}
			before = append(before, f...)
		}
		r := rand.New(rand.NewPCG(cfg.Seed, uint64(wi)))
		for _, k := range cfg.Ks {
			pt := MemoryPoint{Window: w, K: k}
			for range cfg.Prompts {
				segs := make([]engine.Segment, 0, k+1)
				for _, i := range r.Perm(len(facts))[:k] {
					segs = append(segs, engine.Segment{Tokens: facts[i], Chunk: true})
				}
				segs = append(segs, engine.Segment{Tokens: randTokens(r, cfg.QueryTokens, vocab)})
				full, err := serve(ctx, e, nil, engine.Request{Segments: segs}, &pt.Prefill, nil)
				if err != nil {
					return nil, err
				}
				if _, err := serve(ctx, e, store, engine.Request{Segments: segs}, &pt.Inject, full.Logits); err != nil {
					return nil, err
				}
				if _, err := serve(ctx, e, store, engine.Request{Segments: segs, Recompute: cfg.Recompute}, &pt.Repair, full.Logits); err != nil {
					return nil, err
				}
			}
			res.Points = append(res.Points, pt)
			cfg.Progress(fmt.Sprintf("memory w=%d k=%d: TTFT p50 prefill %v, inject %v, repair %v", w, k,
				pt.Prefill.P(0.5), pt.Inject.P(0.5), pt.Repair.P(0.5)))
		}
	}
	return res, nil
}
