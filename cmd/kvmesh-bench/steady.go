package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/workload"
)

// steadyFlags are the -steady mode's settings.
type steadyFlags struct {
	queries   int // per query node
	fullEvery int
	out       string
	nodes     int
	workers   int
	seed      uint64
	kvd       chunk.DType
	codec     chunk.Codec
	policies  string // comma separated: none, all, reuse
	report    string // re-render this steady.json instead of running
	dump      string // write the raw result here (JSON) when set
}

// steadyDump is what steady.json keeps: enough to render STEADY.md and
// its plots again (-steady-report) without rerunning.
type steadyDump struct {
	Env    workload.Env
	Result *workload.SteadyResult
}

// runSteady runs the steady-state RAG benchmark (workload.RunSteady) on
// a random-weight model of workload.SteadyModel's shape and writes
// STEADY.md with its plots.
func runSteady(ctx context.Context, f steadyFlags, progress func(string)) error {
	if f.report != "" {
		b, err := os.ReadFile(f.report)
		if err != nil {
			return err
		}
		var d steadyDump
		if err := json.Unmarshal(b, &d); err != nil {
			return fmt.Errorf("%s: %w", f.report, err)
		}
		return writeSteady(f.out, "", d, progress)
	}
	start, loadStart := time.Now(), loadAvg()
	mc := workload.SteadyModel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var env workload.SteadyEnv
	for i := range env.Engines {
		e, err := workload.NewRandomEngine(mc, f.seed, engine.Config{Workers: f.workers, KVDType: f.kvd, CacheTokens: 2048, Logger: logger})
		if err != nil {
			return err
		}
		defer e.Close()
		env.Engines[i] = e
	}
	env.Codec = f.codec
	// A new cluster stores in meta's default codec.
	stored := chunk.StoredCodec(f.codec, meta.DefaultSettings().Codec)
	if f.codec == chunk.CodecInvalid {
		stored = meta.DefaultSettings().Codec
	}
	env.Stored = stored
	env.Start = func(ctx context.Context, dram int64, adm kvtier.Admission) (*workload.Local, error) {
		return workload.StartLocal(ctx, workload.LocalConfig{Nodes: f.nodes, DRAMBytes: dram, Admission: adm})
	}
	cfg := workload.SteadyConfig{Queries: f.queries, FullEvery: f.fullEvery, Seed: f.seed, Progress: progress}
	all := workload.DefaultSteadyPolicies()
	for _, name := range strings.Split(f.policies, ",") {
		found := false
		for _, p := range all {
			if p.Slug() == strings.TrimSpace(name) {
				cfg.Policies, found = append(cfg.Policies, p), true
			}
		}
		if !found {
			return fmt.Errorf("-steady-policies: unknown policy %q (none, all, reuse)", name)
		}
	}
	res, err := workload.RunSteady(ctx, env, cfg)
	if err != nil {
		return err
	}
	env0 := workload.Env{Model: mc, KVDType: f.kvd.String(), Codec: stored.String(),
		Workers: workers0(f.workers), CPUs: runtime.NumCPU(), CPUModel: cpuModel(), GoVersion: runtime.Version(),
		Nodes: f.nodes, Seed: f.seed, Command: "kvmesh-bench " + strings.Join(os.Args[1:], " "), LoadStart: loadStart,
		Elapsed: time.Since(start), LoadEnd: loadAvg()}
	return writeSteady(f.out, f.dump, steadyDump{Env: env0, Result: res}, progress)
}

// writeSteady writes the raw result to dump (when set), the plots and
// STEADY.md into out (when set) and the markdown to stdout.
func writeSteady(out, dump string, d steadyDump, progress func(string)) error {
	if dump != "" {
		b, err := json.Marshal(d)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dump, b, 0o644); err != nil {
			return err
		}
	}
	var plots []string
	if out != "" {
		var err error
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		if plots, err = d.Result.WritePlots(out); err != nil {
			return err
		}
	}
	md := d.Result.Markdown(d.Env, plots)
	if out != "" {
		p := filepath.Join(out, "STEADY.md")
		if err := os.WriteFile(p, []byte(md), 0o644); err != nil {
			return err
		}
		progress("wrote " + p)
	}
	fmt.Print(md)
	return nil
}
