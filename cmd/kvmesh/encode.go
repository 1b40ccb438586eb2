package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/units"
	"github.com/kvmesh/kvmesh/safetensors"
)

const encodeUsage = `usage: kvmesh encode -spec FILE -kv FILE [-tokens FILE] [-context C [-before FILE] [-window W]] [-codec C] -o FILE

Build an entry file (what put takes) from a chunk's K/V tensors, offline.
  -spec    the model: a register JSON, or a config.json with -revision (as register)
  -kv      a safetensors file with the chunk's pre-RoPE K and V, in the spec's dtype
           (F32, F16 or BF16; nothing is converted), either per layer l
             layers.{l}.k, layers.{l}.v   shape [tokens, kv_heads, head_dim]
           or all in one
             kv                           shape [layers, 2, tokens, kv_heads, head_dim]
           (K before V, as kvmesh.torch.KVCapture.kv() gives), and optionally
             tokens                       shape [tokens], I32, I64 or U32
           Any other tensor is refused.
  -tokens  the chunk's token IDs as a JSON array, when the file has no tokens tensor
  -context what the chunk was encoded after (docs/KEYS.md, section 4):
             standalone                   alone at position 0 (default)
             window                       after the last -window W tokens of -before
                                          (a JSON array of the tokens before the chunk)
             prefix                       after its whole prefix: -before is a JSON array of
                                          the earlier chunks' token arrays, in prompt order
             window(W):ID, prefix:ID      the context itself, as keys print it
  -codec   raw, lossless (the cluster's default, bit-exact), int8, int4 or fp8; a node
           stores a raw or lossless entry in the cluster's codec
Prints the entry's key.`

// encodeOut is `kvmesh encode -format json`.
type encodeOut struct {
	File   string `json:"file"`
	Key    string `json:"key"`
	Tokens int    `json:"tokens"`
	Codec  string `json:"codec"`
	Bytes  int    `json:"bytes"`
}

func encodeCmd(_ context.Context, e *env, args []string) error {
	fs := e.flags("encode")
	sf := addSpecFlags(fs)
	specFile := fs.String("spec", "", "the model: register JSON or config.json (required)")
	kvFile := fs.String("kv", "", "safetensors file with the K/V tensors (required)")
	tokensFile := fs.String("tokens", "", "JSON array of the chunk's token IDs")
	ctxFlag := fs.String("context", "standalone", "standalone, window, prefix, window(W):ID or prefix:ID")
	beforeFile := fs.String("before", "", "JSON: the tokens before the chunk (window) or the earlier chunks (prefix)")
	window := fs.Int("window", 0, "window size W of -context window")
	codecFlag := fs.String("codec", "lossless", "raw, lossless, int8, int4 or fp8")
	outFile := fs.String("o", "", "output entry file (required)")
	if _, err := e.parse(fs, args, 0, 0); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"spec", *specFile}, {"kv", *kvFile}, {"o", *outFile}} {
		if f.v == "" {
			return usagef("encode: -%s is required\n%s", f.name, usageLine("encode"))
		}
	}
	codec, err := chunk.ParseCodec(*codecFlag)
	if err != nil {
		return usagef("encode: -codec %q: want raw, lossless, int8, int4 or fp8", *codecFlag)
	}
	spec, err := sf.readSpec(*specFile)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(*kvFile)
	if err != nil {
		return err
	}
	tensors, _, err := safetensors.Parse(b)
	if err != nil {
		return fmt.Errorf("%s: %w", *kvFile, err)
	}
	tokens, err := chunkTokens(tensors, *tokensFile)
	if err != nil {
		return err
	}
	fp := spec.Fingerprint()
	cx, err := encodeContext(fp, *ctxFlag, *beforeFile, *window)
	if err != nil {
		return err
	}
	kv, err := kvFromTensors(spec, len(tokens), tensors)
	if err != nil {
		return fmt.Errorf("%s: %w", *kvFile, err)
	}
	ent := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: cx},
		DType: spec.DType, Layers: spec.Layers, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, Tokens: tokens, KV: kv}
	blob, err := chunk.Encode(nil, ent, codec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*outFile, blob, 0o644); err != nil {
		return err
	}
	out := encodeOut{*outFile, ent.Key.String(), len(tokens), codec.String(), len(blob)}
	return e.print(out, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "%s %d tokens %s %s -> %s\n", out.Key, out.Tokens, out.Codec, units.Bytes(uint64(out.Bytes)), out.File)
		return err
	})
}

