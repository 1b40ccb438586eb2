package workload

import (
	"fmt"
	"math"
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

// AccuracyReport is everything the accuracy benchmark writes.
type AccuracyReport struct {
	Env    Env
	Model  string // the model directory
	Result *AccuracyResult
	Curve  []CurvePoint
	// Engine and Torch are prefill speeds on the same prompts and threads;
	// TorchThreads is what PyTorch ran with.
	Engine, Torch []SpeedPoint
	TorchThreads  int
	// LogitDiff is the largest |logit| difference between the engine and
	// PyTorch over the reference prompts.
	LogitDiff float64
	Plots     []string
}

func pct(x float64) string { return fmt.Sprintf("%.1f", 100*x) }

// target is one of the bounds, measured.
type target struct {
	what     string
	got, ref float64
	within   float64 // points
	equal    bool
	n        int // prompts behind got (and ref)
}

func (r *AccuracyReport) targets() []target {
	res := r.Result
	find := func(name string) int {
		for i, m := range res.Methods {
			if m.Name == name {
				return i
			}
		}
		return -1
	}
	acc := func(task string, k, m int) float64 {
		if m < 0 {
			return math.NaN()
		}
		if s := res.Cell(Cell{task, k}, m); s != nil {
			return s.Accuracy()
		}
		return math.NaN()
	}
	all := func(m int) float64 {
		if m < 0 {
			return math.NaN()
		}
		var ok, n int
		for ci := range res.Cells {
			ok += res.Stats[ci][m].Correct
			n += res.Stats[ci][m].N()
		}
		if n == 0 {
			return math.NaN()
		}
		return float64(ok) / float64(n)
	}
	cellN := func(task string, k int) int {
		if s := res.Cell(Cell{task, k}, 0); s != nil {
			return s.N()
		}
		return 0
	}
	allN := 0
	for ci := range res.Cells {
		allN += res.Stats[ci][0].N()
	}
	w := res.Config.Window
	var ts []target
	for _, name := range []string{"APPROX standalone, r=15%", fmt.Sprintf("APPROX window w=%d, r=15%%", w), "APPROX after system prompt, r=15%"} {
		ts = append(ts, target{what: "facts k=50, " + name + " within 1 point of full prefill",
			got: acc("facts", 50, find(name)), ref: acc("facts", 50, 0), within: 1, n: cellN("facts", 50)})
	}
	// Each codec against raw, for EXACT hits and for window encodings at
	// the codec ratio (whose raw method has no codec suffix).
	win := fmt.Sprintf("APPROX window w=%d, r=%.0f%%", w, 100*res.Config.CodecRecompute)
	for _, base := range []struct{ raw, prefix string }{{"kvmesh EXACT, raw", "kvmesh EXACT, "}, {win, win + ", "}} {
		raw := all(find(base.raw))
		ts = append(ts,
			target{what: base.prefix + "lossless identical to raw (all tasks)", got: all(find(base.prefix + "lossless")), ref: raw, equal: true, n: allN},
			target{what: base.prefix + "int8 within 1 point of raw (all tasks)", got: all(find(base.prefix + "int8")), ref: raw, within: 1, n: allN})
	}
	return ts
}

// Markdown renders the report.
func (r *AccuracyReport) Markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	res := r.Result
	env := r.Env
	m := env.Model
	p("# Answer accuracy of kvmesh's KV reuse on a trained model\n\n")
	p("Made by `make bench-accuracy` (`%s`) in %v; nothing here is edited by hand.\n\n", env.Command, env.Elapsed.Round(time.Second))
	p("The model (`%s`) is a Llama-architecture decoder trained from scratch by `train/train.py` on the\n", r.Model)
	p("synthetic corpus of `train/gen.py` (see `%s/README.md` for the command and seed): %d layers, hidden %d,\n", r.Model, m.NumLayers, m.HiddenSize)
	p("%d heads of %d, %d KV heads, intermediate %d, vocabulary %d, RMSNorm, SwiGLU, NeoX RoPE (theta %g), %s weights.\n",
		m.NumHeads, m.HeadDim, m.NumKVHeads, m.IntermediateSize, m.VocabSize, m.RopeTheta, m.DType)
	p("Every prompt is a shared system prompt, k chunks and a question; the answer is decoded greedily up to\n")
	p("its stop token and must equal the expected answer token for token (exact match). The people and\n")
	p("entities of the evaluation set are sub-token combinations the training stream never contains.\n\n")
	p("- facts: k memory facts `<person> <relation> <value> .` in random order, question `? <person> <relation>`;\n")
	p("- rag: k passages of 2-3 sentences about entities, question `? <entity> <attribute>`, answer a span (1-3 tokens) of one passage;\n")
	p("- twohop: k facts, half `<person> works_at <entity> .`, half `<entity> in <city> .`; question `? <person> city`.\n\n")
	p("Served by the reference engine (%d workers, KV %s, stored with each codec) from a local cluster of %d nodes (R=%d),\n", env.Workers, env.KVDType, env.Nodes, env.Replicas)
	p("%d prompts per task and k; CPU: %d x %s, %s. Load average at start %s, at end %s (the machine is shared:\n", r.promptsPerCell(), env.CPUs, env.CPUModel, env.GoVersion, env.LoadStart, env.LoadEnd)
	p("wall times are inflated by other work; compute is counted in tokens).\n\n")
	p("Ways: full prefill (no store); prefix caching (vLLM/SGLang rule: only the leading EXACT chunks, here the system\n")
	p("prompt); kvmesh EXACT (an earlier identical request wrote its chunks back keyed by their prefix); kvmesh APPROXIMATE with\n")
	p("chunks encoded standalone, after the system prompt and a window of the w = %d tokens before them in the order they\n", res.Config.Window)
	p("were written (a memory store's order, not the prompt's), or right after the system prompt, served with CacheBlend\n")
	p("recompute r (layer-1 key deviation picks the tokens).\n\n")

	p("## Targets\n\n| target | prompts | measured | reference | met |\n|---|---|---|---|---|\n")
	for _, t := range r.targets() {
		met := "no"
		switch {
		case math.IsNaN(t.got) || math.IsNaN(t.ref):
			met = "not measured"
		case !t.equal && t.n > 0 && 100/float64(t.n) > t.within:
			// One prompt moves the score by more than the bound: the
			// run is too small to decide the target either way.
			met = fmt.Sprintf("undecided: one prompt is %.1f points", 100/float64(t.n))
		case t.equal && t.got == t.ref:
			met = "yes"
		case !t.equal && 100*(t.ref-t.got) <= t.within+1e-9:
			met = "yes"
		}
		p("| %s | %d | %s%% | %s%% | %s |\n", t.what, t.n, pct(t.got), pct(t.ref), met)
	}
	p("\nThe model's own target, >= 95%% exact match with full prefill on held-out facts and passages at every k, is the\nfull prefill row below.\n\n")

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
			p(" %s |", pct(res.Stats[ci][mi].Accuracy()))
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
	p("Prefill of one prompt (best of 3) by the reference engine (%d workers) and by a plain PyTorch forward of the same\n", env.Workers)
	p("model (`train/reference.py`, torch %d threads, Debian python3-torch with OpenBLAS). The engine's logits match\n", r.TorchThreads)
	p("PyTorch's on the reference prompts to %.2g (largest |difference|).\n\n| tokens | engine tok/s | PyTorch tok/s |\n|---|---|---|\n", r.LogitDiff)
	for i, e := range r.Engine {
		t := "-"
		if i < len(r.Torch) {
			t = fmt.Sprintf("%.0f", r.Torch[i].TokensPerS)
		}
		p("| %d | %.0f | %s |\n", e.Tokens, e.TokensPerS, t)
	}
	p("\nBoth ran on the shared machine at different moments; PyTorch's numbers were taken when reference.json was written.\n")

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
			// The plot keeps the ways that differ: raw codec, and r = 15%.
			if me.Codec != chunk.CodecRaw || (!me.Full && !me.Prefix && me.Enc != EncExact && me.Recompute != 0.15 && me.Recompute != 0) {
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
