package workload

import (
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// Model is the workload benchmarks' model shape: deeper than wide, so that
// CacheBlend's check layer (layer 1, computed for every approximate token)
// is a small share of the work, as in the 28-32-layer models the published
// numbers come from (28-36 layers): 24 layers, hidden 192, 6 heads of 32,
// 2 KV heads, intermediate 384, vocabulary 4096, llama3 RoPE scaling, bf16
// weights. It costs about as much per token as a 12-layer model of hidden
// 256, which keeps the full run within 10 minutes on 2 cores.
func Model() engine.ModelConfig {
	return engine.ModelConfig{
		ModelType: "llama", HiddenSize: 192, IntermediateSize: 384, NumLayers: 24,
		NumHeads: 6, NumKVHeads: 2, HeadDim: 32, VocabSize: 4096, RMSNormEps: 1e-5,
		RopeTheta: 500000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 8192,
		RopeScaling: chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
		DType:       chunk.BF16,
	}
}

// NewRandomEngine builds an engine for a random-weight model of c.
func NewRandomEngine(c engine.ModelConfig, seed uint64, cfg engine.Config) (*engine.Engine, error) {
	ts, err := engine.RandomTensors(c, seed, 0)
	if err != nil {
		return nil, err
	}
	w, err := engine.NewWeights(c, ts)
	if err != nil {
		return nil, err
	}
	return engine.New(w, cfg)
}
