package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/loopback"
	"github.com/kvmesh/kvmesh/internal/units"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/ring"
	"github.com/kvmesh/kvmesh/workload"
)

// demoConfig is what the demo runs; flags change it.
type demoConfig struct {
	Facts       int         // memory facts ingested
	FactTokens  int         // tokens per fact
	QueryTokens int         // tokens of the question after the facts
	Window      int         // context window the facts are encoded with
	Ks          []int       // facts retrieved per query
	Queries     int         // timed queries per k and way
	Recompute   float64     // r of the APPROXIMATE answers
	Fallback    float64     // guardrail bound of the standalone APPROXIMATE answers (0: off)
	Hidden      int         // model hidden size
	Layers      int         // model layers
	Replicas    int         // replication factor of the demo cluster
	Codec       chunk.Codec // the cluster's codec for new entries
	Seed        uint64
	OutDir      string
	// Model is the trained model's directory (config.json,
	// model.safetensors, eval.json); empty: random weights of Hidden and
	// Layers, and no answers.
	Model string
	// AnswerPrompts are the held-out prompts per task and k answered.
	AnswerPrompts int
	// Sections are the parts run: ttft (the TTFT tables), answers, serving
	// (the concurrency table), shape (TTFT against k at a realistic shape).
	Sections []string
	Serving  servingLoad
	// The realistic shape: hidden size, layers, ks, queries per k, and
	// the ks prompt injection also runs at.
	ShapeHidden, ShapeLayers, ShapeQueries int
	ShapeKs, ShapePromptKs                 []int
	// CPUProfile, when set, is where a CPU profile of the timed TTFT
	// queries is written.
	CPUProfile string
}

