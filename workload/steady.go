package workload

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kvtier"
)

// SteadyModel is the steady-state benchmark's model shape: a smaller
// sibling of Model (8 layers, hidden 128, 4 heads of 32, 2 KV heads,
// intermediate 256, vocabulary 4096, llama3 RoPE scaling, bf16 weights),
// so that thousands of queries, each served by kvmesh, written back, and
// every few also by full prefill, fit in half an hour on 2 shared cores.
func SteadyModel() engine.ModelConfig {
	c := Model()
	c.HiddenSize, c.IntermediateSize, c.NumLayers, c.NumHeads = 128, 256, 8, 4
	return c
}

// SteadyConfig configures RunSteady. Zero fields take the defaults shown.
type SteadyConfig struct {
	Passages             int     // corpus passages; 1000
	MinTokens, MaxTokens int     // passage length; 32, 48
	SystemLen            int     // shared system prompt; 32
	QuestionLen          int     // tokens; 16
	K                    int     // passages per query; 4
	Zipf                 float64 // exponent s of passage popularity (weight 1/rank^s); 1
	// Queries is how many queries query node A serves; 2000.
	Queries int
	// ColdAfter is how many queries node A serves before node B starts
	// (cold, against the store A filled); Queries/2. From then on they
	// alternate: B serves Queries-ColdAfter.
	ColdAfter int
	// FullEvery measures full prefill on every n-th query of each node,
	// the baseline of the TTFT speedup and of fidelity; 2.
	FullEvery int
	// Window is the number of queries a table row and a plot point
	// summarise; 100.
	Window int
	// Recompute is kvmesh's ratio r for APPROXIMATE chunks; 0.15.
	Recompute float64
	// BudgetFactor sizes each node's DRAM tier as this many times the
	// corpus's KV as stored (pages charged); 2.
	BudgetFactor float64
	// Policies are the write-back policies compared, each on a fresh
	// cluster; {none, all, reuse}.
	Policies []SteadyPolicy
	Seed     uint64
	Progress func(string) `json:"-"`
}

// SteadyPolicy is one way the store is filled during the run.
type SteadyPolicy struct {
	Name string
	// WriteBack: the query nodes write every served prompt back, keyed by
	// its prefix chain (what LMCache does); without it the store holds
	// only what was ingested.
	WriteBack bool
	Admission kvtier.Admission
}

// DefaultSteadyPolicies are the policies a run compares: no write-back,
// unconditional write-back into the plain S3-FIFO tier, and write-back
// under admission by predicted reuse with reuse-weighted eviction.
func DefaultSteadyPolicies() []SteadyPolicy {
	return []SteadyPolicy{
		{Name: "no write-back"},
		{Name: "write-back, admit all", WriteBack: true, Admission: kvtier.AdmitAll},
		{Name: "write-back, admit by reuse", WriteBack: true, Admission: kvtier.AdmitReuse},
	}
}

func (c *SteadyConfig) defaults() {
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&c.Passages, 1000)
	def(&c.MinTokens, 32)
	def(&c.MaxTokens, 48)
	def(&c.SystemLen, 32)
	def(&c.QuestionLen, 16)
	def(&c.K, 4)
	def(&c.Queries, 2000)
	def(&c.ColdAfter, c.Queries/2)
	def(&c.FullEvery, 2)
	def(&c.Window, 100)
	c.MaxTokens = max(c.MaxTokens, c.MinTokens)
	c.K = min(c.K, c.Passages)
	c.ColdAfter = min(c.ColdAfter, c.Queries)
	if c.Zipf <= 0 {
		c.Zipf = 1
	}
	if c.Recompute <= 0 {
		c.Recompute = 0.15
	}
	if c.BudgetFactor <= 0 {
		c.BudgetFactor = 2
	}
	if len(c.Policies) == 0 {
		c.Policies = DefaultSteadyPolicies()
	}
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
}

// SteadyQuery is one served query as measured.
type SteadyQuery struct {
	Node  int // 0: A (warm), 1: B (starts cold)
	Index int // the node's query index, from 0
	// TTFT of kvmesh; Full of full prefill (zero when not measured); CPU
	// and FullCPU the process CPU time over the same spans.
	TTFT, Full, CPU, FullCPU time.Duration
	// TokenLayers computed by kvmesh and by full prefill (always known:
	// full prefill computes every token in every layer).
	TokenLayers, FullTokenLayers int
	Exact, Approx, Miss          int
	// Top1 and KL compare kvmesh's next-token distribution with full
	// prefill's (only when Full was measured).
	Top1 bool
	KL   float64
	// Sent is the KV bytes the query node wrote back; Stored the bytes the
	// cluster admitted for them (all replicas).
	Sent, Stored int64
}

