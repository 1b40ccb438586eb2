package chunk

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// Shared vectors: keys and encoded entries that every client of the format
// (the Python package in python/ reads the same files) must reproduce byte
// for byte. `go test ./chunk -run TestSharedVectors -update` rewrites them;
// without -update the test checks the committed files against this code.
var update = flag.Bool("update", false, "rewrite the shared vectors under testdata/vectors")

const vectorsDir = "testdata/vectors"

// specVector is a ModelSpec in the JSON form the Python tests read: the
// canonical encoding and fingerprint are what they must compute.
type specVector struct {
	Name      string    `json:"name"`
	Spec      ModelSpec `json:"spec"`
	Canonical string    `json:"canonical_hex"`
	FP        string    `json:"fingerprint"`
}

type idVector struct {
	// "content", "window" (WindowID), "prefix_chain", "canonical"
	// (Canonical of Context) or "window_or_prefix" (WindowOrPrefix of W
	// and Chunks).
	What   string   `json:"what"`
	Spec   string   `json:"spec"`
	Tokens []uint32 `json:"tokens,omitempty"`
	// Chunks and W: prefix chains are cut into chunks; windows have a w.
	Chunks [][]uint32 `json:"chunks,omitempty"`
	W      int        `json:"w,omitempty"`
	// Context is the input of "canonical".
	Context *contextVector `json:"context,omitempty"`
	// IDs: one for content and window; for a chain, each chunk's context
	// ID then the chain end.
	IDs []string `json:"ids,omitempty"`
	// Contexts: the text form of each chunk's context of a chain, or of
	// the one result of "canonical" and "window_or_prefix".
	Contexts []string `json:"contexts,omitempty"`
}

type contextVector struct {
	Kind   int    `json:"kind"`
	Window uint32 `json:"window"`
	ID     string `json:"id"`
}

type entryVector struct {
	File    string   `json:"file"`
	Codec   string   `json:"codec"`
	DType   string   `json:"dtype"`
	Tokens  []uint32 `json:"tokens"`
	Layers  int      `json:"layers"`
	KVHeads int      `json:"kv_heads"`
	HeadDim int      `json:"head_dim"`
	FP      string   `json:"fingerprint"`
	Content string   `json:"content"`
	Kind    int      `json:"context_kind"`
	Window  uint32   `json:"context_window"`
	Context string   `json:"context_id"`
	// KVHash is XXH64 (seed 0) of the decoded tensor in the canonical
	// layout; Checksum is the entry's header checksum.
	KVHash   string `json:"kv_xxh64"`
	Checksum string `json:"checksum"`
	// Writer is "go" for entries chunk.Encode wrote, "python" for the
	// ones the Python encoder wrote, "go-f16v1" for f16 lossless entries
	// Go wrote in the first f16 layout, before the exponent layout, and
	// "go-1x" for lossless entries Go wrote when blocks under 4096
	// elements were huff0 1X (every reader must decode those).
	Writer string `json:"writer"`
}

// specCheck is a spec Validate must accept (with its fingerprint) or
// refuse: one model, one fingerprint. NegZero names Scaling fields set to
// -0.0 after reading (JSON cannot carry the sign of a zero to every
// reader).
type specCheck struct {
	Name    string    `json:"name"`
	Spec    ModelSpec `json:"spec"`
	NegZero []string  `json:"negative_zero,omitempty"`
	Valid   bool      `json:"valid"`
	FP      string    `json:"fingerprint,omitempty"`
}

type vectorFile struct {
	Comment    string        `json:"comment"`
	Specs      []specVector  `json:"specs"`
	SpecChecks []specCheck   `json:"spec_checks"`
	IDs        []idVector    `json:"ids"`
	Entries    []entryVector `json:"entries"`
}

// withNegZero returns s with the named Scaling fields set to -0.0.
func withNegZero(s ModelSpec, names []string) ModelSpec {
	nz := math.Copysign(0, -1)
	for _, n := range names {
		switch n {
		case "Factor":
			s.Scaling.Factor = nz
		case "BetaFast":
			s.Scaling.BetaFast = nz
		case "AttentionFactor":
			s.Scaling.AttentionFactor = nz
		default:
			panic("withNegZero: field " + n)
		}
	}
	return s
}

