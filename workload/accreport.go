package workload

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kvmesh/kvmesh/chunk"
)

// CurvePoint is one evaluation of the training run (train/train.py's
// curve.jsonl): held-out exact match by "task@k" on a small set.
type CurvePoint struct {
	Step  int                `json:"step"`
	TimeS float64            `json:"time_s"`
	MaxK  int                `json:"maxk"`
	Loss  float64            `json:"loss"`
	Acc   map[string]float64 `json:"acc"`
}

// SpeedPoint is a prefill speed measurement.
type SpeedPoint struct {
	Tokens     int     `json:"tokens"`
	Seconds    float64 `json:"seconds"`
	TokensPerS float64 `json:"tokens_per_s"`
}

// SpeedCompare is one prompt's prefill speed by the engine and by PyTorch
// at the same thread count, measured in the same run one after the other.
type SpeedCompare struct {
	Threads       int
	Tokens        int
	Engine, Torch float64 // tokens per second, best of their runs; Torch 0 if not measured
}

// AccuracyReport is everything the accuracy benchmark writes.
type AccuracyReport struct {
	Env    Env
	Model  string // the model directory
	Result *AccuracyResult
	Curve  []CurvePoint
	// Speed compares the engine's prefill with PyTorch's on the same
	// prompts; TorchNote says how PyTorch ran (or why it did not).
	Speed     []SpeedCompare
	TorchNote string
	// LogitDiff is the largest |logit| difference between the engine and
	// PyTorch over the reference prompts.
	LogitDiff float64
	// CPU is the process CPU time the run took.
	CPU   time.Duration
	Plots []string
}

func pct(x float64) string { return fmt.Sprintf("%.1f", 100*x) }

// target is one accuracy bound the report checks (a method within some
// points of a reference, or identical to it), measured: method got against
// method ref (indices into Result.Methods, -1 when absent) over cells.
type target struct {
	what     string
	got, ref int
	cells    []int
	within   float64 // points; the target is got >= ref - within
	equal    bool    // the target is the same answer on every prompt
}

// pooled sums method m's results over cells: correct answers and prompts.
func (r *AccuracyReport) pooled(m int, cells []int) (k, n int) {
	for _, ci := range cells {
		s := &r.Result.Stats[ci][m]
		k += s.Correct
		n += s.N()
	}
	return k, n
}

// paired compares methods a and b prompt by prompt over cells.
func (r *AccuracyReport) paired(a, b int, cells []int) (p Paired, differ int) {
	for _, ci := range cells {
		sa, sb := &r.Result.Stats[ci][a], &r.Result.Stats[ci][b]
		for i := range min(len(sa.Right), len(sb.Right)) {
			switch {
			case sa.Right[i] && sb.Right[i]:
				p.Both++
			case sa.Right[i]:
				p.OnlyA++
			case sb.Right[i]:
				p.OnlyB++
			default:
				p.Neither++
			}
			if !slices.Equal(sa.Answers[i], sb.Answers[i]) {
				differ++
			}
		}
	}
	return p, differ
}

// method is the index of the named method, or -1.
func (r *AccuracyReport) method(name string) int {
	for i, m := range r.Result.Methods {
		if m.Name == name {
			return i
		}
	}
	return -1
}

// cellsOf are the indices of task's cells (every cell when task is "")
// and, when k > 0, only that k.
func (r *AccuracyReport) cellsOf(task string, k int) []int {
	var out []int
	for ci, c := range r.Result.Cells {
		if (task == "" || c.Task == task) && (k == 0 || c.K == k) {
			out = append(out, ci)
		}
	}
	return out
}