// SteadyHolding is what the cluster held (all nodes) after an event.
type SteadyHolding struct {
	Event int                    // events served so far (both nodes)
	Bytes [kvtier.NumReuse]int64 // stored bytes by reuse class
	N     [kvtier.NumReuse]int   // entries by reuse class
	Stats [kvtier.NumReuse]kvtier.ReuseStats
}

// SteadyRun is one policy's run.
type SteadyRun struct {
	Policy   SteadyPolicy
	Queries  [2][]SteadyQuery
	Holdings []SteadyHolding
	// Budget is each node's DRAM budget; Elapsed the run's wall time.
	Budget  int64
	Elapsed time.Duration
}

// SteadyResult is what RunSteady measured.
type SteadyResult struct {
	Config SteadyConfig
	Model  engine.ModelConfig
	// CorpusBytes is the corpus's KV as the nodes store it, CorpusCharged
	// as a node's DRAM tier charges it (whole pages).
	CorpusBytes, CorpusCharged int64
	Nodes, Replicas            int
	Runs                       []SteadyRun
}

// SteadyCorpus is the benchmark's documents and query streams.
type SteadyCorpus struct {
	System   []uint32
	Passages [][]uint32
	// Streams[n] are node n's queries: passage indices in prompt order and
	// a question.
	Streams [2][]RAGRequest
}

// NewSteadyCorpus generates the corpus and both nodes' query streams:
// every query draws K distinct passages by Zipf popularity and puts them
// in a random order, so nearly every prompt is a novel ordering.
func NewSteadyCorpus(cfg SteadyConfig, vocab int) *SteadyCorpus {
	cfg.defaults()
	r := rand.New(rand.NewPCG(cfg.Seed, 0x737465616479))
	c := &SteadyCorpus{System: randTokens(r, cfg.SystemLen, vocab)}
	c.Passages = make([][]uint32, cfg.Passages)
	for i := range c.Passages {
		c.Passages[i] = randTokens(r, cfg.MinTokens+r.IntN(cfg.MaxTokens-cfg.MinTokens+1), vocab)
	}
	// Popularity rank is a random permutation of the passages.
	rank := r.Perm(cfg.Passages)
	cum := make([]float64, cfg.Passages)
	var total float64
	for i := range cum {
		total += 1 / math.Pow(float64(i+1), cfg.Zipf)
		cum[i] = total
	}
	for n := range c.Streams {
		qs := make([]RAGRequest, cfg.Queries)
		if n == 1 {
			qs = qs[:cfg.Queries-cfg.ColdAfter]
		}
		for i := range qs {
			var ps []int
			for len(ps) < cfg.K {
				p := rank[sort.SearchFloat64s(cum, r.Float64()*total)]
				if !slices.Contains(ps, p) {
					ps = append(ps, p)
				}
			}
			qs[i] = RAGRequest{Passages: ps, Question: randTokens(r, cfg.QuestionLen, vocab)}
		}
		c.Streams[n] = qs
	}
	return c
}

// Segments is query q's prompt.
func (c *SteadyCorpus) Segments(q RAGRequest) []engine.Segment {
	segs := make([]engine.Segment, 0, len(q.Passages)+2)
	segs = append(segs, engine.Segment{Tokens: c.System, Chunk: true})
	for _, p := range q.Passages {
		segs = append(segs, engine.Segment{Tokens: c.Passages[p], Chunk: true})
	}
	return append(segs, engine.Segment{Tokens: q.Question})
}

// SteadyEnv is what RunSteady needs from its caller: two engines of the
// same weights (the query nodes) and a way to start a fresh local cluster
// per policy.
type SteadyEnv struct {
	Engines [2]*engine.Engine
	// Start starts a cluster whose nodes keep dramBytes each under adm.
	Start func(ctx context.Context, dramBytes int64, adm kvtier.Admission) (*Local, error)
	// Codec entries are sent in; CodecInvalid means the cluster's.
	Codec chunk.Codec
	// Stored is the codec the nodes store entries in (the cluster's); it
	// sizes the corpus, and so the DRAM budget.
	Stored chunk.Codec
}

