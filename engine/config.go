package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/kvmesh/kvmesh/chunk"
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

// ModelConfig is the part of a Hugging Face config.json the forward pass
// needs. JSON names follow transformers; RopeStyle is ours ("kvmesh_rope_style",
// "gptj" for interleaved pairs; HF Llama-family checkpoints are always NeoX).
type ModelConfig struct {
	ModelType             string
	HiddenSize            int
	IntermediateSize      int
	NumLayers             int
	NumHeads              int
	NumKVHeads            int
	HeadDim               int
	VocabSize             int
	RMSNormEps            float64
	RopeTheta             float64
	PartialRotaryFactor   float64 // 0 means 1
	RopeScaling           chunk.RopeScaling
	RopeStyle             chunk.RopeStyle
	MaxPositionEmbeddings int
	TieWordEmbeddings     bool
	// AttentionBias adds biases to q, k and v (Qwen2 always has them) and,
	// except for Qwen2, to o_proj as transformers does.
	AttentionBias bool
	// QKNorm applies RMSNorm over head_dim to q and k before RoPE (Qwen3).
	QKNorm bool
	// SlidingWindow, when > 0, bounds the sequence length the engine accepts
	// (it does not implement windowed attention).
	SlidingWindow int
	// DType is torch_dtype, the dtype the writer stores weights in.
	DType chunk.DType
}

// OutputBias reports whether o_proj has a bias: attention_bias in every
// family but Qwen2, whose o_proj never has one.
func (c ModelConfig) OutputBias() bool { return c.AttentionBias && c.ModelType != "qwen2" }

// RotaryDim is the number of head dims RoPE rotates.
func (c ModelConfig) RotaryDim() int {
	f := c.PartialRotaryFactor
	if f == 0 {
		f = 1
	}
	return int(float64(c.HeadDim) * f)
}

// Validate reports the first reason c cannot be run.
func (c ModelConfig) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidModel, fmt.Sprintf(format, a...))
	}
	switch c.ModelType {
	case "llama", "mistral", "qwen2", "qwen3":
	default:
		return fmt.Errorf("%w: model_type %q (want llama, mistral, qwen2 or qwen3)", ErrUnsupported, c.ModelType)
	}
	switch {
	case c.HiddenSize <= 0 || c.IntermediateSize <= 0 || c.NumLayers <= 0 || c.VocabSize <= 0:
		return bad("sizes must be positive: hidden %d, intermediate %d, layers %d, vocab %d", c.HiddenSize, c.IntermediateSize, c.NumLayers, c.VocabSize)
	case c.NumHeads <= 0 || c.NumKVHeads <= 0 || c.NumHeads%c.NumKVHeads != 0:
		return bad("%d heads must be a positive multiple of %d kv heads", c.NumHeads, c.NumKVHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return bad("head dim %d must be even and positive", c.HeadDim)
	case !(c.RMSNormEps > 0):
		return bad("rms_norm_eps %v must be > 0", c.RMSNormEps)
	case c.PartialRotaryFactor < 0 || c.PartialRotaryFactor > 1:
		return bad("partial_rotary_factor %v out of [0, 1]", c.PartialRotaryFactor)
	case c.RotaryDim()%2 != 0 || c.RotaryDim() == 0:
		return bad("rotary dim %d must be even and positive", c.RotaryDim())
	case c.HiddenSize > 1<<16 || c.IntermediateSize > 1<<18 || c.VocabSize > 1<<22 || c.NumLayers > 1024:
		return bad("model too large for this engine")
	}
	switch c.RopeScaling.Type {
	case "", "default", "linear", "llama3", "yarn":
	default:
		return fmt.Errorf("%w: rope scaling %q", ErrUnsupported, c.RopeScaling.Type)
	}
	return nil
}

// Spec is the chunk.ModelSpec of KV this model produces, stored in kvDType.
// The caller sets WeightsRevision (Load uses a hash of the weights) and
// TokenizerID.
func (c ModelConfig) Spec(kvDType chunk.DType) chunk.ModelSpec {
	rd := c.RotaryDim()
	if rd == c.HeadDim {
		rd = 0
	}
	style := c.RopeStyle
	if style == 0 {
		style = chunk.RopeNeoX
	}
	sc := c.RopeScaling
	if sc.Type == "default" {
		sc.Type = ""
	}
	return chunk.ModelSpec{
		Family:    c.ModelType,
		Layers:    c.NumLayers,
		KVHeads:   c.NumKVHeads,
		HeadDim:   c.HeadDim,
		DType:     kvDType,
		RopeStyle: style,
		RopeTheta: c.RopeTheta,
		RotaryDim: rd,
		Scaling:   sc,
	}
}

