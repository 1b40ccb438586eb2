package chunk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// The register JSON is a ModelSpec as people and other languages write it:
// snake_case names and readable enums ("dtype": "bf16", "rope_style":
// "neox"). Parsing is strict, so that a typo cannot register a different
// model: names match exactly (case included), each at most once, unknown
// names, null values, numbers of the wrong kind and trailing data are
// refused, and the result must pass Validate. docs/KEYS.md specifies it.

var (
	specJSONFields    = []string{"family", "layers", "kv_heads", "head_dim", "dtype", "rope_style", "rope_theta", "rotary_dim", "scaling", "weights_revision", "tokenizer_id", "salt"}
	scalingJSONFields = []string{"type", "factor", "low_freq_factor", "high_freq_factor", "original_max_positions", "beta_fast", "beta_slow", "attention_factor", "max_positions"}
)

// specJSON mirrors ModelSpec with the register JSON's names.
type specJSON struct {
	Family          string       `json:"family"`
	Layers          int          `json:"layers"`
	KVHeads         int          `json:"kv_heads"`
	HeadDim         int          `json:"head_dim"`
	DType           string       `json:"dtype"`
	RopeStyle       string       `json:"rope_style"`
	RopeTheta       float64      `json:"rope_theta"`
	RotaryDim       int          `json:"rotary_dim,omitempty"`
	Scaling         *scalingJSON `json:"scaling,omitempty"`
	WeightsRevision string       `json:"weights_revision,omitempty"`
	TokenizerID     string       `json:"tokenizer_id,omitempty"`
	Salt            string       `json:"salt,omitempty"`
}

type scalingJSON struct {
	Type                 string  `json:"type"`
	Factor               float64 `json:"factor,omitempty"`
	LowFreqFactor        float64 `json:"low_freq_factor,omitempty"`
	HighFreqFactor       float64 `json:"high_freq_factor,omitempty"`
	OriginalMaxPositions int     `json:"original_max_positions,omitempty"`
	BetaFast             float64 `json:"beta_fast,omitempty"`
	BetaSlow             float64 `json:"beta_slow,omitempty"`
	AttentionFactor      float64 `json:"attention_factor,omitempty"`
	MaxPositions         int     `json:"max_positions,omitempty"`
}

// MarshalSpecJSON writes s as register JSON (zero optional fields left out).
func MarshalSpecJSON(s ModelSpec) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	j := specJSON{Family: s.Family, Layers: s.Layers, KVHeads: s.KVHeads, HeadDim: s.HeadDim, DType: s.DType.String(),
		RopeStyle: s.RopeStyle.String(), RopeTheta: s.RopeTheta, RotaryDim: s.RotaryDim,
		WeightsRevision: s.WeightsRevision, TokenizerID: s.TokenizerID, Salt: s.Salt}
	if sc := s.Scaling; sc != (RopeScaling{}) {
		j.Scaling = &scalingJSON{Type: sc.Type, Factor: sc.Factor, LowFreqFactor: sc.LowFreqFactor, HighFreqFactor: sc.HighFreqFactor,
			OriginalMaxPositions: sc.OriginalMaxPositions, BetaFast: sc.BetaFast, BetaSlow: sc.BetaSlow,
			AttentionFactor: sc.AttentionFactor, MaxPositions: sc.MaxPositions}
	}
	return json.MarshalIndent(j, "", "  ")
}

