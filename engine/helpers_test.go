package engine

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// tinyConfig is a 4-layer GQA model small enough for -race.
func tinyConfig() ModelConfig {
	return ModelConfig{
		ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 16, VocabSize: 256, RMSNormEps: 1e-5,
		RopeTheta: 10000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 4096, DType: chunk.F32,
	}
}

// variants are the model families and RoPE settings the tests cover.
func variants() map[string]ModelConfig {
	base := tinyConfig()
	m := map[string]ModelConfig{}
	m["llama-neox"] = base
	g := base
	g.RopeStyle = chunk.RopeGPTJ
	m["llama-gptj"] = g
	l3 := base
	l3.RopeScaling = chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}
	m["llama3-neox"] = l3
	l3g := l3
	l3g.RopeStyle = chunk.RopeGPTJ
	m["llama3-gptj"] = l3g
	y := base
	y.RopeScaling = chunk.RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 256}
	m["yarn-neox"] = y
	yg := y
	yg.RopeStyle = chunk.RopeGPTJ
	m["yarn-gptj"] = yg
	q2 := base
	q2.ModelType, q2.AttentionBias, q2.TieWordEmbeddings = "qwen2", true, true
	m["qwen2-bias-tied"] = q2
	lb := base
	lb.AttentionBias = true // llama: q, k, v and o biases
	m["llama-bias"] = lb
	q3 := base
	q3.ModelType, q3.QKNorm = "qwen3", true
	m["qwen3-qknorm"] = q3
	p := base
	p.ModelType, p.PartialRotaryFactor, p.RopeScaling = "mistral", 0.5, chunk.RopeScaling{Type: "linear", Factor: 2}
	m["mistral-partial-linear"] = p
	return m
}

// newTestEngine writes a random model of c, loads it through the real
// loader and starts an engine.
func newTestEngine(t testing.TB, c ModelConfig, seed uint64) *Engine {
	t.Helper()
	dir := t.TempDir()
	if _, err := WriteRandomModel(dir, c, seed, 1); err != nil {
		t.Fatal(err)
	}
	w, err := LoadWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(w, Config{Workers: 2, CacheTokens: 2048})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func randTokens(r *rand.Rand, n, vocab int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(r.IntN(vocab))
	}
	return out
}

func maxAbsDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}
