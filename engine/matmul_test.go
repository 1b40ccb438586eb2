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
	for _, hd := range []int{8, 16, 64, 96, 128} {
		for _, n := range []int{1, 3, 4, 7, 33} {
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
			p := randSlice(r, n)
			acc := randSlice(r, hd+1)
			ref := append([]float32(nil), acc...)
			pvAVX(&p[0], &kv[0], &offs[0], n, hd, &acc[0])
			for j := 0; j < n; j++ {
				axpyAVX(p[j], &kv[offs[j]], &ref[0], hd)
			}
			for d := range acc {
				if acc[d] != ref[d] {
					t.Fatalf("pv hd=%d n=%d [%d]: %v, sequential axpy %v", hd, n, d, acc[d], ref[d])
				}
			}
		}
	}
}
