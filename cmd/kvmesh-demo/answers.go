package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/workload"
)

// Ways of answering a held-out prompt.
const (
	ansPrompt = iota // prompt injection: full prefill
	ansExact         // KV injection of EXACT entries (an earlier identical request's write-back)
	ansApprox        // KV injection of standalone (APPROXIMATE) encodings, with recompute
	numAns
)

// answerWay is one way's results in one (task, k).
type answerWay struct {
	right, same int // answers equal to the expected one; to prompt injection's
	ttft        []time.Duration
}

type answerCell struct {
	task       string
	k, prompts int
	tokens     int // prompt tokens, summed
	ways       [numAns]answerWay
}

// measureAnswers serves the first cfg.AnswerPrompts prompts of every task
// and k of the trained model's evaluation set three ways through the
// engine's node: prompt injection; KV injection of the prompt's chunks as
// an earlier identical request wrote them back (EXACT); and KV injection
// of the chunks encoded standalone, as a RAG store holds passages, repaired
// with recompute r (APPROXIMATE; the system prompt at the start is EXACT).
// The entries are put before each timed request; TTFT is the request alone.
func measureAnswers(ctx context.Context, cfg demoConfig, e *engine.Engine, c *client.Client, inj engine.CacheInjector, set *workload.EvalSet, stderr io.Writer) ([]answerCell, error) {
	var cells []answerCell
	limit := set.AnswerLimit()
	put := func(ents ...*chunk.Entry) error {
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
	for _, p := range set.Prompts {
		i := slices.IndexFunc(cells, func(c answerCell) bool { return c.task == p.Task && c.k == p.K })
		if i < 0 {
			cells = append(cells, answerCell{task: p.Task, k: p.K})
			i = len(cells) - 1
		}
		cell := &cells[i]
		if cell.prompts >= cfg.AnswerPrompts {
			continue
		}
		cell.prompts++
		segs := p.Segments()
		for _, sg := range segs {
			cell.tokens += len(sg.Tokens)
		}
		var full []uint32
		// APPROXIMATE before EXACT: once the EXACT entries are in the
		// store, every lookup of this prompt finds them.
		for _, way := range []int{ansPrompt, ansApprox, ansExact} {
			switch way {
			case ansApprox:
				for _, sg := range segs[:len(segs)-1] {
					ent, err := e.EncodeStandalone(ctx, sg.Tokens)
					if err != nil {
						return nil, err
					}
					if err := put(ent); err != nil {
						return nil, err
					}
				}
			case ansExact:
				ents, err := e.EncodePrompt(ctx, segs)
				if err != nil {
					return nil, err
				}
				if err := put(ents...); err != nil {
					return nil, err
				}
			}
			req := engine.Request{Segments: segs, Keep: true}
			t0 := time.Now()
			var resp *engine.Response
			var err error
			if way == ansPrompt {
				resp, err = e.Run(ctx, nil, req)
			} else {
				if way == ansApprox {
					req.Recompute = cfg.Recompute
					req.FallbackBound = cfg.Fallback
				}
				resp, err = e.RunInjected(ctx, inj, req)
			}
			d := time.Since(t0)
			if err != nil {
				return nil, err
			}
			ans, err := workload.Decode(ctx, resp, set.Stop, limit)
			if err != nil {
				return nil, err
			}
			if way == ansPrompt {
				full = ans
			}
			w := &cell.ways[way]
			w.ttft = append(w.ttft, d)
			if p.Correct(ans) {
				w.right++
			}
			if slices.Equal(ans, full) {
				w.same++
			}
		}
	}
	fmt.Fprintf(stderr, "answered %d held-out prompts three ways\n", countPrompts(cells))
	return cells, nil
}

func countPrompts(cells []answerCell) int {
	n := 0
	for _, c := range cells {
		n += c.prompts
	}
	return n
}

func p50(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	d := slices.Clone(ds)
	slices.Sort(d)
	return d[len(d)/2]
}

// printAnswers writes the answers table: per task and k, each way's exact
// match and TTFT p50, and the totals with Wilson 95% intervals.
func printAnswers(w io.Writer, cfg demoConfig, model string, cells []answerCell) {
	fmt.Fprintf(w, "\nanswers on held-out prompts (%s/eval.json, the first %d per task and k; exact match of the greedy answer;\n", model, cfg.AnswerPrompts)
	fmt.Fprintf(w, "same = as prompt injection's answer; KV APPROX: chunks encoded standalone, recompute r=%.0f%%, %s), TTFT p50 in ms:\n",
		100*cfg.Recompute, fallbackNote(cfg.Fallback))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "task\tk\tprompt tokens\tprompt inj. right\tTTFT\tKV EXACT right\tsame\tTTFT\tKV APPROX right\tsame\tTTFT\t")
	var tot [numAns]answerWay
	n := 0
	for _, c := range cells {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d/%d\t%s\t%d/%d\t%d\t%s\t%d/%d\t%d\t%s\t\n", c.task, c.k, c.tokens/max(c.prompts, 1),
			c.ways[ansPrompt].right, c.prompts, msOf(p50(c.ways[ansPrompt].ttft)),
			c.ways[ansExact].right, c.prompts, c.ways[ansExact].same, msOf(p50(c.ways[ansExact].ttft)),
			c.ways[ansApprox].right, c.prompts, c.ways[ansApprox].same, msOf(p50(c.ways[ansApprox].ttft)))
		for way := range numAns {
			tot[way].right += c.ways[way].right
			tot[way].same += c.ways[way].same
		}
		n += c.prompts
	}
	tw.Flush()
	names := [numAns]string{"prompt injection", "KV injection, EXACT", fmt.Sprintf("KV injection, APPROXIMATE r=%.0f%% b=%g", 100*cfg.Recompute, cfg.Fallback)}
	for way := range numAns {
		lo, hi := workload.Wilson(tot[way].right, n)
		fmt.Fprintf(w, "%-36s %3d/%d right = %5.1f%% (95%% interval %.0f-%.0f%%), %d/%d answers as prompt injection's\n",
			names[way]+":", tot[way].right, n, 100*float64(tot[way].right)/float64(max(n, 1)), 100*lo, 100*hi, tot[way].same, n)
	}
}

// fallbackNote says what the guardrail does in the answers table's header.
// A trained model needs what came before a chunk (its system prompt):
// standalone encodings deviate, and the guardrail recomputes those whole.
func fallbackNote(b float64) string {
	if b == 0 {
		return "no guardrail"
	}
	return fmt.Sprintf("guardrail b=%g: a chunk deviating more at the check layer is recomputed whole", b)
}
