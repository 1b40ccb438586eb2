package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/kvmesh/kvmesh/chunk"
)

// layerWeights holds one decoder layer, linear weights as [out][in].
type layerWeights struct {
	inputNorm, postNorm []float32
	q, k, v, o          []float32
	qBias, kBias, vBias []float32 // nil without attention bias
	oBias               []float32 // nil unless OutputBias
	qNorm, kNorm        []float32 // nil without QK norm
	gate, up, down      []float32
}

// Weights is a loaded model in float32.
type Weights struct {
	Config ModelConfig
	embed  []float32 // [vocab][hidden]
	layers []layerWeights
	norm   []float32
	lmHead []float32 // [vocab][hidden]; aliases embed when tied
	// Revision is a hash of every tensor's name, shape and bytes, used as
	// the spec's WeightsRevision so different weights never share chunks.
	Revision string
}

// tensorShapes lists every tensor a config implies, HF names and shapes.
func tensorShapes(c ModelConfig) map[string][]int {
	h, q, kv, f := c.HiddenSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim, c.IntermediateSize
	m := map[string][]int{
		"model.embed_tokens.weight": {c.VocabSize, h},
		"model.norm.weight":         {h},
	}
	if !c.TieWordEmbeddings {
		m["lm_head.weight"] = []int{c.VocabSize, h}
	}
	for l := 0; l < c.NumLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		m[p+"input_layernorm.weight"] = []int{h}
		m[p+"post_attention_layernorm.weight"] = []int{h}
		m[p+"self_attn.q_proj.weight"] = []int{q, h}
		m[p+"self_attn.k_proj.weight"] = []int{kv, h}
		m[p+"self_attn.v_proj.weight"] = []int{kv, h}
		m[p+"self_attn.o_proj.weight"] = []int{h, q}
		if c.AttentionBias {
			m[p+"self_attn.q_proj.bias"] = []int{q}
			m[p+"self_attn.k_proj.bias"] = []int{kv}
			m[p+"self_attn.v_proj.bias"] = []int{kv}
		}
		if c.OutputBias() {
			m[p+"self_attn.o_proj.bias"] = []int{h}
		}
		if c.QKNorm {
			m[p+"self_attn.q_norm.weight"] = []int{c.HeadDim}
			m[p+"self_attn.k_norm.weight"] = []int{c.HeadDim}
		}
		m[p+"mlp.gate_proj.weight"] = []int{f, h}
		m[p+"mlp.up_proj.weight"] = []int{f, h}
		m[p+"mlp.down_proj.weight"] = []int{h, f}
	}
	return m
}

// NewWeights checks tensors against the config and builds the model. It
// keeps the tensors' slices (no copy).
//
// Every tensor of the checkpoint is used or refused, never dropped: a
// model whose weights the engine would not apply computes other KV than
// the model it claims to be. Qwen2 applies q/k/v biases whatever
// attention_bias says (as transformers' Qwen2 does), so a Qwen2 checkpoint
// that holds them uses them; any other tensor the config does not use is
// an error naming it. The exceptions are tensors transformers itself
// ignores on load: rotary_emb.inv_freq buffers, and an lm_head.weight
// equal to the tied embeddings.
func NewWeights(c ModelConfig, tensors map[string]*Tensor) (*Weights, error) {
	if err := checkModel(c); err != nil {
		return nil, err
	}
	if alwaysQKVBias(c) && !c.AttentionBias {
		if _, ok := tensors["model.layers.0.self_attn.q_proj.bias"]; ok {
			c.AttentionBias = true
		}
	}
	shapes := tensorShapes(c)
	if err := checkUnused(tensors, shapes); err != nil {
		return nil, err
	}
	get := func(name string) ([]float32, error) {
		t, ok := tensors[name]
		if !ok {
			return nil, fmt.Errorf("%w: missing tensor %q", ErrInvalidModel, name)
		}
		want := shapes[name]
		if len(t.Shape) != len(want) {
			return nil, fmt.Errorf("%w: tensor %q has shape %v, config implies %v", ErrInvalidModel, name, t.Shape, want)
		}
		for i := range want {
			if t.Shape[i] != want[i] {
				return nil, fmt.Errorf("%w: tensor %q has shape %v, config implies %v", ErrInvalidModel, name, t.Shape, want)
			}
		}
		return t.Data, nil
	}
	w := &Weights{Config: c, layers: make([]layerWeights, c.NumLayers)}
	var err error
	must := func(dst *[]float32, name string) {
		if err == nil {
			*dst, err = get(name)
		}
	}
	must(&w.embed, "model.embed_tokens.weight")
	must(&w.norm, "model.norm.weight")
	if c.TieWordEmbeddings {
		w.lmHead = w.embed
	} else {
		must(&w.lmHead, "lm_head.weight")
	}
	for l := range w.layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		lw := &w.layers[l]
		must(&lw.inputNorm, p+"input_layernorm.weight")
		must(&lw.postNorm, p+"post_attention_layernorm.weight")
		must(&lw.q, p+"self_attn.q_proj.weight")
		must(&lw.k, p+"self_attn.k_proj.weight")
		must(&lw.v, p+"self_attn.v_proj.weight")
		must(&lw.o, p+"self_attn.o_proj.weight")
		if c.AttentionBias {
			must(&lw.qBias, p+"self_attn.q_proj.bias")
			must(&lw.kBias, p+"self_attn.k_proj.bias")
			must(&lw.vBias, p+"self_attn.v_proj.bias")
		}
		if c.OutputBias() {
			must(&lw.oBias, p+"self_attn.o_proj.bias")
		}
		if c.QKNorm {
			must(&lw.qNorm, p+"self_attn.q_norm.weight")
			must(&lw.kNorm, p+"self_attn.k_norm.weight")
		}
		must(&lw.gate, p+"mlp.gate_proj.weight")
		must(&lw.up, p+"mlp.up_proj.weight")
		must(&lw.down, p+"mlp.down_proj.weight")
	}
	if err != nil {
		return nil, err
	}
	w.Revision = weightsRevision(tensors)
	return w, nil
}