func parseDemo(args []string, stderr io.Writer) (demoConfig, error) {
	c := demoConfig{}
	fs := flag.NewFlagSet("kvmesh-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.Facts, "facts", 2000, "memory facts to ingest")
	fs.IntVar(&c.FactTokens, "fact-tokens", 24, "tokens per fact")
	fs.IntVar(&c.QueryTokens, "query-tokens", 16, "tokens of the question")
	fs.IntVar(&c.Window, "window", 20, "context window (tokens) the facts are encoded after")
	ks := fs.String("k", "5,10,20,50", "facts retrieved per query, comma-separated")
	fs.IntVar(&c.Queries, "queries", 20, "timed queries per k and way")
	fs.Float64Var(&c.Recompute, "recompute", 0.15, "recompute ratio r of the APPROXIMATE answers")
	fs.Float64Var(&c.Fallback, "fallback-bound", 0.5, "guardrail of the standalone APPROXIMATE answers: a chunk whose relative key deviation at the check layer exceeds it is recomputed whole (0: off)")
	fs.IntVar(&c.Hidden, "hidden", 256, "model hidden size (head dim 64, 2 KV heads)")
	fs.IntVar(&c.Layers, "layers", 4, "model layers")
	fs.IntVar(&c.Replicas, "replicas", 2, "replication factor (2 of 3 nodes: a third of the facts are remote to the engine's node)")
	codec := fs.String("codec", "raw", "codec the cluster stores entries in (raw, lossless, int8, int4, fp8): lossless saves about a fifth of f32 KV and costs the injection path its decode")
	fs.Uint64Var(&c.Seed, "seed", 1, "random seed (model, facts, queries)")
	fs.StringVar(&c.OutDir, "out", "out", "directory for the plot")
	fs.StringVar(&c.Model, "model", "train/recall", "trained model directory (config.json, model.safetensors, eval.json); empty: random weights of -hidden and -layers")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the timed TTFT queries to this file")
	fs.IntVar(&c.AnswerPrompts, "answer-prompts", 4, "held-out prompts per task and k answered each way (with -model)")
	sections := fs.String("sections", "ttft,answers,serving,shape", "parts to run: ttft, answers (with -model), serving (concurrent users), shape (TTFT against k at a realistic shape)")
	srvUsers := fs.String("serve-users", "1,10,50", "closed-loop concurrent users of the serving table")
	srvKs := fs.String("serve-k", "10", "facts retrieved per request in the serving table")
	srvRates := fs.String("serve-rates", "", "open-loop offered rates (requests/s) of the serving table; empty: none")
	fs.IntVar(&c.Serving.Generate, "serve-generate", 16, "tokens generated per request in the serving table")
	fs.DurationVar(&c.Serving.Duration, "serve-duration", time.Second, "time per load level of the serving table (counted)")
	fs.DurationVar(&c.Serving.Warm, "serve-warm", 300*time.Millisecond, "closed-loop warm-up per load level of the serving table (not counted)")
	fs.IntVar(&c.Serving.MaxInjecting, "serve-max-injecting", 4, "requests injecting at once in the serving table's scheduler (0: no bound)")
	fs.IntVar(&c.ShapeHidden, "shape-hidden", 1024, "hidden size of the realistic shape (heads of 128, 8 KV heads)")
	fs.IntVar(&c.ShapeLayers, "shape-layers", 8, "layers of the realistic shape")
	shapeKs := fs.String("shape-k", "5,50", "facts per query at the realistic shape")
	shapePromptKs := fs.String("shape-prompt-k", "5", "ks at which the realistic shape also runs prompt injection (a prefill at k=50 takes seconds)")
	fs.IntVar(&c.ShapeQueries, "shape-queries", 3, "timed queries per k at the realistic shape")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.Sections = strings.Split(*sections, ",")
	for _, s := range c.Sections {
		if !slices.Contains([]string{"ttft", "answers", "serving", "shape"}, s) {
			return c, fmt.Errorf("demo: unknown section %q", s)
		}
	}
	for _, l := range []struct {
		s   string
		dst *[]int
	}{{*srvUsers, &c.Serving.Users}, {*srvKs, &c.Serving.Ks}, {*shapeKs, &c.ShapeKs}, {*shapePromptKs, &c.ShapePromptKs}} {
		for _, f := range strings.Split(l.s, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				return c, fmt.Errorf("demo: bad number %q", f)
			}
			*l.dst = append(*l.dst, n)
		}
	}
	for _, f := range strings.Split(*srvRates, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || r <= 0 {
			return c, fmt.Errorf("demo: bad rate %q", f)
		}
		c.Serving.Rates = append(c.Serving.Rates, r)
	}
	if len(c.Serving.Users) == 0 || len(c.Serving.Ks) == 0 || len(c.ShapeKs) == 0 || c.Serving.Generate < 1 || c.ShapeQueries < 1 {
		return c, errors.New("demo: serving users and ks, shape ks, generate and shape queries must be given")
	}
	if c.ShapeHidden < 1024 || c.ShapeHidden%128 != 0 || c.ShapeLayers < 1 {
		return c, errors.New("demo: shape hidden must be a multiple of 128 from 1024 (8 KV heads), layers at least 1")
	}
	var err error
	if c.Codec, err = chunk.ParseCodec(*codec); err != nil {
		return c, fmt.Errorf("demo: %w", err)
	}
	for _, s := range strings.Split(*ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k <= 0 {
			return c, fmt.Errorf("demo: bad k %q", s)
		}
		c.Ks = append(c.Ks, k)
	}
	switch {
	case c.Facts < 2*slices.Max(c.Ks):
		return c, fmt.Errorf("demo: %d facts are too few for k up to %d", c.Facts, slices.Max(c.Ks))
	case c.FactTokens <= 0 || c.QueryTokens <= 0 || c.Window < 0 || c.Queries <= 0:
		return c, errors.New("demo: sizes must be positive")
	case c.Hidden < 64 || c.Hidden%64 != 0 || c.Layers < 2:
		return c, errors.New("demo: hidden must be a multiple of 64, layers at least 2")
	case c.Replicas < 1 || c.Replicas > 3:
		return c, errors.New("demo: replicas must be 1..3")
	case c.Recompute < 0 || c.Recompute > 1:
		return c, errors.New("demo: recompute must be in [0, 1]")
	case c.Fallback < 0:
		return c, errors.New("demo: fallback-bound must not be negative")
	case c.Model != "" && c.AnswerPrompts <= 0:
		return c, errors.New("demo: answer-prompts must be positive")
	}
	return c, nil
}

// demoModel is the random-weight llama the demo serves.
func demoModel(c demoConfig) engine.ModelConfig {
	return engine.ModelConfig{
		ModelType: "llama", HiddenSize: c.Hidden, IntermediateSize: 3 * c.Hidden, NumLayers: c.Layers,
		NumHeads: c.Hidden / 64, NumKVHeads: 2, HeadDim: 64, VocabSize: 2048, RMSNormEps: 1e-5,
		RopeTheta: 500000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 8192, DType: chunk.BF16,
	}
}