func vectorSpecChecks() []specCheck {
	with := func(s ModelSpec, f func(*ModelSpec)) ModelSpec { f(&s); return s }
	out := []specCheck{
		{Name: "llama, beta_fast -0.0", Spec: llamaSpec, NegZero: []string{"BetaFast"}},
		{Name: "tiny, factor and attention_factor -0.0", Spec: tinySpec, NegZero: []string{"Factor", "AttentionFactor"}},
		{Name: "llama, beta_fast 32 (llama3 does not use it)", Spec: with(llamaSpec, func(s *ModelSpec) { s.Scaling.BetaFast = 32 })},
		{Name: "tiny, default with factor 8", Spec: with(tinySpec, func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "default", Factor: 8} })},
		{Name: "yarn with max_positions (dynamic's)", Spec: with(tinySpec, func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 4096, MaxPositions: 5}
		})},
		{Name: "linear, factor -1", Spec: with(tinySpec, func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "linear", Factor: -1} })},
		{Name: "llama, original_max_positions 2^32+8192", Spec: with(llamaSpec, func(s *ModelSpec) { s.Scaling.OriginalMaxPositions = 1<<32 + 8192 })},
		{Name: "llama, original_max_positions 2^31-1", Spec: with(llamaSpec, func(s *ModelSpec) { s.Scaling.OriginalMaxPositions = MaxSpecPositions })},
		{Name: "dynamic, max_positions 2^31", Spec: with(tinySpec, func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: MaxSpecPositions + 1}
		})},
		{Name: "layers 1025", Spec: with(tinySpec, func(s *ModelSpec) { s.Layers = 1025 })},
		{Name: "rotary dim 3", Spec: with(tinySpec, func(s *ModelSpec) { s.RotaryDim = 3 })},
		{Name: "rope theta 1", Spec: with(tinySpec, func(s *ModelSpec) { s.RopeTheta = 1 })},
		{Name: "salt of 256 bytes", Spec: with(tinySpec, func(s *ModelSpec) { s.Salt = strings.Repeat("s", 256) })},
		{Name: "salt of 257 bytes", Spec: with(tinySpec, func(s *ModelSpec) { s.Salt = strings.Repeat("s", 257) })},
		{Name: "family of 257 bytes", Spec: with(tinySpec, func(s *ModelSpec) { s.Family = strings.Repeat("f", 257) })},
		{Name: "tokenizer id of 128 two-byte characters (256 bytes)", Spec: with(tinySpec, func(s *ModelSpec) { s.TokenizerID = strings.Repeat("é", 128) })},
	}
	for i := range out {
		s := withNegZero(out[i].Spec, out[i].NegZero)
		if out[i].Valid = s.Validate() == nil; out[i].Valid {
			out[i].FP = s.Fingerprint().String()
		}
	}
	return out
}

func vectorSpecs() []specVector {
	yarn := ModelSpec{Family: "qwen2", Layers: 28, KVHeads: 4, HeadDim: 128, DType: BF16, RopeStyle: RopeNeoX,
		RopeTheta: 1e6, Scaling: RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768, BetaFast: 32, BetaSlow: 1},
		WeightsRevision: "Qwen/Qwen2.5-7B-Instruct@a09a354", TokenizerID: "Qwen/Qwen2.5-7B-Instruct", Salt: "lora:ünïcode"}
	small := ModelSpec{Family: "llama", Layers: 2, KVHeads: 2, HeadDim: 16, DType: F32, RopeStyle: RopeNeoX, RopeTheta: 10000}
	out := []specVector{{Name: "tiny", Spec: tinySpec}, {Name: "llama", Spec: llamaSpec}, {Name: "yarn", Spec: yarn}, {Name: "small", Spec: small}}
	for i := range out {
		out[i].Canonical = fmt.Sprintf("%x", out[i].Spec.CanonicalEncoding())
		out[i].FP = out[i].Spec.Fingerprint().String()
	}
	return out
}

