package cudakern

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestSIMDKernelsMatchGo: the assembly kernels give the bits of the Go
// kernels on arbitrary bit patterns (NaN, Inf, subnormals included), on
// rotary halves that are not a multiple of 8, and over several heads with
// strides (one call per token), touching nothing between the heads.
func TestSIMDKernelsMatchGo(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no SIMD kernels on this machine")
	}
	rng := rand.New(rand.NewPCG(21, 22))
	kinds := []struct {
		dt    chunk.DType
		kind  kernelKind
		style chunk.RopeStyle
	}{
		{chunk.BF16, kernelBF16NeoX, chunk.RopeNeoX}, {chunk.F16, kernelF16NeoX, chunk.RopeNeoX},
		{chunk.F32, kernelF32NeoX, chunk.RopeNeoX}, {chunk.BF16, kernelBF16GPTJ, chunk.RopeGPTJ},
	}
	for _, k := range kinds {
		dt, kind := k.dt, k.kind
		for _, shape := range []struct{ hd, rot int }{{16, 16}, {20, 20}, {64, 48}, {128, 128}, {96, 32}, {80, 80}} {
			spec := testSpec(k.style, shape.hd, shape.rot, chunk.RopeScaling{Type: "yarn", Factor: 8, OriginalMaxPositions: 4096})
			tab, err := NewRopeTable(spec, 4096)
			if err != nil {
				t.Fatal(err)
			}
			es := dt.Size()
			row := shape.hd * es
			mk := func(simd, avx512, nt bool) *plan {
				p := &plan{Job: Job{Rope: tab, SrcDType: dt, Layout: pagedkv.CacheLayout{HeadDim: shape.hd, DType: dt}},
					srcES: es, dstES: es, srcRow: row, kernel: kind, simd: simd, avx512: avx512, nt: nt}
				p.pick()
				return p
			}
			mkBF16 := func(nt bool) *plan {
				p := mk(true, true, nt)
				p.bf16 = true
				p.pick()
				return p
			}
			slow := mk(false, false, false)
			// The NT kernels need 32-byte aligned halves.
			ntOK := shape.rot%32 == 0
			others := []*plan{mk(true, false, false), mk(true, false, ntOK)}
			if hasAVX512() {
				others = append(others, mk(true, true, false), mk(true, true, ntOK))
			}
			if hasAVX512BF16() {
				others = append(others, mkBF16(false), mkBF16(ntOK))
			}
			// 3 heads; the destination heads are 64 bytes apart beyond a row
			// (HND-like), with guard bytes between them.
			const heads = 3
			stride := row + 64
			src := make([]byte, heads*row)
			a, b := aligned(heads*stride), make([]byte, heads*stride)
			x := make([]float32, shape.hd)
			for n := 0; n < 200; n++ {
				for i := range src {
					src[i] = byte(rng.Uint32())
				}
				switch n % 4 {
				case 0, 2: // mostly ordinary values in every other round
					for i := 0; i < heads*shape.hd; i++ {
						copy(src[i*es:], encode(nil, dt, float32(rng.NormFloat64())))
					}
				case 1: // tiny values: subnormal results (the bf16 kernel's fix-up)
					for i := 0; i < heads*shape.hd; i++ {
						copy(src[i*es:], encode(nil, dt, float32(rng.NormFloat64()*0x1p-126)))
					}
				}
				c, s := tab.Row(rng.IntN(tab.MaxPositions()))
				for i := range b {
					b[i] = 0xa5
				}
				slow.rotHeads(b, src, c, s, x, heads, stride)
				for _, fast := range others {
					for i := range a {
						a[i] = 0xa5
					}
					fast.rotHeads(a, src, c, s, x, heads, stride)
					sfence()
					for k := 0; k < heads; k++ {
						checkSame(t, fast, dt, shape.hd, a[k*stride:], b[k*stride:], src[k*row:(k+1)*row])
						if k < heads-1 && string(a[k*stride+row:(k+1)*stride]) != string(b[k*stride+row:(k+1)*stride]) {
							t.Fatalf("%v hd %d: bytes between heads %d and %d written", dt, shape.hd, k, k+1)
						}
					}
				}
			}
		}
	}
}