// demo is the demo (`make run`): an embedded 3-node cluster over
// loopback gRPC, a random-weight model written and loaded through the real
// loader, an engine whose paged KV cache lives in shared memory registered
// with its local node, a few thousand memory facts ingested (window
// encodings), then queries served both ways (prompt injection: full
// prefill; KV injection: the node fetches, rotates and writes the facts'
// KV into the engine's cache). It prints TTFT, hit kinds, bytes moved and
// fidelity, and writes a plot.
func demo(ctx context.Context, args []string, w, stderr io.Writer) error {
	cfg, err := parseDemo(args, stderr)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kvmesh-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t0 := time.Now()

	nodes, err := startDemoCluster(ctx, dir, log, w)
	defer func() {
		for _, n := range nodes {
			_ = n.Close()
		}
	}()
	if err != nil {
		return err
	}
	set := nodes[0].Meta().Settings()
	set.ReplicationFactor, set.WriteQuorum = cfg.Replicas, min(set.WriteQuorum, cfg.Replicas)
	set.Codec = cfg.Codec
	if err := nodes[0].Meta().SetSettings(ctx, set, meta.AnyVersion()); err != nil {
		return fmt.Errorf("demo: settings: %w", err)
	}
	for _, n := range nodes {
		for n.Meta().Settings() != set {
			if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
				return err
			}
		}
	}
	c, err := client.New(ctx, client.Config{Seeds: []string{nodes[0].GRPCAddr()}, Logger: log})
	if err != nil {
		return err
	}
	defer c.Close()

	// The trained model, or a random one through the real writer; both
	// through the real loader.
	mdir, kvd, about := cfg.Model, chunk.F32, "trained weights (%s), f32 KV (EXACT hits are bit-identical to prefill)"
	var evalSet *workload.EvalSet
	if cfg.Model == "" {
		mdir, kvd, about = filepath.Join(dir, "model"), chunk.BF16, "random bf16 weights, bf16 KV"
		if _, err := engine.WriteRandomModel(mdir, demoModel(cfg), cfg.Seed, 1); err != nil {
			return err
		}
	} else {
		about = fmt.Sprintf(about, cfg.Model)
		if evalSet, err = workload.LoadEvalSet(filepath.Join(cfg.Model, "eval.json")); err != nil {
			return fmt.Errorf("demo: %w (-model \"\" serves random weights)", err)
		}
	}
	weights, err := engine.LoadWeights(mdir)
	if err != nil {
		return err
	}
	maxPrompt := slices.Max(cfg.Ks)*cfg.FactTokens + cfg.QueryTokens
	if evalSet != nil {
		for _, p := range evalSet.Prompts {
			n := len(p.System) + len(p.Question) + evalSet.AnswerLimit()
			for _, c := range p.Chunks {
				n += len(c)
			}
			maxPrompt = max(maxPrompt, n)
		}
	}
	cacheTokens := 2*maxPrompt + 256
	local := nodes[0]
	// The engine's cache in shared memory (a memfd handed to the node on
	// its cache socket), registered with its local node.
	se, err := newServingEngine(ctx, c, local, weights, "kvmesh-demo", kvd, cacheTokens, log)
	if err != nil {
		return err
	}
	defer se.Close()
	e, inj, shm := se.Engine, se.inj, se.shm
	spec := e.Spec()
	lay, _ := e.CacheMemory()
	mc := e.Config()
	fmt.Fprintf(w, "model: llama %d layers, hidden %d, %d heads / %d KV heads x %d, vocab %d, %s (%d bytes per token)\n",
		mc.NumLayers, mc.HiddenSize, mc.NumHeads, mc.NumKVHeads, mc.HeadDim, mc.VocabSize, about, spec.KVBytesPerToken())
	fmt.Fprintf(w, "engine cache: %d layers x %s in shared memory %s, registered with %s (its local node)\n",
		spec.Layers, units.Bytes(uint64(lay.LayerBytes())), shm.Memory.File.Name(), local.ID())

	rng := rand.New(rand.NewPCG(cfg.Seed, 0x64656d6f))
	facts := make([][]uint32, cfg.Facts)
	for i := range facts {
		facts[i] = randTokens(rng, cfg.FactTokens, mc.VocabSize)
	}
	stored, err := ingest(ctx, e, c, facts, cfg.Window, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "ingested %d facts of %d tokens (window w=%d), %s of entries (codec %s), %d replicas each, in %v\n",
		len(facts), cfg.FactTokens, cfg.Window, units.Bytes(uint64(stored)), cfg.Codec, cfg.Replicas, time.Since(t0).Round(time.Second))

	// Facts on the engine's node, and facts only on the others.
	var near, far []int
	r := c.Ring()
	for i, f := range facts {
		if slices.ContainsFunc(r.Replicas(chunk.ContentID(e.Fingerprint(), f), cfg.Replicas), func(m ring.Member) bool { return m.ID == local.ID() }) {
			near = append(near, i)
		} else {
			far = append(far, i)
		}
	}
	fmt.Fprintf(w, "%d facts have a replica on %s, %d only on other nodes\n\n", len(near), local.ID(), len(far))

	stopProfile, err := startCPUProfile(cfg.CPUProfile)
	if err != nil {
		return err
	}
	defer func() { _ = stopProfile() }()
	var res []ttftPoint
	if cfg.has("ttft") {
		if res, err = measureTTFT(ctx, cfg, e, inj, local, facts, near, far, rng, stderr); err != nil {
			return err
		}
		printDemo(w, cfg, res)
	}
	var ans *answers
	if evalSet != nil && cfg.has("answers") {
		if ans, err = measureAnswers(ctx, cfg, se, c, local, weights, kvd, cacheTokens, log, evalSet, stderr); err != nil {
			return err
		}
		printAnswers(w, cfg, cfg.Model, ans)
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return err
	}
	var plots []string
	if cfg.has("serving") {
		sr, err := measureServing(ctx, cfg, c, local, weights, kvd, log, facts, near, far, cfg.Serving, stderr)
		if err != nil {
			return err
		}
		printServing(w, cfg, sr)
		if len(cfg.Serving.Users) > 1 || len(cfg.Serving.Rates) > 1 {
			if err := plotServing(cfg.OutDir, cfg, sr); err != nil {
				return err
			}
			plots = append(plots, "serving_throughput.png")
			if len(cfg.Serving.Rates) > 0 {
				plots = append(plots, "serving_ttft_vs_rate.png")
			}
		}
	}
	if cfg.has("shape") {
		sh, err := measureShape(ctx, cfg, c, local, log, cfg.ShapePromptKs, stderr)
		if err != nil {
			return err
		}
		printShape(w, cfg, sh, e.Config(), res)
	}
	if err := stopProfile(); err != nil {
		return err
	}
	if res != nil {
		if err := plotTTFT(filepath.Join(cfg.OutDir, "demo_ttft_vs_k.png"), res); err != nil {
			return err
		}
		plots = append([]string{"demo_ttft_vs_k.png"}, plots...)
	}
	for _, p := range plots {
		abs, _ := filepath.Abs(filepath.Join(cfg.OutDir, p))
		fmt.Fprintf(w, "\nplot: %s", abs)
	}
	fmt.Fprintln(w)
	if res != nil {
		printSummary(w, cfg, res, ans)
	}
	fmt.Fprintf(w, "total %v; stopping the cluster and removing %s\n", time.Since(t0).Round(time.Second), dir)
	return nil
}

