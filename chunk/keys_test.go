package chunk

import (
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
)

// The vectors of docs/KEYS.md. They were computed by an independent
// pure-Python XXH64 and key derivation (the script is in docs/KEYS.md), so
// this test pins the Go code to the spec, not to itself.

var llamaSpec = ModelSpec{
	Family: "llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: BF16,
	RopeStyle: RopeNeoX, RopeTheta: 500000,
	Scaling:         RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
	WeightsRevision: "meta-llama/Llama-3.1-8B-Instruct@0e9e39f",
	TokenizerID:     "meta-llama/Llama-3.1-8B-Instruct",
}

var tinySpec = ModelSpec{
	Family: "qwen2", Layers: 2, KVHeads: 1, HeadDim: 4, DType: F16,
	RopeStyle: RopeGPTJ, RopeTheta: 10000, RotaryDim: 2, Salt: "tenant-a",
}

const tinyCanonicalHex = "0e0000006b766d6573682d737065632d7631050000007177656e320200000001000000040000000202000000000088c3" +
	"40020000000700000064656661756c740000000000000000000000000000000000000000000000000000000000000000" +
	"00000000000000000000000000000000000000000000000000000000000000000800000074656e616e742d61"

func TestSpecVectors(t *testing.T) {
	if got := hex.EncodeToString(tinySpec.CanonicalEncoding()); got != tinyCanonicalHex {
		t.Errorf("tiny canonical encoding\n got %s\nwant %s", got, tinyCanonicalHex)
	}
	if n := len(llamaSpec.CanonicalEncoding()); n != 203 {
		t.Errorf("llama canonical encoding is %d bytes, want 203", n)
	}
	for _, tc := range []struct {
		name string
		spec ModelSpec
		want string
	}{
		{"tiny", tinySpec, "a435dd57ab9be5857b3616159d05d659"},
		{"llama", llamaSpec, "13c6ba2ee1b5da5114ad80eab44adfd3"},
	} {
		if err := tc.spec.Validate(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if got := tc.spec.Fingerprint().String(); got != tc.want {
			t.Errorf("%s fingerprint %s, want %s", tc.name, got, tc.want)
		}
	}
}

// Equivalent spellings encode the same; every field changes the fingerprint.
func TestSpecCanonicalForms(t *testing.T) {
	a, b := llamaSpec, llamaSpec
	b.RotaryDim = b.HeadDim
	if a.Fingerprint() != b.Fingerprint() {
		t.Error("RotaryDim 0 and RotaryDim == HeadDim fingerprint differently")
	}
	c, d := tinySpec, tinySpec
	d.Scaling.Type = "default"
	if c.Fingerprint() != d.Fingerprint() {
		t.Error(`scaling "" and "default" fingerprint differently`)
	}
	mutations := []func(*ModelSpec){
		func(s *ModelSpec) { s.Family = "mistral" },
		func(s *ModelSpec) { s.Layers++ },
		func(s *ModelSpec) { s.KVHeads++ },
		func(s *ModelSpec) { s.HeadDim += 2 },
		func(s *ModelSpec) { s.DType = F16 },
		func(s *ModelSpec) { s.RopeStyle = RopeGPTJ },
		func(s *ModelSpec) { s.RopeTheta = 500001 },
		func(s *ModelSpec) { s.RotaryDim = 64 },
		func(s *ModelSpec) { s.Scaling.Type = "yarn" },
		func(s *ModelSpec) { s.Scaling.Factor = 4 },
		func(s *ModelSpec) { s.Scaling.LowFreqFactor = 2 },
		func(s *ModelSpec) { s.Scaling.HighFreqFactor = 5 },
		func(s *ModelSpec) { s.Scaling.OriginalMaxPositions = 4096 },
		func(s *ModelSpec) { s.Scaling.BetaFast = 32 },
		func(s *ModelSpec) { s.Scaling.BetaSlow = 1 },
		func(s *ModelSpec) { s.Scaling.AttentionFactor = 1.1 },
		func(s *ModelSpec) { s.Scaling.MaxPositions = 1 },
		func(s *ModelSpec) { s.WeightsRevision = "x" },
		func(s *ModelSpec) { s.TokenizerID = "x" },
		func(s *ModelSpec) { s.Salt = "x" },
		// Moving bytes between adjacent strings must not collide.
		func(s *ModelSpec) { s.WeightsRevision, s.TokenizerID = s.WeightsRevision+"m", s.TokenizerID[1:] },
	}
	seen := map[Fingerprint]int{llamaSpec.Fingerprint(): -1}
	for i, m := range mutations {
		s := llamaSpec
		m(&s)
		fp := s.Fingerprint()
		if j, dup := seen[fp]; dup {
			t.Errorf("mutation %d collides with %d", i, j)
		}
		seen[fp] = i
	}
}

func TestSpecValidate(t *testing.T) {
	ok := tinySpec
	tests := []struct {
		name string
		mut  func(*ModelSpec)
		ok   bool
	}{
		{"valid", func(*ModelSpec) {}, true},
		{"llama3 valid", func(s *ModelSpec) { *s = llamaSpec }, true},
		{"yarn valid", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768} }, true},
		{"linear valid", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "linear", Factor: 2} }, true},
		{"dynamic valid", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: 4096} }, true},
		{"f32", func(s *ModelSpec) { s.DType = F32 }, true},
		{"no family", func(s *ModelSpec) { s.Family = "" }, false},
		{"zero layers", func(s *ModelSpec) { s.Layers = 0 }, false},
		{"too many layers", func(s *ModelSpec) { s.Layers = 1025 }, false},
		{"zero heads", func(s *ModelSpec) { s.KVHeads = 0 }, false},
		{"odd head dim", func(s *ModelSpec) { s.HeadDim = 5 }, false},
		{"huge head dim", func(s *ModelSpec) { s.HeadDim = 8192 }, false},
		{"fp8 kv", func(s *ModelSpec) { s.DType = FP8E4M3 }, false},
		{"no dtype", func(s *ModelSpec) { s.DType = DTypeInvalid }, false},
		{"no rope style", func(s *ModelSpec) { s.RopeStyle = 0 }, false},
		{"theta 1", func(s *ModelSpec) { s.RopeTheta = 1 }, false},
		{"theta NaN", func(s *ModelSpec) { s.RopeTheta = nan() }, false},
		{"theta Inf", func(s *ModelSpec) { s.RopeTheta = inf() }, false},
		{"odd rotary", func(s *ModelSpec) { s.RotaryDim = 3 }, false},
		{"rotary > head dim", func(s *ModelSpec) { s.RotaryDim = 6 }, false},
		{"negative rotary", func(s *ModelSpec) { s.RotaryDim = -2 }, false},
		{"linear no factor", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "linear"} }, false},
		{"dynamic no max", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "dynamic", Factor: 2} }, false},
		{"llama3 low >= high", func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 4, HighFreqFactor: 4, OriginalMaxPositions: 8192}
		}, false},
		{"llama3 no orig", func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4}
		}, false},
		{"yarn no orig", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "yarn", Factor: 4} }, false},
		{"unknown scaling", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "longrope", Factor: 4} }, false},
		// One model, one fingerprint: fields the type does not use, values
		// the encoding would truncate, strings over the limit.
		{"llama3 with beta_fast", func(s *ModelSpec) { *s = llamaSpec; s.Scaling.BetaFast = 32 }, false},
		{"default with llama3 factors", func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "default", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
		}, false},
		{"none with a factor", func(s *ModelSpec) { s.Scaling = RopeScaling{Factor: 2} }, false},
		{"linear with max positions", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "linear", Factor: 2, MaxPositions: 4096} }, false},
		{"dynamic with low_freq_factor", func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: 4096, LowFreqFactor: 1}
		}, false},
		{"yarn with max positions", func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768, MaxPositions: 131072}
		}, false},
		{"yarn all fields", func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768, BetaFast: 32, BetaSlow: 1, AttentionFactor: 1.2}
		}, true},
		{"yarn NaN beta", func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768, BetaFast: nan()}
		}, false},
		{"yarn negative attention factor", func(s *ModelSpec) {
			s.Scaling = RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768, AttentionFactor: -1}
		}, false},
		{"orig max past 2^32", func(s *ModelSpec) { *s = llamaSpec; s.Scaling.OriginalMaxPositions = 1<<32 + 8192 }, false},
		{"orig max past int32", func(s *ModelSpec) { *s = llamaSpec; s.Scaling.OriginalMaxPositions = 1 << 31 }, false},
		{"orig max at int32", func(s *ModelSpec) { *s = llamaSpec; s.Scaling.OriginalMaxPositions = 1<<31 - 1 }, true},
		{"max positions past 2^32", func(s *ModelSpec) { s.Scaling = RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: 1<<32 + 4096} }, false},
		{"layers past 2^32", func(s *ModelSpec) { s.Layers = 1<<32 + 2 }, false},
		{"salt at the limit", func(s *ModelSpec) { s.Salt = strings.Repeat("s", MaxSpecString) }, true},
		{"salt over the limit", func(s *ModelSpec) { s.Salt = strings.Repeat("s", MaxSpecString+1) }, false},
		{"family over the limit", func(s *ModelSpec) { s.Family = strings.Repeat("f", MaxSpecString+1) }, false},
		{"tokenizer not UTF-8", func(s *ModelSpec) { s.TokenizerID = "\xff" }, false},
	}
	for _, tc := range tests {
		s := ok
		tc.mut(&s)
		err := s.Validate()
		if tc.ok && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if !tc.ok && !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: got %v, want ErrInvalidSpec", tc.name, err)
		}
	}
}

