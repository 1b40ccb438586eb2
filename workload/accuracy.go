package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

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
	Select    engine.Selection // how recomputed tokens are chosen
	Bound     float64          // the fallback bound (Request.FallbackBound); 0 off
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
	// Selections are the token selections tried besides key deviation,
	// on standalone and window encodings at CodecRecompute; {attention,
	// both}.
	Selections []engine.Selection
	// Bounds are the fallback bounds tried on standalone and window
	// encodings at CodecRecompute: relative key deviations at the check
	// layer (engine.ChunkResult.Deviation); {0.5, 0.7, 0.9}. The report
	// lists the deviations measured, to place them.
	Bounds []float64
	// Budget bounds the run's time: prompts are taken round-robin over
	// the cells (the i-th prompt of every cell, then the (i+1)-th), and no
	// round after the first starts once Budget has passed, so a cut run
	// still has as many prompts in every cell (give or take one). 0: no
	// bound.
	Budget   time.Duration
	Seed     uint64
	Progress func(string)
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
	if c.Selections == nil {
		c.Selections = []engine.Selection{engine.SelectAttention, engine.SelectBoth}
	}
	if c.Bounds == nil {
		c.Bounds = []float64{0.5, 0.7, 0.9}
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
			ms = append(ms, Method{Name: c.approxName(enc, r), Enc: enc, Codec: chunk.CodecRaw, Recompute: r})
		}
	}
	for _, cd := range c.Codecs {
		if cd == chunk.CodecRaw {
			continue
		}
		ms = append(ms, Method{Name: fmt.Sprintf("APPROX window w=%d, r=%.0f%%, %s", c.Window, 100*c.CodecRecompute, cd),
			Enc: EncWindow, Codec: cd, Recompute: c.CodecRecompute})
	}
	for _, enc := range []Encoding{EncStandalone, EncWindow} {
		for _, sel := range c.Selections {
			ms = append(ms, Method{Name: c.approxName(enc, c.CodecRecompute) + ", select " + sel.String(),
				Enc: enc, Codec: chunk.CodecRaw, Recompute: c.CodecRecompute, Select: sel})
		}
		for _, b := range c.Bounds {
			ms = append(ms, Method{Name: fmt.Sprintf("%s, bound %g", c.approxName(enc, c.CodecRecompute), b),
				Enc: enc, Codec: chunk.CodecRaw, Recompute: c.CodecRecompute, Bound: b})
		}
	}
	return ms
}

// approxName names the APPROXIMATE method of enc at ratio r with the
// default selection and no bound.
func (c *AccuracyConfig) approxName(enc Encoding, r float64) string {
	if enc == EncWindow {
		return fmt.Sprintf("APPROX window w=%d, r=%.0f%%", c.Window, 100*r)
	}
	return fmt.Sprintf("APPROX %s, r=%.0f%%", enc, 100*r)
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
	// Answers and Right are each prompt's answer and whether it was
	// correct, in the same prompt order for every method of the cell (so
	// two methods compare prompt by prompt).
	Answers [][]uint32
	Right   []bool
	// Deviations are the APPROXIMATE chunks' relative key deviations at
	// the check layer (measured under recomputation or a bound);
	// Fallbacks the chunks the bound recomputed whole.
	Deviations []float64
	Fallbacks  int
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
	// Rounds is the number of prompts taken from each cell, and Budgeted
	// whether the time budget stopped the run before the set was used up.
	Rounds   int
	Budgeted bool
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
	st := map[accKey]accStore{}
	for _, m := range res.Methods {
		k := accKey{m.Enc, m.Codec}
		if m.Full || st[k].e != nil {
			continue
		}
		e, s, err := stores(ctx, m.Enc, m.Codec)
		if err != nil {
			return nil, err
		}
		st[k] = accStore{e, s}
	}
	// The stores in a fixed order, so puts happen in the same order each run.
	keys := make([]accKey, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b accKey) int {
		if a.enc != b.enc {
			return int(a.enc) - int(b.enc)
		}
		return int(a.codec) - int(b.codec)
	})
	limit := cfg.Set.AnswerLimit()
	// The prompts of each cell, in the set's order.
	byCell := map[Cell][]int{}
	rounds := 0
	for pi, p := range cfg.Set.Prompts {
		c := Cell{p.Task, p.K}
		if _, ok := byCell[c]; !ok {
			res.Cells = append(res.Cells, c)
			res.Stats = append(res.Stats, make([]AccStats, len(res.Methods)))
		}
		byCell[c] = append(byCell[c], pi)
		rounds = max(rounds, len(byCell[c]))
	}
	if cfg.Prompts > 0 {
		rounds = min(rounds, cfg.Prompts)
	}
	start := time.Now()
	served := 0
	for round := 0; round < rounds; round++ {
		if round > 0 && cfg.Budget > 0 && time.Since(start) > cfg.Budget {
			res.Budgeted = true
			cfg.Progress(fmt.Sprintf("accuracy: time budget %v spent after %d rounds; stopping", cfg.Budget, round))
			break
		}
		for ci, c := range res.Cells {
			if round >= len(byCell[c]) {
				continue
			}
			pi := byCell[c][round]
			if err := serveEval(ctx, base, st, keys, res, ci, pi, limit); err != nil {
				return nil, err
			}
			served++
		}
		res.Rounds = round + 1
		el := time.Since(start)
		left := time.Duration(float64(el) / float64(round+1) * float64(rounds-round-1))
		cfg.Progress(fmt.Sprintf("accuracy round %d/%d: %d prompts x %d ways in %v, about %v left",
			round+1, rounds, served, len(res.Methods), el.Round(time.Second), left.Round(time.Second)))
	}
	return res, nil
}

