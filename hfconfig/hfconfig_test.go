package hfconfig

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

var update = flag.Bool("update", false, "rewrite testdata/specs.golden")

// revisions names the weights of each testdata config.json; the Llama one
// is the llama spec of docs/KEYS.md.
var revisions = map[string][2]string{
	"llama-3.1-8b-instruct": {"meta-llama/Llama-3.1-8B-Instruct@0e9e39f", "meta-llama/Llama-3.1-8B-Instruct"},
}

// TestSpecsGolden maps every testdata config.json to its spec: the
// register JSON and the fingerprint are pinned by testdata/specs.golden
// (`go test ./hfconfig -update` rewrites it).
func TestSpecsGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil || len(files) < 4 {
		t.Fatalf("testdata: %v %v", files, err)
	}
	var out bytes.Buffer
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !IsConfig(b) {
			t.Fatalf("%s: IsConfig false", f)
		}
		c, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		s := c.Spec(c.DType)
		s.WeightsRevision, s.TokenizerID = name, ""
		if r, ok := revisions[name]; ok {
			s.WeightsRevision, s.TokenizerID = r[0], r[1]
		}
		js, err := chunk.MarshalSpecJSON(s)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		fmt.Fprintf(&out, "%s %s\n%s\n\n", name, s.Fingerprint(), js)
		if name == "llama-3.1-8b-instruct" && s.Fingerprint().String() != "13c6ba2ee1b5da5114ad80eab44adfd3" {
			t.Errorf("Llama 3.1 8B: %v, want the llama fingerprint of docs/KEYS.md", s.Fingerprint())
		}
		// Marshal writes what Parse reads back.
		m, err := Marshal(c)
		if err != nil {
			t.Fatalf("%s: marshal: %v", f, err)
		}
		if back, err := Parse(m); err != nil || back != c {
			t.Fatalf("%s: round trip %+v, %v\nwant %+v", f, back, err, c)
		}
	}
	const golden = "testdata/specs.golden"
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("specs differ from %s (run with -update after an intended change):\n%s", golden, out.String())
	}
}

func TestParse(t *testing.T) {
	base := `"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096`
	ok := map[string]struct {
		json string
		want chunk.ModelSpec
	}{
		"defaults": {`{"model_type": "llama", ` + base + `}`,
			chunk.ModelSpec{Family: "llama", Layers: 4, KVHeads: 2, HeadDim: 16, DType: chunk.F32, RopeStyle: chunk.RopeNeoX, RopeTheta: 10000}},
		"no kv heads: one per head": {`{"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}`,
			chunk.ModelSpec{Family: "mistral", Layers: 2, KVHeads: 4, HeadDim: 16, DType: chunk.F32, RopeStyle: chunk.RopeNeoX, RopeTheta: 10000}},
		"dynamic": {`{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "dynamic", "factor": 2}}`,
			chunk.ModelSpec{Family: "llama", Layers: 4, KVHeads: 2, HeadDim: 16, DType: chunk.F32, RopeStyle: chunk.RopeNeoX, RopeTheta: 10000,
				Scaling: chunk.RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: 4096}}},
		"linear, legacy type": {`{"model_type": "llama", ` + base + `, "rope_scaling": {"type": "linear", "factor": 4}}`,
			chunk.ModelSpec{Family: "llama", Layers: 4, KVHeads: 2, HeadDim: 16, DType: chunk.F32, RopeStyle: chunk.RopeNeoX, RopeTheta: 10000,
				Scaling: chunk.RopeScaling{Type: "linear", Factor: 4}}},
		"rope_parameters, v5 dtype, partial": {`{"model_type": "qwen3", ` + base + `, "head_dim": 32, "dtype": "float16",
			"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}}`,
			chunk.ModelSpec{Family: "qwen3", Layers: 4, KVHeads: 2, HeadDim: 32, DType: chunk.F16, RopeStyle: chunk.RopeNeoX, RopeTheta: 1e6, RotaryDim: 16}},
	}
	for name, tc := range ok {
		c, err := Parse([]byte(tc.json))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := c.Spec(c.DType); got != tc.want {
			t.Errorf("%s: %+v\nwant %+v", name, got, tc.want)
		}
	}
	refused := map[string]struct {
		json string
		err  error
	}{
		"another architecture":  {`{"model_type": "gpt2", ` + base + `}`, ErrUnsupported},
		"gemma":                 {`{"model_type": "gemma", ` + base + `}`, ErrUnsupported},
		"no model_type":         {`{` + base + `}`, ErrUnsupported},
		"longrope":              {`{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "longrope", "factor": 2}}`, ErrUnsupported},
		"rope style":            {`{"model_type": "llama", ` + base + `, "kvmesh_rope_style": "alibi"}`, ErrUnsupported},
		"dtype":                 {`{"model_type": "llama", ` + base + `, "torch_dtype": "int4"}`, ErrUnsupported},
		"not json":              {`{"model_type": `, ErrInvalid},
		"kv heads":              {`{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 3}`, ErrInvalid},
		"hidden not per head":   {`{"model_type": "llama", "hidden_size": 66, "num_hidden_layers": 4, "num_attention_heads": 4}`, ErrInvalid},
		"odd head dim":          {`{"model_type": "llama", ` + base + `, "head_dim": 15}`, ErrInvalid},
		"no layers":             {`{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}`, ErrInvalid},
		"llama3 incomplete":     {`{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "llama3", "factor": 8}}`, ErrInvalid},
		"yarn without factor":   {`{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "yarn"}}`, ErrInvalid},
		"rope_theta twice":      {`{"model_type": "llama", ` + base + `, "rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}`, ErrInvalid},
		"both rope members":     {`{"model_type": "llama", ` + base + `, "rope_scaling": {"type": "linear", "factor": 2}, "rope_parameters": {"rope_type": "default"}}`, ErrInvalid},
		"type and rope_type":    {`{"model_type": "llama", ` + base + `, "rope_scaling": {"type": "linear", "rope_type": "dynamic", "factor": 2}}`, ErrInvalid},
		"two dtypes":            {`{"model_type": "llama", ` + base + `, "torch_dtype": "bfloat16", "dtype": "float16"}`, ErrInvalid},
		"theta <= 1":            {`{"model_type": "llama", ` + base + `, "rope_theta": 1}`, ErrInvalid},
		"partial rotary over 1": {`{"model_type": "llama", ` + base + `, "partial_rotary_factor": 2}`, ErrInvalid},
		"string where a number": {`{"model_type": "llama", ` + base + `, "rope_theta": "1e6"}`, ErrInvalid},
	}
	for name, tc := range refused {
		if _, err := Parse([]byte(tc.json)); !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", name, err, tc.err)
		}
	}
	if IsConfig([]byte(`{"family": "llama"}`)) || IsConfig([]byte(`[1]`)) || IsConfig([]byte(`x`)) {
		t.Error("IsConfig true for a document without model_type")
	}
}
