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
	Ks []int // facts per prompt; {5, 10, 20, 50}
	// Windows lists the context windows of the stored encodings: the
	// tokens of the conversation before a fact that it is encoded after;
	// {0, 20}.
	Windows []int
	// SystemLen is the length of the system prompt every prompt starts
	// with; 32 (negative: none). It is stored encoded at the start of a
	// prompt (EXACT for every prompt), and every fact is encoded after it
	// and then its window, as it follows it in every prompt: the
	// encoding's first token is then the system prompt's, as the prompt's
	// is, instead of a fact token standing where the attention sink is.
	// With none, w = 0 means standalone and the first fact of a prompt has
	// no context at all, which is the workload before SystemLen.
	SystemLen int
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
	if c.SystemLen == 0 {
		c.SystemLen = 32
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

// RunMemory is InferScale's memory-fact workload through store: the
// system prompt is stored encoded at the start of a prompt; for each
// window w, a per-user store of facts (a conversation's memory, in order)
// is encoded once, each fact after the system prompt and the w tokens
// before it in the conversation (EncodeFact), and put in the store; then
// prompts of the system prompt, k facts drawn from the store in relevance
// (random) order and a query are served by prefill and by injection. Each
// w has its own facts, since a store returns one best encoding per
// content.
func RunMemory(ctx context.Context, e *engine.Engine, store engine.ChunkStore, cfg MemoryConfig) (*MemoryResult, error) {
	cfg.defaults()
	res := &MemoryResult{Config: cfg}
	vocab := e.Config().VocabSize
	var system []uint32
	if cfg.SystemLen > 0 {
		system = randTokens(rand.New(rand.NewPCG(cfg.Seed, 0x73797374656d)), cfg.SystemLen, vocab)
		ent, err := e.EncodeStandalone(ctx, system)
		if err != nil {
			return nil, err
		}
		if err := store.Put(ctx, ent); err != nil {
			return nil, err
		}
	}
	for wi, w := range cfg.Windows {
		facts := Facts(cfg.Seed+uint64(wi)*104729, cfg.StoreFacts, cfg.FactTokens, vocab)
		for i, f := range facts {
			ent, err := EncodeFact(ctx, e, system, facts[:i], w, f)
			if err != nil {
				return nil, err
			}
			if err := store.Put(ctx, ent); err != nil {
				return nil, err
			}
		}
		r := rand.New(rand.NewPCG(cfg.Seed, uint64(wi)))
		for _, k := range cfg.Ks {
			pt := MemoryPoint{Window: w, K: k}
			for range cfg.Prompts {
				segs := make([]engine.Segment, 0, k+2)
				if len(system) > 0 {
					segs = append(segs, engine.Segment{Tokens: system, Chunk: true})
				}
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

// EncodeFact encodes fact as a memory store does when the conversation
// produces it: after the system prompt (if any) and the last w tokens of
// the conversation before it (conv, its chunks in order), which is what
// precedes a fact in the prompts that use it up to the order of the facts.
// The context says exactly what it was encoded after, as its one key:
// standalone for nothing, the prefix chain of the system prompt and conv
// when the window holds all of conv (EXACT for a fact right after them),
// else a window of the system prompt and conv's tail.
func EncodeFact(ctx context.Context, e *engine.Engine, system []uint32, conv [][]uint32, w int, fact []uint32) (*chunk.Entry, error) {
	w = max(w, 0)
	var all []uint32
	for _, c := range conv {
		all = append(all, c...)
	}
	switch {
	case len(system) == 0:
		return e.EncodeWindow(ctx, conv, w, fact)
	case w == 0 || len(all) == 0:
		return e.EncodeAfterPrefix(ctx, [][]uint32{system}, fact)
	case len(all) <= w:
		return e.EncodeAfterPrefix(ctx, append([][]uint32{system}, conv...), fact)
	}
	before := append(append(make([]uint32, 0, len(system)+w), system...), all[len(all)-w:]...)
	return e.Encode(ctx, before, fact, chunk.WindowContext(e.Fingerprint(), len(before), before), engine.EncodeOptions{})
}