func TestKeyVectors(t *testing.T) {
	fp := llamaSpec.Fingerprint()
	t1 := []uint32{128000, 9906, 1917, 0, 4294967295}
	t300 := make([]uint32, 300) // longer than hashTokens' stack buffer
	for i := range t300 {
		t300[i] = uint32(i) * 2654435761
	}
	for _, tc := range []struct {
		name string
		got  ID
		want string
	}{
		{"content of no tokens", ContentID(fp, nil), "2c833ef0399da39c0aac40930a37e9e5"},
		{"content of t1", ContentID(fp, t1), "b103c42617731a24b016e31e1d9683f1"},
		{"content of t300", ContentID(fp, t300), "7c6f042a83631d0098ecfa685ae18ec5"},
		{"window 4 of [11 12 13 14]", WindowContext(fp, 4, []uint32{11, 12, 13, 14}).ID, "4905e031126139977f989e509f4ed905"},
		{"window 20 of [7 8 9]", WindowContext(fp, 20, []uint32{7, 8, 9}).ID, "791f08d10bae24a82bbff8741418573f"},
		{"prefix root", PrefixRoot(fp), "3de8ca5c84d3b32964dfe58cdd32f1fd"},
	} {
		if tc.got.String() != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
	chunks := [][]uint32{{128000, 882, 25}, {9906, 1917}, {0, 1, 2, 3, 4}}
	wantChain := []string{
		"standalone", // chunk 0: nothing before it (the chain starts at the root)
		"prefix:c94c8584ed6eb861a89fa8d4412db66e",
		"prefix:efa5cb6c9561fa38c9f40f1ed33ec9a0",
	}
	ctxs, end := PrefixChain(fp, chunks)
	for i, c := range ctxs {
		if c.String() != wantChain[i] {
			t.Errorf("context of chunk %d: %v, want %s", i, c, wantChain[i])
		}
	}
	if end.String() != "f3961b5e41a521cfacf7b5413e343276" {
		t.Errorf("prefix chain end %s", end)
	}
	if w := WindowContext(fp, 20, []uint32{7, 8, 9}); w.Kind != ContextWindow || w.Window != 20 {
		t.Errorf("window context %+v", w)
	}
	if s := StandaloneContext(); s.Kind != ContextStandalone || !s.ID.IsZero() {
		t.Errorf("standalone context %+v", s)
	}
}

// The three ID kinds never coincide for the same tokens, and IDs depend on
// the fingerprint, token order and token boundaries.
func TestKeyDomains(t *testing.T) {
	fp := llamaSpec.Fingerprint()
	toks := []uint32{1, 2, 3}
	ids := map[ID]string{}
	add := func(name string, id ID) {
		if prev, dup := ids[id]; dup {
			t.Errorf("%s equals %s", name, prev)
		}
		ids[id] = name
	}
	add("content", ContentID(fp, toks))
	add("window", WindowContext(fp, 3, toks).ID)
	add("prefix", NextPrefix(PrefixRoot(fp), toks))
	add("root", PrefixRoot(fp))
	add("other model", ContentID(tinySpec.Fingerprint(), toks))
	add("reordered", ContentID(fp, []uint32{3, 2, 1}))
	add("extended", ContentID(fp, []uint32{1, 2, 3, 0}))
	// A chain is not the hash of the concatenation.
	add("chain [1] [2 3]", NextPrefix(NextPrefix(PrefixRoot(fp), []uint32{1}), []uint32{2, 3}))
	if allocs := testing.AllocsPerRun(100, func() { _ = ContentID(fp, toks) }); allocs != 0 {
		t.Errorf("ContentID allocates %v times", allocs)
	}
}

func nan() float64 { var z float64; return z / z }
func inf() float64 { var z float64; return 1 / z }

// TestSpecNegativeZero: -0.0 and 0.0 are one value, so they give one
// fingerprint.
func TestSpecNegativeZero(t *testing.T) {
	a := tinySpec
	a.Scaling = RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768}
	b := a
	b.Scaling.BetaFast, b.Scaling.AttentionFactor = math.Copysign(0, -1), math.Copysign(0, -1)
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	if a.Fingerprint() != b.Fingerprint() {
		t.Fatalf("-0.0 fingerprints %v, 0.0 %v", b.Fingerprint(), a.Fingerprint())
	}
}

