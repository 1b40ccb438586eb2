package workload

import (
	"time"

	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// tinyModel is small enough for -race: 4 layers, hidden 64.
func tinyModel() engine.ModelConfig {
	return engine.ModelConfig{
		ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 16, VocabSize: 256, RMSNormEps: 1e-5,
		RopeTheta: 10000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 4096, DType: chunk.F32,
	}
}

func tinyEngine(t testing.TB) *engine.Engine {
	t.Helper()
	e, err := NewRandomEngine(tinyModel(), 7, engine.Config{Workers: 2, CacheTokens: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// smallCorpus has short passages so the tests stay fast.
func smallCorpus() CorpusConfig {
	return CorpusConfig{Passages: 24, MinTokens: 8, MaxTokens: 16, Topics: 3, TopicSize: 10, SystemLen: 6, Seed: 3}
}

func timeMS(x int64) time.Duration { return time.Duration(x) * time.Millisecond }