// has reports whether the section runs.
func (c *demoConfig) has(section string) bool { return slices.Contains(c.Sections, section) }

// startDemoCluster starts 3 in-process nodes over loopback gRPC and waits
// until all of them are in the ring with a leader.
func startDemoCluster(ctx context.Context, dir string, log *slog.Logger, w io.Writer) ([]*node.Node, error) {
	var nodes []*node.Node
	var seeds []string
	for i, h := range loopback.Hosts(3) {
		n, err := node.New(node.Config{NodeID: fmt.Sprintf("n%d", i+1), DataDir: filepath.Join(dir, strconv.Itoa(i)),
			GRPCAddr: h + ":0", Seeds: seeds, BootstrapExpect: 3, DRAMBytes: 512 << 20, LocalTiming: true, Logger: log,
			GPU:      linkedGPU(),
			Insecure: true}) // one process on loopback
		if err != nil {
			return nodes, err
		}
		if err := n.Start(ctx); err != nil {
			return nodes, err
		}
		nodes = append(nodes, n)
		if i == 0 {
			seeds = []string{n.GossipAddr()}
		}
		fmt.Fprintf(w, "started %s grpc=%s http=%s\n", n.ID(), n.GRPCAddr(), n.HTTPAddr())
		if i == 0 {
			// The nodes' logs are discarded; this says where they inject.
			fmt.Fprintf(w, "injection kernel: %s\n", n.InjectKernel())
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		ready := true
		for _, n := range nodes {
			if n.Ready() != nil || n.Meta().Ring().Len() != 3 {
				ready = false
			}
		}
		if ready {
			return nodes, nil
		}
		if err := sleepCtx(wctx, 50*time.Millisecond); err != nil {
			return nodes, fmt.Errorf("demo: cluster not ready: %w", err)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func randTokens(r *rand.Rand, n, vocab int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(vocab))
	}
	return out
}

// ingest encodes every fact after the window of the stream before it and
// puts it into the cluster (puts overlap the next encodes), with a
// progress bar on stderr. It returns the bytes stored (one replica).
func ingest(ctx context.Context, e *engine.Engine, c *client.Client, facts [][]uint32, window int, stderr io.Writer) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	blobs := make(chan []byte, 8)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		putErr error
		done   int
		bytes  int64
	)
	start := time.Now()
	bar := func(final bool) {
		mu.Lock()
		d, b := done, bytes
		mu.Unlock()
		const width = 40
		fill := d * width / len(facts)
		rate := float64(d) / max(time.Since(start).Seconds(), 1e-3)
		fmt.Fprintf(stderr, "\ringest [%s%s] %d/%d facts %s %.0f/s ", strings.Repeat("#", fill), strings.Repeat(" ", width-fill), d, len(facts), units.Bytes(uint64(b)), rate)
		if final {
			fmt.Fprintln(stderr)
		}
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for blob := range blobs {
				_, err := c.Put(ctx, blob)
				mu.Lock()
				if err != nil && putErr == nil {
					putErr = err
					cancel()
				}
				done++
				bytes += int64(len(blob))
				mu.Unlock()
			}
		}()
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var encErr error
	for i, f := range facts {
		ent, err := e.EncodeWindow(ctx, facts[:i], window, f)
		if err == nil {
			var blob []byte
			if blob, err = chunk.Encode(nil, ent, c.Codec()); err == nil {
				select {
				case blobs <- blob:
				case <-ctx.Done():
					err = ctx.Err()
				}
			}
		}
		if err != nil {
			encErr = err
			break
		}
		select {
		case <-tick.C:
			bar(false)
		default:
		}
	}
	close(blobs)
	wg.Wait()
	bar(true)
	if putErr != nil {
		return 0, fmt.Errorf("demo: put: %w", putErr)
	}
	if encErr != nil {
		return 0, fmt.Errorf("demo: encode: %w", encErr)
	}
	return bytes, nil
}

