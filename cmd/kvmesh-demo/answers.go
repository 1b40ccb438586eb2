package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/workload"
)

// Ways of answering a held-out prompt.
const (
	ansPrompt     = iota // prompt injection: full prefill
	ansExact             // KV injection of EXACT entries (an earlier identical request's write-back)
	ansSystem            // APPROXIMATE: chunks encoded right after the system prompt, recompute r
	ansWindow            // APPROXIMATE: chunks encoded after the system prompt and a window, recompute r
	ansStandalone        // APPROXIMATE: chunks encoded alone, recompute r and the guardrail
	numAns
)

// ansEncoding is how the store holds a way's chunks.
var ansEncoding = [numAns]workload.Encoding{ansExact: workload.EncExact, ansSystem: workload.EncSystem,
	ansWindow: workload.EncWindow, ansStandalone: workload.EncStandalone}

// answerReps is how many times each way serves a prompt, timed each time:
// a cell's TTFT is the median of reps × prompts runs, which a burst of
// load on a shared machine moves less than a median of a few.
const answerReps = 3

// answerWay is one way's results in one (task, k).
type answerWay struct {
	right, same int // answers equal to the expected one; to prompt injection's
	ttft        []time.Duration
	// tokenLayers is what the way's forward passes computed, full what
	// full prefill computes for the same prompts (tokens × layers).
	tokenLayers, full int
	fallbacks, approx int // chunks the guardrail recomputed whole; APPROXIMATE chunks
}

func (w *answerWay) add(o *answerWay) {
	w.right += o.right
	w.same += o.same
	w.ttft = append(w.ttft, o.ttft...)
	w.tokenLayers += o.tokenLayers
	w.full += o.full
	w.fallbacks += o.fallbacks
	w.approx += o.approx
}

// computed is the share of full prefill's (token, layer) computations the
// way did.
func (w *answerWay) computed() float64 { return float64(w.tokenLayers) / float64(max(w.full, 1)) }

type answerCell struct {
	task       string
	k, prompts int
	tokens     int // prompt tokens, summed
	ways       [numAns]answerWay
}

// fidelityRow is one encoding at one recompute ratio, against full prefill,
// on the held-out prompts answered.
type fidelityRow struct {
	enc               workload.Encoding
	recompute         float64
	f                 engine.Fidelity
	identical         int // prompts whose logits are bit-identical to prefill's
	tokenLayers, full int
}

// answers is what measureAnswers measured.
type answers struct {
	cells    []answerCell
	fidelity []fidelityRow
}

// total sums a way over every cell.
func (a *answers) total(way int) answerWay {
	var t answerWay
	for i := range a.cells {
		t.add(&a.cells[i].ways[way])
	}
	return t
}