// ParseSpecJSON reads register JSON strictly (see above) into a valid
// ModelSpec. Errors wrap ErrInvalidSpec.
func ParseSpecJSON(b []byte) (ModelSpec, error) {
	bad := func(format string, a ...any) (ModelSpec, error) {
		return ModelSpec{}, fmt.Errorf("%w: register JSON: %s", ErrInvalidSpec, fmt.Sprintf(format, a...))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	top, err := readJSONObject(dec, specJSONFields, "scaling")
	if err != nil {
		return bad("%v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return bad("data after the spec object")
	}
	var j specJSON
	var sc scalingJSON
	for name, raw := range top {
		var dst any
		switch name {
		case "scaling":
			continue
		case "family":
			dst = &j.Family
		case "layers":
			dst = &j.Layers
		case "kv_heads":
			dst = &j.KVHeads
		case "head_dim":
			dst = &j.HeadDim
		case "dtype":
			dst = &j.DType
		case "rope_style":
			dst = &j.RopeStyle
		case "rope_theta":
			dst = &j.RopeTheta
		case "rotary_dim":
			dst = &j.RotaryDim
		case "weights_revision":
			dst = &j.WeightsRevision
		case "tokenizer_id":
			dst = &j.TokenizerID
		case "salt":
			dst = &j.Salt
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return bad("%s: %v", name, err)
		}
	}
	if raw, ok := top["scaling"]; ok {
		sdec := json.NewDecoder(bytes.NewReader(raw))
		fields, err := readJSONObject(sdec, scalingJSONFields, "")
		if err != nil {
			return bad("scaling: %v", err)
		}
		for name, raw := range fields {
			dst := map[string]any{"type": &sc.Type, "factor": &sc.Factor, "low_freq_factor": &sc.LowFreqFactor,
				"high_freq_factor": &sc.HighFreqFactor, "original_max_positions": &sc.OriginalMaxPositions,
				"beta_fast": &sc.BetaFast, "beta_slow": &sc.BetaSlow, "attention_factor": &sc.AttentionFactor,
				"max_positions": &sc.MaxPositions}[name]
			if err := json.Unmarshal(raw, dst); err != nil {
				return bad("scaling.%s: %v", name, err)
			}
		}
	}
	s := ModelSpec{Family: j.Family, Layers: j.Layers, KVHeads: j.KVHeads, HeadDim: j.HeadDim, RopeTheta: j.RopeTheta,
		RotaryDim: j.RotaryDim, WeightsRevision: j.WeightsRevision, TokenizerID: j.TokenizerID, Salt: j.Salt,
		Scaling: RopeScaling{Type: sc.Type, Factor: sc.Factor, LowFreqFactor: sc.LowFreqFactor, HighFreqFactor: sc.HighFreqFactor,
			OriginalMaxPositions: sc.OriginalMaxPositions, BetaFast: sc.BetaFast, BetaSlow: sc.BetaSlow,
			AttentionFactor: sc.AttentionFactor, MaxPositions: sc.MaxPositions}}
	// Only the spellings String prints: one name per value.
	switch j.DType {
	case "f32":
		s.DType = F32
	case "f16":
		s.DType = F16
	case "bf16":
		s.DType = BF16
	default:
		return bad("dtype %q: want \"f32\", \"f16\" or \"bf16\"", j.DType)
	}
	switch j.RopeStyle {
	case "neox":
		s.RopeStyle = RopeNeoX
	case "gptj":
		s.RopeStyle = RopeGPTJ
	default:
		return bad("rope_style %q: want \"neox\" or \"gptj\"", j.RopeStyle)
	}
	if err := s.Validate(); err != nil {
		return ModelSpec{}, err
	}
	return s, nil
}

// readJSONObject reads one JSON object from dec and returns its members'
// raw values by name: each name must be in allowed and appear once, and no
// value may be null. The member named nested (if any) must be an object.
func readJSONObject(dec *json.Decoder, allowed []string, nested string) (map[string]json.RawMessage, error) {
	if t, err := dec.Token(); err != nil {
		return nil, err
	} else if t != json.Delim('{') {
		return nil, fmt.Errorf("want an object, got %v", t)
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := t.(string)
		if !slices.Contains(allowed, name) {
			return nil, fmt.Errorf("unknown field %q", name)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("field %q given twice", name)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if string(raw) == "null" {
			return nil, fmt.Errorf("%s: null", name)
		}
		if name == nested && (len(raw) == 0 || raw[0] != '{') {
			return nil, fmt.Errorf("%s: want an object", name)
		}
		out[name] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return out, nil
}
