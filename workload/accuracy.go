package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// Encoding is how a prompt's chunks were stored before the prompt came.
type Encoding int

// The encodings compared.
const (
	// EncExact: an earlier identical request wrote back its chunks keyed by
	// their true prefix, so every chunk is an EXACT hit.
	EncExact Encoding = iota
	// EncStandalone: each chunk encoded alone (APPROXIMATE).
	EncStandalone
	// EncWindow: each chunk encoded after the system prompt and the last w
	// tokens before it in the order the chunks were written (a memory
	// store's conversation order, not the prompt's).
	EncWindow
	// EncSystem: each chunk encoded right after the system prompt (EXACT
	// for the prompt's first chunk, APPROXIMATE for the others).
	EncSystem
	numEncodings
)

func (e Encoding) String() string {
	switch e {
	case EncExact:
		return "EXACT"
	case EncStandalone:
		return "standalone"
	case EncWindow:
		return "window"
	case EncSystem:
		return "after system prompt"
	}
	return fmt.Sprintf("encoding(%d)", int(e))
}

// StoreFactory gives the engine and store of one (encoding, codec): each
// pair needs its own store, because a store answers one best encoding per
// chunk content. The engines must run the same weights.
type StoreFactory func(ctx context.Context, enc Encoding, codec chunk.Codec) (*engine.Engine, engine.ChunkStore, error)

// Method is one way of serving the evaluation prompts.
type Method struct {
	Name      string
	Full      bool // full prefill, no store
	Prefix    bool // prefix caching's lookup rule
	Enc       Encoding
	Codec     chunk.Codec
	Recompute float64
}

// AccuracyConfig configures RunAccuracy. Zero fields take the defaults shown.
type AccuracyConfig struct {
	Set *EvalSet
	// Prompts per task and k; every prompt of the set when 0.
	Prompts int
	// Recompute lists the ratios r APPROXIMATE encodings are served with;
	// {0, 0.15, 0.30}.
	Recompute []float64
	Window    int // context window of EncWindow; 20
	// Codecs stored with; {raw, lossless, int8, int4, fp8}. Raw serves
	// every method; the others serve EXACT and window w at CodecRecompute.
	Codecs         []chunk.Codec
	CodecRecompute float64 // 0.15
	Seed           uint64
	Progress       func(string)
}

func (c *AccuracyConfig) defaults() {
	if len(c.Recompute) == 0 {
		c.Recompute = []float64{0, 0.15, 0.30}
	}
	if c.Window <= 0 {
		c.Window = 20
	}
	if len(c.Codecs) == 0 {
		c.Codecs = []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless, chunk.CodecInt8, chunk.CodecInt4, chunk.CodecFP8}
	}
	if c.CodecRecompute == 0 {
		c.CodecRecompute = 0.15
	}
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
}

// Methods lists what cfg compares, full prefill first.
func (c *AccuracyConfig) Methods() []Method {
	c.defaults()
	ms := []Method{
		{Name: "full prefill", Full: true},
		{Name: "prefix caching", Prefix: true, Enc: EncStandalone, Codec: chunk.CodecRaw},
	}
	for _, cd := range c.Codecs {
		ms = append(ms, Method{Name: "kvmesh EXACT, " + cd.String(), Enc: EncExact, Codec: cd})
	}
	for _, enc := range []Encoding{EncStandalone, EncWindow, EncSystem} {
		for _, r := range c.Recompute {
			name := fmt.Sprintf("APPROX %s, r=%.0f%%", enc, 100*r)
			if enc == EncWindow {
				name = fmt.Sprintf("APPROX window w=%d, r=%.0f%%", c.Window, 100*r)
			}
			ms = append(ms, Method{Name: name, Enc: enc, Codec: chunk.CodecRaw, Recompute: r})
		}
	}
	for _, cd := range c.Codecs {
		if cd == chunk.CodecRaw {
			continue
		}
		ms = append(ms, Method{Name: fmt.Sprintf("APPROX window w=%d, r=%.0f%%, %s", c.Window, 100*c.CodecRecompute, cd),
			Enc: EncWindow, Codec: cd, Recompute: c.CodecRecompute})
	}
	return ms
}