func vectorIDs(specs []specVector) []idVector {
	fps := map[string]Fingerprint{}
	for _, s := range specs {
		fps[s.Name] = s.Spec.Fingerprint()
	}
	t300 := make([]uint32, 300)
	for i := range t300 {
		t300[i] = uint32(i) * 2654435761
	}
	var out []idVector
	for _, name := range []string{"llama", "tiny"} {
		fp := fps[name]
		for _, toks := range [][]uint32{{}, {0}, {128000, 9906, 1917, 0, 4294967295}, t300} {
			out = append(out, idVector{What: "content", Spec: name, Tokens: toks, IDs: []string{ContentID(fp, toks).String()}})
		}
		for _, w := range []struct {
			w    int
			toks []uint32
		}{{4, []uint32{11, 12, 13, 14}}, {20, []uint32{7, 8, 9}}, {8, nil}} {
			out = append(out, idVector{What: "window", Spec: name, Tokens: w.toks, W: w.w, IDs: []string{WindowID(fp, w.toks).String()}})
		}
		for _, chunks := range [][][]uint32{
			{{128000, 882, 25}, {9906, 1917}, {0, 1, 2, 3, 4}, t300[:37]},
			{{}, {1, 2}, {}, {3}}, // empty chunks leave the chain as it is
		} {
			ctxs, end := PrefixChain(fp, chunks)
			v := idVector{What: "prefix_chain", Spec: name, Chunks: chunks}
			for _, c := range ctxs {
				v.IDs = append(v.IDs, c.ID.String())
				v.Contexts = append(v.Contexts, c.String())
			}
			v.IDs = append(v.IDs, end.String())
			out = append(out, v)
		}
		// One computation, one key.
		for _, c := range []Context{
			PrefixContext(PrefixRoot(fp)),
			{Kind: ContextWindow, Window: 8, ID: WindowID(fp, nil)},
			WindowContext(fp, 8, []uint32{1, 2, 3}),
			PrefixContext(NextPrefix(PrefixRoot(fp), []uint32{5, 6})),
			StandaloneContext(),
		} {
			out = append(out, idVector{What: "canonical", Spec: name,
				Context:  &contextVector{Kind: int(c.Kind), Window: c.Window, ID: c.ID.String()},
				Contexts: []string{Canonical(fp, c).String()}})
		}
		for _, w := range []struct {
			w      int
			chunks [][]uint32
		}{
			{4, [][]uint32{{1, 2}, {3}}}, // every token before: the prefix
			{3, [][]uint32{{1, 2}, {3}}},
			{2, [][]uint32{{1, 2}, {3}}}, // a window of [2 3]
			{0, [][]uint32{{1, 2}, {3}}}, // nothing: standalone
			{5, nil},
			{5, [][]uint32{{}, {}}},
		} {
			out = append(out, idVector{What: "window_or_prefix", Spec: name, W: w.w, Chunks: w.chunks,
				Contexts: []string{WindowOrPrefix(fp, w.w, w.chunks).String()}})
		}
	}
	return out
}

// vectorEntries are the Go-written entries: every dtype in every codec
// (the large one raw and lossless only), a layer long enough for two
// lossless blocks and huff0's four-stream format, a constant layer
// (run-length planes), and shapes with partial quantization groups.
func vectorEntries() []*Entry {
	rng := rand.New(rand.NewPCG(20, 26))
	var out []*Entry
	mk := func(dt DType, tokens, layers, heads, dim int, ctx func(Fingerprint, []uint32) Context) *Entry {
		e := synthEntry(rng, dt, tokens, layers, heads, dim)
		e.Key.Context = ctx(e.Key.Fingerprint, e.Tokens)
		return e
	}
	standalone := func(Fingerprint, []uint32) Context { return StandaloneContext() }
	window := func(fp Fingerprint, t []uint32) Context { return WindowContext(fp, 16, []uint32{1, 2, 3}) }
	prefix := func(fp Fingerprint, t []uint32) Context {
		return PrefixContext(NextPrefix(PrefixRoot(fp), []uint32{5, 6}))
	}
	out = append(out,
		mk(F32, 5, 2, 2, 8, standalone),
		mk(F16, 7, 3, 1, 4, window),
		mk(BF16, 9, 2, 2, 16, prefix),
		mk(BF16, 130, 1, 8, 64, prefix), // 66560 elements per half: blocks of 65536 and 1024
		mk(F32, 40, 1, 4, 32, window),   // 5120 elements per half: four streams
	)
	zero := mk(F16, 16, 2, 2, 8, standalone)
	clear(zero.KV[:zero.LayerBytes()]) // layer 0: every plane one repeated byte
	return append(out, zero,
		mk(F16, 130, 1, 2, 80, window),   // quantized: 3 token groups, dim groups of 64 and 16
		mk(BF16, 3, 1, 1, 5, standalone), // an odd number of elements: int4's padding nibble
	)
}

