package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

func TestParseConfig(t *testing.T) {
	base := `"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
		"num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096`
	tests := []struct {
		name  string
		json  string
		check func(t *testing.T, c ModelConfig)
		err   error
	}{
		{"llama defaults", `{"model_type": "llama", ` + base + `}`, func(t *testing.T, c ModelConfig) {
			if c.HeadDim != 16 || c.RopeTheta != 10000 || c.RopeStyle != chunk.RopeNeoX || c.AttentionBias || c.QKNorm || c.DType != chunk.F32 {
				t.Fatalf("%+v", c)
			}
		}, nil},
		{"llama3 rope_scaling", `{"model_type": "llama", ` + base + `, "rope_theta": 500000, "torch_dtype": "bfloat16",
			"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}`,
			func(t *testing.T, c ModelConfig) {
				want := chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
				if c.RopeScaling != want || c.RopeTheta != 500000 || c.DType != chunk.BF16 {
					t.Fatalf("%+v", c)
				}
			}, nil},
		{"legacy type linear", `{"model_type": "llama", ` + base + `, "rope_scaling": {"type": "linear", "factor": 2}}`,
			func(t *testing.T, c ModelConfig) {
				if c.RopeScaling != (chunk.RopeScaling{Type: "linear", Factor: 2}) {
					t.Fatalf("%+v", c.RopeScaling)
				}
			}, nil},
		{"rope_parameters yarn", `{"model_type": "qwen3", ` + base + `, "head_dim": 32,
			"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000, "factor": 4, "beta_fast": 32}}`,
			func(t *testing.T, c ModelConfig) {
				want := chunk.RopeScaling{Type: "yarn", Factor: 4, BetaFast: 32, OriginalMaxPositions: 4096}
				if c.RopeScaling != want || c.RopeTheta != 1e6 || c.HeadDim != 32 || !c.QKNorm {
					t.Fatalf("%+v", c)
				}
			}, nil},
		{"qwen2 bias", `{"model_type": "qwen2", ` + base + `, "sliding_window": 4096, "use_sliding_window": false}`,
			func(t *testing.T, c ModelConfig) {
				if !c.AttentionBias || c.SlidingWindow != 0 {
					t.Fatalf("%+v", c)
				}
			}, nil},
		{"mistral window partial", `{"model_type": "mistral", ` + base + `, "sliding_window": 4096, "partial_rotary_factor": 0.5}`,
			func(t *testing.T, c ModelConfig) {
				if c.SlidingWindow != 4096 || c.RotaryDim() != 8 || c.Spec(chunk.F32).RotaryDim != 8 {
					t.Fatalf("%+v", c)
				}
			}, nil},
		{"gptj", `{"model_type": "llama", ` + base + `, "kvmesh_rope_style": "gptj"}`,
			func(t *testing.T, c ModelConfig) {
				if c.RopeStyle != chunk.RopeGPTJ {
					t.Fatalf("%+v", c)
				}
			}, nil},
		{"mlp bias", `{"model_type": "llama", ` + base + `, "mlp_bias": true}`, nil, ErrUnsupported},
		{"gelu", `{"model_type": "llama", ` + base + `, "hidden_act": "gelu"}`, nil, ErrUnsupported},
		{"not json", `{"model_type": `, nil, ErrInvalidModel},
		{"gpt2", `{"model_type": "gpt2", ` + base + `}`, nil, ErrUnsupported},
		{"dynamic", `{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "dynamic", "factor": 2}}`, nil, ErrUnsupported},
		{"longrope", `{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "longrope", "factor": 2}}`, nil, ErrUnsupported},
		{"fp8 dtype", `{"model_type": "llama", ` + base + `, "torch_dtype": "float8_e4m3fn"}`, nil, ErrUnsupported},
		{"heads", `{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
			"num_attention_heads": 4, "num_key_value_heads": 3, "vocab_size": 256, "rms_norm_eps": 1e-6}`, nil, ErrInvalidModel},
		{"no eps", `{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
			"num_attention_heads": 4, "vocab_size": 256}`, nil, ErrInvalidModel},
		{"llama3 incomplete", `{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "llama3", "factor": 8}}`, nil, ErrInvalidModel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.json))
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
			// MarshalConfig round-trips.
			js, err := MarshalConfig(c)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := ParseConfig(js)
			if err != nil {
				t.Fatal(err)
			}
			if c2 != c {
				t.Fatalf("round trip\n%+v\n%+v", c, c2)
			}
		})
	}
}

func TestModelRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dtype  chunk.DType
		shards int
		mutate func(*ModelConfig)
	}{
		{"f32", chunk.F32, 1, nil},
		{"bf16-sharded", chunk.BF16, 4, nil},
		{"f16-qwen2", chunk.F16, 1, func(c *ModelConfig) { c.ModelType, c.AttentionBias, c.TieWordEmbeddings = "qwen2", true, true }},
		{"bf16-qwen3-sharded", chunk.BF16, 2, func(c *ModelConfig) { c.ModelType, c.QKNorm = "qwen3", true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tinyConfig()
			c.DType = tc.dtype
			if tc.mutate != nil {
				tc.mutate(&c)
			}
			dir := t.TempDir()
			wrote, err := WriteRandomModel(dir, c, 77, tc.shards)
			if err != nil {
				t.Fatal(err)
			}
			got, err := LoadTensors(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(wrote) {
				t.Fatalf("read %d tensors, wrote %d", len(got), len(wrote))
			}
			for n, w := range wrote {
				g := got[n]
				if g == nil || g.DType != tc.dtype || len(g.Data) != len(w.Data) {
					t.Fatalf("tensor %q missing or reshaped", n)
				}
				for i := range w.Data {
					if math.Float32bits(g.Data[i]) != math.Float32bits(w.Data[i]) {
						t.Fatalf("tensor %q[%d]: read %v, wrote %v", n, i, g.Data[i], w.Data[i])
					}
				}
			}
			w, err := LoadWeights(dir)
			if err != nil {
				t.Fatal(err)
			}
			if w.Config != c {
				t.Fatalf("config\n%+v\n%+v", w.Config, c)
			}
			if w.Revision != weightsRevision(wrote) {
				t.Fatal("revision differs from the written tensors'")
			}
			// A different seed is a different revision, so chunks never mix.
			other, _ := RandomTensors(c, 78, 0)
			if weightsRevision(other) == w.Revision {
				t.Fatal("two seeds share a revision")
			}
		})
	}
}

// stFile builds a safetensors file from a raw header and data.
func stFile(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

func TestParseSafetensorsMalformed(t *testing.T) {
	good := stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8))
	if ts, _, err := ParseSafetensors(good); err != nil || len(ts["a"].Data) != 2 {
		t.Fatalf("good file: %v", err)
	}
	tests := []struct {
		name string
		b    []byte
		err  error
	}{
		{"short", []byte{1, 2, 3}, ErrInvalidModel},
		{"header past end", binary.LittleEndian.AppendUint64(nil, 100), ErrInvalidModel},
		{"huge header", binary.LittleEndian.AppendUint64(nil, 1<<62), ErrInvalidModel},
		{"bad json", stFile(`{"a":`, nil), ErrInvalidModel},
		{"dtype", stFile(`{"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}}`, make([]byte, 2)), ErrUnsupported},
		{"f64", stFile(`{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`, make([]byte, 8)), ErrUnsupported},
		{"size mismatch", stFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8)), ErrInvalidModel},
		{"past data", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 8)), ErrInvalidModel},
		{"reversed", stFile(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, make([]byte, 8)), ErrInvalidModel},
		{"negative dim", stFile(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, make([]byte, 8)), ErrInvalidModel},
		{"overlap", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), ErrInvalidModel},
		{"bad metadata", stFile(`{"__metadata__":{"x":1}}`, nil), ErrInvalidModel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := ParseSafetensors(tc.b); !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
		})
	}
}