func (r *AccuracyReport) targets() []target {
	res := r.Result
	w := res.Config.Window
	var ts []target
	for _, name := range []string{"APPROX standalone, r=15%", fmt.Sprintf("APPROX window w=%d, r=15%%", w), "APPROX after system prompt, r=15%"} {
		ts = append(ts, target{what: "facts k=50, " + name + " within 1 point of full prefill",
			got: r.method(name), ref: 0, cells: r.cellsOf("facts", 50), within: 1})
	}
	// Each codec against raw, for EXACT hits and for window encodings at
	// the codec ratio (whose raw method has no codec suffix).
	win := fmt.Sprintf("APPROX window w=%d, r=%.0f%%", w, 100*res.Config.CodecRecompute)
	all := r.cellsOf("", 0)
	for _, base := range []struct{ raw, prefix string }{{"kvmesh EXACT, raw", "kvmesh EXACT, "}, {win, win + ", "}} {
		raw := r.method(base.raw)
		ts = append(ts,
			target{what: base.prefix + "lossless identical to raw (all tasks)", got: r.method(base.prefix + "lossless"), ref: raw, cells: all, equal: true},
			target{what: base.prefix + "int8 within 1 point of raw (all tasks)", got: r.method(base.prefix + "int8"), ref: raw, cells: all, within: 1})
	}
	return ts
}

// accCell renders k of n as a percentage with its count and Wilson 95%
// interval.
func accCell(k, n int) string {
	if n == 0 {
		return "-"
	}
	lo, hi := Wilson(k, n)
	return fmt.Sprintf("%.1f (%d/%d, %.0f-%.0f)", 100*float64(k)/float64(n), k, n, 100*lo, 100*hi)
}

// diffCell renders a paired difference in points with its 95% interval.
func diffCell(p Paired) string {
	lo, hi := p.DiffInterval()
	return fmt.Sprintf("%+.1f [%+.1f, %+.1f]", 100*p.Diff(), 100*lo, 100*hi)
}

// verdict decides a target from the interval of got - ref: met when the
// whole interval is above -within, not met when it is all below, and
// undecided otherwise (more prompts needed); "identical" targets are met
// when no answer differs.
func (t target) verdict(p Paired, differ int) string {
	if t.equal {
		if differ == 0 {
			return "yes"
		}
		return fmt.Sprintf("no: %d answers differ", differ)
	}
	lo, hi := p.DiffInterval()
	switch b := -t.within / 100; {
	case lo >= b:
		return "yes"
	case hi < b:
		return "no"
	}
	return "undecided: the interval straddles the bound"
}

