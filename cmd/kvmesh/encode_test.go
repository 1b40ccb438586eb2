package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/safetensors"
)

// TestEncode builds safetensors files of a chunk's K/V in both layouts
// encode reads, encodes them, and checks that the entry decodes to the
// same bits under the key its tokens and context give; then that wrong
// shapes, dtypes and names are refused, and that put stores the file.
func TestEncode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	write := func(name string, b []byte) string {
		if err := os.WriteFile(path(name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path(name)
	}
	writeJSON := func(name string, v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return write(name, b)
	}
	writeST := func(name string, ts map[string]safetensors.Tensor) string {
		var buf bytes.Buffer
		if err := safetensors.Write(&buf, ts, nil); err != nil {
			t.Fatal(err)
		}
		return write(name, buf.Bytes())
	}
	spec := chunk.ModelSpec{Family: "llama", Layers: 2, KVHeads: 2, HeadDim: 4, DType: chunk.BF16, RopeStyle: chunk.RopeNeoX,
		RopeTheta: 10000, WeightsRevision: "test@1"}
	js, err := chunk.MarshalSpecJSON(spec)
	if err != nil {
		t.Fatal(err)
	}
	specFile := write("spec.json", js)
	fp := spec.Fingerprint()
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := []uint32{7, 11, 13}
	per := len(tokens) * spec.KVHeads * spec.HeadDim * 2 // bytes of one layer's K (or V)
	// want is the entry's canonical layout: [layer][K|V][token][head][dim].
	want := make([]byte, 2*spec.Layers*per)
	for i := range want {
		want[i] = byte(rng.Uint32())
		if i%2 == 1 {
			want[i] &^= 0x40 // a finite bf16 (the lossy codec refuses NaN and Inf)
		}
	}
	layerTensors := map[string]safetensors.Tensor{}
	for l := range spec.Layers {
		for j, kind := range []string{"k", "v"} {
			off := (2*l + j) * per
			layerTensors[fmt.Sprintf("layers.%d.%s", l, kind)] = safetensors.Tensor{DType: "BF16",
				Shape: []int{len(tokens), spec.KVHeads, spec.HeadDim}, Data: want[off : off+per]}
		}
	}
	tokensFile := writeJSON("tokens.json", tokens)
	perLayer := writeST("layers.safetensors", layerTensors)
	tok64 := make([]byte, 0, 8*len(tokens))
	for _, v := range tokens {
		tok64 = binary.LittleEndian.AppendUint64(tok64, uint64(v))
	}
	oneKV := writeST("kv.safetensors", map[string]safetensors.Tensor{
		"kv":     {DType: "BF16", Shape: []int{spec.Layers, 2, len(tokens), spec.KVHeads, spec.HeadDim}, Data: want},
		"tokens": {DType: "I64", Shape: []int{len(tokens)}, Data: tok64},
	})
	earlier := [][]uint32{{1, 2, 3}, {4, 5}}
	_, prefixEnd := chunk.PrefixChain(fp, earlier)
	for _, tc := range []struct {
		name  string
		args  []string
		cx    chunk.Context
		lossy bool
	}{
		{"per layer, standalone", []string{"-kv", perLayer, "-tokens", tokensFile}, chunk.StandaloneContext(), false},
		{"one kv, tokens in the file, prefix", []string{"-kv", oneKV, "-context", "prefix", "-before", writeJSON("chunks.json", earlier)},
			chunk.PrefixContext(prefixEnd), false},
		{"window of the last 2", []string{"-kv", perLayer, "-tokens", tokensFile, "-context", "window", "-window", "2",
			"-before", writeJSON("before.json", []uint32{9, 4, 5}), "-codec", "raw"}, chunk.WindowContext(fp, 2, []uint32{4, 5}), false},
		{"explicit context, int8", []string{"-kv", perLayer, "-tokens", tokensFile, "-context", chunk.PrefixContext(prefixEnd).String(),
			"-codec", "int8"}, chunk.PrefixContext(prefixEnd), true},
	} {
		out := path("entry.kvmc")
		stdout, stderr, code := runCLI(ctx, append([]string{"encode", "-spec", specFile, "-o", out, "-format", "json"}, tc.args...)...)
		if code != exitOK {
			t.Fatalf("%s: exit %d\n%s%s", tc.name, code, stdout, stderr)
		}
		blob, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		e, err := chunk.Decode(blob, chunk.Limits{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		key := chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: tc.cx}
		var printed encodeOut
		if err := json.Unmarshal([]byte(stdout), &printed); err != nil || printed.Key != key.String() || e.Key != key {
			t.Fatalf("%s: key %v, printed %+v (%v), want %v", tc.name, e.Key, printed, err, key)
		}
		if !slices.Equal(e.Tokens, tokens) || e.DType != chunk.BF16 || e.Layers != 2 || e.KVHeads != 2 || e.HeadDim != 4 {
			t.Fatalf("%s: entry %+v", tc.name, e)
		}
		if !tc.lossy && !bytes.Equal(e.KV, want) {
			t.Fatalf("%s: decoded K/V differ from the tensors' bits", tc.name)
		}
	}
	nbad := 0
	badTensors := func(mutate func(m map[string]safetensors.Tensor)) string {
		m := map[string]safetensors.Tensor{}
		for k, v := range layerTensors {
			m[k] = v
		}
		mutate(m)
		nbad++
		return writeST(fmt.Sprintf("bad%d.safetensors", nbad), m)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"f16 tensor for a bf16 spec", []string{"-tokens", tokensFile, "-kv", badTensors(func(m map[string]safetensors.Tensor) {
			t := m["layers.1.v"]
			t.DType = "F16"
			m["layers.1.v"] = t
		})}, exitError, `"layers.1.v" is F16`},
		{"another token count", []string{"-tokens", writeJSON("two.json", tokens[:2]), "-kv", perLayer}, exitError, "want [2 2 4]"},
		{"heads and dims swapped", []string{"-tokens", tokensFile, "-kv", badTensors(func(m map[string]safetensors.Tensor) {
			t := m["layers.0.k"]
			t.Shape = []int{3, 4, 2}
			m["layers.0.k"] = t
		})}, exitError, "shape [3 4 2]"},
		{"missing layer", []string{"-tokens", tokensFile, "-kv", badTensors(func(m map[string]safetensors.Tensor) { delete(m, "layers.1.k") })},
			exitError, `no tensor "layers.1.k"`},
		{"unknown tensor", []string{"-tokens", tokensFile, "-kv", badTensors(func(m map[string]safetensors.Tensor) {
			m["layers.2.k"] = m["layers.0.k"]
		})}, exitError, `tensor "layers.2.k": not one of`},
		{"kv and layers", []string{"-tokens", tokensFile, "-kv", badTensors(func(m map[string]safetensors.Tensor) {
			m["kv"] = safetensors.Tensor{DType: "BF16", Shape: []int{2, 2, 3, 2, 4}, Data: want}
		})}, exitError, "both a kv tensor and per-layer"},
		{"no tokens", []string{"-kv", perLayer}, exitUsage, "no tokens"},
		{"tokens twice", []string{"-kv", oneKV, "-tokens", tokensFile}, exitUsage, "twice"},
		{"window without before", []string{"-kv", perLayer, "-tokens", tokensFile, "-context", "window", "-window", "2"}, exitUsage, "needs -before"},
		{"no output", []string{"-kv", perLayer, "-tokens", tokensFile, "-o", ""}, exitUsage, "-o is required"},
		{"codec", []string{"-kv", perLayer, "-tokens", tokensFile, "-codec", "zstd"}, exitUsage, `-codec "zstd"`},
		{"not safetensors", []string{"-kv", tokensFile, "-tokens", tokensFile}, exitError, "safetensors: invalid file"},
	} {
		out, errOut, code := runCLI(ctx, append([]string{"encode", "-spec", specFile, "-o", path("refused.kvmc")}, tc.args...)...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%s: exit %d, want %d; output lacks %q?\n%s%s", tc.name, code, tc.code, tc.want, out, errOut)
		}
	}
	if _, err := os.Stat(path("refused.kvmc")); !os.IsNotExist(err) {
		t.Errorf("a refused encode wrote its output: %v", err)
	}
	// What encode wrote, put stores and get returns.
	addr := nodetest.Start(t, 1, nodetest.Config{}).Nodes[0].GRPCAddr()
	entry := path("put.kvmc")
	if out, errOut, code := runCLI(ctx, "encode", "-spec", specFile, "-kv", perLayer, "-tokens", tokensFile, "-o", entry); code != exitOK {
		t.Fatalf("encode: exit %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{{"register", specFile}, {"put", entry}} {
		if out, errOut, code := runCLI(ctx, append(args, "-addr", addr)...); code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	key := chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: chunk.StandaloneContext()}
	got, errOut, code := runCLI(ctx, "get", key.String(), "-addr", addr, "-layers", "0:2")
	if code != exitOK || got != string(want) {
		t.Fatalf("get: exit %d, %d bytes, want the %d tensor bytes\n%s", code, len(got), len(want), errOut)
	}
}
