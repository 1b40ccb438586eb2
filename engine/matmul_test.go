package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvmesh/kvmesh/internal/cputime"
)

func naiveMatmul(x, w, bias []float32, n, in, out int) []float32 {
	y := make([]float32, n*out)
	for i := 0; i < n; i++ {
		for o := 0; o < out; o++ {
			var s float64
			for k := 0; k < in; k++ {
				s += float64(x[i*in+k]) * float64(w[o*in+k])
			}
			if bias != nil {
				s += float64(bias[o])
			}
			y[i*out+o] = float32(s)
		}
	}
	return y
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func TestMatmul(t *testing.T) {
	for _, avx := range []bool{false, true} {
		if avx && !hasAVXKernels() {
			t.Log("no AVX2+FMA here: assembly kernels not tested")
			continue
		}
		t.Run(fmt.Sprintf("avx=%v", avx), func(t *testing.T) { testMatmul(t, avx) })
	}
}

func testMatmul(t *testing.T, avx bool) {
	p := newPool(3, avx)
	defer p.close()
	r := rand.New(rand.NewPCG(1, 2))
	var mt matmulTask
	for _, tc := range []struct{ n, in, out int }{
		{1, 1, 1}, {1, 7, 5}, {1, 8, 5}, {2, 64, 64}, {3, 65, 67}, {3, 64, 67}, {17, 128, 33}, {70, 96, 130}, {129, 64, 202},
	} {
		for _, withBias := range []bool{false, true} {
			t.Run(fmt.Sprintf("%dx%dx%d/bias=%v", tc.n, tc.in, tc.out, withBias), func(t *testing.T) {
				x, w := randSlice(r, tc.n*tc.in), randSlice(r, tc.out*tc.in)
				var bias []float32
				if withBias {
					bias = randSlice(r, tc.out)
				}
				y := make([]float32, tc.n*tc.out)
				p.matmul(&mt, y, x, w, bias, tc.n, tc.in, tc.out)
				want := naiveMatmul(x, w, bias, tc.n, tc.in, tc.out)
				for i := range y {
					if d := math.Abs(float64(y[i] - want[i])); d > 1e-4*math.Sqrt(float64(tc.in))+1e-5 {
						t.Fatalf("y[%d] = %v, want %v", i, y[i], want[i])
					}
				}
				// Row results do not depend on the batch they were computed in.
				for i := 0; i < tc.n; i++ {
					y1 := make([]float32, tc.out)
					p.matmul(&mt, y1, x[i*tc.in:], w, bias, 1, tc.in, tc.out)
					for o := range y1 {
						if y1[o] != y[i*tc.out+o] {
							t.Fatalf("row %d col %d: alone %v, in batch %v", i, o, y1[o], y[i*tc.out+o])
						}
					}
				}
			})
		}
	}
}

func BenchmarkMatmul(b *testing.B) {
	for _, avx := range []bool{false, true} {
		b.Run(fmt.Sprintf("avx=%v", avx && hasAVXKernels()), func(b *testing.B) { benchMatmul(b, avx) })
	}
}

func benchMatmul(b *testing.B, avx bool) {
	p := newPool(runtime.GOMAXPROCS(0), avx)
	defer p.close()
	for _, tc := range []struct{ n, in, out int }{
		{1, 512, 1536}, {16, 512, 1536}, {256, 512, 1536}, {1024, 512, 512},
	} {
		b.Run(fmt.Sprintf("n=%d/%dx%d", tc.n, tc.in, tc.out), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x, w := randSlice(r, tc.n*tc.in), randSlice(r, tc.out*tc.in)
			y := make([]float32, tc.n*tc.out)
			var mt matmulTask
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cputime.Process()
			for b.Loop() {
				p.matmul(&mt, y, x, w, nil, tc.n, tc.in, tc.out)
			}
			cpu := cputime.Process() - cpu0
			flops := 2 * float64(tc.n*tc.in*tc.out) * float64(b.N)
			b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			// Per CPU-second (all threads): robust on a shared machine.
			b.ReportMetric(flops/cpu.Seconds()/1e9, "GFLOP/CPU-s")
		})
	}
}