// Markdown renders the report.
func (r *AccuracyReport) Markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	res := r.Result
	env := r.Env
	m := env.Model
	p("# Answer accuracy of kvmesh's KV reuse on a trained model\n\n")
	p("Made by `%s` (`make bench-accuracy`, or `make bench-accuracy-facts50` for the 400 facts prompts at k=50) in %v; nothing here is edited by hand.\n\n", env.Command, env.Elapsed.Round(time.Second))
	p("The model (`%s`) is a Llama-architecture decoder trained from scratch by `train/train.py` on the\n", r.Model)
	p("synthetic corpus of `train/gen.py` (see `train/README.md` for the command and seed): %d layers, hidden %d,\n", m.NumLayers, m.HiddenSize)
	p("%d heads of %d, %d KV heads, intermediate %d, vocabulary %d, RMSNorm, SwiGLU, NeoX RoPE (theta %g), %s weights.\n",
		m.NumHeads, m.HeadDim, m.NumKVHeads, m.IntermediateSize, m.VocabSize, m.RopeTheta, m.DType)
	p("Every prompt is a shared system prompt, k chunks and a question; the answer is decoded greedily up to\n")
	p("its stop token and must equal the expected answer token for token (exact match). The people and\n")
	p("entities of the evaluation set are sub-token combinations the training stream never contains; no two\n")
	p("names in one prompt share a sub-token.\n\n")
	p("- facts: k memory facts `<person> <relation> <value> .` in random order, question `? <person> <relation>`;\n")
	p("- rag: k passages of 2-3 sentences about an entity, each naming it, question `? <entity> <attribute>`, answer a span of one passage (one token, or a person's two);\n")
	p("- twohop: k facts, half `<person> works_at <entity> .`, half `<entity> in <city> .`; question `? <person> city`.\n\n")
	p("Served by the reference engine (%d workers, KV %s, stored with each codec) from a local cluster of %d nodes (R=%d),\n", env.Workers, env.KVDType, env.Nodes, env.Replicas)
	p("%d prompts per task and k", r.promptsPerCell())
	if res.Budgeted {
		p(" (the run's time budget, %v, stopped it before the set's end; prompts are taken round-robin over the cells)", res.Config.Budget)
	}
	p("; CPU: %d x %s, %s. Load average at start %s, at end %s (the machine is shared:\n", env.CPUs, env.CPUModel, env.GoVersion, env.LoadStart, env.LoadEnd)
	p("wall times are inflated by other work; compute is counted in tokens). The run took %v of wall time and %v of CPU time.\n\n",
		env.Elapsed.Round(time.Second), r.CPU.Round(time.Second))
	p("Every accuracy comes with its count and its Wilson 95%% interval, e.g. `85.0 (34/40, 71-93)`. A difference between two\n")
	p("ways is taken prompt by prompt (both ran on the same prompts) with Tango's paired score 95%% interval, in points.\n\n")
	p("Ways: full prefill (no store); prefix caching (vLLM/SGLang rule: only the leading EXACT chunks, here the system\n")
	p("prompt); kvmesh EXACT (an earlier identical request wrote its chunks back keyed by their prefix); kvmesh APPROXIMATE with\n")
	p("chunks encoded standalone, after the system prompt and a window of the w = %d tokens before them in the order they\n", res.Config.Window)
	p("were written (a memory store's order, not the prompt's), or right after the system prompt, served with CacheBlend\n")
	p("recompute r (layer-1 key deviation picks the tokens unless the way says `select attention`: the attention the\n")
	p("question pays them at layer 1, or `select both`; `bound b`: a chunk whose relative key deviation at layer 1 exceeds b\n")
	p("is recomputed whole).\n\n")

	p("## Targets\n\nMet when the whole 95%% interval of the difference lies within the bound, not met when it lies wholly\n")
	p("outside, undecided otherwise. A 1-point bound needs a few hundred prompts: with no answer changed the interval's\n")
	p("half-width is 3.84/(n+3.84) for n prompts (380 prompts for 1 point), so at 40 prompts a cell cannot show it.\n\n")
	p("| target | measured | reference | difference (points) | met |\n|---|---|---|---|---|\n")
	for _, t := range r.targets() {
		if t.got < 0 || t.ref < 0 {
			p("| %s | - | - | - | not measured |\n", t.what)
			continue
		}
		pr, differ := r.paired(t.got, t.ref, t.cells)
		gk, gn := r.pooled(t.got, t.cells)
		rk, rn := r.pooled(t.ref, t.cells)
		d := diffCell(pr)
		if t.equal {
			d = fmt.Sprintf("%d of %d answers differ", differ, pr.N())
		}
		p("| %s | %s | %s | %s | %s |\n", t.what, accCell(gk, gn), accCell(rk, rn), d, t.verdict(pr, differ))
	}
	p("\nThe model's own target, >= 95%% exact match with full prefill on held-out facts and passages at every k, is the\nfull prefill row below.\n\n")

	r.attempts(p)
	p("## Exact match (%%) per task and k\n\n| way |")
	for _, c := range res.Cells {
		p(" %s k=%d |", c.Task, c.K)
	}
	p("\n|---|")
	for range res.Cells {
		p("---|")
	}
	p("\n")
	for mi, me := range res.Methods {
		p("| %s |", me.Name)
		for ci := range res.Cells {
			s := &res.Stats[ci][mi]
			p(" %s |", accCell(s.Correct, s.N()))
		}
		p("\n")
	}

	p("\n## Agreement with full prefill\n\nPer task over every k: answers equal to full prefill's (answer for answer), top-1 agreement of the\n")
	p("first answer token's distribution, and mean KL(full || way) of it in nats.\n\n| way |")
	tasks := r.tasks()
	for _, t := range tasks {
		p(" %s same answer %% | %s top-1 %% | %s KL |", t, t, t)
	}
	p("\n|---|")
	for range tasks {
		p("---|---|---|")
	}
	p("\n")
	for mi, me := range res.Methods {
		p("| %s |", me.Name)
		for _, t := range tasks {
			var same, n int
			var f Stats
			for ci, c := range res.Cells {
				if c.Task != t {
					continue
				}
				s := &res.Stats[ci][mi]
				same += s.SameAsFull
				n += s.N()
				f.Fid.N += s.Fid.N
				f.Fid.Top1 += s.Fid.Top1
				f.Fid.SumKL += s.Fid.SumKL
			}
			p(" %s | %s | %.4f |", pct(float64(same)/float64(max(n, 1))), pct(f.Fid.Top1Rate()), f.Fid.MeanKL())
		}
		p("\n")
	}

	p("\n## Time to first token and compute\n\nTTFT p50 in ms (lookup, injection and prefill up to the first answer token's logits) and, in brackets,\n")
	p("the share of full prefill's (token, layer) computations the way spent, per task and k.\n\n| way |")
	for _, c := range res.Cells {
		p(" %s k=%d |", c.Task, c.K)
	}
	p("\n|---|")
	for range res.Cells {
		p("---|")
	}
	p("\n")
	for mi, me := range res.Methods {
		p("| %s |", me.Name)
		for ci := range res.Cells {
			s, full := &res.Stats[ci][mi], &res.Stats[ci][0]
			p(" %s (%s%%) |", msf(s.P(0.5)), pct(float64(s.TokenLayers)/float64(max(full.TokenLayers, 1))))
		}
		p("\n")
	}

	p("\n## The baseline: prefill speed, engine and PyTorch\n\n")
	p("Prefill of one prompt by the reference engine and by a plain PyTorch forward of the same model (`train/reference.py`,\n")
	p("torch's own attention and OpenBLAS matmuls), at the same thread count, measured in this run one after the other\n")
	p("(PyTorch, then the engine, for each thread count; best of 3 runs after a warm-up each, and the best over the rounds).\n%s\n", r.TorchNote)
	p("The engine's logits match PyTorch's on the reference prompts to %.2g (largest |difference|).\n\n", r.LogitDiff)
	p("Two things make PyTorch look slower than it is when measured naively on this shared machine: OpenMP's default\n")
	p("spin-waiting (with 2 threads and the other core busy, a forward took several times longer than with 1 thread, the\n")
	p("~160 tok/s once recorded in reference.json), hence OMP_WAIT_POLICY=PASSIVE; and the first call's warm-up, which\n")
	p("reference.py leaves out. The PyTorch forward (train/model.py) materialises every head's t x t attention scores\n")
	p("(Debian's torch 1.13 has no fused attention), so its speed falls with the prompt's length.\n\n")
	p("| threads | tokens | engine tok/s | PyTorch tok/s | engine / PyTorch |\n|---|---|---|---|---|\n")
	for _, sp := range r.Speed {
		t, ratio := "-", "-"
		if sp.Torch > 0 {
			t, ratio = fmt.Sprintf("%.0f", sp.Torch), fmt.Sprintf("%.1fx", sp.Engine/sp.Torch)
		}
		p("| %d | %d | %.0f | %s | %s |\n", sp.Threads, sp.Tokens, sp.Engine, t, ratio)
	}
	p("\n")

	if len(r.Curve) > 0 {
		p("\n## Training curve\n\nHeld-out exact match (teacher-forced greedy, on a small set of its own seed) during training; the largest k\n")
		p("of the curriculum in the maxk column.\n\n| step | time (s) | maxk | loss |")
		keys := curveKeys(r.Curve)
		for _, k := range keys {
			p(" %s |", k)
		}
		p("\n|---|---|---|---|")
		for range keys {
			p("---|")
		}
		p("\n")
		every := max(1, len(r.Curve)/12)
		for i, c := range r.Curve {
			if i%every != 0 && i != len(r.Curve)-1 {
				continue
			}
			p("| %d | %.0f | %d | %.4f |", c.Step, c.TimeS, c.MaxK, c.Loss)
			for _, k := range keys {
				p(" %s |", pct(c.Acc[k]))
			}
			p("\n")
		}
	}
	if len(r.Plots) > 0 {
		p("\n## Plots\n\n")
		for _, f := range r.Plots {
			p("![%s](%s)\n\n", f, f)
		}
	}
	return b.String()
}