// Cell is one (task, k).
type Cell struct {
	Task string
	K    int
}

// AccStats is one method's results in one cell.
type AccStats struct {
	Stats
	Correct int // answers equal to the expected one
	// SameAsFull counts answers equal to full prefill's, answer for answer.
	SameAsFull int
}

// Accuracy is the exact-match rate.
func (a *AccStats) Accuracy() float64 {
	if a.N() == 0 {
		return 0
	}
	return float64(a.Correct) / float64(a.N())
}

// AccuracyResult holds every method's results per cell.
type AccuracyResult struct {
	Config  AccuracyConfig
	Methods []Method
	Cells   []Cell
	// Stats[cell][method], in the orders of Cells and Methods.
	Stats [][]AccStats
}

// Cell returns the results of method m in cell c, or nil.
func (r *AccuracyResult) Cell(c Cell, m int) *AccStats {
	i := slices.Index(r.Cells, c)
	if i < 0 {
		return nil
	}
	return &r.Stats[i][m]
}

// RunAccuracy serves every prompt of cfg.Set each way, decoding the answer
// greedily, and compares it with the expected answer and with full
// prefill's. For each prompt, each store first gets the prompt's chunks as
// its encoding stores them (and the system prompt, EXACT at the start of
// every prompt), then the prompt is served from it.
func RunAccuracy(ctx context.Context, base *engine.Engine, stores StoreFactory, cfg AccuracyConfig) (*AccuracyResult, error) {
	cfg.defaults()
	if cfg.Set == nil || len(cfg.Set.Prompts) == 0 {
		return nil, fmt.Errorf("workload: accuracy needs an evaluation set")
	}
	res := &AccuracyResult{Config: cfg, Methods: cfg.Methods()}
	type storeKey struct {
		enc   Encoding
		codec chunk.Codec
	}
	type store struct {
		e *engine.Engine
		s engine.ChunkStore
	}
	st := map[storeKey]store{}
	for _, m := range res.Methods {
		k := storeKey{m.Enc, m.Codec}
		if m.Full || st[k].e != nil {
			continue
		}
		e, s, err := stores(ctx, m.Enc, m.Codec)
		if err != nil {
			return nil, err
		}
		st[k] = store{e, s}
	}
	// The stores in a fixed order, so puts happen in the same order each run.
	keys := make([]storeKey, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b storeKey) int {
		if a.enc != b.enc {
			return int(a.enc) - int(b.enc)
		}
		return int(a.codec) - int(b.codec)
	})
	limit := cfg.Set.AnswerLimit()
	counts := map[Cell]int{}
	for pi := range cfg.Set.Prompts {
		p := &cfg.Set.Prompts[pi]
		c := Cell{p.Task, p.K}
		if cfg.Prompts > 0 && counts[c] >= cfg.Prompts {
			continue
		}
		counts[c]++
		ci := slices.Index(res.Cells, c)
		if ci < 0 {
			ci = len(res.Cells)
			res.Cells = append(res.Cells, c)
			res.Stats = append(res.Stats, make([]AccStats, len(res.Methods)))
		}
		segs := p.Segments()
		order := rand.New(rand.NewPCG(cfg.Seed, uint64(pi))).Perm(len(p.Chunks))
		// Each encoding is computed once and keyed for every store of it.
		encoded := map[Encoding][]keyed{}
		for _, k := range keys {
			ents, ok := encoded[k.enc]
			if !ok {
				var err error
				if ents, err = encodePrompt(ctx, base, k.enc, p, segs, order, cfg.Window); err != nil {
					return nil, err
				}
				encoded[k.enc] = ents
			}
			for _, ent := range ents {
				if err := st[k].s.Put(ctx, ent.keyFor(st[k].e.Fingerprint())); err != nil {
					return nil, err
				}
			}
		}
		var fullAns []uint32
		var fullLogits []float32
		for mi, m := range res.Methods {
			as := &res.Stats[ci][mi]
			e, src := base, engine.ChunkSource(nil)
			if !m.Full {
				s := st[storeKey{m.Enc, m.Codec}]
				e, src = s.e, s.s
				if m.Prefix {
					src = PrefixOnly(src)
				}
			}
			resp, err := serve(ctx, e, src, engine.Request{Segments: segs, Recompute: m.Recompute, Keep: true}, &as.Stats, fullLogits)
			if err != nil {
				return nil, fmt.Errorf("workload: %s on %s k=%d #%d: %w", m.Name, p.Task, p.K, p.Index, err)
			}
			logits := resp.Logits
			ans, err := Decode(ctx, resp, cfg.Set.Stop, limit)
			if err != nil {
				return nil, err
			}
			if m.Full {
				fullAns, fullLogits = ans, logits
			}
			if p.Correct(ans) {
				as.Correct++
			}
			if slices.Equal(ans, fullAns) {
				as.SameAsFull++
			}
		}
		if counts[c] == cfg.Prompts || (cfg.Prompts == 0 && pi+1 < len(cfg.Set.Prompts) && Cell{cfg.Set.Prompts[pi+1].Task, cfg.Set.Prompts[pi+1].K} != c) {
			full := &res.Stats[ci][0]
			cfg.Progress(fmt.Sprintf("accuracy %s k=%d: full prefill %.0f%% over %d prompts", c.Task, c.K, 100*full.Accuracy(), full.N()))
		}
	}
	return res, nil
}