func entryVectorOf(e *Entry, c Codec, file string, blob []byte) entryVector {
	hd, err := ParseHeader(blob, Limits{})
	if err != nil {
		panic(err)
	}
	return entryVector{File: file, Codec: c.String(), DType: e.DType.String(), Tokens: e.Tokens, Layers: e.Layers,
		KVHeads: e.KVHeads, HeadDim: e.HeadDim, FP: e.Key.Fingerprint.String(), Content: e.Key.Content.String(),
		Kind: int(e.Key.Context.Kind), Window: e.Key.Context.Window, Context: e.Key.Context.ID.String(),
		KVHash: fmt.Sprintf("%016x", xxhash.Sum64(e.KV)), Checksum: fmt.Sprintf("%016x", hd.Checksum), Writer: "go"}
}

func writeVectors(t *testing.T) {
	path := filepath.Join(vectorsDir, "vectors.json")
	var old vectorFile
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &old)
	}
	specs := vectorSpecs()
	vf := vectorFile{
		Comment: "Written by `go test ./chunk -run TestSharedVectors -update`; read by chunk/vectors_test.go and python/tests/test_vectors.py.",
		Specs:   specs, SpecChecks: vectorSpecChecks(), IDs: vectorIDs(specs),
	}
	for i, e := range vectorEntries() {
		codecs := []Codec{CodecRaw, CodecLossless, CodecInt8, CodecInt4, CodecFP8}
		if e.Shape().RawBytes() > 64<<10 {
			codecs = codecs[:2] // keep the committed files small
		}
		for _, c := range codecs {
			blob, err := Encode(nil, e, c)
			if err != nil {
				t.Fatal(err)
			}
			file := fmt.Sprintf("go_%d_%s_%s.kvmc", i, e.DType, c)
			if err := os.WriteFile(filepath.Join(vectorsDir, file), blob, 0o644); err != nil {
				t.Fatal(err)
			}
			// The record holds what the entry decodes to (lossy codecs
			// do not give e.KV back).
			d, err := Decode(blob, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			vf.Entries = append(vf.Entries, entryVectorOf(d, c, file, blob))
		}
	}
	// The Python-written entries are kept (their writer regenerates
	// them), and so are the first f16 layout's, which no encoder writes.
	for _, ev := range old.Entries {
		if ev.Writer != "go" {
			vf.Entries = append(vf.Entries, ev)
		}
	}
	b, err := json.MarshalIndent(vf, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSharedVectors(t *testing.T) {
	if *update {
		if err := os.MkdirAll(vectorsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeVectors(t)
	}
	b, err := os.ReadFile(filepath.Join(vectorsDir, "vectors.json"))
	if err != nil {
		t.Fatalf("%v (run go test ./chunk -run TestSharedVectors -update to create)", err)
	}
	var vf vectorFile
	if err := json.Unmarshal(b, &vf); err != nil {
		t.Fatal(err)
	}
	fps := map[string]Fingerprint{}
	for _, sv := range vf.Specs {
		fps[sv.Name] = sv.Spec.Fingerprint()
		if got := fmt.Sprintf("%x", sv.Spec.CanonicalEncoding()); got != sv.Canonical {
			t.Errorf("spec %s: canonical encoding\n got %s\nwant %s", sv.Name, got, sv.Canonical)
		}
		if got := sv.Spec.Fingerprint().String(); got != sv.FP {
			t.Errorf("spec %s: fingerprint %s, want %s", sv.Name, got, sv.FP)
		}
	}
	if len(vf.IDs) == 0 || len(vf.Entries) == 0 || len(vf.SpecChecks) == 0 {
		t.Fatal("vectors.json has no IDs, entries or spec checks")
	}
	for _, sc := range vf.SpecChecks {
		s := withNegZero(sc.Spec, sc.NegZero)
		err := s.Validate()
		if (err == nil) != sc.Valid {
			t.Errorf("spec check %q: Validate %v, want valid %v", sc.Name, err, sc.Valid)
		}
		if err == nil && s.Fingerprint().String() != sc.FP {
			t.Errorf("spec check %q: fingerprint %v, want %s", sc.Name, s.Fingerprint(), sc.FP)
		}
	}
	for _, iv := range vf.IDs {
		fp, ok := fps[iv.Spec]
		if !ok {
			t.Fatalf("id vector names unknown spec %q", iv.Spec)
		}
		var got []string
		switch iv.What {
		case "content":
			got = []string{ContentID(fp, iv.Tokens).String()}
		case "window":
			got = []string{WindowID(fp, iv.Tokens).String()}
		case "prefix_chain":
			ctxs, end := PrefixChain(fp, iv.Chunks)
			var texts []string
			for _, c := range ctxs {
				got = append(got, c.ID.String())
				texts = append(texts, c.String())
			}
			got = append(got, end.String())
			if fmt.Sprint(texts) != fmt.Sprint(iv.Contexts) {
				t.Errorf("prefix chain of %s %v: contexts %v, want %v", iv.Spec, iv.Chunks, texts, iv.Contexts)
			}
		case "canonical":
			var id ID
			if _, err := fmt.Sscanf(iv.Context.ID, "%016x%016x", &id.Hi, &id.Lo); err != nil {
				t.Fatal(err)
			}
			c := Context{Kind: ContextKind(iv.Context.Kind), Window: iv.Context.Window, ID: id}
			got, iv.IDs = []string{Canonical(fp, c).String()}, iv.Contexts
		case "window_or_prefix":
			got, iv.IDs = []string{WindowOrPrefix(fp, iv.W, iv.Chunks).String()}, iv.Contexts
		default:
			t.Fatalf("unknown id vector %q", iv.What)
		}
		if fmt.Sprint(got) != fmt.Sprint(iv.IDs) {
			t.Errorf("%s of %s %v %v: %v, want %v", iv.What, iv.Spec, iv.Tokens, iv.Chunks, got, iv.IDs)
		}
	}
	for _, ev := range vf.Entries {
		t.Run(ev.File, func(t *testing.T) { checkEntryVector(t, ev) })
	}
}

func checkEntryVector(t *testing.T, ev entryVector) {
	blob, err := os.ReadFile(filepath.Join(vectorsDir, ev.File))
	if err != nil {
		t.Fatal(err)
	}
	e, err := Decode(blob, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCodec(ev.Codec)
	if err != nil {
		t.Fatal(err)
	}
	hd, _ := ParseHeader(blob, Limits{})
	want := entryVector{File: ev.File, Codec: ev.Codec, DType: ev.DType, Tokens: ev.Tokens, Layers: ev.Layers,
		KVHeads: ev.KVHeads, HeadDim: ev.HeadDim, FP: ev.FP, Content: ev.Content, Kind: ev.Kind, Window: ev.Window,
		Context: ev.Context, KVHash: ev.KVHash, Checksum: ev.Checksum, Writer: ev.Writer}
	got := entryVectorOf(e, hd.Codec, ev.File, blob)
	got.Writer = ev.Writer
	if hd.Codec != c || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("decoded\n got %+v\nwant %+v", got, want)
	}
	if ev.Writer == "go-f16v1" {
		// Each layer is in the first f16 layout, which these vectors
		// are kept to check.
		for l := range hd.Layers {
			if p, err := hd.LayerPayload(blob, l); err != nil || hd.Shape.DType != F16 || p[0] == layoutF16Exp {
				t.Fatalf("layer %d is not in the first f16 layout (%v)", l, err)
			}
		}
	}
	if ev.Writer != "go" || c.Lossy() {
		// Re-encoding what a lossy codec decoded to need not give the
		// same codes; those vectors pin the decoders.
		return
	}
	again, err := Encode(nil, e, c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, blob) {
		t.Fatalf("Encode writes %d bytes that differ from the committed %d", len(again), len(blob))
	}
}