// RunSteady runs the steady-state RAG benchmark: per policy, a fresh
// cluster ingests the corpus (the system prompt and every passage
// standalone), then query node A serves ColdAfter queries alone,
// A and B (each an engine beside its own node) alternate until A has
// served Queries, and B serves the rest of its Queries. Each query is
// served by kvmesh chunk reuse (EXACT, else APPROXIMATE with recompute r)
// and, under write-back policies, written back keyed by its prefix chain;
// every FullEvery-th query is also served by full prefill.
func RunSteady(ctx context.Context, env SteadyEnv, cfg SteadyConfig) (*SteadyResult, error) {
	cfg.defaults()
	ea := env.Engines[0]
	corpus := NewSteadyCorpus(cfg, ea.Config().VocabSize)
	res := &SteadyResult{Config: cfg, Model: ea.Config()}
	// Encode the corpus once: every run ingests the same entries.
	var ingest []*chunk.Entry
	// The system prompt starts every prompt: nothing is before it, so its
	// one key is standalone (chunk.Canonical), EXACT for every query.
	sys, err := ea.EncodeStandalone(ctx, corpus.System)
	if err != nil {
		return nil, err
	}
	ingest = append(ingest, sys)
	const page = 64 << 10 // kvtier's default DRAM page
	for _, p := range corpus.Passages {
		ent, err := ea.EncodeStandalone(ctx, p)
		if err != nil {
			return nil, err
		}
		ingest = append(ingest, ent)
	}
	for _, ent := range ingest {
		n, err := encodedLen(ent, env.Stored)
		if err != nil {
			return nil, err
		}
		res.CorpusBytes += int64(n)
		res.CorpusCharged += int64((n + page - 1) / page * page)
	}
	cfg.Progress(fmt.Sprintf("steady: corpus of %d passages encoded, %.1f MiB of KV (%.1f MiB in DRAM pages)",
		len(corpus.Passages), mib(res.CorpusBytes), mib(res.CorpusCharged)))
	budget := int64(cfg.BudgetFactor * float64(res.CorpusCharged))
	for _, pol := range cfg.Policies {
		run, err := runSteadyPolicy(ctx, env, cfg, corpus, ingest, pol, budget, res)
		if err != nil {
			return nil, fmt.Errorf("steady %s: %w", pol.Name, err)
		}
		res.Runs = append(res.Runs, *run)
	}
	return res, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func encodedLen(ent *chunk.Entry, codec chunk.Codec) (int, error) {
	if codec == chunk.CodecInvalid {
		codec = chunk.CodecRaw
	}
	b, err := chunk.Encode(nil, ent, codec)
	return len(b), err
}

// countingSink counts the KV bytes put through it.
type countingSink struct {
	engine.ChunkSink
	sent int64
}

func (c *countingSink) Put(ctx context.Context, e *chunk.Entry) error {
	c.sent += int64(len(e.KV))
	return c.ChunkSink.Put(ctx, e)
}

func runSteadyPolicy(ctx context.Context, env SteadyEnv, cfg SteadyConfig, corpus *SteadyCorpus, ingest []*chunk.Entry,
	pol SteadyPolicy, budget int64, res *SteadyResult) (*SteadyRun, error) {
	t0 := time.Now()
	l, err := env.Start(ctx, budget, pol.Admission)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	run := &SteadyRun{Policy: pol, Budget: budget}
	res.Nodes, res.Replicas = len(l.Nodes), l.Client.ReplicationFactor()
	fp, err := l.Client.RegisterModel(ctx, env.Engines[0].Spec())
	if err != nil {
		return nil, err
	}
	// Each query node's client starts from its own node.
	var stores [2]*ClusterStore
	for n := range stores {
		c, err := client.New(ctx, client.Config{Seeds: []string{l.Nodes[n%len(l.Nodes)].GRPCAddr()}, Logger: discardLogger()})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		stores[n] = NewClusterStore(c, StoreConfig{Fingerprint: fp, Codec: env.Codec})
	}
	for _, ent := range ingest {
		if err := stores[0].Put(ctx, ent); err != nil {
			return nil, err
		}
	}
	admitted := func() int64 {
		var b int64
		for _, n := range l.Nodes {
			for _, r := range n.StoreStats().Reuse {
				b += int64(r.AdmittedBytes)
			}
		}
		return b
	}
	hold := func(event int) {
		h := SteadyHolding{Event: event}
		for _, n := range l.Nodes {
			for c, r := range n.StoreStats().Reuse {
				h.Bytes[c] += r.StoredBytes
				h.N[c] += r.Entries
				s := &h.Stats[c]
				s.Admitted += r.Admitted
				s.AdmittedBytes += r.AdmittedBytes
				s.Refused += r.Refused
				s.RefusedBytes += r.RefusedBytes
				s.Evicted += r.Evicted
			}
		}
		run.Holdings = append(run.Holdings, h)
	}
	hold(0)
	// The schedule: A alone, then A and B alternating, then B alone.
	type ev struct{ node, i int }
	var sched []ev
	for i := range cfg.ColdAfter {
		sched = append(sched, ev{0, i})
	}
	for i := range cfg.Queries - cfg.ColdAfter {
		sched = append(sched, ev{0, cfg.ColdAfter + i}, ev{1, i})
	}
	before := admitted()
	for k, e := range sched {
		eng, store := env.Engines[e.node], stores[e.node]
		segs := corpus.Segments(corpus.Streams[e.node][e.i])
		q := SteadyQuery{Node: e.node, Index: e.i}
		var ref []float32
		if e.i%cfg.FullEvery == 0 {
			c, t := processCPU(), time.Now()
			full, err := eng.Run(ctx, nil, engine.Request{Segments: segs})
			if err != nil {
				return nil, err
			}
			q.Full, q.FullCPU = time.Since(t), processCPU()-c
			ref = full.Logits
		}
		c, t := processCPU(), time.Now()
		resp, err := eng.Run(ctx, store, engine.Request{Segments: segs, Recompute: cfg.Recompute})
		if err != nil {
			return nil, err
		}
		q.TTFT, q.CPU = time.Since(t), processCPU()-c
		q.TokenLayers, q.FullTokenLayers = resp.TokenLayers, resp.Tokens*eng.Config().NumLayers
		for _, cr := range resp.Chunks {
			switch cr.Match {
			case chunk.MatchExact:
				q.Exact++
			case chunk.MatchApproximate:
				q.Approx++
			default:
				q.Miss++
			}
		}
		if ref != nil {
			q.Top1 = engine.Argmax(ref) == engine.Argmax(resp.Logits)
			q.KL = engine.KL(ref, resp.Logits)
		}
		if pol.WriteBack {
			sink := &countingSink{ChunkSink: store}
			if err := writeBack(ctx, eng, sink, segs); err != nil {
				return nil, err
			}
			q.Sent = sink.sent
			now := admitted()
			q.Stored, before = now-before, now
		}
		run.Queries[e.node] = append(run.Queries[e.node], q)
		if (k+1)%(cfg.Window/2) == 0 || k == len(sched)-1 {
			hold(k + 1)
		}
		if (k+1)%500 == 0 {
			cfg.Progress(fmt.Sprintf("steady %s: %d of %d queries (%v)", pol.Name, k+1, len(sched), time.Since(t0).Round(time.Second)))
		}
	}
	run.Elapsed = time.Since(t0)
	return run, nil
}

// SteadyWindow summarises Window consecutive queries of one node.
type SteadyWindow struct {
	From, To int // query indices [From, To)
	// Speedup is the median, over the queries where both were measured,
	// of full prefill's TTFT over kvmesh's on the same query: the two run
	// back to back, so load from other processes, which drifts over
	// seconds, mostly cancels. CPUSpeedup is the same for process CPU
	// time; WorkSpeedup the token-layers of full prefill over kvmesh's,
	// over all queries (load does not change it).
	Speedup, CPUSpeedup, WorkSpeedup float64
	FullP50, TTFTP50                 time.Duration
	Exact, Approx, Miss              float64 // shares of chunk lookups
	Top1                             float64 // kvmesh's next token agrees with full prefill's
	KL                               float64 // mean KL(full || kvmesh)
	Sent, Stored                     float64 // bytes per query
}

// Windows summarises node n's queries of run r.
func (r *SteadyRun) Windows(n, size int) []SteadyWindow {
	qs := r.Queries[n]
	var out []SteadyWindow
	for lo := 0; lo < len(qs); lo += size {
		hi := min(lo+size, len(qs))
		w := SteadyWindow{From: qs[lo].Index, To: qs[hi-1].Index + 1}
		var full, all []time.Duration
		var ratios, cpuRatios []float64
		var work, fullWork, chunks, top1, sampled int
		for _, q := range qs[lo:hi] {
			all = append(all, q.TTFT)
			work += q.TokenLayers
			fullWork += q.FullTokenLayers
			w.Exact += float64(q.Exact)
			w.Approx += float64(q.Approx)
			w.Miss += float64(q.Miss)
			chunks += q.Exact + q.Approx + q.Miss
			w.Sent += float64(q.Sent)
			w.Stored += float64(q.Stored)
			if q.Full > 0 {
				full = append(full, q.Full)
				if q.TTFT > 0 {
					ratios = append(ratios, float64(q.Full)/float64(q.TTFT))
				}
				if q.CPU > 0 {
					cpuRatios = append(cpuRatios, float64(q.FullCPU)/float64(q.CPU))
				}
				sampled++
				w.KL += q.KL
				if q.Top1 {
					top1++
				}
			}
		}
		w.FullP50, w.TTFTP50 = Quantile(full, 0.5), Quantile(all, 0.5)
		w.Speedup, w.CPUSpeedup = Quantile(ratios, 0.5), Quantile(cpuRatios, 0.5)
		if work > 0 {
			w.WorkSpeedup = float64(fullWork) / float64(work)
		}
		if chunks > 0 {
			w.Exact, w.Approx, w.Miss = w.Exact/float64(chunks), w.Approx/float64(chunks), w.Miss/float64(chunks)
		}
		if sampled > 0 {
			w.Top1, w.KL = float64(top1)/float64(sampled), w.KL/float64(sampled)
		}
		n := float64(hi - lo)
		w.Sent, w.Stored = w.Sent/n, w.Stored/n
		out = append(out, w)
	}
	return out
}
