package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/workload"
)

// baselineBudget bounds the baseline: no round after the first starts
// once it has taken this long (a loaded machine makes every run slow).
const baselineBudget = 2 * time.Minute

// baseline measures prefill speed of the engine and of PyTorch on the same
// model, prompts and thread count, one after the other in this run:
// PyTorch through train/reference.py (next to the model directory), then an
// engine of as many workers, for each thread count, f.rounds times over;
// each side keeps its best. PyTorch runs with OMP_WAIT_POLICY=PASSIVE:
// OpenMP's default spin-waiting makes a 2-thread forward several times
// slower than 1 thread on a machine whose other core is busy. If PyTorch
// cannot run, the engine is measured alone and the note says why.
func baseline(ctx context.Context, w *engine.Weights, f accuracyFlags, set *workload.EvalSet, progress func(string)) ([]workload.SpeedCompare, string, error) {
	script := filepath.Join(filepath.Dir(filepath.Clean(f.model)), "reference.py")
	type key struct{ threads, tokens int }
	best := map[key]*workload.SpeedCompare{}
	var order []key
	torchOK, why := true, ""
	start, rounds := time.Now(), 0
	for round := range max(f.rounds, 1) {
		if round > 0 && time.Since(start) > baselineBudget {
			progress(fmt.Sprintf("baseline: %v spent after %d rounds; stopping", time.Since(start).Round(time.Second), round))
			break
		}
		for _, threads := range f.threads {
			var torch []workload.SpeedPoint
			if torchOK {
				var err error
				if torch, err = torchSpeed(ctx, f.python, script, f.model, set, threads); err != nil {
					torchOK, why = false, err.Error()
					progress("PyTorch baseline unavailable: " + why)
				}
			}
			if !torchOK {
				// The engine alone, on the prompts reference.json lists.
				ref, err := workload.LoadTorchReference(filepath.Join(f.model, "reference.json"))
				if err != nil {
					return nil, "", err
				}
				torch = nil
				for _, sp := range ref.Speed {
					torch = append(torch, workload.SpeedPoint{Tokens: sp.Tokens})
				}
			}
			e, err := engine.New(w, engine.Config{Workers: threads, CacheTokens: 2048})
			if err != nil {
				return nil, "", err
			}
			for _, sp := range torch {
				p := promptOfLength(set, sp.Tokens)
				if p == nil {
					continue
				}
				fastest := time.Duration(math.MaxInt64)
				for i := range 4 { // the first is the warm-up
					t0 := time.Now()
					if _, err := e.Run(ctx, nil, engine.Request{Segments: p.Segments()}); err != nil {
						e.Close()
						return nil, "", err
					}
					if i > 0 {
						fastest = min(fastest, time.Since(t0))
					}
				}
				k := key{threads, sp.Tokens}
				b := best[k]
				if b == nil {
					b = &workload.SpeedCompare{Threads: threads, Tokens: sp.Tokens}
					best[k] = b
					order = append(order, k)
				}
				b.Engine = max(b.Engine, float64(sp.Tokens)/fastest.Seconds())
				b.Torch = max(b.Torch, sp.TokensPerS)
				progress(fmt.Sprintf("baseline round %d: prefill %d tokens, %d threads: engine %.0f tok/s, PyTorch %.0f tok/s",
					round+1, sp.Tokens, threads, float64(sp.Tokens)/fastest.Seconds(), sp.TokensPerS))
			}
			e.Close()
		}
		rounds++
	}
	out := make([]workload.SpeedCompare, 0, len(order))
	for _, k := range order {
		out = append(out, *best[k])
	}
	if !torchOK {
		return out, "PyTorch did not run here (" + why + "); the engine is not compared.", nil
	}
	return out, fmt.Sprintf("PyTorch ran as `OMP_NUM_THREADS=N OPENBLAS_NUM_THREADS=N OMP_WAIT_POLICY=PASSIVE %s %s --threads N` (torch.set_num_threads(N)); the engine with N workers; %d of %d rounds (none starts after %v), each side's best. Load average when the baseline ended: %s.", f.python, script, rounds, max(f.rounds, 1), baselineBudget, loadAvg()), nil
}

// torchSpeed runs reference.py with threads and returns the prefill speeds
// it measured. It is given an evaluation set of only the prompts it times
// (the first of facts and rag at a few k): with no prompt at k = 5 it
// skips its reference logits and answers, which the committed
// reference.json holds.
func torchSpeed(ctx context.Context, python, script, model string, set *workload.EvalSet, threads int) ([]workload.SpeedPoint, error) {
	tmp, err := os.MkdirTemp("", "kvmesh-torch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	timed := &workload.EvalSet{Seed: set.Seed, Stop: set.Stop}
	for _, c := range []workload.Cell{{Task: "facts", K: 50}, {Task: "rag", K: 50}, {Task: "rag", K: 20}, {Task: "facts", K: 10}} {
		if i := slices.IndexFunc(set.Prompts, func(p workload.EvalPrompt) bool { return p.Task == c.Task && p.K == c.K }); i >= 0 {
			timed.Prompts = append(timed.Prompts, set.Prompts[i])
		}
	}
	data, err := json.Marshal(timed)
	if err != nil {
		return nil, err
	}
	evalFile, outFile := filepath.Join(tmp, "eval.json"), filepath.Join(tmp, "reference.json")
	if err := os.WriteFile(evalFile, data, 0o644); err != nil {
		return nil, err
	}
	n := strconv.Itoa(threads)
	cmd := exec.CommandContext(ctx, python, script, "--model", model, "--eval", evalFile, "--out", outFile, "--threads", n)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS="+n, "OPENBLAS_NUM_THREADS="+n, "MKL_NUM_THREADS="+n, "OMP_WAIT_POLICY=PASSIVE")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", python, script, err, lastLine(b))
	}
	ref, err := workload.LoadTorchReference(outFile)
	if err != nil {
		return nil, err
	}
	return ref.Speed, nil
}

func lastLine(b []byte) string {
	s := string(b)
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad count %q in %q", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}
