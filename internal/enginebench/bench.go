// Package enginebench is the reference engine's benchmark harness
// (cmd/kvmesh-engine-bench, `make bench-engine`): time to first token for
// prompt injection against KV injection from a chunk store, the fidelity
// of approximate encodings and what each codec does to EXACT entries.
package enginebench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/cputime"
)

// Config configures Run. Zero fields take the defaults shown.
type Config struct {
	Ks          []int // retrieved facts per prompt; {5, 10, 20, 50}
	FactTokens  int   // tokens per fact; 24
	QueryTokens int   // 16
	// Trials is the number of timed runs per point; the fastest is reported,
	// since on a shared machine the slower ones measure other processes; 3.
	Trials    int
	Window    int // context window of the stored encodings; 20
	Recompute float64
	// FidelityPrompts prompts of FidelityK facts each measure fidelity;
	// 32 and 10.
	FidelityPrompts int
	FidelityK       int
	Seed            uint64
	// Codecs are measured on EXACT entries: what each does to the logits
	// and the bytes it stores. Default raw, lossless, int8, int4, fp8.
	Codecs []chunk.Codec
	// Progress, if set, is called with a line per finished step.
	Progress func(string)
}

func (c *Config) defaults() {
	if len(c.Ks) == 0 {
		c.Ks = []int{5, 10, 20, 50}
	}
	if c.FactTokens <= 0 {
		c.FactTokens = 24
	}
	if c.QueryTokens <= 0 {
		c.QueryTokens = 16
	}
	if c.Trials <= 0 {
		c.Trials = 3
	}
	if c.Window <= 0 {
		c.Window = 20
	}
	if c.Recompute == 0 {
		c.Recompute = 0.15
	}
	if c.FidelityPrompts <= 0 {
		c.FidelityPrompts = 32
	}
	if c.FidelityK <= 0 {
		c.FidelityK = 10
	}
	if len(c.Codecs) == 0 {
		c.Codecs = []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless, chunk.CodecInt8, chunk.CodecInt4, chunk.CodecFP8}
	}
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
}

// TTFTRow is one k of the time-to-first-token comparison.
type TTFTRow struct {
	K            int
	PromptTokens int
	// Prefill is prompt injection: every token prefilled. Inject is KV
	// injection of the stored facts plus a prefill of the query; Repair is
	// injection with deviation-guided recomputation at the configured ratio.
	Prefill, Inject, Repair time.Duration
	// PrefillCPU and InjectCPU are the process CPU time of the same paths
	// (fastest run), all threads: the work, whatever else the machine runs.
	PrefillCPU, InjectCPU time.Duration
	// Lookup and Scatter split Inject's time outside the forward pass.
	Lookup, Scatter time.Duration
	// Token-layers each path computed.
	PrefillTL, InjectTL, RepairTL int
}

// FidelityRow is one encoding's closeness to full prefill.
type FidelityRow struct {
	Name      string
	Recompute float64
	engine.Fidelity
	// WorkFraction is the computed token-layers over a full prefill's.
	WorkFraction float64
}

// CodecRow is what a codec does to EXACT entries.
type CodecRow struct {
	Codec chunk.Codec
	engine.Fidelity
	// Ratio is raw KV bytes over stored bytes (entry headers included).
	Ratio float64
}

// Result is what Run measured.
type Result struct {
	Model    engine.ModelConfig
	KVDType  chunk.DType // of the stored entries
	Config   Config
	Workers  int
	TTFT     []TTFTRow
	Fidelity []FidelityRow
	Codecs   []CodecRow
}

// InjectGrowth is Inject's TTFT growth from the smallest to the largest k
// (0.04 means 4%); PrefillGrowth likewise; Speedup is Prefill / Inject at
// the largest k.
func (r *Result) InjectGrowth() float64 {
	a, b := r.TTFT[0], r.TTFT[len(r.TTFT)-1]
	return b.Inject.Seconds()/a.Inject.Seconds() - 1
}

// PrefillGrowth: see InjectGrowth.
func (r *Result) PrefillGrowth() float64 {
	a, b := r.TTFT[0], r.TTFT[len(r.TTFT)-1]
	return b.Prefill.Seconds()/a.Prefill.Seconds() - 1
}

// Speedup: see InjectGrowth.
func (r *Result) Speedup() float64 {
	b := r.TTFT[len(r.TTFT)-1]
	return b.Prefill.Seconds() / b.Inject.Seconds()
}

// CPUGrowth is InjectGrowth and PrefillGrowth in CPU time.
func (r *Result) CPUGrowth() (inject, prefill float64) {
	a, b := r.TTFT[0], r.TTFT[len(r.TTFT)-1]
	return b.InjectCPU.Seconds()/a.InjectCPU.Seconds() - 1, b.PrefillCPU.Seconds()/a.PrefillCPU.Seconds() - 1
}

