package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/ring"
)

// shapeModel is the realistic shape: a llama whose compute per token is
// large against its KV bytes per token, as a served model's is. Both grow
// with the layers, so their ratio is set by the width: 2·params/token over
// KV elements/token is about 12·hidden²/(2·8·128) FLOPs per KV element,
// 6k at hidden 1024 and 25k at 2048 (Llama-3.1-8B: 98k; the demo's trained
// model: 0.8k).
func shapeModel(hidden, layers int) engine.ModelConfig {
	return engine.ModelConfig{
		ModelType: "llama", HiddenSize: hidden, IntermediateSize: (hidden*11/4 + 63) / 64 * 64, NumLayers: layers,
		NumHeads: hidden / 128, NumKVHeads: 8, HeadDim: 128, VocabSize: 4096, RMSNormEps: 1e-5,
		RopeTheta: 500000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 8192, DType: chunk.BF16,
	}
}

// shapePoint is TTFT at one k on the realistic shape.
type shapePoint struct {
	k              int
	inject, prompt []time.Duration  // TTFT: KV injection (local hits), prompt injection
	injectCall     []time.Duration  // the engine's Inject timer of the KV injection runs
	stages         []inject.Timings // the node's stage timers over each KV injection run
}

type shapeResult struct {
	mc          engine.ModelConfig
	flopsPerTok float64
	kvPerTok    int // entry bytes per token
	pts         []shapePoint
}

// measureShape serves TTFT against k on random weights of the realistic
// shape: the facts' entries are synthetic KV (random bf16, keyed as the
// engine would key them, stored where the ring puts them; only facts with
// a replica on the engine's node are used), since TTFT does not depend on
// the values and encoding them would cost more than the measurement.
// Prompt injection runs at promptKs only (a prefill at k=50 takes seconds).
func measureShape(ctx context.Context, cfg demoConfig, c *client.Client, local *node.Node, log *slog.Logger,
	promptKs []int, stderr io.Writer) (*shapeResult, error) {
	mc := shapeModel(cfg.ShapeHidden, cfg.ShapeLayers)
	// In memory: the loader is the trained model's, and writing a few
	// hundred MB of random weights would cost more than the measurement.
	t0 := time.Now()
	ts, err := engine.RandomTensors(mc, cfg.Seed, 0)
	if err != nil {
		return nil, err
	}
	weights, err := engine.NewWeights(mc, ts)
	if err != nil {
		return nil, err
	}
	maxK := slices.Max(cfg.ShapeKs)
	se, err := newServingEngine(ctx, c, local, weights, "kvmesh-demo/shape", chunk.BF16, maxK*cfg.FactTokens+cfg.QueryTokens+64, log)
	if err != nil {
		return nil, err
	}
	defer se.Close()
	fp := se.Fingerprint()
	res := &shapeResult{mc: mc, kvPerTok: se.Spec().KVBytesPerToken()}
	res.flopsPerTok = flopsPerToken(mc)
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7368617065))
	var facts [][]uint32
	r := c.Ring()
	for len(facts) < maxK {
		toks := randTokens(rng, cfg.FactTokens, mc.VocabSize)
		id := chunk.ContentID(fp, toks)
		if !slices.ContainsFunc(r.Replicas(id, cfg.Replicas), func(m ring.Member) bool { return m.ID == local.ID() }) {
			continue
		}
		ent := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: id, Context: chunk.StandaloneContext()},
			DType: chunk.BF16, Layers: mc.NumLayers, KVHeads: mc.NumKVHeads, HeadDim: mc.HeadDim, Tokens: toks}
		ent.KV = make([]byte, ent.Shape().RawBytes())
		for i := 0; i+2 <= len(ent.KV); i += 2 {
			binary.LittleEndian.PutUint16(ent.KV[i:], uint16(math.Float32bits(float32(rng.NormFloat64()))>>16))
		}
		blob, err := chunk.Encode(nil, ent, c.Codec())
		if err != nil {
			return nil, err
		}
		if _, err := c.Put(ctx, blob); err != nil {
			return nil, fmt.Errorf("demo: put: %w", err)
		}
		facts = append(facts, toks)
	}
	fmt.Fprintf(stderr, "shape: model written and %d facts stored in %v\n", len(facts), time.Since(t0).Round(time.Millisecond))
	idx := make([]int, len(facts))
	for i := range idx {
		idx[i] = i
	}
	for _, k := range cfg.ShapeKs {
		pt := shapePoint{k: k}
		for q := -1; q < cfg.ShapeQueries; q++ {
			segs := promptOf(facts, pick(rng, idx, k), randTokens(rng, cfg.QueryTokens, mc.VocabSize))
			before := local.InjectStageTotals()
			t1 := time.Now()
			resp, err := se.RunInjected(ctx, se.inj, engine.Request{Segments: segs})
			d := time.Since(t1)
			after := local.InjectStageTotals()
			if err != nil {
				return nil, err
			}
			if resp.Injected != k*cfg.FactTokens {
				return nil, fmt.Errorf("demo: shape k=%d: %d of %d tokens injected", k, resp.Injected, k*cfg.FactTokens)
			}
			if q >= 0 {
				pt.inject = append(pt.inject, d)
				pt.injectCall = append(pt.injectCall, resp.Inject)
				pt.stages = append(pt.stages, inject.Timings{Fetch: after.Fetch - before.Fetch, Arrive: after.Arrive - before.Arrive,
					Verify: after.Verify - before.Verify, Decode: after.Decode - before.Decode, Scatter: after.Scatter - before.Scatter})
			}
			if slices.Contains(promptKs, k) && q >= 0 && q < 2 {
				t1 := time.Now()
				if _, err := se.Run(ctx, nil, engine.Request{Segments: segs}); err != nil {
					return nil, err
				}
				pt.prompt = append(pt.prompt, time.Since(t1))
			}
		}
		fmt.Fprintf(stderr, "shape k=%d: KV injection %v, prompt injection %v (p50)\n", k, p50(pt.inject).Round(10*time.Microsecond), p50(pt.prompt).Round(time.Millisecond))
		res.pts = append(res.pts, pt)
	}
	return res, nil
}

