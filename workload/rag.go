package workload

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/engine"
)

// RAGConfig configures RunRAG. Zero fields take the defaults shown.
type RAGConfig struct {
	Corpus CorpusConfig
	Ks     []int // passages per request; {4, 8, 16}
	// Requests is the number of measured requests per k; 24.
	Requests int
	// Warm is the number of earlier requests per k served (by prefill)
	// and written back before measuring; 8 (negative: none).
	Warm        int
	QuestionLen int     // tokens; 16
	Noise       float64 // reranker noise in ranks; 1.5
	// Recompute is kvmesh's ratio r for APPROXIMATE chunks; 0.15. A
	// negative value means 0 (inject as stored).
	Recompute float64
	// Sweep lists extra ratios r measured (fidelity and work) on the
	// requests of the largest k; nil means none.
	Sweep []float64
	Seed  uint64
	// Progress, if set, gets a line per finished step.
	Progress func(string)
}

func (c *RAGConfig) defaults() {
	if len(c.Ks) == 0 {
		c.Ks = []int{4, 8, 16}
	}
	if c.Requests <= 0 {
		c.Requests = 24
	}
	if c.Warm < 0 {
		c.Warm = 0
	} else if c.Warm == 0 {
		c.Warm = 8
	}
	if c.QuestionLen <= 0 {
		c.QuestionLen = 16
	}
	if c.Noise == 0 {
		c.Noise = 1.5
	}
	switch {
	case c.Recompute < 0:
		c.Recompute = 0
	case c.Recompute == 0:
		c.Recompute = 0.15
	}
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
	if c.Corpus.Seed == 0 {
		c.Corpus.Seed = c.Seed
	}
}

// RAGPoint is one k: every way on the same requests.
type RAGPoint struct {
	K    int
	Ways [numWays]Stats
	// Sweep[i] is kvmesh at RAGConfig.Sweep[i] (largest k only).
	Sweep []Stats
}

// RAGResult is what RunRAG measured.
type RAGResult struct {
	Config RAGConfig
	Corpus *Corpus
	Points []RAGPoint
	// Ingested counts what the warm-up put in the store.
	Ingested Ingest
}

// Ingest counts warm-up writes.
type Ingest struct {
	Standalone int // passages encoded alone
	Root       int // system prompts encoded at the start of a prompt
	Requests   int // earlier requests written back (prefix-chain encodings)
	Entries    int // entries put in all
}

// IngestCorpus puts what a deployment holds before the first measured
// request: the system prompt encoded at the start of a prompt (alone: the
// key of a chunk with nothing before it is standalone, so it is EXACT
// wherever a prompt starts with it), and
// every passage encoded once on its own when it was indexed. Passages are
// stored standalone rather than windowed because a RAG passage has no fixed
// neighbour: any window would be as wrong as none.
func IngestCorpus(ctx context.Context, e *engine.Engine, store engine.ChunkSink, c *Corpus) (Ingest, error) {
	var in Ingest
	ent, err := e.EncodeStandalone(ctx, c.System)
	if err != nil {
		return in, err
	}
	if err := store.Put(ctx, ent); err != nil {
		return in, err
	}
	in.Root, in.Entries = 1, 1
	for _, p := range c.Passages {
		ent, err := e.EncodeStandalone(ctx, p)
		if err != nil {
			return in, err
		}
		if err := store.Put(ctx, ent); err != nil {
			return in, err
		}
		in.Standalone++
		in.Entries++
	}
	return in, nil
}

// RunRAG serves RAG requests three ways on e against store: per k, Warm
// earlier requests are prefilled and written back, then each measured
// request runs as full prefill, as prefix caching and as kvmesh chunk reuse,
// and is written back too (as the serving engine would), so the store grows
// as a deployment's does. The corpus is ingested first (IngestCorpus).
func RunRAG(ctx context.Context, e *engine.Engine, store engine.ChunkStore, cfg RAGConfig) (*RAGResult, error) {
	cfg.defaults()
	cfg.Corpus.Vocab = e.Config().VocabSize
	c := NewCorpus(cfg.Corpus)
	res := &RAGResult{Config: cfg, Corpus: c}
	in, err := IngestCorpus(ctx, e, store, c)
	if err != nil {
		return nil, err
	}
	res.Ingested = in
	cfg.Progress(fmt.Sprintf("rag: ingested %d passages standalone and the system prompt", in.Standalone))
	prefix := PrefixOnly(store)
	for ki, k := range cfg.Ks {
		reqs := c.RAGRequests(cfg.Seed+uint64(ki)*7919, cfg.Warm+cfg.Requests, k, cfg.Noise, cfg.QuestionLen)
		for _, r := range reqs[:cfg.Warm] {
			if err := writeBack(ctx, e, store, c.Segments(r)); err != nil {
				return nil, err
			}
			res.Ingested.Requests++
			res.Ingested.Entries += len(r.Passages) + 1
		}
		pt := RAGPoint{K: k}
		last := ki == len(cfg.Ks)-1
		if last {
			pt.Sweep = make([]Stats, len(cfg.Sweep))
		}
		for _, r := range reqs[cfg.Warm:] {
			segs := c.Segments(r)
			full, err := serve(ctx, e, nil, engine.Request{Segments: segs}, &pt.Ways[Full], nil)
			if err != nil {
				return nil, err
			}
			if _, err := serve(ctx, e, prefix, engine.Request{Segments: segs}, &pt.Ways[Prefix], full.Logits); err != nil {
				return nil, err
			}
			if _, err := serve(ctx, e, store, engine.Request{Segments: segs, Recompute: cfg.Recompute}, &pt.Ways[Chunk], full.Logits); err != nil {
				return nil, err
			}
			if last {
				for i, rr := range cfg.Sweep {
					if _, err := serve(ctx, e, store, engine.Request{Segments: segs, Recompute: rr}, &pt.Sweep[i], full.Logits); err != nil {
						return nil, err
					}
				}
			}
			if err := writeBack(ctx, e, store, segs); err != nil {
				return nil, err
			}
		}
		res.Points = append(res.Points, pt)
		cfg.Progress(fmt.Sprintf("rag k=%d: TTFT p50 full %v, prefix %v, kvmesh %v", k,
			pt.Ways[Full].P(0.5), pt.Ways[Prefix].P(0.5), pt.Ways[Chunk].P(0.5)))
	}
	return res, nil
}