// benchFacts is a memory stream: facts in order, with windowed encodings
// stored (each after the Window tokens of the stream before it).
func benchFacts(r *rand.Rand, n, tokens, vocab int) [][]uint32 {
	out := make([][]uint32, n)
	for i := range out {
		out[i] = make([]uint32, tokens)
		for j := range out[i] {
			out[i][j] = uint32(r.IntN(vocab))
		}
	}
	return out
}

// storeStream encodes every fact of a stream, windowed (w > 0) or standalone
// (w == 0), and puts it in store.
func storeStream(ctx context.Context, e *engine.Engine, store engine.ChunkSink, facts [][]uint32, w int) error {
	for i, f := range facts {
		var ent *chunk.Entry
		var err error
		if w > 0 {
			ent, err = e.EncodeWindow(ctx, facts[:i], w, f)
		} else {
			ent, err = e.EncodeStandalone(ctx, f)
		}
		if err != nil {
			return err
		}
		if err := store.Put(ctx, ent); err != nil {
			return fmt.Errorf("enginebench: put: %w", err)
		}
	}
	return nil
}

func promptOf(facts [][]uint32, query []uint32) []engine.Segment {
	segs := make([]engine.Segment, 0, len(facts)+1)
	for _, f := range facts {
		segs = append(segs, engine.Segment{Tokens: f, Chunk: true})
	}
	return append(segs, engine.Segment{Tokens: query})
}

// Run measures time to first token for prompt injection against KV
// injection from store, and the fidelity of approximate encodings, on e.
// The store is written with the facts' encodings; any engine.ChunkStore works (an
// in-memory one, or the cluster client).
func Run(ctx context.Context, e *engine.Engine, store engine.ChunkStore, cfg Config) (*Result, error) {
	cfg.defaults()
	res := &Result{Model: e.Config(), KVDType: e.Spec().DType, Config: cfg, Workers: e.Workers()}
	r := rand.New(rand.NewPCG(cfg.Seed, 0x62656e6368))
	vocab := e.Config().VocabSize
	maxK := slices.Max(cfg.Ks)
	stream := benchFacts(r, maxK, cfg.FactTokens, vocab)
	if err := storeStream(ctx, e, store, stream, cfg.Window); err != nil {
		return nil, err
	}
	cfg.Progress(fmt.Sprintf("stored %d facts (w=%d)", maxK, cfg.Window))
	query := benchFacts(r, 1, cfg.QueryTokens, vocab)[0]
	best := slices.Min[[]time.Duration]
	var lastCPU time.Duration
	timed := func(src engine.ChunkSource, req engine.Request) (time.Duration, *engine.Response, error) {
		// Start from a collected heap, so no run pays for the garbage of
		// the one before it.
		runtime.GC()
		c0, t0 := cputime.Process(), time.Now()
		resp, err := e.Run(ctx, src, req)
		d := time.Since(t0)
		lastCPU = cputime.Process() - c0
		return d, resp, err
	}
	for _, k := range cfg.Ks {
		segs := promptOf(stream[:k], query)
		row := TTFTRow{K: k, PromptTokens: k*cfg.FactTokens + cfg.QueryTokens}
		var pre, inj, rep, look, scat, preCPU, injCPU []time.Duration
		// One untimed run of each path warms caches and the store.
		for trial := -1; trial < cfg.Trials; trial++ {
			d, resp, err := timed(nil, engine.Request{Segments: segs})
			if err != nil {
				return nil, err
			}
			row.PrefillTL = resp.TokenLayers
			if trial >= 0 {
				pre, preCPU = append(pre, d), append(preCPU, lastCPU)
			}
			d, resp, err = timed(store, engine.Request{Segments: segs})
			if err != nil {
				return nil, err
			}
			if resp.Injected != k*cfg.FactTokens {
				return nil, fmt.Errorf("enginebench: k=%d: store injected %d of %d fact tokens", k, resp.Injected, k*cfg.FactTokens)
			}
			row.InjectTL = resp.TokenLayers
			if trial >= 0 {
				inj, look, scat = append(inj, d), append(look, resp.Lookup), append(scat, resp.Inject)
				injCPU = append(injCPU, lastCPU)
			}
			d, resp, err = timed(store, engine.Request{Segments: segs, Recompute: cfg.Recompute})
			if err != nil {
				return nil, err
			}
			row.RepairTL = resp.TokenLayers
			if trial >= 0 {
				rep = append(rep, d)
			}
		}
		row.Prefill, row.Inject, row.Repair = best(pre), best(inj), best(rep)
		// The split of the fastest injection run, not the fastest of each part.
		fastest := slices.Index(inj, row.Inject)
		row.Lookup, row.Scatter = look[fastest], scat[fastest]
		row.PrefillCPU, row.InjectCPU = best(preCPU), best(injCPU)
		res.TTFT = append(res.TTFT, row)
		cfg.Progress(fmt.Sprintf("k=%d: prefill %v, inject %v, repair %v", k, row.Prefill, row.Inject, row.Repair))
	}
	fid, err := benchFidelity(ctx, e, store, r, cfg)
	if err != nil {
		return nil, err
	}
	res.Fidelity = fid
	if res.Codecs, err = benchCodecs(ctx, e, r, cfg); err != nil {
		return nil, err
	}
	return res, nil
}