// Ways of serving a query.
const (
	wayPrompt = iota // prompt injection: full prefill
	wayNear          // KV injection, every fact on the engine's node
	wayFar           // KV injection, every fact only on other nodes
	numWays
)

var wayNames = [numWays]string{"prompt injection", "KV inject (local hit)", "KV inject (remote hit)"}

type wayStats struct {
	ttft                   []time.Duration
	exact, approx, miss    int
	localBytes, peerBytes  float64
	injected, promptTokens int
}

func (s *wayStats) p(q float64) time.Duration { return workload.Quantile(s.ttft, q) }

type ttftPoint struct {
	k    int
	ways [numWays]wayStats
	// plain times, in each round right after the remote hit, a plain gRPC
	// stream of the bytes that hit fetched from peers, on the same
	// loopback; plainBytes is their mean.
	plain      wayStats
	plainBytes int
}

// remoteExtra is what a remote hit adds to a local one: the median over
// rounds of the remote hit's TTFT minus the local hit's in the same round.
// The two run back to back, so load that comes and goes (another process,
// a GC) cancels out, which a difference of two medians does not do.
func (pt *ttftPoint) remoteExtra() time.Duration {
	near, far := pt.ways[wayNear].ttft, pt.ways[wayFar].ttft
	d := make([]time.Duration, min(len(near), len(far)))
	if len(d) == 0 {
		return 0
	}
	for i := range d {
		d[i] = far[i] - near[i]
	}
	return workload.Quantile(d, 0.5)
}

// speedup is prompt injection's TTFT p50 over way's.
func (pt *ttftPoint) speedup(way int) float64 {
	return pt.ways[wayPrompt].p(0.5).Seconds() / max(pt.ways[way].p(0.5).Seconds(), 1e-9)
}

