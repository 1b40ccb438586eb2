package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/hfconfig"
)

// Errors callers branch on.
var (
	// ErrUnsupported: a model, dtype or option this engine does not implement.
	ErrUnsupported = errors.New("engine: unsupported")
	// ErrInvalidModel: a config.json or checkpoint that cannot be a model.
	ErrInvalidModel = errors.New("engine: invalid model")
	// ErrCacheFull: the paged KV cache has no free block left.
	ErrCacheFull = errors.New("engine: kv cache full")
)

// ModelConfig is a model's config.json as hfconfig reads it; the engine
// runs the subset checkModel accepts.
type ModelConfig = hfconfig.Config

// checkModel reports the first reason c cannot be run by this engine: what
// hfconfig.Config.Validate refuses, then what the engine does not implement.
func checkModel(c ModelConfig) error {
	if err := c.Validate(); err != nil {
		return engineErr(err)
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidModel, fmt.Sprintf(format, a...))
	}
	switch c.ModelType {
	case "llama", "mistral", "qwen2", "qwen3":
	default:
		return fmt.Errorf("%w: model_type %q (want llama, mistral, qwen2 or qwen3)", ErrUnsupported, c.ModelType)
	}
	switch {
	case c.IntermediateSize <= 0 || c.VocabSize <= 0:
		return bad("sizes must be positive: intermediate %d, vocab %d", c.IntermediateSize, c.VocabSize)
	case !(c.RMSNormEps > 0):
		return bad("rms_norm_eps %v must be > 0", c.RMSNormEps)
	case c.HiddenSize > 1<<16 || c.IntermediateSize > 1<<18 || c.VocabSize > 1<<22 || c.NumLayers > 1024:
		return bad("model too large for this engine")
	case c.MLPBias:
		return fmt.Errorf("%w: mlp_bias", ErrUnsupported)
	case c.HiddenAct != "" && c.HiddenAct != "silu":
		return fmt.Errorf("%w: hidden_act %q (want silu)", ErrUnsupported, c.HiddenAct)
	case c.DType != chunk.F32 && c.DType != chunk.F16 && c.DType != chunk.BF16:
		return fmt.Errorf("%w: torch_dtype %v", ErrUnsupported, c.DType)
	}
	switch c.RopeScaling.Type {
	case "", "default", "linear", "llama3", "yarn":
	default:
		return fmt.Errorf("%w: rope scaling %q", ErrUnsupported, c.RopeScaling.Type)
	}
	return nil
}

// engineErr wraps hfconfig's errors in the engine's sentinels.
func engineErr(err error) error {
	switch {
	case errors.Is(err, hfconfig.ErrUnsupported):
		return fmt.Errorf("%w: %w", ErrUnsupported, err)
	case errors.Is(err, hfconfig.ErrInvalid):
		return fmt.Errorf("%w: %w", ErrInvalidModel, err)
	}
	return err
}

// ParseConfig reads a config.json (hfconfig.Parse) of a model this engine
// runs.
func ParseConfig(data []byte) (ModelConfig, error) {
	c, err := hfconfig.Parse(data)
	if err != nil {
		return c, engineErr(err)
	}
	return c, checkModel(c)
}

// MarshalConfig writes c as a transformers config.json.
func MarshalConfig(c ModelConfig) ([]byte, error) {
	b, err := hfconfig.Marshal(c)
	return b, engineErr(err)
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (ModelConfig, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return ModelConfig{}, fmt.Errorf("engine: read config: %w", err)
	}
	return ParseConfig(data)
}

// BenchModel is the model shape of the engine's benchmarks and of the TTFT
// benchmark (internal/enginebench): 8 layers, hidden 512, 8 heads, 2 KV
// heads, head dim 64.
func BenchModel() ModelConfig {
	return ModelConfig{
		ModelType: "llama", HiddenSize: 512, IntermediateSize: 1536, NumLayers: 8,
		NumHeads: 8, NumKVHeads: 2, HeadDim: 64, VocabSize: 4096, RMSNormEps: 1e-5,
		RopeTheta: 500000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 8192,
		RopeScaling: chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
		DType:       chunk.BF16,
	}
}
