// Command kvmesh-engine-bench measures time to first token for prompt
// injection against KV injection from an in-memory chunk store on the
// reference engine, and the fidelity of approximate encodings. It
// writes a random-weight model (or loads -model), runs enginebench.Run and
// prints markdown tables.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/enginebench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kvmesh-engine-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	model := flag.String("model", "", "model directory (config.json + safetensors); empty writes a random one of the benchmark shape to a temp dir")
	ks := flag.String("k", "5,10,20,50", "facts per prompt, comma separated")
	trials := flag.Int("trials", 3, "timed runs per point (the fastest is reported)")
	prompts := flag.Int("prompts", 32, "prompts for the fidelity table")
	workers := flag.Int("workers", 0, "worker goroutines (0: GOMAXPROCS)")
	seed := flag.Uint64("seed", 1, "random seed (weights and prompts)")
	codec := flag.String("codec", "raw", "codec of the in-memory store")
	kvType := flag.String("kv-dtype", "bf16", "dtype of the stored chunk KV (f32, bf16, f16)")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var cfg enginebench.Config
	for _, s := range strings.Split(*ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k <= 0 {
			return fmt.Errorf("bad -k %q", *ks)
		}
		cfg.Ks = append(cfg.Ks, k)
	}
	cfg.Trials, cfg.FidelityPrompts, cfg.Seed = *trials, *prompts, *seed
	if !*quiet {
		cfg.Progress = func(s string) { fmt.Fprintln(os.Stderr, s) }
	}
	c, err := chunk.ParseCodec(*codec)
	if err != nil {
		return err
	}
	kvd, err := chunk.ParseDType(*kvType)
	if err != nil {
		return err
	}
	dir := *model
	if dir == "" {
		tmp, err := os.MkdirTemp("", "kvmesh-engine-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if _, err := engine.WriteRandomModel(tmp, engine.BenchModel(), *seed, 1); err != nil {
			return err
		}
		dir = tmp
	}
	w, err := engine.LoadWeights(dir)
	if err != nil {
		return err
	}
	e, err := engine.New(w, engine.Config{Workers: *workers, KVDType: kvd, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		return err
	}
	defer e.Close()
	res, err := enginebench.Run(ctx, e, engine.NewMemStore(c), cfg)
	if err != nil {
		return err
	}
	fmt.Print(res.Markdown())
	return nil
}
