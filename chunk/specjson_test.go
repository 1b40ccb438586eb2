package chunk

import (
	"errors"
	"strings"
	"testing"
)

// llamaJSON is llamaSpec (docs/KEYS.md) as register JSON.
const llamaJSON = `{
  "family": "llama", "layers": 32, "kv_heads": 8, "head_dim": 128,
  "dtype": "bf16", "rope_style": "neox", "rope_theta": 500000,
  "scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
              "original_max_positions": 8192},
  "weights_revision": "meta-llama/Llama-3.1-8B-Instruct@0e9e39f",
  "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct"
}`

func TestSpecJSON(t *testing.T) {
	s, err := ParseSpecJSON([]byte(llamaJSON))
	if err != nil {
		t.Fatal(err)
	}
	if s != llamaSpec || s.Fingerprint().String() != "13c6ba2ee1b5da5114ad80eab44adfd3" {
		t.Fatalf("parsed %+v (%v), want llamaSpec", s, s.Fingerprint())
	}
	for _, spec := range []ModelSpec{llamaSpec, tinySpec} {
		b, err := MarshalSpecJSON(spec)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseSpecJSON(b)
		if err != nil || back != spec {
			t.Fatalf("round trip of %+v: %+v, %v\n%s", spec, back, err, b)
		}
	}
	tiny := `{"family": "qwen2", "layers": 2, "kv_heads": 1, "head_dim": 4, "dtype": "f16", "rope_style": "gptj", "rope_theta": 10000, "rotary_dim": 2, "salt": "tenant-a"}`
	if s, err := ParseSpecJSON([]byte(tiny)); err != nil || s.Fingerprint().String() != "a435dd57ab9be5857b3616159d05d659" {
		t.Fatalf("tiny: %v %v", s.Fingerprint(), err)
	}
	refused := map[string]string{
		"unknown field":          `"vocab": 128256`,
		"Go field name":          `"Salt": "x"`,
		"other case":             `"Tokenizer_ID": "x"`,
		"twice":                  `"layers": 32`,
		"null":                   `"salt": null`,
		"numeric dtype":          `"dtype": 3`,
		"unknown dtype spelling": `"dtype": "bfloat16"`,
		"numeric rope style":     `"rope_style": 1`,
		"float integer":          `"rotary_dim": 64.5`,
		"integer past 2^32":      `"rotary_dim": 4294967360`,
		"integer past int64":     `"rotary_dim": 99999999999999999999`,
		"scaling unknown field":  `"scaling": {"type": "linear", "factor": 2, "beta": 1}`,
		"scaling unused field":   `"scaling": {"type": "linear", "factor": 2, "beta_fast": 32}`,
		"scaling not an object":  `"scaling": "linear"`,
		"positions past int32":   `"scaling": {"type": "dynamic", "factor": 2, "max_positions": 2147483648}`,
	}
	base := strings.TrimSuffix(strings.TrimSpace(llamaJSON), "}")
	base = strings.Replace(base, `"layers": 32, `, "", 1)
	base = strings.Replace(base, `"scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
              "original_max_positions": 8192},`, "", 1)
	if _, err := ParseSpecJSON([]byte(base + `, "layers": 32}`)); err != nil {
		t.Fatalf("base: %v", err)
	}
	for name, member := range refused {
		in := base + `, "layers": 32, ` + member + "}"
		if name == "twice" {
			in = base + `, "layers": 32, "layers": 32}`
		}
		if _, err := ParseSpecJSON([]byte(in)); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec\n%s", name, err, in)
		}
	}
	for name, in := range map[string]string{
		"trailing object":  llamaJSON + ` {}`,
		"trailing garbage": llamaJSON + `x`,
		"two specs":        llamaJSON + llamaJSON,
		"array":            `[` + llamaJSON + `]`,
		"empty":            ``,
	} {
		if _, err := ParseSpecJSON([]byte(in)); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec", name, err)
		}
	}
}
