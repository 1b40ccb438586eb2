package inject

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// BenchmarkTTFT is time to first token against k retrieved facts through
// a real 3-node cluster: prompt injection (full prefill) against KV
// injection by the engine's node, with every fact in its own tier (local)
// or only on the two other nodes (remote). The plain cases overlap the
// forward pass with the injection (layer l starts once layer l is
// written); the -wait cases wait for the whole injection first. The model is kvmesh-demo's
// (llama, 4 layers, hidden 256, 2 KV heads x 64, bf16 KV); facts are 24
// tokens encoded after a 20-token window, the question 16 tokens.
//
//	go test -run '^$' -bench TTFT -benchtime 10x ./tests/inject
func BenchmarkTTFT(b *testing.B) {
	bin := buildKvmeshd(b)
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	c := startCluster(b, ctx, bin)
	mc := engine.ModelConfig{
		ModelType: "llama", HiddenSize: 256, IntermediateSize: 768, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 64, VocabSize: 2048, RMSNormEps: 1e-5,
		RopeTheta: 500000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 8192, DType: chunk.BF16,
	}
	e, shm := newEngine(b, mc, chunk.BF16)
	spec, fp := e.Spec(), e.Fingerprint()
	if _, err := c.cl.RegisterModel(ctx, spec); err != nil {
		b.Fatal(err)
	}
	lay, _ := e.CacheMemory()
	inj, err := c.cl.RegisterCache(ctx, c.procs[0].Addr("grpc"), client.CacheRegistration{Fingerprint: fp, Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, File: shm.Memory.File, Offsets: shm.Memory.Offsets})
	if err != nil {
		b.Fatal(err)
	}
	defer inj.Close(b.Context())

	const maxK, factTokens, window = 50, 24, 20
	rng := rand.New(rand.NewPCG(5, 6))
	toks := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(rng.IntN(mc.VocabSize))
		}
		return out
	}
	// One stream of facts; the first half goes through the client (R=3:
	// on the engine's node too), the second only to n2 and n3.
	stream := make([][]uint32, 2*maxK)
	for i := range stream {
		stream[i] = toks(factTokens)
	}
	for i, f := range stream {
		ent, err := e.EncodeWindow(ctx, stream[:i], window, f)
		if err != nil {
			b.Fatal(err)
		}
		blob, err := chunk.Encode(nil, ent, chunk.CodecRaw)
		if err != nil {
			b.Fatal(err)
		}
		if i < maxK {
			if _, err := c.cl.Put(ctx, blob); err != nil {
				b.Fatal(err)
			}
			continue
		}
		for _, p := range c.procs[1:] {
			if err := putDirect(ctx, p.Addr("grpc"), blob, ent.Key); err != nil {
				b.Fatal(err)
			}
		}
	}
	query := toks(16)
	prompt := func(facts [][]uint32) []engine.Segment {
		var segs []engine.Segment
		for _, f := range facts {
			segs = append(segs, engine.Segment{Tokens: f, Chunk: true})
		}
		return append(segs, engine.Segment{Tokens: query})
	}
	for _, k := range []int{1, 5, 10, 20, 50} {
		near, far := prompt(stream[:k]), prompt(stream[maxK:maxK+k])
		b.Run(fmt.Sprintf("k=%d/prompt", k), func(b *testing.B) {
			for b.Loop() {
				if _, err := e.Run(ctx, nil, engine.Request{Segments: near}); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, way := range []struct {
			name string
			segs []engine.Segment
			inj  engine.CacheInjector
		}{{"local", near, inj}, {"remote", far, inj}, {"local-wait", near, waitAll{inj}}, {"remote-wait", far, waitAll{inj}}} {
			b.Run(fmt.Sprintf("k=%d/%s", k, way.name), func(b *testing.B) {
				var inj, comp time.Duration
				for b.Loop() {
					resp, err := e.RunInjected(ctx, way.inj, engine.Request{Segments: way.segs})
					if err != nil {
						b.Fatal(err)
					}
					if resp.Injected != k*factTokens {
						b.Fatalf("injected %d of %d tokens", resp.Injected, k*factTokens)
					}
					inj += resp.Inject
					comp += resp.Compute
				}
				// inject-ms: the injector's call; compute-ms: the forward
				// pass (overlapping the call in the layered cases).
				b.ReportMetric(float64(inj.Microseconds())/1e3/float64(b.N), "inject-ms")
				b.ReportMetric(float64(comp.Microseconds())/1e3/float64(b.N), "compute-ms")
			})
		}
	}
}

// waitAll hides the client's InjectPlanned: RunInjected then waits for the
// whole injection before its forward pass (the sequential path).
type waitAll struct{ inj *client.Injector }

func (w waitAll) InjectChunks(ctx context.Context, chunks []pagedkv.InjectChunk) ([]pagedkv.InjectResult, error) {
	return w.inj.InjectChunks(ctx, chunks)
}