// benchFidelity compares approximate encodings with full prefill. The
// standalone and windowed rows use two streams of fresh facts, because a
// store returns only its best encoding of a content and would always pick
// the window.
func benchFidelity(ctx context.Context, e *engine.Engine, store engine.ChunkStore, r *rand.Rand, cfg Config) ([]FidelityRow, error) {
	streamLen := cfg.FidelityK + cfg.FidelityPrompts
	type variant struct {
		name string
		w    int
		rec  float64
	}
	groups := []struct {
		w        int
		variants []variant
	}{
		{0, []variant{{"standalone", 0, 0}, {"standalone", 0, cfg.Recompute}}},
		{cfg.Window, []variant{{fmt.Sprintf("window w=%d", cfg.Window), cfg.Window, 0}, {fmt.Sprintf("window w=%d", cfg.Window), cfg.Window, cfg.Recompute}}},
	}
	var rows []FidelityRow
	for _, g := range groups {
		stream := benchFacts(r, streamLen, cfg.FactTokens, e.Config().VocabSize)
		if err := storeStream(ctx, e, store, stream, g.w); err != nil {
			return nil, err
		}
		fs := make([]engine.Fidelity, len(g.variants))
		work := make([]int, len(g.variants))
		full := 0
		for p := 0; p < cfg.FidelityPrompts; p++ {
			// A run of consecutive facts, as retrieved from a conversation.
			start := r.IntN(streamLen - cfg.FidelityK + 1)
			query := benchFacts(r, 1, cfg.QueryTokens, e.Config().VocabSize)[0]
			segs := promptOf(stream[start:start+cfg.FidelityK], query)
			ref, err := e.Run(ctx, nil, engine.Request{Segments: segs})
			if err != nil {
				return nil, err
			}
			full += ref.TokenLayers
			for i, v := range g.variants {
				resp, err := e.Run(ctx, store, engine.Request{Segments: segs, Recompute: v.rec})
				if err != nil {
					return nil, err
				}
				fs[i].Add(ref.Logits, resp.Logits)
				work[i] += resp.TokenLayers
			}
		}
		for i, v := range g.variants {
			rows = append(rows, FidelityRow{Name: v.name, Recompute: v.rec, Fidelity: fs[i], WorkFraction: float64(work[i]) / float64(full)})
			cfg.Progress(fmt.Sprintf("fidelity %s r=%.2f: KL %.4g top1 %.3f", v.name, v.rec, fs[i].MeanKL(), fs[i].Top1Rate()))
		}
	}
	return rows, nil
}

