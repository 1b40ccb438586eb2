package cudakern

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// testSpec is a small valid spec; variants modify it.
func testSpec(style chunk.RopeStyle, headDim, rotary int, sc chunk.RopeScaling) chunk.ModelSpec {
	return chunk.ModelSpec{
		Family: "llama", Layers: 2, KVHeads: 4, HeadDim: headDim, DType: chunk.BF16,
		RopeStyle: style, RopeTheta: 10000, RotaryDim: rotary, Scaling: sc,
	}
}

// variants covers every scaling type and pairing, with full and partial
// rotary.
func variants() []struct {
	name string
	spec chunk.ModelSpec
} {
	scalings := []struct {
		name string
		sc   chunk.RopeScaling
	}{
		{"default", chunk.RopeScaling{}},
		{"linear", chunk.RopeScaling{Type: "linear", Factor: 4}},
		{"llama3", chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}},
		{"yarn", chunk.RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 2048}},
		{"dynamic", chunk.RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: 1024}},
	}
	var out []struct {
		name string
		spec chunk.ModelSpec
	}
	for _, style := range []chunk.RopeStyle{chunk.RopeNeoX, chunk.RopeGPTJ} {
		for _, rot := range []int{0, 32} {
			for _, s := range scalings {
				name := style.String() + "/" + s.name
				if rot != 0 {
					name += "/partial"
				}
				out = append(out, struct {
					name string
					spec chunk.ModelSpec
				}{name, testSpec(style, 64, rot, s.sc)})
			}
		}
	}
	return out
}

func TestInvFreqGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/invfreq_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden []struct {
		Name string   `json:"name"`
		Bits []uint32 `json:"inv_freq_f32_bits"`
		Attn float64  `json:"attention_factor"`
	}
	if err := json.Unmarshal(raw, &golden); err != nil {
		t.Fatal(err)
	}
	// The same cases as testdata/invfreq_golden.py, as specs.
	specs := map[string]struct {
		spec   chunk.ModelSpec
		maxPos int
	}{
		"default-llama2":       {chunk.ModelSpec{RopeTheta: 10000, HeadDim: 128}, 16},
		"default-qwen-partial": {chunk.ModelSpec{RopeTheta: 1e6, HeadDim: 128, RotaryDim: 64}, 16},
		"linear-4":             {chunk.ModelSpec{RopeTheta: 10000, HeadDim: 128, Scaling: chunk.RopeScaling{Type: "linear", Factor: 4}}, 16},
		"llama3.1": {chunk.ModelSpec{RopeTheta: 500000, HeadDim: 128, Scaling: chunk.RopeScaling{
			Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}, 16},
		"yarn-qwen": {chunk.ModelSpec{RopeTheta: 1e6, HeadDim: 128, Scaling: chunk.RopeScaling{
			Type: "yarn", Factor: 4, OriginalMaxPositions: 32768}}, 16},
		"yarn-small": {chunk.ModelSpec{RopeTheta: 10000, HeadDim: 32, Scaling: chunk.RopeScaling{
			Type: "yarn", Factor: 16, OriginalMaxPositions: 2048, BetaFast: 16, BetaSlow: 2, AttentionFactor: 1.25}}, 16},
		"dynamic": {chunk.ModelSpec{RopeTheta: 10000, HeadDim: 64, Scaling: chunk.RopeScaling{
			Type: "dynamic", Factor: 2, MaxPositions: 2048}}, 4096},
	}
	if len(golden) != len(specs) {
		t.Fatalf("%d golden cases, %d specs", len(golden), len(specs))
	}
	for _, g := range golden {
		t.Run(g.Name, func(t *testing.T) {
			c, ok := specs[g.Name]
			if !ok {
				t.Fatalf("no spec for %q", g.Name)
			}
			s := c.spec
			s.Family, s.Layers, s.KVHeads, s.DType, s.RopeStyle = "llama", 1, 1, chunk.BF16, chunk.RopeNeoX
			tab, err := NewRopeTable(s, c.maxPos)
			if err != nil {
				t.Fatal(err)
			}
			inv := tab.InvFreq()
			if len(inv) != len(g.Bits) {
				t.Fatalf("%d inv_freq, golden has %d", len(inv), len(g.Bits))
			}
			for i, b := range g.Bits {
				// Python's and Go's pow may differ in the last float64 bit,
				// which can move the float32 rounding by one ulp.
				if d := int64(math.Float32bits(inv[i])) - int64(b); d < -1 || d > 1 {
					t.Errorf("inv_freq[%d] = %g, golden %g", i, inv[i], math.Float32frombits(b))
				}
			}
			if math.Abs(tab.AttentionFactor()-g.Attn) > 1e-15 {
				t.Errorf("attention factor %v, golden %v", tab.AttentionFactor(), g.Attn)
			}
		})
	}
}