// kvFromTensors lays the K/V tensors of a safetensors file out as an
// entry's KV ([layer][K|V][token][kv_head][head_dim] in spec.DType): per
// layer "layers.{l}.k" and "layers.{l}.v" of shape [tokens, kv_heads,
// head_dim], or one "kv" of shape [layers, 2, tokens, kv_heads, head_dim],
// in spec's dtype; a "tokens" tensor may be there too. Anything else is
// refused: a tensor of another shape or dtype, a missing layer, a name it
// does not know.
func kvFromTensors(spec chunk.ModelSpec, ntok int, tensors map[string]safetensors.Tensor) ([]byte, error) {
	want := map[chunk.DType]string{chunk.F32: "F32", chunk.F16: "F16", chunk.BF16: "BF16"}[spec.DType]
	check := func(name string, t safetensors.Tensor, shape []int) error {
		if t.DType != want {
			return fmt.Errorf("tensor %q is %s; the spec's K/V are %s (%v): convert it before encoding", name, t.DType, want, spec.DType)
		}
		if !slices.Equal(t.Shape, shape) {
			return fmt.Errorf("tensor %q has shape %v, want %v", name, t.Shape, shape)
		}
		return nil
	}
	perLayer := 0
	for name := range tensors {
		if name == "tokens" || name == "kv" {
			continue
		}
		perLayer++
		var l int
		var kind string
		if _, err := fmt.Sscanf(name, "layers.%d.%s", &l, &kind); err != nil || (kind != "k" && kind != "v") ||
			name != fmt.Sprintf("layers.%d.%s", l, kind) || l < 0 || l >= spec.Layers {
			return nil, fmt.Errorf("tensor %q: not one of layers.{0..%d}.k|v, kv or tokens", name, spec.Layers-1)
		}
	}
	sz := spec.DType.Size()
	per := ntok * spec.KVHeads * spec.HeadDim * sz // one layer's K, or V
	if t, ok := tensors["kv"]; ok {
		if perLayer > 0 {
			return nil, fmt.Errorf("both a kv tensor and per-layer tensors: give one or the other")
		}
		if err := check("kv", t, []int{spec.Layers, 2, ntok, spec.KVHeads, spec.HeadDim}); err != nil {
			return nil, err
		}
		return append([]byte(nil), t.Data...), nil
	}
	kv := make([]byte, 0, 2*spec.Layers*per)
	for l := range spec.Layers {
		for _, kind := range []string{"k", "v"} {
			name := fmt.Sprintf("layers.%d.%s", l, kind)
			t, ok := tensors[name]
			if !ok {
				return nil, fmt.Errorf("no tensor %q (a %d-layer spec needs layers.{0..%d}.k and .v, or kv)", name, spec.Layers, spec.Layers-1)
			}
			if err := check(name, t, []int{ntok, spec.KVHeads, spec.HeadDim}); err != nil {
				return nil, err
			}
			kv = append(kv, t.Data...)
		}
	}
	return kv, nil
}

// chunkTokens is the chunk's token IDs: the file's "tokens" tensor or the
// JSON array in path, exactly one of them.
func chunkTokens(tensors map[string]safetensors.Tensor, path string) ([]uint32, error) {
	t, inFile := tensors["tokens"]
	switch {
	case inFile && path != "":
		return nil, usagef("encode: the safetensors file has a tokens tensor; -tokens would give them twice")
	case path != "":
		var toks []uint32
		if err := readJSON(path, &toks); err != nil {
			return nil, err
		}
		if len(toks) == 0 {
			return nil, fmt.Errorf("%s: no tokens", path)
		}
		return toks, nil
	case !inFile:
		return nil, usagef("encode: no tokens: give -tokens FILE or put a tokens tensor in the safetensors file")
	}
	if len(t.Shape) != 1 || t.Shape[0] == 0 {
		return nil, fmt.Errorf("tensor \"tokens\" has shape %v, want [tokens]", t.Shape)
	}
	toks := make([]uint32, t.Shape[0])
	le := binary.LittleEndian
	for i := range toks {
		var v int64
		switch t.DType {
		case "I32":
			v = int64(int32(le.Uint32(t.Data[4*i:])))
		case "U32":
			v = int64(le.Uint32(t.Data[4*i:]))
		case "I64":
			v = int64(le.Uint64(t.Data[8*i:]))
		default:
			return nil, fmt.Errorf("tensor \"tokens\" is %s, want I32, I64 or U32", t.DType)
		}
		if v < 0 || v > 1<<32-1 {
			return nil, fmt.Errorf("token %d at %d is not a token ID", v, i)
		}
		toks[i] = uint32(v)
	}
	return toks, nil
}

// encodeContext is the chunk's context from -context, -before and -window.
func encodeContext(fp chunk.Fingerprint, kind, beforeFile string, w int) (chunk.Context, error) {
	needBefore := kind == "window" || kind == "prefix"
	switch {
	case needBefore && beforeFile == "":
		return chunk.Context{}, usagef("encode: -context %s needs -before FILE", kind)
	case !needBefore && beforeFile != "":
		return chunk.Context{}, usagef("encode: -before applies to -context window or prefix")
	case kind != "window" && w != 0:
		return chunk.Context{}, usagef("encode: -window applies to -context window")
	}
	switch kind {
	case "window":
		if w < 1 || w > chunk.MaxWindow {
			return chunk.Context{}, usagef("encode: -context window needs -window W in 1..%d", chunk.MaxWindow)
		}
		var before []uint32
		if err := readJSON(beforeFile, &before); err != nil {
			return chunk.Context{}, err
		}
		return chunk.WindowContext(fp, w, before[max(0, len(before)-w):]), nil
	case "prefix":
		var chunks [][]uint32
		if err := readJSON(beforeFile, &chunks); err != nil {
			return chunk.Context{}, err
		}
		_, end := chunk.PrefixChain(fp, chunks)
		return chunk.PrefixContext(end), nil
	}
	cx, err := parseContext(kind)
	if err != nil {
		return chunk.Context{}, usagef("encode: -context: %v", err)
	}
	if err := cx.CheckCanonical(); err != nil {
		return chunk.Context{}, usagef("encode: -context: %v", err)
	}
	return cx, nil
}

// readJSON decodes the JSON file path into v, refusing trailing data.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if dec.More() {
		return fmt.Errorf("%s: data after the JSON value", path)
	}
	return nil
}