func pick(r *rand.Rand, from []int, k int) []int {
	idx := r.Perm(len(from))[:k]
	out := make([]int, k)
	for i, j := range idx {
		out[i] = from[j]
	}
	return out
}

func promptOf(facts [][]uint32, idx []int, query []uint32) []engine.Segment {
	segs := make([]engine.Segment, 0, len(idx)+1)
	for _, i := range idx {
		segs = append(segs, engine.Segment{Tokens: facts[i], Chunk: true})
	}
	return append(segs, engine.Segment{Tokens: query})
}

// measureTTFT serves cfg.Queries queries per k each way, interleaved, with
// one untimed warm-up round.
func measureTTFT(ctx context.Context, cfg demoConfig, e *engine.Engine, inj engine.CacheInjector, local *node.Node,
	facts [][]uint32, near, far []int, rng *rand.Rand, stderr io.Writer) ([]ttftPoint, error) {
	var out []ttftPoint
	var plain plainRef
	defer plain.close()
	for _, k := range cfg.Ks {
		if k > len(near) || k > len(far) {
			return nil, fmt.Errorf("demo: k=%d exceeds the facts on one side (%d local, %d remote)", k, len(near), len(far))
		}
		pt := ttftPoint{k: k}
		for q := -1; q < cfg.Queries; q++ {
			query := randTokens(rng, cfg.QueryTokens, e.Config().VocabSize)
			for way := range numWays {
				var segs []engine.Segment
				switch way {
				case wayFar:
					segs = promptOf(facts, pick(rng, far, k), query)
				default:
					segs = promptOf(facts, pick(rng, near, k), query)
				}
				l0, p0 := local.InjectFetchedBytes()
				t0 := time.Now()
				var resp *engine.Response
				var err error
				if way == wayPrompt {
					resp, err = e.Run(ctx, nil, engine.Request{Segments: segs})
				} else {
					resp, err = e.RunInjected(ctx, inj, engine.Request{Segments: segs})
				}
				d := time.Since(t0)
				if err != nil {
					return nil, err
				}
				l1, p1 := local.InjectFetchedBytes()
				if way == wayFar && p1 > p0 {
					// The same bytes over a plain stream, right after the
					// remote hit, so both see the same load.
					pd, err := plain.time(ctx, int(p1-p0))
					if err != nil {
						return nil, err
					}
					if q >= 0 {
						pt.plain.ttft = append(pt.plain.ttft, pd)
					}
				}
				if q < 0 {
					continue
				}
				s := &pt.ways[way]
				s.ttft = append(s.ttft, d)
				s.localBytes += l1 - l0
				s.peerBytes += p1 - p0
				s.injected += resp.Injected
				s.promptTokens += resp.Tokens
				if way != wayPrompt {
					for _, cr := range resp.Chunks {
						switch cr.Match {
						case chunk.MatchExact:
							s.exact++
						case chunk.MatchApproximate:
							s.approx++
						default:
							s.miss++
						}
					}
				}
			}
		}
		pt.plainBytes = int(pt.ways[wayFar].peerBytes) / cfg.Queries
		fmt.Fprintf(stderr, "k=%d: prompt %v, local hit %v, remote hit %v, plain gRPC of %s %v (p50)\n", k,
			pt.ways[wayPrompt].p(0.5).Round(10*time.Microsecond), pt.ways[wayNear].p(0.5).Round(10*time.Microsecond),
			pt.ways[wayFar].p(0.5).Round(10*time.Microsecond), units.Bytes(uint64(pt.plainBytes)), pt.plain.p(0.5).Round(10*time.Microsecond))
		out = append(out, pt)
	}
	return out, nil
}