// benchCodecs stores the EXACT entries of fresh prompts through every
// codec and compares injection with prefill. Each codec has its own
// in-memory store: the bench's store keeps whatever codec it was built with.
func benchCodecs(ctx context.Context, e *engine.Engine, r *rand.Rand, cfg Config) ([]CodecRow, error) {
	rows := make([]CodecRow, len(cfg.Codecs))
	stores := make([]*engine.MemStore, len(cfg.Codecs))
	for i, c := range cfg.Codecs {
		rows[i].Codec, stores[i] = c, engine.NewMemStore(c)
	}
	raw := 0
	prompts := max(1, cfg.FidelityPrompts/4)
	for p := 0; p < prompts; p++ {
		facts := benchFacts(r, cfg.FidelityK, cfg.FactTokens, e.Config().VocabSize)
		segs := promptOf(facts, benchFacts(r, 1, cfg.QueryTokens, e.Config().VocabSize)[0])
		ents, err := e.EncodePrompt(ctx, segs)
		if err != nil {
			return nil, err
		}
		ref, err := e.Run(ctx, nil, engine.Request{Segments: segs})
		if err != nil {
			return nil, err
		}
		for _, ent := range ents {
			if ent != nil {
				raw += len(ent.KV)
			}
		}
		for i, st := range stores {
			for _, ent := range ents {
				if ent != nil {
					if err := st.Put(ctx, ent); err != nil {
						return nil, err
					}
				}
			}
			resp, err := e.Run(ctx, st, engine.Request{Segments: segs})
			if err != nil {
				return nil, err
			}
			if resp.Injected != cfg.FidelityK*cfg.FactTokens {
				return nil, fmt.Errorf("enginebench: codec %v: injected %d tokens", rows[i].Codec, resp.Injected)
			}
			rows[i].Add(ref.Logits, resp.Logits)
		}
	}
	for i, st := range stores {
		rows[i].Ratio = float64(raw) / float64(st.Bytes())
		cfg.Progress(fmt.Sprintf("codec %v: ratio %.2f, KL %.3g, max |dlogit| %.3g", rows[i].Codec, rows[i].Ratio, rows[i].MeanKL(), rows[i].MaxLogit))
	}
	return rows, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

// Markdown renders the result as the tables docs/BENCHMARKS.md shows.
func (r *Result) Markdown() string {
	var b strings.Builder
	m := r.Model
	fmt.Fprintf(&b, "Model: %s, %d layers, hidden %d, %d heads, %d KV heads, head dim %d, intermediate %d, vocab %d (random weights, %v on disk, f32 compute); %d workers.\n",
		m.ModelType, m.NumLayers, m.HiddenSize, m.NumHeads, m.NumKVHeads, m.HeadDim, m.IntermediateSize, m.VocabSize, m.DType, r.Workers)
	fmt.Fprintf(&b, "Facts of %d tokens, %d-token query, stored as %v KV with a %d-token context window; best of %d runs.\n\n",
		r.Config.FactTokens, r.Config.QueryTokens, r.KVDType, r.Config.Window, r.Config.Trials)
	fmt.Fprintf(&b, "| k | prompt tokens | (a) prompt injection TTFT ms | (b) KV injection TTFT ms | (a)/(b) | (a) CPU ms | (b) CPU ms | lookup ms | rotate+scatter ms | (b) + recompute r=%.0f%% ms | token-layers (a) / (b) / recompute |\n", 100*r.Config.Recompute)
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, t := range r.TTFT {
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %.1fx | %s | %s | %s | %s | %s | %d / %d / %d |\n", t.K, t.PromptTokens, ms(t.Prefill), ms(t.Inject),
			t.Prefill.Seconds()/t.Inject.Seconds(), ms(t.PrefillCPU), ms(t.InjectCPU), ms(t.Lookup), ms(t.Scatter), ms(t.Repair), t.PrefillTL, t.InjectTL, t.RepairTL)
	}
	k0, k1 := r.TTFT[0].K, r.TTFT[len(r.TTFT)-1].K
	ci, cp := r.CPUGrowth()
	fmt.Fprintf(&b, "\nFrom k=%d to k=%d: (a) grows %+.0f%% (CPU %+.0f%%), (b) grows %+.0f%% (CPU %+.0f%%); (b) is %.1fx faster at k=%d.\n\n",
		k0, k1, 100*r.PrefillGrowth(), 100*cp, 100*r.InjectGrowth(), 100*ci, r.Speedup(), k1)
	fmt.Fprintf(&b, "Fidelity to full prefill: %d prompts of %d consecutive facts + query, next-token distribution.\n\n", r.Config.FidelityPrompts, r.Config.FidelityK)
	b.WriteString("| encoding | recompute r | top-1 agreement | mean KL (nats) | max KL | max abs logit diff | token-layers vs prefill |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.Fidelity {
		fmt.Fprintf(&b, "| %s | %.0f%% | %.3f | %.4f | %.4f | %.3f | %.0f%% |\n", f.Name, 100*f.Recompute, f.Top1Rate(), f.MeanKL(), f.MaxKL, f.MaxLogit, 100*f.WorkFraction)
	}
	if len(r.Codecs) > 0 {
		fmt.Fprintf(&b, "\nCodecs on EXACT %v entries (%d prompts of %d facts encoded after their true prefix), injection against prefill.\n\n",
			r.KVDType, r.Codecs[0].N, r.Config.FidelityK)
		b.WriteString("| codec | raw/stored bytes | top-1 agreement | mean KL (nats) | max abs logit diff |\n")
		b.WriteString("|---|---:|---:|---:|---:|\n")
		for _, c := range r.Codecs {
			fmt.Fprintf(&b, "| %v | %.2f | %.3f | %.2e | %.2e |\n", c.Codec, c.Ratio, c.Top1Rate(), c.MeanKL(), c.MaxLogit)
		}
	}
	return b.String()
}