func (r *AccuracyReport) promptsPerCell() int {
	n := 0
	for ci := range r.Result.Cells {
		n = max(n, r.Result.Stats[ci][0].N())
	}
	return n
}

func (r *AccuracyReport) tasks() []string {
	var ts []string
	for _, c := range r.Result.Cells {
		if len(ts) == 0 || ts[len(ts)-1] != c.Task {
			ts = append(ts, c.Task)
		}
	}
	return ts
}

func curveKeys(cs []CurvePoint) []string {
	var keys []string
	for k := range cs[len(cs)-1].Acc {
		keys = append(keys, k)
	}
	// task@k sorted by task, then numerically by k.
	slices.SortFunc(keys, func(a, b string) int {
		ta, ka, _ := strings.Cut(a, "@")
		tb, kb, _ := strings.Cut(b, "@")
		if c := strings.Compare(ta, tb); c != 0 {
			return c
		}
		x, _ := strconv.Atoi(ka)
		y, _ := strconv.Atoi(kb)
		return x - y
	})
	return keys
}

// WritePlots writes accuracy against k per way for each task, and the
// training curve, into dir.
func (r *AccuracyReport) WritePlots(dir string) error {
	save := func(file, title, x, y string, args []any) error {
		p := plot.New()
		p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
		p.Y.Min, p.Y.Max = 0, 100
		if err := plotutil.AddLinePoints(p, args...); err != nil {
			return err
		}
		p.Legend.Top, p.Legend.Left = false, true
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, file)); err != nil {
			return fmt.Errorf("workload: plot %s: %w", file, err)
		}
		r.Plots = append(r.Plots, file)
		return nil
	}
	res := r.Result
	for _, t := range r.tasks() {
		var args []any
		for mi, me := range res.Methods {
			// The plot keeps the ways that differ: raw codec, and r = 15%,
			// deviation selection and no bound.
			if me.Codec != chunk.CodecRaw || me.Select != 0 || me.Bound != 0 ||
				(!me.Full && !me.Prefix && me.Enc != EncExact && me.Recompute != 0.15 && me.Recompute != 0) {
				continue
			}
			var xy plotter.XYs
			for ci, c := range res.Cells {
				if c.Task == t {
					xy = append(xy, plotter.XY{X: float64(c.K), Y: 100 * res.Stats[ci][mi].Accuracy()})
				}
			}
			args = append(args, me.Name, xy)
		}
		if err := save("accuracy_"+t+".png", t+": exact match against k", "k (chunks)", "exact match (%)", args); err != nil {
			return err
		}
	}
	if len(r.Curve) > 0 {
		var args []any
		for _, k := range curveKeys(r.Curve) {
			var xy plotter.XYs
			for _, c := range r.Curve {
				xy = append(xy, plotter.XY{X: float64(c.Step), Y: 100 * c.Acc[k]})
			}
			args = append(args, k, xy)
		}
		if err := save("accuracy_training.png", "Training: held-out exact match", "step", "exact match (%)", args); err != nil {
			return err
		}
	}
	return nil
}