func msOf(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

func printDemo(w io.Writer, cfg demoConfig, pts []ttftPoint) {
	fmt.Fprintf(w, "TTFT over %d queries per k and way (%d-token question), ms:\n", cfg.Queries, cfg.QueryTokens)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "k\tprompt tokens\tprompt p50\tp99\tlocal hit p50\tp99\tremote hit p50\tp99\tspeedup local\tremote\t")
	for _, pt := range pts {
		pre, near, far := &pt.ways[wayPrompt], &pt.ways[wayNear], &pt.ways[wayFar]
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.1fx\t%.1fx\t\n", pt.k, pt.k*cfg.FactTokens+cfg.QueryTokens,
			msOf(pre.p(0.5)), msOf(pre.p(0.99)), msOf(near.p(0.5)), msOf(near.p(0.99)), msOf(far.p(0.5)), msOf(far.p(0.99)),
			pt.speedup(wayNear), pt.speedup(wayFar))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nwhat a remote hit adds to a local one (median over rounds of remote minus local in the same round), against a plain gRPC stream of the same bytes on this loopback (p50), ms:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "k\tpeer bytes per query\tremote - local\tplain gRPC\tratio\t")
	for _, pt := range pts {
		extra := pt.remoteExtra()
		plain := pt.plain.p(0.5)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.2fx\t\n", pt.k, units.Bytes(uint64(pt.plainBytes)), msOf(extra), msOf(plain),
			extra.Seconds()/max(plain.Seconds(), 1e-9))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nhits and bytes the engine's node fetched (node metrics), per way:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "k\tway\tEXACT\tAPPROXIMATE\tMISS\tinjected tokens\tfetched locally\tfetched from peers\t")
	for _, pt := range pts {
		for _, way := range []int{wayNear, wayFar} {
			s := &pt.ways[way]
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t\n", pt.k, wayNames[way], s.exact, s.approx, s.miss, s.injected,
				units.Bytes(uint64(s.localBytes)), units.Bytes(uint64(s.peerBytes)))
		}
	}
	tw.Flush()
}

func plotTTFT(path string, pts []ttftPoint) error {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = "kvmesh demo: TTFT p50 against retrieved facts", "k (facts)", "TTFT p50 (ms)"
	p.Y.Min = 0
	var args []any
	for way := range numWays {
		var xy plotter.XYs
		for _, pt := range pts {
			xy = append(xy, plotter.XY{X: float64(pt.k), Y: float64(pt.ways[way].p(0.5).Microseconds()) / 1000})
		}
		args = append(args, wayNames[way], xy)
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	p.Legend.Top, p.Legend.Left = true, true
	if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("demo: plot: %w", err)
	}
	return nil
}

// startCPUProfile starts a CPU profile into path (nothing when path is
// empty); the returned func stops it and closes the file.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// printSummary writes the closing summary, every figure of it taken from
// the tables above: the TTFT speedup at the largest k, the answers kept,
// and the compute saved (ans is nil without a trained model).
func printSummary(w io.Writer, cfg demoConfig, pts []ttftPoint, ans *answers) {
	fmt.Fprintln(w, "\nsummary:")
	pt := pts[len(pts)-1]
	local, remote := pt.speedup(wayNear), pt.speedup(wayFar)
	fmt.Fprintf(w, "- TTFT at k=%d (%d-token prompts, p50): KV injection %.1fx faster than prompt injection from a local hit, %.1fx from a remote hit.\n",
		pt.k, pt.k*cfg.FactTokens+cfg.QueryTokens, local, remote)
	if ans == nil {
		return
	}
	n := countPrompts(ans.cells)
	ex, ap := ans.total(ansExact), ans.total(ansSystem)
	// Per task, as the answers table's rows sum them.
	var tasks []string
	same, prompts := map[string]int{}, map[string]int{}
	for _, c := range ans.cells {
		if !slices.Contains(tasks, c.task) {
			tasks = append(tasks, c.task)
		}
		same[c.task] += c.ways[ansSystem].same
		prompts[c.task] += c.prompts
	}
	var per []string
	for _, t := range tasks {
		per = append(per, fmt.Sprintf("%s %d/%d", t, same[t], prompts[t]))
	}
	fmt.Fprintf(w, "- answers kept on %d held-out prompts: %s %d of %d the same as prompt injection's, %s %d of %d (%s); right: %d, %d and %d of %d.\n",
		n, ansName(cfg, ansExact), ex.same, n, ansName(cfg, ansSystem), ap.same, n, strings.Join(per, ", "), ans.total(ansPrompt).right, ex.right, ap.right, n)
	faster, cells := ans.fastCells(ansSystem, 20)
	fmt.Fprintf(w, "- compute saved: %s computes %.0f%% of full prefill's token-layers (%.0f%% saved), its TTFT below prompt injection's in %d of %d cells with k >= 20; %s computes %.0f%%.\n",
		ansName(cfg, ansSystem), 100*ap.computed(), 100-100*ap.computed(), faster, cells, ansName(cfg, ansExact), 100*ex.computed())
}