// hfConfig mirrors config.json. Pointers tell "absent" from zero.
type hfConfig struct {
	ModelType             string          `json:"model_type"`
	HiddenSize            int             `json:"hidden_size"`
	IntermediateSize      int             `json:"intermediate_size"`
	NumLayers             int             `json:"num_hidden_layers"`
	NumHeads              int             `json:"num_attention_heads"`
	NumKVHeads            *int            `json:"num_key_value_heads,omitempty"`
	HeadDim               *int            `json:"head_dim,omitempty"`
	VocabSize             int             `json:"vocab_size"`
	RMSNormEps            float64         `json:"rms_norm_eps"`
	RopeTheta             *float64        `json:"rope_theta,omitempty"`
	PartialRotaryFactor   *float64        `json:"partial_rotary_factor,omitempty"`
	RopeScaling           json.RawMessage `json:"rope_scaling,omitempty"`
	RopeParameters        json.RawMessage `json:"rope_parameters,omitempty"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	TieWordEmbeddings     bool            `json:"tie_word_embeddings"`
	AttentionBias         *bool           `json:"attention_bias,omitempty"`
	MLPBias               bool            `json:"mlp_bias,omitempty"`
	HiddenAct             string          `json:"hidden_act,omitempty"`
	SlidingWindow         *int            `json:"sliding_window,omitempty"`
	UseSlidingWindow      *bool           `json:"use_sliding_window,omitempty"`
	TorchDType            string          `json:"torch_dtype,omitempty"`
	DType                 string          `json:"dtype,omitempty"` // transformers v5 spelling
	Architectures         []string        `json:"architectures,omitempty"`
	RopeStyle             string          `json:"kvmesh_rope_style,omitempty"`
}

// ropeJSON is rope_scaling (legacy "type" or "rope_type") or
// rope_parameters (which also carries rope_theta).
type ropeJSON struct {
	RopeType       string   `json:"rope_type"`
	Type           string   `json:"type"`
	RopeTheta      *float64 `json:"rope_theta"`
	Factor         float64  `json:"factor"`
	LowFreqFactor  float64  `json:"low_freq_factor"`
	HighFreqFactor float64  `json:"high_freq_factor"`
	OrigMax        int      `json:"original_max_position_embeddings"`
	BetaFast       float64  `json:"beta_fast"`
	BetaSlow       float64  `json:"beta_slow"`
	AttnFactor     float64  `json:"attention_factor"`
	PartialRotary  *float64 `json:"partial_rotary_factor"`
}

// ParseConfig reads a config.json.
func ParseConfig(data []byte) (ModelConfig, error) {
	var h hfConfig
	if err := json.Unmarshal(data, &h); err != nil {
		return ModelConfig{}, fmt.Errorf("%w: config.json: %v", ErrInvalidModel, err)
	}
	c := ModelConfig{
		ModelType:             h.ModelType,
		HiddenSize:            h.HiddenSize,
		IntermediateSize:      h.IntermediateSize,
		NumLayers:             h.NumLayers,
		NumHeads:              h.NumHeads,
		NumKVHeads:            h.NumHeads,
		VocabSize:             h.VocabSize,
		RMSNormEps:            h.RMSNormEps,
		RopeTheta:             10000,
		MaxPositionEmbeddings: h.MaxPositionEmbeddings,
		TieWordEmbeddings:     h.TieWordEmbeddings,
		DType:                 chunk.F32,
	}
	if h.NumKVHeads != nil {
		c.NumKVHeads = *h.NumKVHeads
	}
	if h.HeadDim != nil && *h.HeadDim > 0 {
		c.HeadDim = *h.HeadDim
	} else if h.NumHeads > 0 {
		c.HeadDim = h.HiddenSize / h.NumHeads
	}
	if h.RopeTheta != nil {
		c.RopeTheta = *h.RopeTheta
	}
	if h.PartialRotaryFactor != nil {
		c.PartialRotaryFactor = *h.PartialRotaryFactor
	}
	switch h.ModelType {
	case "qwen2":
		c.AttentionBias = true
	case "qwen3":
		c.QKNorm = true
	}
	if h.AttentionBias != nil {
		c.AttentionBias = *h.AttentionBias
	}
	if h.MLPBias {
		return c, fmt.Errorf("%w: mlp_bias", ErrUnsupported)
	}
	if h.HiddenAct != "" && h.HiddenAct != "silu" {
		return c, fmt.Errorf("%w: hidden_act %q (want silu)", ErrUnsupported, h.HiddenAct)
	}
	if h.SlidingWindow != nil && *h.SlidingWindow > 0 && (h.UseSlidingWindow == nil || *h.UseSlidingWindow) {
		c.SlidingWindow = *h.SlidingWindow
	}
	switch h.RopeStyle {
	case "", "neox":
		c.RopeStyle = chunk.RopeNeoX
	case "gptj":
		c.RopeStyle = chunk.RopeGPTJ
	default:
		return c, fmt.Errorf("%w: kvmesh_rope_style %q", ErrUnsupported, h.RopeStyle)
	}
	dt := h.TorchDType
	if dt == "" {
		dt = h.DType
	}
	if dt != "" {
		d, err := chunk.ParseDType(dt)
		if err != nil || d == chunk.FP8E4M3 {
			return c, fmt.Errorf("%w: torch_dtype %q", ErrUnsupported, dt)
		}
		c.DType = d
	}
	rope := h.RopeScaling
	if len(h.RopeParameters) > 0 && string(h.RopeParameters) != "null" {
		rope = h.RopeParameters
	}
	if len(rope) > 0 && string(rope) != "null" {
		var r ropeJSON
		if err := json.Unmarshal(rope, &r); err != nil {
			return c, fmt.Errorf("%w: rope parameters: %v", ErrInvalidModel, err)
		}
		if r.RopeTheta != nil {
			c.RopeTheta = *r.RopeTheta
		}
		if r.PartialRotary != nil {
			c.PartialRotaryFactor = *r.PartialRotary
		}
		typ := r.RopeType
		if typ == "" {
			typ = r.Type
		}
		sc := chunk.RopeScaling{Type: typ}
		switch typ {
		case "", "default":
			sc.Type = ""
		case "linear":
			sc.Factor = r.Factor
		case "llama3":
			sc.Factor, sc.LowFreqFactor, sc.HighFreqFactor, sc.OriginalMaxPositions = r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.OrigMax
		case "yarn":
			// Pinned: the correction range uses original_max_position_embeddings
			// when given, else max_position_embeddings (transformers < 4.45).
			sc.Factor, sc.BetaFast, sc.BetaSlow, sc.AttentionFactor = r.Factor, r.BetaFast, r.BetaSlow, r.AttnFactor
			sc.OriginalMaxPositions = r.OrigMax
			if sc.OriginalMaxPositions == 0 {
				sc.OriginalMaxPositions = h.MaxPositionEmbeddings
			}
		default:
			return c, fmt.Errorf("%w: rope type %q", ErrUnsupported, typ)
		}
		c.RopeScaling = sc
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	if err := c.Spec(chunk.F32).Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidModel, err)
	}
	return c, nil
}

// MarshalConfig writes c as a transformers config.json.
func MarshalConfig(c ModelConfig) ([]byte, error) {
	m := map[string]any{
		"model_type":              c.ModelType,
		"hidden_size":             c.HiddenSize,
		"intermediate_size":       c.IntermediateSize,
		"num_hidden_layers":       c.NumLayers,
		"num_attention_heads":     c.NumHeads,
		"num_key_value_heads":     c.NumKVHeads,
		"head_dim":                c.HeadDim,
		"vocab_size":              c.VocabSize,
		"rms_norm_eps":            c.RMSNormEps,
		"rope_theta":              c.RopeTheta,
		"max_position_embeddings": c.MaxPositionEmbeddings,
		"tie_word_embeddings":     c.TieWordEmbeddings,
		"attention_bias":          c.AttentionBias,
		"torch_dtype":             torchName(c.DType),
	}
	if c.PartialRotaryFactor != 0 && c.PartialRotaryFactor != 1 {
		m["partial_rotary_factor"] = c.PartialRotaryFactor
	}
	if c.RopeStyle == chunk.RopeGPTJ {
		m["kvmesh_rope_style"] = "gptj"
	}
	if c.SlidingWindow > 0 {
		m["sliding_window"] = c.SlidingWindow
	}
	switch sc := c.RopeScaling; sc.Type {
	case "", "default":
	case "linear":
		m["rope_scaling"] = map[string]any{"rope_type": "linear", "factor": sc.Factor}
	case "llama3":
		m["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": sc.Factor, "low_freq_factor": sc.LowFreqFactor,
			"high_freq_factor": sc.HighFreqFactor, "original_max_position_embeddings": sc.OriginalMaxPositions}
	case "yarn":
		r := map[string]any{"rope_type": "yarn", "factor": sc.Factor, "original_max_position_embeddings": sc.OriginalMaxPositions}
		if sc.BetaFast != 0 {
			r["beta_fast"] = sc.BetaFast
		}
		if sc.BetaSlow != 0 {
			r["beta_slow"] = sc.BetaSlow
		}
		if sc.AttentionFactor != 0 {
			r["attention_factor"] = sc.AttentionFactor
		}
		m["rope_scaling"] = r
	default:
		return nil, fmt.Errorf("%w: rope scaling %q", ErrUnsupported, sc.Type)
	}
	for _, v := range []float64{c.RMSNormEps, c.RopeTheta} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: non-finite config value", ErrInvalidModel)
		}
	}
	return json.MarshalIndent(m, "", "  ")
}

func torchName(d chunk.DType) string {
	switch d {
	case chunk.F16:
		return "float16"
	case chunk.BF16:
		return "bfloat16"
	}
	return "float32"
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