// attempts writes the tables of the recompute variants: token selection,
// and the fallback bound.
func (r *AccuracyReport) attempts(p func(string, ...any)) {
	res := r.Result
	cfg := &res.Config
	all := r.cellsOf("", 0)
	encs := []Encoding{EncStandalone, EncWindow}
	// row writes one way's pooled results against full prefill.
	type pooled struct {
		k, n, same, fall, approx, tl, fullTL int
		ttft                                 []time.Duration
	}
	pool := func(m int) pooled {
		var o pooled
		for _, ci := range all {
			s, f := &res.Stats[ci][m], &res.Stats[ci][0]
			o.k, o.n, o.same = o.k+s.Correct, o.n+s.N(), o.same+s.SameAsFull
			o.fall, o.approx = o.fall+s.Fallbacks, o.approx+s.Approx
			o.tl, o.fullTL = o.tl+s.TokenLayers, o.fullTL+f.TokenLayers
			o.ttft = append(o.ttft, s.TTFT...)
		}
		return o
	}
	taskAcc := func(m int, task string, k int) string {
		kk, n := r.pooled(m, r.cellsOf(task, k))
		return accCell(kk, n)
	}
	p("## Which tokens to recompute\n\nAt r = %.0f%%, the tokens recomputed after layer 1 chosen by key deviation (CacheBlend's rule),\n", 100*cfg.CodecRecompute)
	p("by the attention the question pays them at layer 1, or by both (the sum of the two scores, each divided by its\n")
	p("largest value). Exact match over every task and k, the difference from full prefill prompt by prompt, per task.\n\n")
	p("| way | all tasks | vs full prefill (points) | facts k=50 | rag | twohop | same answer as full %% | compute %% |\n|---|---|---|---|---|---|---|---|\n")
	for _, enc := range encs {
		base := cfg.approxName(enc, cfg.CodecRecompute)
		names := []string{base}
		for _, sel := range cfg.Selections {
			names = append(names, base+", select "+sel.String())
		}
		for _, name := range names {
			m := r.method(name)
			if m < 0 {
				continue
			}
			o := pool(m)
			pr, _ := r.paired(m, 0, all)
			p("| %s | %s | %s | %s | %s | %s | %s | %s |\n", name, accCell(o.k, o.n), diffCell(pr), taskAcc(m, "facts", 50),
				taskAcc(m, "rag", 0), taskAcc(m, "twohop", 0), pct(float64(o.same)/float64(max(o.n, 1))), pct(float64(o.tl)/float64(max(o.fullTL, 1))))
		}
	}
	p("\n## Guardrail: falling back to recomputing a chunk\n\n")
	p("Each APPROXIMATE chunk's relative key deviation at layer 1, sqrt(sum |k_fresh - k_stored|^2 / sum |k_fresh|^2) over its\n")
	p("tokens, is measured during the pass; a chunk above the bound b is recomputed whole, the r = %.0f%% selection picks among\n", 100*cfg.CodecRecompute)
	p("the others. The deviations measured (quantiles over the APPROXIMATE chunks of every prompt):\n\n| encoding | chunks | p10 | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|---|\n")
	for _, enc := range encs {
		m := r.method(cfg.approxName(enc, cfg.CodecRecompute))
		if m < 0 {
			continue
		}
		var ds []float64
		for _, ci := range all {
			ds = append(ds, res.Stats[ci][m].Deviations...)
		}
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		q := func(f float64) float64 { return Quantile(ds, f) }
		p("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", enc, len(ds), q(0.1), q(0.5), q(0.9), q(0.99), ds[len(ds)-1])
	}
	p("\nThe bound's effect (every task and k pooled; compute is the share of full prefill's (token, layer) computations,\n")
	p("TTFT the median over every prompt):\n\n")
	p("| way | all tasks | vs full prefill (points) | twohop | chunks recomputed whole %% | compute %% | TTFT p50 ms |\n|---|---|---|---|---|---|---|\n")
	for _, enc := range encs {
		base := cfg.approxName(enc, cfg.CodecRecompute)
		names := []string{base}
		for _, b := range cfg.Bounds {
			names = append(names, fmt.Sprintf("%s, bound %g", base, b))
		}
		for _, name := range names {
			m := r.method(name)
			if m < 0 {
				continue
			}
			o := pool(m)
			pr, _ := r.paired(m, 0, all)
			p("| %s | %s | %s | %s | %s | %s | %s |\n", name, accCell(o.k, o.n), diffCell(pr), taskAcc(m, "twohop", 0),
				pct(float64(o.fall)/float64(max(o.approx, 1))), pct(float64(o.tl)/float64(max(o.fullTL, 1))), msf(Quantile(o.ttft, 0.5)))
		}
	}
	if m := r.method("full prefill"); m >= 0 {
		p("| full prefill | %s | - | %s | - | 100.0 | %s |\n", func() string { k, n := r.pooled(m, all); return accCell(k, n) }(),
			taskAcc(m, "twohop", 0), msf(Quantile(pool(m).ttft, 0.5)))
	}
	p("\n")
}