// measureAnswers serves the first cfg.AnswerPrompts prompts of every task
// and k of the trained model's evaluation set through the engine's node:
// prompt injection; KV injection of the prompt's chunks as an earlier
// identical request wrote them back (EXACT); and KV injection of
// APPROXIMATE encodings, the chunks encoded after the shared system prompt,
// after it and a window of the chunks written before (in a random order:
// a memory's order, not the prompt's), and alone, all repaired with
// recompute r (the last with the guardrail too). Each approximate encoding
// has its own engine on the same weights, so its entries are the only ones
// its lookups find. The entries are put before each timed request; TTFT is
// the request alone. It also measures, on the same prompts, every
// encoding's fidelity to full prefill at r = 0, r and 1.
func measureAnswers(ctx context.Context, cfg demoConfig, exact *servingEngine, c *client.Client, local *node.Node, weights *engine.Weights,
	kvd chunk.DType, cacheTokens int, log *slog.Logger, set *workload.EvalSet, stderr io.Writer) (*answers, error) {
	var engines [numAns]*servingEngine
	engines[ansExact] = exact
	for _, way := range []int{ansSystem, ansWindow, ansStandalone} {
		se, err := newServingEngine(ctx, c, local, weights, "kvmesh-demo/"+ansEncoding[way].String(), kvd, cacheTokens, log)
		if err != nil {
			return nil, err
		}
		defer se.Close()
		engines[way] = se
	}
	res := &answers{}
	fid := map[[2]int]int{} // row of res.fidelity by (way, r index)
	rs := []float64{0, cfg.Recompute, 1}
	for _, way := range []int{ansExact, ansSystem, ansWindow, ansStandalone} {
		for ri, r := range rs {
			if way == ansExact && ri > 0 {
				break // no APPROXIMATE tokens: r changes nothing
			}
			fid[[2]int{way, ri}] = len(res.fidelity)
			res.fidelity = append(res.fidelity, fidelityRow{enc: ansEncoding[way], recompute: r})
		}
	}
	limit := set.AnswerLimit()
	put := func(ents []*chunk.Entry) error {
		for _, ent := range ents {
			if ent == nil {
				continue
			}
			blob, err := chunk.Encode(nil, ent, c.Codec())
			if err != nil {
				return err
			}
			if _, err := c.Put(ctx, blob); err != nil {
				return fmt.Errorf("demo: put: %w", err)
			}
		}
		return nil
	}
	layers := exact.Config().NumLayers
	for pi := range set.Prompts {
		p := &set.Prompts[pi]
		i := slices.IndexFunc(res.cells, func(c answerCell) bool { return c.task == p.Task && c.k == p.K })
		if i < 0 {
			res.cells = append(res.cells, answerCell{task: p.Task, k: p.K})
			i = len(res.cells) - 1
		}
		cell := &res.cells[i]
		if cell.prompts >= cfg.AnswerPrompts {
			continue
		}
		cell.prompts++
		segs := p.Segments()
		for _, sg := range segs {
			cell.tokens += len(sg.Tokens)
		}
		order := rand.New(rand.NewPCG(cfg.Seed, uint64(pi))).Perm(len(p.Chunks))
		var full []uint32
		var ref []float32
		for way := range numAns {
			se := engines[way]
			if way == ansPrompt {
				se = exact
			} else {
				ents, err := workload.EncodeEval(ctx, se.Engine, ansEncoding[way], p, order, cfg.Window)
				if err != nil {
					return nil, err
				}
				if err := put(ents); err != nil {
					return nil, err
				}
			}
			req := engine.Request{Segments: segs}
			if way >= ansSystem {
				req.Recompute = cfg.Recompute
			}
			if way == ansStandalone {
				req.FallbackBound = cfg.Fallback
			}
			w := &cell.ways[way]
			var resp *engine.Response
			for rep := range answerReps {
				req.Keep = rep == answerReps-1
				t0 := time.Now()
				var err error
				if way == ansPrompt {
					resp, err = se.Run(ctx, nil, req)
				} else {
					resp, err = se.RunInjected(ctx, se.inj, req)
				}
				w.ttft = append(w.ttft, time.Since(t0))
				if err != nil {
					return nil, err
				}
			}
			w.tokenLayers += resp.TokenLayers
			w.full += resp.Tokens * layers
			w.fallbacks += resp.Fallbacks
			for _, cr := range resp.Chunks {
				if cr.Match == chunk.MatchApproximate {
					w.approx++
				}
			}
			logits := resp.Logits
			ans, err := workload.Decode(ctx, resp, set.Stop, limit)
			if err != nil {
				return nil, err
			}
			if way == ansPrompt {
				full, ref = ans, logits
			}
			if p.Correct(ans) {
				w.right++
			}
			if slices.Equal(ans, full) {
				w.same++
			}
			if way == ansPrompt {
				continue
			}
			// Fidelity without the guardrail: what the encoding gives.
			for ri, r := range rs {
				fi, ok := fid[[2]int{way, ri}]
				if !ok {
					continue
				}
				row := &res.fidelity[fi]
				got := resp
				if r != req.Recompute || req.FallbackBound > 0 {
					if got, err = se.RunInjected(ctx, se.inj, engine.Request{Segments: segs, Recompute: r}); err != nil {
						return nil, err
					}
				}
				row.f.Add(ref, got.Logits)
				if slices.Equal(ref, got.Logits) {
					row.identical++
				}
				row.tokenLayers += got.TokenLayers
				row.full += got.Tokens * layers
			}
		}
	}
	fmt.Fprintf(stderr, "answered %d held-out prompts %d ways\n", countPrompts(res.cells), numAns)
	return res, nil
}

func countPrompts(cells []answerCell) int {
	n := 0
	for _, c := range cells {
		n += c.prompts
	}
	return n
}

func p50(ds []time.Duration) time.Duration { return workload.Quantile(ds, 0.5) }

// ansName is a way's name in the tables and the summary.
func ansName(cfg demoConfig, way int) string {
	switch way {
	case ansPrompt:
		return "prompt injection"
	case ansExact:
		return "KV EXACT"
	case ansSystem:
		return fmt.Sprintf("APPROX after system prompt, r=%.0f%%", 100*cfg.Recompute)
	case ansWindow:
		return fmt.Sprintf("APPROX window w=%d, r=%.0f%%", cfg.Window, 100*cfg.Recompute)
	}
	return fmt.Sprintf("APPROX standalone, r=%.0f%%, guardrail b=%g", 100*cfg.Recompute, cfg.Fallback)
}

