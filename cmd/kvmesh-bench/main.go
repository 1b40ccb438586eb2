// Command kvmesh-bench runs the workload benchmarks (package workload)
// against a local cluster: RAG with reordered chunks (full prefill, prefix caching and
// kvmesh chunk reuse on the same requests), multi-turn chat, and
// InferScale's memory-fact workload. It starts a 3-node cluster in this
// process, builds a random-weight model of workload.Model's shape, and
// writes WORKLOADS.md with PNG plots to -out (and the markdown to stdout).
//
//	kvmesh-bench [-quick] [-seed N] [-out docs/bench]
//	kvmesh-bench -accuracy train/recall [-accuracy-prompts N] [-out docs/bench]
//	kvmesh-bench -putget [-kvmeshd bin/kvmeshd] [-putget-duration 3s] ...
//	kvmesh-bench -linkrate [-kvmeshd bin/kvmeshd] [-linkrate-gbit 0,1,10,25] [-linkrate-codecs raw,lossless,int8,fp8]
//	kvmesh-bench -steady [-steady-queries N] [-steady-policies none,all,reuse] [-out docs/bench]
//
// -accuracy instead loads the trained recall model (train/) and measures
// the exact-match accuracy of its answers served each way (full prefill,
// prefix caching, EXACT and APPROXIMATE chunk reuse, each codec), writing
// ACCURACY.md.
//
// -putget instead starts 3 kvmeshd processes (tests/harness) and
// redis-server, and prints one table of Put and Get throughput and
// latency of the same entries on both, with their ratios, from the same
// run (make bench-redis).
//
// -linkrate instead starts 3 kvmeshd processes whose peer connections are
// paced to emulated link rates (-peer-link-rate) and prints the table of
// remote-hit TTFT at k chunks for each codec at each rate, with each
// codec's decode rate and the link rate below which it beats raw
// (make bench-linkrate).
//
// -steady instead runs the steady-state RAG benchmark: a 1000-passage
// corpus with Zipf popularity, two query nodes serving thousands of
// novel-order queries each against a 3-node cluster whose DRAM holds twice
// the corpus, once per write-back policy, writing STEADY.md.
//
// The full run is sized for about 5 minutes on 2 idle cores and stops at
// -timeout (10 minutes); -quick is about a minute.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/workload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kvmesh-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	quick := flag.Bool("quick", false, "a run of about a minute: fewer requests and conversations")
	seed := flag.Uint64("seed", 1, "random seed (weights, corpus, requests)")
	out := flag.String("out", "docs/bench", "directory for WORKLOADS.md and the PNG plots (empty: stdout only)")
	nodes := flag.Int("nodes", 3, "nodes of the local cluster")
	workers := flag.Int("workers", 0, "engine worker goroutines (0: GOMAXPROCS)")
	kvType := flag.String("kv-dtype", "bf16", "dtype of stored chunk KV (f32, bf16, f16)")
	codecName := flag.String("codec", "", "codec entries are sent in (raw, lossless, int8, int4, fp8); empty: the cluster's (lossless unless set); the nodes store raw and lossless entries in the cluster's codec")
	timeout := flag.Duration("timeout", 10*time.Minute, "stop after this long")
	only := flag.String("only", "rag,chat,memory", "workloads to run, comma separated")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	memSystem := flag.Int("memory-system", 32, "system prompt tokens of the memory-fact prompts (negative: none, the workload before SystemLen)")
	accuracy := flag.String("accuracy", "", "instead: measure answer accuracy of the trained model in this directory each way, and write ACCURACY.md")
	accEval := flag.String("accuracy-eval", "", "with -accuracy: the evaluation set (train/gen.py's JSON; default: eval.json in the model directory)")
	accPrompts := flag.Int("accuracy-prompts", 0, "prompts per task and k of the accuracy run (0: all of eval.json)")
	accBudget := flag.Duration("accuracy-budget", 10*time.Minute, "with -accuracy: start no round of prompts (one per task and k) after this long (0: no bound)")
	accPython := flag.String("accuracy-python", "/usr/bin/python3", "with -accuracy: the Python with torch that runs train/reference.py for the prefill baseline")
	accThreads := flag.String("accuracy-threads", "1,2", "with -accuracy: thread counts of the engine-vs-PyTorch prefill baseline")
	accRounds := flag.Int("accuracy-baseline-rounds", 3, "with -accuracy: rounds of the prefill baseline (PyTorch then the engine at each thread count; none after the first once 2 minutes have passed); each side keeps its best")
	putget := flag.Bool("putget", false, "instead: time Put and Get on 3 kvmeshd processes against redis-server (make bench-redis)")
	kvmeshd := flag.String("kvmeshd", "", "with -putget or -linkrate: the kvmeshd binary (empty: build one)")
	pgDur := flag.Duration("putget-duration", 3*time.Second, "with -putget: timed work per point")
	pgClients := flag.Int("putget-clients", 8, "with -putget: concurrent clients (kvmesh clients and Redis connections)")
	pgSizes := flag.String("putget-sizes", "256KiB,1MiB,4MiB", "with -putget: raw entry sizes")
	pgCodecs := flag.String("putget-codecs", "raw,lossless", "with -putget: codecs (each also set as the cluster's)")
	pgConfigs := flag.String("putget-rw", "3/2,1/1", "with -putget: replication R/W settings")
	pgPool := flag.Int("putget-pool", 128<<20, "with -putget: bytes of distinct entries per point")
	pgProfile := flag.String("putget-profile", "", "with -putget: write each point's CPU and allocation profiles of every node, and the clients' CPU profile, here")
	pgClientRate := flag.Int64("putget-client-link-rate", 0, "with -putget: bytes/s each way every kvmesh client connection is paced to (0: unpaced; e.g. 125000000 for 1 Gbit/s, with -putget-kvmeshd-args '-peer-link-rate 125000000' for the peer links); Redis's connections stay unpaced")
	pgNodeArgs := flag.String("putget-kvmeshd-args", "-dram-release off", "with -putget: more kvmeshd flags, space separated (the default keeps the pages the deletes between rounds free resident, as a full node reuses what it evicts)")
	linkRate := flag.Bool("linkrate", false, "instead: remote-hit TTFT for each codec at emulated link rates on 3 kvmeshd processes (make bench-linkrate)")
	lrRates := flag.String("linkrate-gbit", "0,1,10,25", "with -linkrate: emulated peer link rates in Gbit/s (0: unpaced loopback)")
	lrCodecs := flag.String("linkrate-codecs", "raw,lossless,int8,fp8", "with -linkrate: codecs the chunks are stored in")
	lrK := flag.Int("linkrate-k", 50, "with -linkrate: chunks per request")
	lrReps := flag.Int("linkrate-reps", 15, "with -linkrate: timed requests per codec and rate")
	steady := flag.Bool("steady", false, "instead: run the steady-state RAG benchmark (two query nodes, a bounded store, each write-back policy) and write STEADY.md")
	steadyQueries := flag.Int("steady-queries", 2000, "queries per query node of the -steady run")
	steadyFull := flag.Int("steady-full-every", 2, "measure full prefill on every n-th query of the -steady run")
	steadyPolicies := flag.String("steady-policies", "none,all,reuse", "write-back policies of the -steady run: none, all (admit every put), reuse (admission by predicted reuse)")
	steadyReport := flag.String("steady-report", "", "with -steady: render STEADY.md and its plots again from this JSON (-steady-json) instead of running")
	steadyJSON := flag.String("steady-json", "", "with -steady: also write the raw per-query result to this file (JSON)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	start, loadStart := time.Now(), loadAvg()
	progress := func(s string) {
		if !*quiet {
			fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(start).Seconds(), s)
		}
	}
	if *putget {
		f := putGetFlags{kvmeshd: *kvmeshd, duration: *pgDur, clients: *pgClients, poolBytes: *pgPool, profile: *pgProfile,
			nodeArgs: strings.Fields(*pgNodeArgs), clientRate: *pgClientRate}
		var err error
		if f.sizes, err = parseSizes(*pgSizes); err != nil {
			return err
		}
		if f.codecs, err = parseCodecs(*pgCodecs); err != nil {
			return err
		}
		if f.configs, err = parseConfigs(*pgConfigs); err != nil {
			return err
		}
		return runPutGet(ctx, f, progress)
	}
	if *linkRate {
		f := linkRateFlags{kvmeshd: *kvmeshd, k: *lrK, reps: *lrReps}
		var err error
		if f.rates, err = parseRates(*lrRates); err != nil {
			return err
		}
		if f.codecs, err = parseCodecs(*lrCodecs); err != nil {
			return err
		}
		if f.k < 1 || f.reps < 1 {
			return fmt.Errorf("-linkrate-k and -linkrate-reps must be positive")
		}
		return runLinkRate(ctx, f, progress)
	}
	if *accuracy != "" {
		threads, err := parseInts(*accThreads)
		if err != nil {
			return err
		}
		return runAccuracy(ctx, accuracyFlags{model: *accuracy, eval: *accEval, prompts: *accPrompts, out: *out, nodes: *nodes,
			workers: *workers, seed: *seed, budget: *accBudget, python: *accPython, threads: threads, rounds: *accRounds}, progress)
	}
	kvd, err := chunk.ParseDType(*kvType)
	if err != nil {
		return err
	}
	codec := chunk.CodecInvalid
	if *codecName != "" {
		if codec, err = chunk.ParseCodec(*codecName); err != nil {
			return err
		}
	}
	if *steady {
		return runSteady(ctx, steadyFlags{queries: *steadyQueries, fullEvery: *steadyFull, out: *out, nodes: *nodes,
			workers: *workers, seed: *seed, kvd: kvd, codec: codec, policies: *steadyPolicies, report: *steadyReport, dump: *steadyJSON}, progress)
	}
	want := map[string]bool{}
	for _, w := range strings.Split(*only, ",") {
		want[strings.TrimSpace(w)] = true
	}

	mc := workload.Model()
	e, err := workload.NewRandomEngine(mc, *seed, engine.Config{Workers: *workers, KVDType: kvd, CacheTokens: 8192,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	defer e.Close()
	l, err := workload.StartLocal(ctx, workload.LocalConfig{Nodes: *nodes, DRAMBytes: 768 << 20})
	if err != nil {
		return err
	}
	defer l.Close()
	fp, err := l.Client.RegisterModel(ctx, e.Spec())
	if err != nil {
		return err
	}
	if fp != e.Fingerprint() {
		return fmt.Errorf("cluster fingerprint %v differs from the engine's %v", fp, e.Fingerprint())
	}
	store := workload.NewClusterStore(l.Client, workload.StoreConfig{Fingerprint: fp, Codec: codec})
	progress(fmt.Sprintf("cluster of %d nodes up; model registered", *nodes))

	rag := workload.RAGConfig{Requests: 16, Warm: 6, Sweep: []float64{0, 0.3, 1}, Seed: *seed, Progress: progress}
	chat := workload.ChatRunConfig{Conversations: 5, Seed: *seed + 1, Progress: progress}
	mem := workload.MemoryConfig{Prompts: 4, SystemLen: *memSystem, Seed: *seed + 2, Progress: progress}
	if *quick {
		rag.Requests, rag.Warm, rag.Sweep = 6, 3, []float64{0, 1}
		chat.Conversations = 2
		mem.Prompts = 2
	}
	rep := &workload.Report{Env: workload.Env{
		Model: mc, KVDType: kvd.String(), Codec: chunk.StoredCodec(codec, l.Client.Codec()).String(), Workers: workers0(*workers), CPUs: runtime.NumCPU(),
		CPUModel: cpuModel(), GoVersion: runtime.Version(), Nodes: *nodes, Replicas: l.Client.ReplicationFactor(),
		Seed: *seed, Quick: *quick, Command: "kvmesh-bench " + strings.Join(os.Args[1:], " "), LoadStart: loadStart,
	}}
	var corpus *workload.Corpus
	if want["rag"] || want["chat"] {
		if rep.RAG, err = workload.RunRAG(ctx, e, store, rag); err != nil {
			return fmt.Errorf("rag: %w", err)
		}
		corpus = rep.RAG.Corpus
		if !want["rag"] {
			rep.RAG = nil
		}
	}
	if want["chat"] {
		if rep.Chat, err = workload.RunChat(ctx, e, store, corpus, chat); err != nil {
			return fmt.Errorf("chat: %w", err)
		}
	}
	if want["memory"] {
		if rep.Memory, err = workload.RunMemory(ctx, e, store, mem); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
	}
	rep.Env.Elapsed = time.Since(start)
	rep.Env.LoadEnd = loadAvg()
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		if err := rep.WritePlots(*out); err != nil {
			return err
		}
	}
	md := rep.Markdown()
	if *out != "" {
		p := filepath.Join(*out, "WORKLOADS.md")
		if err := os.WriteFile(p, []byte(md), 0o644); err != nil {
			return err
		}
		progress("wrote " + p)
	}
	fmt.Print(md)
	return nil
}

func workers0(w int) int {
	if w <= 0 {
		return runtime.GOMAXPROCS(0)
	}
	return w
}

// cpuModel is /proc/cpuinfo's first "model name", or "unknown".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// loadAvg is the first three fields of /proc/loadavg, or "".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