func TestVectorKernels(t *testing.T) {
	if !hasAVXKernels() {
		t.Skip("no AVX2+FMA here")
	}
	r := rand.New(rand.NewPCG(9, 9))
	for _, n := range []int{0, 8, 16, 24, 64, 136} {
		a, b := randSlice(r, n+1), randSlice(r, n+1)
		var want float64
		for i := 0; i < n; i++ {
			want += float64(a[i]) * float64(b[i])
		}
		var got float32
		if n > 0 {
			got = dotAVX(&a[0], &b[0], n)
		}
		if math.Abs(float64(got)-want) > 1e-5*float64(n+1) {
			t.Fatalf("dot n=%d: %v, want %v", n, got, want)
		}
		if n == 0 {
			continue
		}
		y := append([]float32(nil), b...)
		axpyAVX(0.5, &a[0], &y[0], n)
		for i := 0; i < n; i++ {
			if w := b[i] + 0.5*a[i]; math.Abs(float64(y[i]-w)) > 1e-6 {
				t.Fatalf("axpy n=%d [%d]: %v, want %v", n, i, y[i], w)
			}
		}
		if y[n] != b[n] {
			t.Fatalf("axpy n=%d wrote past n", n)
		}
	}
}

func TestExpNeg(t *testing.T) {
	for x := float32(0); x > -100; x -= 0.0137 {
		got, want := float64(expNeg(x)), math.Exp(float64(x))
		if want < 1e-37 {
			if got > 1e-37 {
				t.Fatalf("expNeg(%v) = %v, want ~0", x, got)
			}
			continue
		}
		if rel := math.Abs(got-want) / want; rel > 4e-7 {
			t.Fatalf("expNeg(%v) = %v, want %v (rel %.2g)", x, got, want, rel)
		}
	}
	if expNeg(0) != 1 {
		t.Fatalf("expNeg(0) = %v", expNeg(0))
	}
}

func TestAttentionKernels(t *testing.T) {
	if !hasAVXKernels() {
		t.Skip("no AVX2+FMA here")
	}
	r := rand.New(rand.NewPCG(10, 10))
	for _, hd := range []int{8, 16, 32, 40, 64, 96, 128} {
		for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 33} {
			kv := randSlice(r, 50*hd)
			offs := make([]int32, n)
			for j := range offs {
				offs[j] = int32(r.IntN(50) * hd)
			}
			q := randSlice(r, hd)
			out := make([]float32, n)
			qkAVX(&q[0], &kv[0], &offs[0], n, hd, &out[0])
			for j := 0; j < n; j++ {
				var want float64
				for d := 0; d < hd; d++ {
					want += float64(q[d]) * float64(kv[int(offs[j])+d])
				}
				if math.Abs(float64(out[j])-want) > 1e-5*float64(hd) {
					t.Fatalf("qk hd=%d n=%d j=%d: %v, want %v", hd, n, j, out[j], want)
				}
				// A key alone gets the same bits as in a group of four.
				var one float32
				qkAVX(&q[0], &kv[0], &offs[j], 1, hd, &one)
				if one != out[j] {
					t.Fatalf("qk hd=%d: key %d alone %v, in a group %v", hd, j, one, out[j])
				}
			}
			// Two heads sharing the keys get qkAVX's bits each.
			q1 := randSlice(r, hd)
			out0, out1 := make([]float32, n+1), make([]float32, n+1)
			out0[n], out1[n] = 42, 42
			qk2AVX(&q[0], &q1[0], &kv[0], &offs[0], n, hd, &out0[0], &out1[0])
			want1 := make([]float32, n)
			qkAVX(&q1[0], &kv[0], &offs[0], n, hd, &want1[0])
			for j := 0; j < n; j++ {
				if out0[j] != out[j] || out1[j] != want1[j] {
					t.Fatalf("qk2 hd=%d n=%d j=%d: %v %v, one head at a time %v %v", hd, n, j, out0[j], out1[j], out[j], want1[j])
				}
			}
			if out0[n] != 42 || out1[n] != 42 {
				t.Fatalf("qk2 hd=%d n=%d wrote past n", hd, n)
			}
			p := randSlice(r, n)
			acc := randSlice(r, hd+1)
			ref := make([]float32, hd+1)
			ref[hd] = acc[hd]
			const scale = 0.37
			pvAVX(&p[0], &kv[0], &offs[0], n, hd, scale, &acc[0])
			for j := 0; j < n; j++ {
				axpyAVX(p[j], &kv[offs[j]], &ref[0], hd)
			}
			for d := range ref[:hd] {
				ref[d] *= scale
			}
			for d := range acc {
				if acc[d] != ref[d] {
					t.Fatalf("pv hd=%d n=%d [%d]: %v, sequential axpy %v", hd, n, d, acc[d], ref[d])
				}
			}
			// Two heads sharing the values get pvAVX's bits each.
			p1 := randSlice(r, n)
			acc1 := make([]float32, hd)
			pvAVX(&p1[0], &kv[0], &offs[0], n, hd, 1.5, &acc1[0])
			two := randSlice(r, 2*hd+1)
			guard := two[2*hd]
			pv2AVX(&p[0], &p1[0], &kv[0], &offs[0], n, hd, scale, 1.5, &two[0], &two[hd])
			for d := 0; d < hd; d++ {
				if two[d] != acc[d] || two[hd+d] != acc1[d] {
					t.Fatalf("pv2 hd=%d n=%d [%d]: %v %v, one head at a time %v %v", hd, n, d, two[d], two[hd+d], acc[d], acc1[d])
				}
			}
			if two[2*hd] != guard {
				t.Fatalf("pv2 hd=%d n=%d wrote past 2*hd", hd, n)
			}
		}
	}
}