// growth is TTFT p50 at the last k over the first's, minus 1.
func growth(first, last time.Duration) float64 {
	return float64(last)/float64(max(first, 1)) - 1
}

// printShape writes TTFT against k on the realistic shape next to the
// trained model's local hits (pts, from the TTFT table).
func printShape(w io.Writer, cfg demoConfig, sr *shapeResult, served engine.ModelConfig, pts []ttftPoint) {
	mc := sr.mc
	fmt.Fprintf(w, "\nTTFT against k at a realistic shape (random weights: llama %d layers, hidden %d, %d heads / %d KV heads x %d, intermediate %d;\n",
		mc.NumLayers, mc.HiddenSize, mc.NumHeads, mc.NumKVHeads, mc.HeadDim, mc.IntermediateSize)
	fmt.Fprintf(w, "%.2f GFLOP per token against %d KiB of bf16 KV per token; the demo's model: %.3f GFLOP), KV injection of local facts, p50 of %d, ms:\n",
		sr.flopsPerTok/1e9, sr.kvPerTok>>10, flopsPerToken(served)/1e9, cfg.ShapeQueries)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "k\tprompt tokens\tKV inject TTFT\tinject call\tshare\tprompt injection\t")
	for _, pt := range sr.pts {
		call := p50(pt.injectCall)
		pr := "-"
		if len(pt.prompt) > 0 {
			pr = msOf(p50(pt.prompt))
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%.0f%%\t%s\t\n", pt.k, pt.k*cfg.FactTokens+cfg.QueryTokens, msOf(p50(pt.inject)), msOf(call),
			100*call.Seconds()/max(p50(pt.inject).Seconds(), 1e-9), pr)
	}
	tw.Flush()
	fmt.Fprintln(w, "The inject call split by the node's stage timers (p50 per stage, ms; verify, decode and scatter are summed over chunks and layers")
	fmt.Fprintln(w, "across the node's workers, so they may exceed the call; fetch is the wall time of finding and verifying every entry):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "k\tinject call\tfetch\tverify\tdecode\tscatter\tarrive\t")
	for _, pt := range sr.pts {
		fmt.Fprintf(tw, "%d\t%s\t", pt.k, msOf(p50(pt.injectCall)))
		for _, f := range []func(inject.Timings) time.Duration{
			func(t inject.Timings) time.Duration { return t.Fetch }, func(t inject.Timings) time.Duration { return t.Verify },
			func(t inject.Timings) time.Duration { return t.Decode }, func(t inject.Timings) time.Duration { return t.Scatter },
			func(t inject.Timings) time.Duration { return t.Arrive },
		} {
			ds := make([]time.Duration, len(pt.stages))
			for i, t := range pt.stages {
				ds[i] = f(t)
			}
			fmt.Fprintf(tw, "%s\t", msOf(p50(ds)))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	first, last := sr.pts[0], sr.pts[len(sr.pts)-1]
	fmt.Fprintf(w, "TTFT growth k=%d->%d with KV injection: %+.0f%% at this shape", first.k, last.k, 100*growth(p50(first.inject), p50(last.inject)))
	var tf, tl *ttftPoint
	for i := range pts {
		if pts[i].k == first.k {
			tf = &pts[i]
		}
		if pts[i].k == last.k {
			tl = &pts[i]
		}
	}
	if tf != nil && tl != nil {
		fmt.Fprintf(w, ", %+.0f%% on the demo's model (local hits above)", 100*growth(tf.ways[wayNear].p(0.5), tl.ways[wayNear].p(0.5)))
	}
	fmt.Fprintln(w, " (InferScale on Llama-3.1-8B: +4%; the inject call overlaps the forward pass layer by layer).")
}

// flopsPerToken is a forward pass's matmul FLOPs per token (attention's
// own, which grow with the context, left out).
func flopsPerToken(mc engine.ModelConfig) float64 {
	H, F, Q, KV := mc.HiddenSize, mc.IntermediateSize, mc.NumHeads*mc.HeadDim, mc.NumKVHeads*mc.HeadDim
	return 2 * float64(mc.NumLayers*(H*Q*2+H*KV*2+3*H*F)+H*mc.VocabSize)
}