func TestLoadWeightsErrors(t *testing.T) {
	c := tinyConfig()
	write := func(t *testing.T, shards int) string {
		dir := t.TempDir()
		if _, err := WriteRandomModel(dir, c, 1, shards); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	tests := []struct {
		name   string
		shards int
		break_ func(t *testing.T, dir string)
		err    error
	}{
		{"missing tensor", 1, func(t *testing.T, dir string) {
			ts, _ := RandomTensors(c, 1, 0)
			delete(ts, "model.layers.2.mlp.up_proj.weight")
			if err := WriteModel(dir, c, ts, 1); err != nil {
				t.Fatal(err)
			}
		}, ErrInvalidModel},
		{"wrong shape", 1, func(t *testing.T, dir string) {
			ts, _ := RandomTensors(c, 1, 0)
			ts["model.norm.weight"] = &Tensor{DType: chunk.F32, Shape: []int{c.HiddenSize + 1}, Data: make([]float32, c.HiddenSize+1)}
			if err := WriteModel(dir, c, ts, 1); err != nil {
				t.Fatal(err)
			}
		}, ErrInvalidModel},
		{"truncated file", 1, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)-10], 0o644)
		}, ErrInvalidModel},
		{"shard missing tensor", 2, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors.index.json")
			b, _ := os.ReadFile(p)
			b = bytes.Replace(b, []byte(`"model.norm.weight": "model-00002-of-00002`), []byte(`"model.norm.weight": "model-00001-of-00002`), 1)
			os.WriteFile(p, b, 0o644)
		}, ErrInvalidModel},
		{"shard path escape", 2, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors.index.json")
			os.WriteFile(p, []byte(`{"weight_map": {"model.norm.weight": "../x.safetensors"}}`), 0o644)
		}, ErrInvalidModel},
		{"bad config", 1, func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type": "llama"}`), 0o644)
		}, ErrInvalidModel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := write(t, tc.shards)
			tc.break_(t, dir)
			if _, err := LoadWeights(dir); !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
		})
	}
	if _, err := LoadWeights(t.TempDir()); err == nil {
		t.Fatal("empty directory loaded")
	}
}