// refRotate64 rotates x to pos in float64 with the table's own float32
// angle (the reference for the error bound), and returns the exact result
// before any rounding.
func refRotate64(tab *RopeTable, x []float64, pos int) []float64 {
	out := append([]float64(nil), x...)
	inv := tab.InvFreq()
	for i, f := range inv {
		angle := float64(float32(pos) * f)
		c, s := math.Cos(angle)*tab.AttentionFactor(), math.Sin(angle)*tab.AttentionFactor()
		a, b := i+len(inv), 2*i+1
		ia := i
		if tab.Spec().RopeStyle == chunk.RopeGPTJ {
			ia, a = 2*i, b
		}
		x0, x1 := x[ia], x[a]
		out[ia] = x0*c - x1*s
		out[a] = x1*c + x0*s
	}
	return out
}

// ulp returns the spacing of dtype dt at magnitude m (its subnormal spacing
// below the normal range).
func ulp(dt chunk.DType, m float64) float64 {
	var mant, minExp int // mantissa bits, exponent of the smallest normal
	switch dt {
	case chunk.F32:
		mant, minExp = 23, -126
	case chunk.F16:
		mant, minExp = 10, -14
	case chunk.BF16:
		mant, minExp = 7, -126
	case chunk.FP8E4M3:
		mant, minExp = 3, -6
	}
	_, e := math.Frexp(m) // m = f * 2^e, f in [0.5, 1)
	e--
	if e < minExp || m == 0 {
		e = minExp
	}
	return math.Ldexp(1, e-mant)
}

// rotTolerance is how far a rounded rotation of the pair (x0, x1) may be
// from the float64 reference ref: one ulp of the destination at ref, plus
// what float32 arithmetic can lose when x*cos and y*sin cancel (cos, sin,
// both products and the sum round once each, relative 2^-24 of |x|+|y|).
func rotTolerance(dt chunk.DType, ref, x0, x1, attn float64) float64 {
	return ulp(dt, math.Abs(ref)) + 3*0x1p-24*(math.Abs(x0)+math.Abs(x1))*attn
}

func TestRotateF32MatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			tab, err := NewRopeTable(v.spec, 4096)
			if err != nil {
				t.Fatal(err)
			}
			hd := v.spec.HeadDim
			x := make([]float32, hd)
			x64 := make([]float64, hd)
			worst := 0.0
			for n := 0; n < 200; n++ {
				pos := rng.IntN(5000) // some beyond the table
				for i := range x {
					x[i] = float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()))
					x64[i] = float64(x[i])
				}
				ref := refRotate64(tab, x64, pos)
				tab.RotateF32(x, pos)
				for i := range x {
					j := pairOf(v.spec, i)
					if j < 0 { // pass-through dim
						if float64(x[i]) != x64[i] {
							t.Fatalf("pos %d dim %d beyond rotary changed: %v -> %v", pos, i, x64[i], x[i])
						}
						continue
					}
					err := math.Abs(float64(x[i]) - ref[i])
					tol := rotTolerance(chunk.F32, ref[i], x64[i], x64[j], tab.AttentionFactor())
					if err > tol {
						t.Fatalf("pos %d dim %d: got %v, reference %v (err %g > tol %g)", pos, i, x[i], ref[i], err, tol)
					}
					worst = max(worst, err/ulp(chunk.F32, math.Hypot(x64[i], x64[j])))
				}
			}
			t.Logf("worst error %.2f f32 ulps of the pair norm", worst)
		})
	}
}

// pairOf returns the index rotated together with i, or -1 for a
// pass-through dim.
func pairOf(s chunk.ModelSpec, i int) int {
	r := s.Rotary()
	if i >= r {
		return -1
	}
	if s.RopeStyle == chunk.RopeGPTJ {
		return i ^ 1
	}
	if i < r/2 {
		return i + r/2
	}
	return i - r/2
}

func TestRotateOutOfTableSameBits(t *testing.T) {
	spec := testSpec(chunk.RopeNeoX, 64, 0, chunk.RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 2048})
	small, err := NewRopeTable(spec, 100)
	if err != nil {
		t.Fatal(err)
	}
	big, err := NewRopeTable(spec, 3000)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, pos := range []int{100, 101, 1000, 2999} {
		a := make([]float32, 64)
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		b := append([]float32(nil), a...)
		small.RotateF32(a, pos)
		big.RotateF32(b, pos)
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("pos %d dim %d: on the fly %v, table %v", pos, i, a[i], b[i])
			}
		}
	}
}