// fastCells counts the cells with k >= minK, and those where way's TTFT
// p50 is below prompt injection's.
func (a *answers) fastCells(way, minK int) (faster, cells int) {
	for _, c := range a.cells {
		if c.k < minK {
			continue
		}
		cells++
		// As printed, so a reader of the table counts the same.
		if msOf(p50(c.ways[way].ttft)) != msOf(p50(c.ways[ansPrompt].ttft)) && p50(c.ways[way].ttft) < p50(c.ways[ansPrompt].ttft) {
			faster++
		}
	}
	return faster, cells
}

// printAnswers writes the answers table (per task and k: prompt injection,
// EXACT and the approximate way after the system prompt), the totals of
// every way with Wilson 95% intervals, and the fidelity table.
func printAnswers(w io.Writer, cfg demoConfig, model string, a *answers) {
	fmt.Fprintf(w, "\nanswers on held-out prompts (%s/eval.json, the first %d per task and k; right = exact match of the greedy answer;\n", model, cfg.AnswerPrompts)
	fmt.Fprintf(w, "same = prompt injection's answer; computed = (token, layer) pairs computed / full prefill's; TTFT p50 of %d runs per prompt, ms).\n", answerReps)
	fmt.Fprintf(w, "APPROX: every passage or fact encoded once right after the shared system prompt, as a store holds it, injected with recompute r=%.0f%%:\n", 100*cfg.Recompute)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "task\tk\tprompt tokens\tprompt inj. right\tTTFT\tKV EXACT right\tsame\tTTFT\tcomputed\tAPPROX right\tsame\tTTFT\tcomputed\t")
	for _, c := range a.cells {
		pr, ex, ap := &c.ways[ansPrompt], &c.ways[ansExact], &c.ways[ansSystem]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d/%d\t%s\t%d/%d\t%d\t%s\t%.0f%%\t%d/%d\t%d\t%s\t%.0f%%\t\n", c.task, c.k, c.tokens/max(c.prompts, 1),
			pr.right, c.prompts, msOf(p50(pr.ttft)),
			ex.right, c.prompts, ex.same, msOf(p50(ex.ttft)), 100*ex.computed(),
			ap.right, c.prompts, ap.same, msOf(p50(ap.ttft)), 100*ap.computed())
	}
	tw.Flush()
	n := countPrompts(a.cells)
	fmt.Fprintf(w, "\nevery way over the %d prompts (the standalone row is what the guardrail is for: the trained model needs its system prompt\n", n)
	fmt.Fprintln(w, "before a chunk, so standalone encodings deviate, and the guardrail keeps the answers by recomputing those chunks whole):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "way\tright\t95% interval\tsame as prompt inj.\tTTFT p50\tcomputed\tchunks recomputed whole\t")
	for way := range numAns {
		t := a.total(way)
		lo, hi := workload.Wilson(t.right, n)
		whole := "-"
		if t.approx > 0 {
			whole = fmt.Sprintf("%.0f%%", 100*float64(t.fallbacks)/float64(t.approx))
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%.0f-%.0f%%\t%d/%d\t%s\t%.0f%%\t%s\t\n", ansName(cfg, way), t.right, n, 100*lo, 100*hi,
			t.same, n, msOf(p50(t.ttft)), 100*t.computed(), whole)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nfidelity to full prefill on the same %d prompts (the next-token distribution after the prompt; no guardrail;\n", n)
	fmt.Fprintln(w, "identical = logits bit-identical to prefill's; r=100% recomputes every APPROXIMATE token, so it must be identical):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "encoding\tr\ttop-1 agreement\tmean KL (nats)\tmax KL\tidentical\tcomputed\t")
	for _, r := range a.fidelity {
		rr := fmt.Sprintf("%.0f%%", 100*r.recompute)
		if r.enc == workload.EncExact {
			rr = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.4g\t%.4g\t%d/%d\t%.0f%%\t\n", encName(cfg, r.enc), rr, r.f.Top1Rate(), r.f.MeanKL(), r.f.MaxKL,
			r.identical, r.f.N, 100*float64(r.tokenLayers)/float64(max(r.full, 1)))
	}
	tw.Flush()
}

func encName(cfg demoConfig, enc workload.Encoding) string {
	if enc == workload.EncWindow {
		return fmt.Sprintf("window w=%d", cfg.Window)
	}
	return enc.String()
}
