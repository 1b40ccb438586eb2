// Package hfconfig reads and writes a Hugging Face transformers config.json
// of the decoder families kvmesh knows and maps one to the chunk.ModelSpec of
// the KV it produces. It is the one place that knows config.json: the
// reference engine loads models through it and `kvmesh register` turns a
// config.json into a spec with it (docs/KEYS.md, section 1b).
//
// Parse refuses what a spec cannot describe (ErrUnsupported: another
// architecture, a RoPE type kvmesh does not implement) and what cannot be a
// model (ErrInvalid: heads that kv heads do not divide, a head dim the
// hidden size does not give, an incomplete rope_scaling, rope_theta given
// twice with two values). Members it does not read are ignored, as
// transformers does: a config.json carries many.
package hfconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvmesh/kvmesh/chunk"
)

// Errors callers branch on.
var (
	// ErrUnsupported: an architecture, RoPE type or option kvmesh cannot describe.
	ErrUnsupported = errors.New("hfconfig: unsupported")
	// ErrInvalid: a config.json that cannot be a model.
	ErrInvalid = errors.New("hfconfig: invalid config.json")
)

// Families are the model_type values Parse accepts: decoders with grouped
// K/V heads and rotate-half (NeoX) RoPE over the whole head, whose KV a
// ModelSpec describes. The reference engine runs a subset of them.
var Families = []string{"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}

// Config is the part of a config.json kvmesh reads. JSON names follow
// transformers; RopeStyle is ours ("kvmesh_rope_style": "gptj" for
// interleaved pairs; HF checkpoints of these families are always NeoX).
type Config struct {
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
	// MLPBias adds biases to the MLP's projections.
	MLPBias bool
	// HiddenAct is the MLP's activation ("" means silu).
	HiddenAct string
	// QKNorm applies RMSNorm over head_dim to q and k before RoPE (Qwen3).
	QKNorm bool
	// SlidingWindow is the attention window when one is used (0: none).
	SlidingWindow int
	// DType is torch_dtype (transformers v5: dtype), the dtype of the
	// weights; float32 when absent, as in transformers.
	DType chunk.DType
}

// OutputBias reports whether o_proj has a bias: attention_bias in every
// family but Qwen2, whose o_proj never has one.
func (c Config) OutputBias() bool { return c.AttentionBias && c.ModelType != "qwen2" }

// RotaryDim is the number of head dims RoPE rotates.
func (c Config) RotaryDim() int {
	f := c.PartialRotaryFactor
	if f == 0 {
		f = 1
	}
	return int(float64(c.HeadDim) * f)
}

// Validate reports the first reason c cannot be a model of Families.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if !slices.Contains(Families, c.ModelType) {
		return fmt.Errorf("%w: model_type %q (want one of %v)", ErrUnsupported, c.ModelType, Families)
	}
	switch {
	case c.HiddenSize <= 0 || c.NumLayers <= 0:
		return bad("hidden_size %d and num_hidden_layers %d must be positive", c.HiddenSize, c.NumLayers)
	case c.NumHeads <= 0 || c.NumKVHeads <= 0 || c.NumHeads%c.NumKVHeads != 0:
		return bad("num_attention_heads %d must be a positive multiple of num_key_value_heads %d", c.NumHeads, c.NumKVHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return bad("head dim %d must be even and positive", c.HeadDim)
	case c.PartialRotaryFactor < 0 || c.PartialRotaryFactor > 1:
		return bad("partial_rotary_factor %v out of [0, 1]", c.PartialRotaryFactor)
	case c.RotaryDim()%2 != 0 || c.RotaryDim() == 0:
		return bad("rotary dim %d must be even and positive", c.RotaryDim())
	case c.IntermediateSize < 0 || c.VocabSize < 0 || c.MaxPositionEmbeddings < 0 || c.SlidingWindow < 0 || c.RMSNormEps < 0:
		return bad("negative size")
	}
	if err := c.Spec(chunk.F32).Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// Spec is the chunk.ModelSpec of KV this model produces, stored in kvDType.
// The caller sets WeightsRevision, TokenizerID and Salt: a config.json does
// not name its weights, and two fine-tunes of one base share it.
func (c Config) Spec(kvDType chunk.DType) chunk.ModelSpec {
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

// IsConfig reports whether b is a JSON object with a model_type member: a
// config.json rather than another JSON document (a register JSON has
// "family" instead).
func IsConfig(b []byte) bool {
	var probe map[string]json.RawMessage
	if json.Unmarshal(b, &probe) != nil {
		return false
	}
	_, ok := probe["model_type"]
	return ok
}

// Parse reads a config.json and checks it with Validate.
func Parse(data []byte) (Config, error) {
	var h hfConfig
	if err := json.Unmarshal(data, &h); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	c := Config{
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
		MLPBias:               h.MLPBias,
		HiddenAct:             h.HiddenAct,
		DType:                 chunk.F32,
	}
	if !slices.Contains(Families, h.ModelType) {
		return c, fmt.Errorf("%w: model_type %q (want one of %v)", ErrUnsupported, h.ModelType, Families)
	}
	if h.NumKVHeads != nil {
		c.NumKVHeads = *h.NumKVHeads
	}
	switch {
	case h.HeadDim != nil && *h.HeadDim > 0:
		c.HeadDim = *h.HeadDim
	case h.NumHeads > 0 && h.HiddenSize%h.NumHeads != 0:
		return c, fmt.Errorf("%w: no head_dim, and hidden_size %d is not a multiple of num_attention_heads %d", ErrInvalid, h.HiddenSize, h.NumHeads)
	case h.NumHeads > 0:
		c.HeadDim = h.HiddenSize / h.NumHeads
	}
	if h.RopeTheta != nil {
		c.RopeTheta = *h.RopeTheta
	}
	if h.PartialRotaryFactor != nil {
		c.PartialRotaryFactor = *h.PartialRotaryFactor
	}
	switch h.ModelType {
	case "qwen2", "qwen2_moe":
		c.AttentionBias = true
	case "qwen3", "qwen3_moe":
		c.QKNorm = true
	}
	if h.AttentionBias != nil {
		c.AttentionBias = *h.AttentionBias
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
		return c, fmt.Errorf("%w: kvmesh_rope_style %q (want neox or gptj)", ErrUnsupported, h.RopeStyle)
	}
	dt := h.TorchDType
	switch {
	case dt == "":
		dt = h.DType
	case h.DType != "" && h.DType != dt:
		return c, fmt.Errorf("%w: torch_dtype %q and dtype %q disagree", ErrInvalid, h.TorchDType, h.DType)
	}
	if dt != "" {
		d, err := chunk.ParseDType(dt)
		if err != nil {
			return c, fmt.Errorf("%w: torch_dtype %q", ErrUnsupported, dt)
		}
		c.DType = d
	}
	rope := h.RopeScaling
	if len(h.RopeParameters) > 0 && string(h.RopeParameters) != "null" {
		if len(rope) > 0 && string(rope) != "null" {
			return c, fmt.Errorf("%w: both rope_scaling and rope_parameters", ErrInvalid)
		}
		rope = h.RopeParameters
	}
	if len(rope) > 0 && string(rope) != "null" {
		sc, err := parseRope(rope, &c, h)
		if err != nil {
			return c, err
		}
		c.RopeScaling = sc
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// parseRope reads rope_scaling or rope_parameters into a scaling, setting
// c's rope_theta and partial rotary factor when it carries them.
func parseRope(rope json.RawMessage, c *Config, h hfConfig) (chunk.RopeScaling, error) {
	var r ropeJSON
	if err := json.Unmarshal(rope, &r); err != nil {
		return chunk.RopeScaling{}, fmt.Errorf("%w: rope parameters: %v", ErrInvalid, err)
	}
	if r.RopeTheta != nil {
		if h.RopeTheta != nil && *h.RopeTheta != *r.RopeTheta {
			return chunk.RopeScaling{}, fmt.Errorf("%w: rope_theta %v and rope_parameters.rope_theta %v disagree", ErrInvalid, *h.RopeTheta, *r.RopeTheta)
		}
		c.RopeTheta = *r.RopeTheta
	}
	if r.PartialRotary != nil {
		c.PartialRotaryFactor = *r.PartialRotary
	}
	typ := r.RopeType
	switch {
	case typ == "":
		typ = r.Type
	case r.Type != "" && r.Type != typ:
		return chunk.RopeScaling{}, fmt.Errorf("%w: rope type %q and rope_type %q disagree", ErrInvalid, r.Type, r.RopeType)
	}
	sc := chunk.RopeScaling{Type: typ}
	switch typ {
	case "", "default":
		sc.Type = ""
	case "linear":
		sc.Factor = r.Factor
	case "dynamic":
		// transformers' dynamic NTK starts from max_position_embeddings.
		sc.Factor, sc.MaxPositions = r.Factor, h.MaxPositionEmbeddings
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
		return chunk.RopeScaling{}, fmt.Errorf("%w: rope type %q (want default, linear, dynamic, llama3 or yarn)", ErrUnsupported, typ)
	}
	return sc, nil
}

// Marshal writes c as a transformers config.json that Parse reads back as c.
func Marshal(c Config) ([]byte, error) {
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
	if c.MLPBias {
		m["mlp_bias"] = true
	}
	if c.HiddenAct != "" {
		m["hidden_act"] = c.HiddenAct
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
	case "dynamic":
		if sc.MaxPositions != c.MaxPositionEmbeddings {
			return nil, fmt.Errorf("%w: dynamic scaling from %d positions, max_position_embeddings %d", ErrInvalid, sc.MaxPositions, c.MaxPositionEmbeddings)
		}
		m["rope_scaling"] = map[string]any{"rope_type": "dynamic", "factor": sc.Factor}
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
			return nil, fmt.Errorf("%w: non-finite config value", ErrInvalid)
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
	case chunk.FP8E4M3:
		return "float8_e4m3fn"
	}
	return "float32"
}
