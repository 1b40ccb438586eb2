package chunk

import (
	"math"
	"math/big"
	"testing"
)

// checkRoundTrip16 checks every 16-bit code and every representable
// midpoint between neighbouring codes.
func checkRoundTrip16(t *testing.T, name string, widen func(uint16) float32, narrow func(float32) uint16) {
	t.Helper()
	// Every code widens and narrows back to itself (NaNs to a NaN).
	for c := 0; c < 1<<16; c++ {
		f := widen(uint16(c))
		got := narrow(f)
		if f != f {
			if g := widen(got); g == g {
				t.Fatalf("%s: NaN code %#04x narrowed to non-NaN %#04x", name, c, got)
			}
			continue
		}
		if got != uint16(c) {
			t.Fatalf("%s: code %#04x -> %v -> %#04x", name, c, f, got)
		}
	}
	// Midpoints between neighbours round to the even code, and points just
	// beside a midpoint round to the nearer code.
	for c := 0; c < 0x7fff; c++ {
		a, b := widen(uint16(c)), widen(uint16(c+1))
		if a != a || b != b || math.IsInf(float64(b), 0) {
			continue
		}
		mid := (float64(a) + float64(b)) / 2
		m32 := float32(mid)
		if float64(m32) != mid {
			continue // midpoint not representable in float32: nothing to test
		}
		want := uint16(c)
		if c&1 == 1 {
			want = uint16(c + 1)
		}
		if got := narrow(m32); got != want {
			t.Fatalf("%s: midpoint %v of %#04x,%#04x -> %#04x, want %#04x", name, mid, c, c+1, got, want)
		}
		if got := narrow(math.Nextafter32(m32, float32(math.Inf(-1)))); got != uint16(c) && a != m32 {
			t.Fatalf("%s: below midpoint %v -> %#04x, want %#04x", name, mid, got, c)
		}
		if got := narrow(math.Nextafter32(m32, float32(math.Inf(1)))); got != uint16(c+1) {
			t.Fatalf("%s: above midpoint %v -> %#04x, want %#04x", name, mid, got, c+1)
		}
	}
}

func TestF16Exhaustive(t *testing.T)  { checkRoundTrip16(t, "f16", F16ToF32, F32ToF16) }
func TestBF16Exhaustive(t *testing.T) { checkRoundTrip16(t, "bf16", BF16ToF32, F32ToBF16) }

func TestF16Specials(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{0, 0}, {float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65519.99, 0x7bff}, {65520, 0x7c00},
		{float32(math.Inf(1)), 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{5.960464477539063e-08, 0x0001}, // smallest subnormal 2^-24
		{2.98e-08, 0x0000},              // just under half of it
		{2.99e-08, 0x0001},              // just over half of it
		{6.097555160522461e-05, 0x03ff}, // largest subnormal
		{6.103515625e-05, 0x0400},       // smallest normal
	}
	for _, c := range cases {
		if got := F32ToF16(c.in); got != c.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
}

// TestNarrowRandom compares against math/big rounding on random float32s.
func TestNarrowRandom(t *testing.T) {
	var x uint32 = 12345
	for i := 0; i < 200000; i++ {
		x = x*1664525 + 1013904223
		f := math.Float32frombits(x)
		if f != f || math.IsInf(float64(f), 0) {
			continue
		}
		for _, c := range []struct {
			name   string
			narrow func(float32) uint16
			widen  func(uint16) float32
		}{{"f16", F32ToF16, F16ToF32}, {"bf16", F32ToBF16, BF16ToF32}} {
			got := c.narrow(f)
			g := c.widen(got)
			// The result must be a nearest code: its neighbours are not closer.
			bf := new(big.Float).SetFloat64(float64(f))
			d := func(v float32) *big.Float {
				r := new(big.Float).Sub(bf, new(big.Float).SetFloat64(float64(v)))
				return r.Abs(r)
			}
			if math.IsInf(float64(g), 0) {
				continue
			}
			dg := d(g)
			for _, nb := range []uint16{got + 1, got - 1} {
				v := c.widen(nb)
				if v != v || math.IsInf(float64(v), 0) || (nb&0x7fff) == 0x7fff {
					continue
				}
				if d(v).Cmp(dg) < 0 {
					t.Fatalf("%s(%g) = %v but neighbour %v is closer", c.name, f, g, v)
				}
			}
		}
	}
}

func TestFP8E4M3(t *testing.T) {
	for c := 0; c < 256; c++ {
		f := FP8E4M3ToF32(uint8(c))
		if f != f {
			if c&0x7f != 0x7f {
				t.Fatalf("code %#02x is NaN", c)
			}
			continue
		}
		if got := F32ToFP8E4M3(f); got != uint8(c) {
			t.Fatalf("code %#02x -> %v -> %#02x", c, f, got)
		}
	}
	if FP8E4M3ToF32(0x7e) != 448 {
		t.Fatalf("max = %v", FP8E4M3ToF32(0x7e))
	}
	for _, c := range []struct {
		in   float32
		want uint8
	}{{1000, 0x7e}, {-1e9, 0xfe}, {float32(math.Inf(1)), 0x7e}, {1.0 / 512, 0x01}, {1.0 / 1024, 0x00}, {1.5 / 512, 0x02}, {1, 0x38}} {
		if got := F32ToFP8E4M3(c.in); got != c.want {
			t.Errorf("F32ToFP8E4M3(%g) = %#02x, want %#02x", c.in, got, c.want)
		}
	}
}