// alwaysQKVBias reports whether the family's attention always has q, k
// and v biases in transformers, whatever attention_bias says.
func alwaysQKVBias(c ModelConfig) bool { return c.ModelType == "qwen2" || c.ModelType == "qwen2_moe" }

// checkUnused refuses a tensor of the checkpoint that the config does not
// use (shapes: the tensors it does), naming it.
func checkUnused(tensors map[string]*Tensor, shapes map[string][]int) error {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		switch {
		case shapes[n] != nil:
		case strings.HasSuffix(n, ".rotary_emb.inv_freq"):
			// A buffer older checkpoints saved; RoPE is computed from the
			// config, as transformers does.
		case n == "lm_head.weight" && tiedCopy(tensors[n], tensors["model.embed_tokens.weight"]):
			// Tied embeddings saved twice: the same values.
		default:
			return fmt.Errorf("%w: checkpoint tensor %q is not used by the model's config (the engine would compute without it)", ErrInvalidModel, n)
		}
	}
	return nil
}

// tiedCopy reports whether a holds the same shape and values as b.
func tiedCopy(a, b *Tensor) bool {
	return a != nil && b != nil && slices.Equal(a.Shape, b.Shape) && slices.Equal(a.Data, b.Data)
}

// weightsRevision hashes names, shapes and float32 bits in name order.
func weightsRevision(tensors map[string]*Tensor) string {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	d := xxhash.New()
	var buf []byte
	for _, n := range names {
		t := tensors[n]
		buf = append(buf[:0], n...)
		for _, s := range t.Shape {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(s))
		}
		d.Write(buf)
		buf = chunk.AppendRow(buf[:0], t.Data, chunk.F32)
		d.Write(buf)
	}
	return fmt.Sprintf("xxh64:%016x", d.Sum64())
}

// LoadWeights reads config.json and the safetensors checkpoint in dir.
func LoadWeights(dir string) (*Weights, error) {
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	ts, err := LoadTensors(dir)
	if err != nil {
		return nil, err
	}
	return NewWeights(c, ts)
}

// RandomTensors makes weights for c from seed: linear weights uniform with
// standard deviation Scale/sqrt(fan_in) (Scale 0 means 1), norm weights near
// 1, biases small; every value already rounded to c.DType so a write and a
// load give back the same bits.
func RandomTensors(c ModelConfig, seed uint64, scale float64) (map[string]*Tensor, error) {
	if err := checkModel(c); err != nil {
		return nil, err
	}
	if scale == 0 {
		scale = 1
	}
	rng := rand.New(rand.NewPCG(seed, 0x6b766d657368))
	shapes := tensorShapes(c)
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		names = append(names, n)
	}
	sort.Strings(names) // a fixed order makes the seed reproducible
	out := make(map[string]*Tensor, len(names))
	for _, n := range names {
		shape := shapes[n]
		t := &Tensor{DType: c.DType, Shape: shape}
		t.Data = make([]float32, t.NumElements())
		switch {
		case len(shape) == 1 && (filepath.Ext(n) == ".weight"): // norms
			for i := range t.Data {
				t.Data[i] = float32(1 + 0.1*(2*rng.Float64()-1))
			}
		case len(shape) == 1: // biases
			for i := range t.Data {
				t.Data[i] = float32(0.1 * (2*rng.Float64() - 1))
			}
		default:
			// Uniform in [-a, a] has std a/sqrt(3).
			a := scale * math.Sqrt(3/float64(shape[1]))
			if n == "model.embed_tokens.weight" {
				a = math.Sqrt(3) // embeddings of unit scale per element
			}
			for i := range t.Data {
				t.Data[i] = float32(a * (2*rng.Float64() - 1))
			}
		}
		for i, v := range t.Data {
			t.Data[i] = roundTo(v, c.DType)
		}
		out[n] = t
	}
	return out, nil
}

func roundTo(v float32, d chunk.DType) float32 {
	switch d {
	case chunk.F16:
		return chunk.F16ToF32(chunk.F32ToF16(v))
	case chunk.BF16:
		return chunk.BF16ToF32(chunk.F32ToBF16(v))
	}
	return v
}

// WriteModel writes config.json and tensors to dir (created if needed): one
// model.safetensors when shards <= 1, else that many shards and an index.
func WriteModel(dir string, c ModelConfig, tensors map[string]*Tensor, shards int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	js, err := MarshalConfig(c)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), js, 0o644); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if shards <= 1 {
		return writeSafetensorsFile(filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"})
	}
	return writeSharded(dir, tensors, shards)
}

// WriteRandomModel writes a random-weight model of shape c to dir and
// returns the tensors it wrote (as a load will read them back).
func WriteRandomModel(dir string, c ModelConfig, seed uint64, shards int) (map[string]*Tensor, error) {
	ts, err := RandomTensors(c, seed, 0)
	if err != nil {
		return nil, err
	}
	return ts, WriteModel(dir, c, ts, shards)
}