func FuzzParseSafetensors(f *testing.F) {
	f.Add(stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(stFile(`{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(stFile(`{"c":{"dtype":"F16","shape":[],"data_offsets":[0,2]}}`, make([]byte, 2)))
	var buf bytes.Buffer
	ts, _ := RandomTensors(ModelConfig{ModelType: "llama", HiddenSize: 4, IntermediateSize: 4, NumLayers: 1, NumHeads: 2,
		NumKVHeads: 1, HeadDim: 2, VocabSize: 3, RMSNormEps: 1e-5, RopeTheta: 10000, DType: chunk.BF16}, 1, 0)
	WriteSafetensors(&buf, ts, map[string]string{"format": "pt"})
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, _, err := ParseSafetensors(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidModel) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		// What parses writes back and parses to the same values.
		var out bytes.Buffer
		if err := WriteSafetensors(&out, ts, nil); err != nil {
			t.Fatal(err)
		}
		again, _, err := ParseSafetensors(out.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		for n, x := range ts {
			y := again[n]
			for i := range x.Data {
				if math.Float32bits(x.Data[i]) != math.Float32bits(y.Data[i]) && !(x.Data[i] != x.Data[i]) {
					t.Fatalf("%q[%d]: %v vs %v", n, i, x.Data[i], y.Data[i])
				}
			}
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	c := tinyConfig()
	js, _ := MarshalConfig(c)
	f.Add(js)
	c.RopeScaling = chunk.RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 256}
	js, _ = MarshalConfig(c)
	f.Add(js)
	f.Add([]byte(`{"model_type":"qwen3","rope_parameters":{"rope_type":"llama3"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidModel) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if err := checkModel(c); err != nil {
			t.Fatalf("parsed config does not validate: %v", err)
		}
		js, err := MarshalConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseConfig(js); err != nil {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// TestQwen2BiasesApplied: transformers' Qwen2 applies q/k/v biases whatever
// attention_bias says, so a Qwen2 checkpoint that holds them computes with
// them even when its config.json says "attention_bias": false, exactly as
// with true (never silently without them).
func TestQwen2BiasesApplied(t *testing.T) {
	ctx := t.Context()
	c := variants()["qwen2-bias-tied"]
	ts, err := RandomTensors(c, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	var engines [2]*Engine
	for i, bias := range []bool{true, false} {
		cf := c
		cf.AttentionBias = bias
		dir := t.TempDir()
		if err := WriteModel(dir, cf, ts, 1); err != nil {
			t.Fatal(err)
		}
		w, err := LoadWeights(dir)
		if err != nil {
			t.Fatalf("attention_bias %v: %v", bias, err)
		}
		if !w.Config.AttentionBias || w.layers[0].qBias == nil || w.layers[0].oBias != nil {
			t.Fatalf("attention_bias %v: biases not applied (config %v, q bias %d values)", bias, w.Config.AttentionBias, len(w.layers[0].qBias))
		}
		if engines[i], err = New(w, Config{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { engines[i].Close() })
	}
	segs := []Segment{{Tokens: []uint32{1, 2, 3, 4, 5}}}
	a, err := engines[0].Run(ctx, nil, Request{Segments: segs})
	if err != nil {
		t.Fatal(err)
	}
	b, err := engines[1].Run(ctx, nil, Request{Segments: segs})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(a.Logits, b.Logits); d != 0 {
		t.Fatalf("attention_bias false computes otherwise than true: max |dlogit| %g", d)
	}
}

// TestUnusedTensorRefused: a checkpoint tensor the config does not use is
// an error that names it, not a weight silently left out.
func TestUnusedTensorRefused(t *testing.T) {
	c := tinyConfig() // llama without biases
	for name, extra := range map[string]string{
		"a llama bias with attention_bias false": "model.layers.1.self_attn.q_proj.bias",
		"an mlp bias":                            "model.layers.0.mlp.up_proj.bias",
		"a q norm without qk norm":               "model.layers.3.self_attn.q_norm.weight",
		"an unknown tensor":                      "model.extra.weight",
	} {
		t.Run(name, func(t *testing.T) {
			ts, err := RandomTensors(c, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			ts[extra] = &Tensor{DType: chunk.F32, Shape: []int{c.HeadDim}, Data: make([]float32, c.HeadDim)}
			dir := t.TempDir()
			if err := WriteModel(dir, c, ts, 1); err != nil {
				t.Fatal(err)
			}
			_, err = LoadWeights(dir)
			if !errors.Is(err, ErrInvalidModel) || !strings.Contains(err.Error(), `"`+extra+`"`) {
				t.Fatalf("load with %s: %v, want ErrInvalidModel naming it", extra, err)
			}
		})
	}
	// What transformers ignores on load is ignored: RoPE buffers, and an
	// lm_head equal to the tied embeddings.
	q := variants()["qwen2-bias-tied"]
	ts, err := RandomTensors(q, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	ts["model.layers.0.self_attn.rotary_emb.inv_freq"] = &Tensor{DType: chunk.F32, Shape: []int{q.HeadDim / 2}, Data: make([]float32, q.HeadDim/2)}
	ts["lm_head.weight"] = ts["model.embed_tokens.weight"]
	dir := t.TempDir()
	if err := WriteModel(dir, q, ts, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadWeights(dir); err != nil {
		t.Fatalf("load with ignorable tensors: %v", err)
	}
}