func checkSame(t *testing.T, p *plan, dt chunk.DType, hd int, a, b, src []byte) {
	t.Helper()
	es := dt.Size()
	for i := 0; i < hd; i++ {
		va, vb := decode(a, dt, i), decode(b, dt, i)
		if math.IsNaN(va) && math.IsNaN(vb) {
			continue // NaN payloads may follow operand order
		}
		if string(a[i*es:(i+1)*es]) != string(b[i*es:(i+1)*es]) {
			t.Fatalf("%v hd %d rotary %d (avx512 %v bf16 %v nt %v) dim %d: simd %x, go %x (src %x)", dt, hd, p.Rope.rotary,
				p.avx512, p.bf16, p.nt, i, a[i*es:(i+1)*es], b[i*es:(i+1)*es], src)
		}
	}
}

// aligned returns n zero bytes starting on a 64-byte boundary.
func aligned(n int) []byte {
	b := make([]byte, n+64)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 63)
	return b[off : off+n : off+n]
}

func TestCopyNT(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no SIMD kernels on this machine")
	}
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i * 7)
	}
	for _, c := range []struct{ n, count, dstStride, srcStride int }{
		{64, 1, 0, 0}, {128, 1, 0, 0}, {256, 1, 0, 0}, {4096, 1, 0, 0},
		{64, 3, 128, 64}, {256, 4, 512, 96}, {128, 2, 128, 200},
	} {
		size := (c.count-1)*c.dstStride + c.n
		dst := aligned(size + 64)
		for i := range dst {
			dst[i] = 0xee
		}
		copyNT(&dst[0], &src[0], c.n, c.count, c.dstStride, c.srcStride)
		sfence()
		want := make([]byte, len(dst))
		for i := range want {
			want[i] = 0xee
		}
		for k := 0; k < c.count; k++ {
			copy(want[k*c.dstStride:k*c.dstStride+c.n], src[k*c.srcStride:])
		}
		if string(dst) != string(want) {
			t.Fatalf("copyNT %+v: wrong bytes", c)
		}
	}
}

// TestRotateNMatchesGo: the float32 rotation kernels of the conversion path
// (NeoX AVX2 and AVX-512, GPT-J AVX2) give the bits of the Go loops over
// several heads, for arbitrary bit patterns and rotary halves that are not
// multiples of the vector width.
func TestRotateNMatchesGo(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no SIMD kernels on this machine")
	}
	rng := rand.New(rand.NewPCG(29, 30))
	sets := []isa{{avx2: true}}
	if hasAVX512() {
		sets = append(sets, isa{avx2: true, avx512: true})
	}
	for _, style := range []chunk.RopeStyle{chunk.RopeNeoX, chunk.RopeGPTJ} {
		for _, shape := range []struct{ hd, rot int }{{8, 8}, {20, 20}, {64, 48}, {128, 128}, {96, 32}, {80, 80}} {
			spec := testSpec(style, shape.hd, shape.rot, chunk.RopeScaling{})
			tab, err := NewRopeTable(spec, 1024)
			if err != nil {
				t.Fatal(err)
			}
			const heads = 3
			src := make([]float32, heads*shape.hd)
			want, got := make([]float32, len(src)), make([]float32, len(src))
			for n := 0; n < 100; n++ {
				for i := range src {
					if n%2 == 0 {
						src[i] = math.Float32frombits(rng.Uint32())
					} else {
						src[i] = float32(rng.NormFloat64())
					}
				}
				c, s := tab.Row(rng.IntN(tab.MaxPositions()))
				copy(want, src)
				tab.rotateN(want, c, s, heads, isa{})
				for _, k := range sets {
					copy(got, src)
					tab.rotateN(got, c, s, heads, k)
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] != got[i] && want[i] != want[i]) {
							t.Fatalf("%v hd %d rotary %d %+v: element %d: simd %#08x, go %#08x", style, shape.hd, shape.rot, k, i,
								math.Float32bits(got[i]), math.Float32bits(want[i]))
						}
					}
				}
			}
		}
	}
}
