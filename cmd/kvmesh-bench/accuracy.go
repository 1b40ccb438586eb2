package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/workload"
)

// accuracyFlags are the -accuracy mode's settings.
type accuracyFlags struct {
	model   string // model directory: config.json, model.safetensors, eval.json, reference.json, curve.jsonl
	eval    string // the evaluation set; empty: the model directory's eval.json
	prompts int    // per task and k; 0 = all
	out     string
	nodes   int
	workers int
	seed    uint64
	budget  time.Duration // of the evaluation's prompt rounds; 0: none
	python  string        // the interpreter that runs train/reference.py
	threads []int         // thread counts of the prefill baseline
	rounds  int           // of the prefill baseline, alternating PyTorch and the engine
}

// runAccuracy measures answer accuracy of the trained model each way
// through a local cluster, and writes ACCURACY.md with its plots.
func runAccuracy(ctx context.Context, f accuracyFlags, progress func(string)) error {
	start, cpu0, loadStart := time.Now(), workload.ProcessCPU(), loadAvg()
	w, err := engine.LoadWeights(f.model)
	if err != nil {
		return err
	}
	evalPath := f.eval
	if evalPath == "" {
		evalPath = filepath.Join(f.model, "eval.json")
	}
	set, err := workload.LoadEvalSet(evalPath)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	newEngine := func(tokenizer string) (*engine.Engine, error) {
		// Float32 KV: an EXACT hit is then bit-identical to prefill, and
		// each codec starts from the same bytes.
		return engine.New(w, engine.Config{Workers: f.workers, KVDType: chunk.F32, CacheTokens: 2048,
			TokenizerID: tokenizer, Logger: logger})
	}
	base, err := newEngine("kvmesh-recall")
	if err != nil {
		return err
	}
	defer base.Close()
	l, err := workload.StartLocal(ctx, workload.LocalConfig{Nodes: f.nodes, DRAMBytes: 768 << 20})
	if err != nil {
		return err
	}
	defer l.Close()
	progress(fmt.Sprintf("cluster of %d nodes up", f.nodes))
	var engines []*engine.Engine
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	// Each (encoding, codec) is its own model registration (a tokenizer ID
	// of its own), so that each store answers with its own encodings.
	stores := func(ctx context.Context, enc workload.Encoding, codec chunk.Codec) (*engine.Engine, engine.ChunkStore, error) {
		e, err := newEngine(fmt.Sprintf("kvmesh-recall/%s/%s", strings.ReplaceAll(enc.String(), " ", "-"), codec))
		if err != nil {
			return nil, nil, err
		}
		engines = append(engines, e)
		fp, err := l.Client.RegisterModel(ctx, e.Spec())
		if err != nil {
			return nil, nil, err
		}
		return e, workload.NewClusterStore(l.Client, workload.StoreConfig{Fingerprint: fp, Codec: codec}), nil
	}
	res, err := workload.RunAccuracy(ctx, base, stores, workload.AccuracyConfig{Set: set, Prompts: f.prompts, Budget: f.budget, Seed: f.seed, Progress: progress})
	if err != nil {
		return err
	}
	rep := &workload.AccuracyReport{
		Env: workload.Env{Model: base.Config(), KVDType: "f32", Workers: workers0(f.workers), CPUs: runtime.NumCPU(),
			CPUModel: cpuModel(), GoVersion: runtime.Version(), Nodes: f.nodes, Replicas: l.Client.ReplicationFactor(),
			Seed: f.seed, Command: "kvmesh-bench " + strings.Join(os.Args[1:], " "), LoadStart: loadStart},
		Model:  f.model,
		Result: res,
	}
	if rep.Curve, err = workload.LoadCurve(filepath.Join(f.model, "curve.jsonl")); err != nil {
		return err
	}
	ref, err := workload.LoadTorchReference(filepath.Join(f.model, "reference.json"))
	if err != nil {
		return err
	}
	for _, r := range ref.Logits {
		got, err := logitsAfter(ctx, base, r.Tokens)
		if err != nil {
			return err
		}
		for i := range got {
			rep.LogitDiff = math.Max(rep.LogitDiff, math.Abs(float64(got[i])-float64(r.Logits[i])))
		}
	}
	if rep.Speed, rep.TorchNote, err = baseline(ctx, w, f, set, progress); err != nil {
		return err
	}
	rep.Env.Elapsed = time.Since(start)
	rep.CPU = workload.ProcessCPU() - cpu0
	rep.Env.LoadEnd = loadAvg()
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return err
		}
		if err := rep.WritePlots(f.out); err != nil {
			return err
		}
	}
	md := rep.Markdown()
	if f.out != "" {
		p := filepath.Join(f.out, "ACCURACY.md")
		if err := os.WriteFile(p, []byte(md), 0o644); err != nil {
			return err
		}
		progress("wrote " + p)
	}
	fmt.Print(md)
	return nil
}

// logitsAfter prefills tokens and returns the next-token logits.
func logitsAfter(ctx context.Context, e *engine.Engine, tokens []uint32) ([]float32, error) {
	s, err := e.NewSequence(0)
	if err != nil {
		return nil, err
	}
	defer s.Release()
	return s.Append(ctx, tokens)
}

// promptOfLength is the first prompt of set with n tokens before its answer.
func promptOfLength(set *workload.EvalSet, n int) *workload.EvalPrompt {
	for i := range set.Prompts {
		p := &set.Prompts[i]
		m := len(p.System) + len(p.Question)
		for _, c := range p.Chunks {
			m += len(c)
		}
		if m == n {
			return p
		}
	}
	return nil
}