func TestRotateInverse(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			tab, err := NewRopeTable(v.spec, 2048)
			if err != nil {
				t.Fatal(err)
			}
			x := make([]float32, v.spec.HeadDim)
			orig := make([]float32, len(x))
			for n := 0; n < 200; n++ {
				norm := 0.0
				for i := range x {
					x[i] = float32(rng.NormFloat64())
					orig[i] = x[i]
					norm += float64(x[i]) * float64(x[i])
				}
				pos := rng.IntN(1 << 20)
				tab.RotateF32(x, pos)
				tab.UnrotateF32(x, pos)
				for i := range x {
					// A handful of float32 roundings relative to the vector.
					if d := math.Abs(float64(x[i] - orig[i])); d > 8*0x1p-24*math.Sqrt(norm) {
						t.Fatalf("pos %d dim %d: %v -> %v (diff %g)", pos, i, orig[i], x[i], d)
					}
				}
			}
		})
	}
}

// TestRelativeProperty: with q at m and k at n the score depends only on
// n - m. float32 angles lose about |p| * 2^-24 radians, so positions stay
// below 6000 and the tolerance is 1e-3 of |q||k|*attn^2.
func TestRelativeProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			tab, err := NewRopeTable(v.spec, 6000)
			if err != nil {
				t.Fatal(err)
			}
			hd := v.spec.HeadDim
			q0, k0 := make([]float32, hd), make([]float32, hd)
			q, k := make([]float32, hd), make([]float32, hd)
			for n := 0; n < 50; n++ {
				var nq, nk float64
				for i := range q0 {
					q0[i], k0[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
					nq += float64(q0[i] * q0[i])
					nk += float64(k0[i] * k0[i])
				}
				m, dist := rng.IntN(2000), rng.IntN(2000)
				score := func(shift int) float64 {
					copy(q, q0)
					copy(k, k0)
					tab.RotateF32(q, m+shift)
					tab.RotateF32(k, m+dist+shift)
					s := 0.0
					for i := range q {
						s += float64(q[i]) * float64(k[i])
					}
					return s
				}
				base := score(0)
				a2 := tab.AttentionFactor() * tab.AttentionFactor()
				tol := 1e-3 * math.Sqrt(nq*nk) * a2
				for _, shift := range []int{1, 17, 300, 1999} {
					if s := score(shift); math.Abs(s-base) > tol {
						t.Fatalf("m %d n-m %d shift %d: score %v, unshifted %v (tol %g)", m, dist, shift, s, base, tol)
					}
				}
			}
		})
	}
}

// TestNeoXIsPermutedGPTJ: NeoX pairing is GPT-J pairing under the
// permutation that interleaves the two halves, bit for bit.
func TestNeoXIsPermutedGPTJ(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	sc := chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}
	neox, err := NewRopeTable(testSpec(chunk.RopeNeoX, 48, 32, sc), 512)
	if err != nil {
		t.Fatal(err)
	}
	gptj, err := NewRopeTable(testSpec(chunk.RopeGPTJ, 48, 32, sc), 512)
	if err != nil {
		t.Fatal(err)
	}
	a, b := make([]float32, 48), make([]float32, 48)
	for n := 0; n < 100; n++ {
		for i := range a {
			a[i] = float32(rng.NormFloat64())
		}
		for i := 0; i < 16; i++ {
			b[2*i], b[2*i+1] = a[i], a[i+16]
		}
		copy(b[32:], a[32:])
		pos := rng.IntN(512)
		neox.RotateF32(a, pos)
		gptj.RotateF32(b, pos)
		for i := 0; i < 16; i++ {
			if a[i] != b[2*i] || a[i+16] != b[2*i+1] {
				t.Fatalf("pos %d pair %d: neox (%v,%v) gptj (%v,%v)", pos, i, a[i], a[i+16], b[2*i], b[2*i+1])
			}
		}
	}
}

func TestNewRopeTableErrors(t *testing.T) {
	ok := testSpec(chunk.RopeNeoX, 64, 0, chunk.RopeScaling{})
	cases := []struct {
		name   string
		mut    func(*chunk.ModelSpec)
		maxPos int
	}{
		{"zero positions", func(*chunk.ModelSpec) {}, 0},
		{"too many positions", func(*chunk.ModelSpec) {}, MaxTablePositions + 1},
		{"bad theta", func(s *chunk.ModelSpec) { s.RopeTheta = 1 }, 10},
		{"odd rotary", func(s *chunk.ModelSpec) { s.RotaryDim = 3 }, 10},
		{"bad style", func(s *chunk.ModelSpec) { s.RopeStyle = 9 }, 10},
		{"dynamic dim 2", func(s *chunk.ModelSpec) {
			s.RotaryDim = 2
			s.Scaling = chunk.RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: 4}
		}, 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := ok
			c.mut(&s)
			if _, err := NewRopeTable(s, c.maxPos); !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("err = %v, want ErrInvalidSpec", err)
			}
		})
	}
}