// TestCanonicalVectors: the canonical-form rows of docs/KEYS.md section 5.
func TestCanonicalVectors(t *testing.T) {
	s := llamaSpec
	s.Scaling.BetaFast = math.Copysign(0, -1)
	if err := s.Validate(); err != nil || s.Fingerprint().String() != "13c6ba2ee1b5da5114ad80eab44adfd3" {
		t.Fatalf("llama with -0.0: %v %v", s.Fingerprint(), err)
	}
	for name, s := range map[string]ModelSpec{
		"llama beta_fast": func() ModelSpec { s := llamaSpec; s.Scaling.BetaFast = 32; return s }(),
		"tiny default factor": func() ModelSpec {
			s := tinySpec
			s.Scaling = RopeScaling{Type: "default", Factor: 8}
			return s
		}(),
		"llama 2^32+8192": func() ModelSpec { s := llamaSpec; s.Scaling.OriginalMaxPositions = 1<<32 + 8192; return s }(),
		"tiny salt 257":   func() ModelSpec { s := tinySpec; s.Salt = strings.Repeat("a", 257); return s }(),
	} {
		if err := s.Validate(); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec", name, err)
		}
	}
}

// TestOneComputationOneKey: every spelling of one computation has one key.
// A chunk with nothing before it is standalone, whether asked for as the
// root of a prefix chain or as a window of no tokens; a window that holds
// every token before the chunk is keyed by the prefix; every other context
// keeps its key.
func TestOneComputationOneKey(t *testing.T) {
	fp := llamaSpec.Fingerprint()
	standalone := StandaloneContext()
	for _, c := range []Context{PrefixContext(PrefixRoot(fp)), {Kind: ContextWindow, Window: 8, ID: WindowID(fp, nil)}, WindowContext(fp, 8, nil)} {
		if got := Canonical(fp, c); got != standalone {
			t.Errorf("Canonical(%v) = %v, want standalone", c, got)
		}
	}
	if ctxs, _ := PrefixChain(fp, [][]uint32{{}, {1}}); ctxs[0] != standalone || ctxs[1] != standalone {
		t.Errorf("chunks with nothing before them: %v, want standalone", ctxs)
	}
	for _, c := range []Context{standalone, WindowContext(fp, 8, []uint32{1}), PrefixContext(NextPrefix(PrefixRoot(fp), []uint32{1})),
		PrefixContext(PrefixRoot(tinySpec.Fingerprint()))} {
		if got := Canonical(fp, c); got != c {
			t.Errorf("Canonical(%v) = %v, want it unchanged", c, got)
		}
	}
	// CheckKey refuses the other spellings, so no store holds them.
	tokens := []uint32{9, 9}
	for _, c := range []Context{PrefixContext(PrefixRoot(fp)), {Kind: ContextWindow, Window: 3, ID: WindowID(fp, nil)}} {
		k := Key{Fingerprint: fp, Content: ContentID(fp, tokens), Context: c}
		if err := CheckKey(k, tokens); !errors.Is(err, ErrNonCanonical) {
			t.Errorf("CheckKey(%v): %v, want ErrNonCanonical", c, err)
		}
	}
	before := [][]uint32{{1, 2}, {3}}
	ctxs, _ := PrefixChain(fp, append(before, []uint32{4})) // ctxs[2]: the chunk after before
	for _, tc := range []struct {
		w    int
		want Context
	}{
		{3, ctxs[2]}, {100, ctxs[2]}, // the window is every token before: the prefix key
		{2, WindowContext(fp, 2, []uint32{2, 3})},
		{1, WindowContext(fp, 1, []uint32{3})},
		{0, standalone},
	} {
		if got := WindowOrPrefix(fp, tc.w, before); got != tc.want {
			t.Errorf("WindowOrPrefix(w=%d) = %v, want %v", tc.w, got, tc.want)
		}
	}
	if got := WindowOrPrefix(fp, 4, nil); got != standalone {
		t.Errorf("WindowOrPrefix with nothing before: %v", got)
	}
}