// TestSoftmaxKernel checks softmaxAVX against softmaxRow and against
// float64 over lengths around every multiple of eight, and at the edges of
// the exponent's range.
func TestSoftmaxKernel(t *testing.T) {
	if !hasAVXKernels() {
		t.Skip("no AVX2+FMA here")
	}
	r := rand.New(rand.NewPCG(11, 11))
	check := func(t *testing.T, in []float32, scale float32) {
		t.Helper()
		n := len(in)
		ref := append([]float32(nil), in...)
		refSum := softmaxRow(ref, scale)
		got := append(append([]float32(nil), in...), 42) // a guard past n
		sum := softmaxAVX(&got[0], n, scale)
		if got[n] != 42 {
			t.Fatalf("n=%d: wrote past n", n)
		}
		mx := float32(math.Inf(-1))
		for _, v := range in {
			mx = max(mx, v*scale)
		}
		var want float64
		for j, v := range in {
			// x rounded to float32 as both compute it; the exponential
			// of that x is what they approximate.
			x := v*scale - mx
			e := math.Exp(float64(x))
			want += e
			if e < 1e-37 {
				if got[j] > 1e-37 || ref[j] > 1e-37 {
					t.Fatalf("n=%d [%d]: e^%v = %v (Go %v), want ~0", n, j, x, got[j], ref[j])
				}
				continue
			}
			if rel := math.Abs(float64(got[j])-e) / e; rel > 4e-7 {
				t.Fatalf("n=%d [%d]: e^%v = %v, want %v (rel %.2g)", n, j, x, got[j], e, rel)
			}
			if rel := math.Abs(float64(got[j]-ref[j])) / e; rel > 6e-7 {
				t.Fatalf("n=%d [%d]: kernel %v, Go %v", n, j, got[j], ref[j])
			}
			if x == 0 && got[j] != 1 {
				t.Fatalf("n=%d [%d]: the max gives %v, want 1", n, j, got[j])
			}
		}
		// Float32 sums of n terms <= 1, in lanes or in a row.
		tol := 1e-7 * float64(n) * want
		if d := math.Abs(float64(sum) - want); d > tol {
			t.Fatalf("n=%d: sum %v, want %v", n, sum, want)
		}
		if d := math.Abs(float64(refSum) - want); d > tol {
			t.Fatalf("n=%d: Go sum %v, want %v", n, refSum, want)
		}
	}
	lengths := []int{300, 511, 723, 1024}
	for n := 1; n <= 70; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		for _, spread := range []float64{0.1, 3, 30, 1000} {
			s := randSlice(r, n)
			for j := range s {
				s[j] *= float32(spread)
			}
			check(t, s, 0.125)
		}
	}
	// The exponent's range: x from 0 down past -87 (zero there), with the
	// max at 0 and scale 1, in blocks that end at every lane.
	var xs []float32
	for x := float32(0); x > -100; x -= 0.0137 {
		xs = append(xs, x)
	}
	xs = append(xs, -87, -86.99999, -87.00001, -88, -1e30, float32(math.Inf(-1)), -math.SmallestNonzeroFloat32, 0)
	for lo := 0; lo < len(xs); lo += 61 {
		check(t, append([]float32{0}, xs[lo:min(lo+61, len(xs))]...), 1)
	}
	check(t, []float32{5, 5, 5, 5, 5, 5, 5, 5, 5}, 0.5)
	check(t, []float32{-3}, 0.125)
}