// accStore is the engine and store of one (encoding, codec).
type accStore struct {
	e *engine.Engine
	s engine.ChunkStore
}

type accKey struct {
	enc   Encoding
	codec chunk.Codec
}

// serveEval serves prompt pi of the set every way and records the results
// in cell ci. Each store first gets the prompt's chunks as its encoding
// stores them.
func serveEval(ctx context.Context, base *engine.Engine, st map[accKey]accStore, keys []accKey, res *AccuracyResult, ci, pi, limit int) error {
	cfg := &res.Config
	p := &cfg.Set.Prompts[pi]
	segs := p.Segments()
	order := rand.New(rand.NewPCG(cfg.Seed, uint64(pi))).Perm(len(p.Chunks))
	// Each encoding is computed once and keyed for every store of it.
	encoded := map[Encoding][]keyed{}
	for _, k := range keys {
		ents, ok := encoded[k.enc]
		if !ok {
			var err error
			if ents, err = encodePrompt(ctx, base, k.enc, p, segs, order, cfg.Window); err != nil {
				return err
			}
			encoded[k.enc] = ents
		}
		for _, ent := range ents {
			if err := st[k].s.Put(ctx, ent.keyFor(st[k].e.Fingerprint())); err != nil {
				return err
			}
		}
	}
	var fullAns []uint32
	var fullLogits []float32
	for mi, m := range res.Methods {
		as := &res.Stats[ci][mi]
		e, src := base, engine.ChunkSource(nil)
		if !m.Full {
			s := st[accKey{m.Enc, m.Codec}]
			e, src = s.e, s.s
			if m.Prefix {
				src = PrefixOnly(src)
			}
		}
		req := engine.Request{Segments: segs, Recompute: m.Recompute, Select: m.Select, FallbackBound: m.Bound, Keep: true}
		resp, err := serve(ctx, e, src, req, &as.Stats, fullLogits)
		if err != nil {
			return fmt.Errorf("workload: %s on %s k=%d #%d: %w", m.Name, p.Task, p.K, p.Index, err)
		}
		if m.Recompute > 0 || m.Bound > 0 {
			for _, cr := range resp.Chunks {
				if cr.Match == chunk.MatchApproximate {
					as.Deviations = append(as.Deviations, cr.Deviation)
				}
			}
		}
		as.Fallbacks += resp.Fallbacks
		logits := resp.Logits
		ans, err := Decode(ctx, resp, cfg.Set.Stop, limit)
		if err != nil {
			return err
		}
		if m.Full {
			fullAns, fullLogits = ans, logits
		}
		right := p.Correct(ans)
		if right {
			as.Correct++
		}
		as.Answers, as.Right = append(as.Answers, ans), append(as.Right, right)
		if slices.Equal(ans, fullAns) {
			as.SameAsFull++
		}
	}
	return nil
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

// EncodeEval is what a store holds under encoding enc before prompt p
// arrives (see the Encoding constants), keyed for e's fingerprint: with
// EncExact the prompt's chunks keyed by their prefix, otherwise the system
// prompt and every chunk as enc encodes it, the chunks written in order (a
// permutation of p.Chunks' indices; EncWindow's windows follow it) and w
// the window of EncWindow.
func EncodeEval(ctx context.Context, e *engine.Engine, enc Encoding, p *EvalPrompt, order []int, w int) ([]*chunk.Entry, error) {
	ks, err := encodePrompt(ctx, e, enc, p, p.Segments(), order, w)
	if err != nil {
		return nil, err
	}
	out := make([]*chunk.Entry, len(ks))
	for i, k := range ks {
		out[i] = k.keyFor(e.Fingerprint())
	}
	return out, nil
}

// ProcessCPU is the process's user+system CPU time, for a run's total.
func ProcessCPU() time.Duration { return processCPU() }