// TestCompareKeys: CompareKeys is a total order whose ties are equal keys,
// and content ID decides first.
func TestCompareKeys(t *testing.T) {
	var keys []Key
	for _, v := range []uint64{0, 1, math.MaxUint64} {
		keys = append(keys,
			Key{Content: ID{Hi: v}},
			Key{Content: ID{Lo: v}, Fingerprint: Fingerprint{Hi: 1}},
			Key{Fingerprint: Fingerprint{Lo: v}},
			Key{Context: Context{Kind: ContextWindow, Window: uint32(v & 0xff), ID: ID{Lo: v}}},
			Key{Context: Context{Kind: ContextPrefix, ID: ID{Hi: v}}},
		)
	}
	for _, a := range keys {
		for _, b := range keys {
			ab, ba := CompareKeys(a, b), CompareKeys(b, a)
			if ab != -ba {
				t.Fatalf("CompareKeys(%v, %v) = %d but the reverse is %d", a, b, ab, ba)
			}
			if (ab == 0) != (a == b) {
				t.Fatalf("CompareKeys(%v, %v) = %d for keys that are equal: %v", a, b, ab, a == b)
			}
			for _, c := range keys {
				if ab < 0 && CompareKeys(b, c) < 0 && CompareKeys(a, c) >= 0 {
					t.Fatalf("not transitive: %v < %v < %v", a, b, c)
				}
			}
		}
	}
	lo, hi := Key{Content: ID{Lo: 1}, Fingerprint: Fingerprint{Hi: 9}}, Key{Content: ID{Lo: 2}}
	if CompareKeys(lo, hi) >= 0 {
		t.Fatal("the content ID does not decide before the fingerprint")
	}
}