// TestSiluKernel checks siluMulAVX against siluMul over the range where
// e^-x is finite and past it on both sides.
func TestSiluKernel(t *testing.T) {
	if !hasAVXKernels() {
		t.Skip("no AVX2+FMA here")
	}
	r := rand.New(rand.NewPCG(12, 12))
	var g []float32
	for x := float32(-100); x < 100; x += 0.0123 {
		g = append(g, x)
	}
	g = append(g, 0, -0, 1e-30, -1e-30, 87, 88, 89, -87, -88, -88.0001, -88.7, -89, 1e30, -1e30,
		math.MaxFloat32, -math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()))
	for len(g)%8 != 0 {
		g = append(g, float32(r.NormFloat64()))
	}
	u := randSlice(r, len(g)+1)
	got := append(append([]float32(nil), g...), 42)
	siluMulAVX(&got[0], &u[0], len(g))
	if got[len(g)] != 42 {
		t.Fatal("wrote past n")
	}
	ref := append([]float32(nil), g...)
	siluMul(ref, u[:len(g)])
	for i, x := range g {
		want := float64(x) / (1 + math.Exp(-float64(x))) * float64(u[i])
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), -1) {
			if !math.IsNaN(float64(ref[i])) || math.IsNaN(float64(x)) != math.IsNaN(float64(got[i])) {
				t.Fatalf("silu(%v)*%v = %v, Go %v", x, u[i], got[i], ref[i])
			}
			continue
		}
		if d := math.Abs(float64(got[i]) - want); d > 6e-7*math.Abs(want)+1e-35 {
			t.Fatalf("silu(%v)*%v = %v, want %v (Go %v)", x, u[i], got[i], want, ref[i])
		}
		if d := math.Abs(float64(ref[i]) - want); d > 6e-7*math.Abs(want)+1e-35 {
			t.Fatalf("Go silu(%v)*%v = %v, want %v", x, u[i], ref[i], want)
		}
	}
}

// TestRMSNormKernel checks rmsNormAVX against rmsNorm, in place and not.
func TestRMSNormKernel(t *testing.T) {
	if !hasAVXKernels() {
		t.Skip("no AVX2+FMA here")
	}
	r := rand.New(rand.NewPCG(13, 13))
	for _, dim := range []int{8, 16, 64, 128, 136, 512} {
		for _, rows := range []int{1, 2, 5} {
			for _, spread := range []float32{1e-20, 1e-3, 1, 1e15} {
				h, w := randSlice(r, rows*dim), randSlice(r, dim)
				for i := range h {
					h[i] *= spread
				}
				want := make([]float32, rows*dim)
				rmsNorm(want, h, w, rows, dim, 1e-5)
				got := make([]float32, rows*dim+1)
				got[rows*dim] = 42
				rmsNormAVX(&got[0], &h[0], &w[0], rows, dim, 1e-5)
				inPlace := append([]float32(nil), h...)
				rmsNormAVX(&inPlace[0], &inPlace[0], &w[0], rows, dim, 1e-5)
				if got[rows*dim] != 42 {
					t.Fatalf("dim=%d rows=%d: wrote past the rows", dim, rows)
				}
				for i, v := range want {
					// The float64 sums differ in order only: the float32
					// scale is almost always the same, and one rounding off
					// at worst.
					if d := math.Abs(float64(got[i] - v)); d > 3e-7*math.Abs(float64(v)) || inPlace[i] != got[i] {
						t.Fatalf("dim=%d rows=%d spread=%g [%d]: %v (in place %v), Go %v", dim, rows, spread, i, got[i], inPlace[i], v)
					}
				}
			}
		}
	}
}
