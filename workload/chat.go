package workload

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/engine"
)

// ChatRunConfig configures RunChat. Zero fields take the defaults shown.
type ChatRunConfig struct {
	Chat          ChatConfig
	Conversations int // 6
	// Recompute is kvmesh's r for APPROXIMATE chunks (quoted documents);
	// 0.15; negative means 0.
	Recompute float64
	Seed      uint64
	Progress  func(string)
}

// ChatResult holds, per turn, every way's statistics over the
// conversations.
type ChatResult struct {
	Config ChatRunConfig
	Turns  [][numWays]Stats
}

// RunChat serves conversations turn by turn on e against store, which
// must already hold the corpus (IngestCorpus). Each turn runs as full
// prefill, prefix caching and kvmesh chunk reuse; then the turn's prompt
// and reply are written back, as a serving engine holds them after
// decoding the reply. Quoted documents are corpus passages, found as their
// standalone encodings (APPROXIMATE) when first quoted in a conversation,
// and as part of the history (EXACT) afterwards.
func RunChat(ctx context.Context, e *engine.Engine, store engine.ChunkStore, c *Corpus, cfg ChatRunConfig) (*ChatResult, error) {
	cfg.Chat.defaults()
	if cfg.Conversations <= 0 {
		cfg.Conversations = 6
	}
	switch {
	case cfg.Recompute < 0:
		cfg.Recompute = 0
	case cfg.Recompute == 0:
		cfg.Recompute = 0.15
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string) {}
	}
	res := &ChatResult{Config: cfg, Turns: make([][numWays]Stats, cfg.Chat.Turns)}
	prefix := PrefixOnly(store)
	for ci, conv := range c.Conversations(cfg.Seed, cfg.Conversations, cfg.Chat) {
		for t := range conv.Turns {
			segs := c.Prompt(conv, t)
			st := &res.Turns[t]
			full, err := serve(ctx, e, nil, engine.Request{Segments: segs}, &st[Full], nil)
			if err != nil {
				return nil, err
			}
			if _, err := serve(ctx, e, prefix, engine.Request{Segments: segs}, &st[Prefix], full.Logits); err != nil {
				return nil, err
			}
			if _, err := serve(ctx, e, store, engine.Request{Segments: segs, Recompute: cfg.Recompute}, &st[Chunk], full.Logits); err != nil {
				return nil, err
			}
			if err := writeBack(ctx, e, store, c.Served(conv, t)); err != nil {
				return nil, err
			}
		}
		cfg.Progress(fmt.Sprintf("chat: conversation %d of %d done", ci+1, cfg.Conversations))
	}
	return res, nil
}