// keyed is an encoding of a chunk, keyed for any fingerprint of the same
// weights: its KV does not depend on the fingerprint, its key does.
type keyed struct {
	ent *chunk.Entry
	cx  func(fp chunk.Fingerprint) chunk.Context
}

func (k keyed) keyFor(fp chunk.Fingerprint) *chunk.Entry {
	ent := *k.ent
	ent.Key = chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, ent.Tokens), Context: k.cx(fp)}
	return &ent
}

// encodePrompt encodes what a store would hold, under encoding enc, before
// prompt p arrives: with EncExact the prompt's chunks keyed by their prefix
// (an earlier identical request's write-back), otherwise the system prompt
// (EXACT at the start of every prompt) and each chunk as enc encodes it, in
// the order the chunks were written.
func encodePrompt(ctx context.Context, e *engine.Engine, enc Encoding, p *EvalPrompt, segs []engine.Segment, order []int, w int) ([]keyed, error) {
	if enc == EncExact {
		ents, err := e.EncodePrompt(ctx, segs)
		if err != nil {
			return nil, err
		}
		toks := make([][]uint32, len(segs))
		for i, sg := range segs {
			toks[i] = sg.Tokens
		}
		var out []keyed
		for i, ent := range ents {
			if ent != nil {
				out = append(out, keyed{ent, func(fp chunk.Fingerprint) chunk.Context {
					cs, _ := chunk.PrefixChain(fp, toks)
					return cs[i]
				}})
			}
		}
		return out, nil
	}
	afterSystem := func(fp chunk.Fingerprint) chunk.Context {
		_, end := chunk.PrefixChain(fp, [][]uint32{p.System})
		return chunk.PrefixContext(end)
	}
	// Nothing before the system prompt: its one key is standalone.
	root := func(chunk.Fingerprint) chunk.Context { return chunk.StandaloneContext() }
	sys, err := e.EncodeStandalone(ctx, p.System)
	if err != nil {
		return nil, err
	}
	out := []keyed{{sys, root}}
	var conv []uint32
	for _, i := range order {
		ch := p.Chunks[i]
		var before []uint32
		cx := afterSystem
		switch enc {
		case EncStandalone:
			cx = func(chunk.Fingerprint) chunk.Context { return chunk.StandaloneContext() }
		case EncWindow:
			// As EncodeFact: the system prompt and the window; right after
			// the system prompt when there is no window yet.
			if win := conv[max(0, len(conv)-w):]; len(win) > 0 {
				before = append(append(before, p.System...), win...)
				cx = func(fp chunk.Fingerprint) chunk.Context { return chunk.WindowContext(fp, len(before), before) }
			} else {
				before = p.System
			}
		case EncSystem:
			before = p.System
		}
		ent, err := e.Encode(ctx, before, ch, cx(e.Fingerprint()), engine.EncodeOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, keyed{ent, cx})
		conv = append(conv, ch...)
	}
	return out, nil
}
