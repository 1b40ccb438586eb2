package cudakern

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/kvmesh/kvmesh/chunk"
)

// TestSIMDKernelsMatchGo: the assembly kernels give the bits of the Go
// kernels on arbitrary bit patterns (NaN, Inf, subnormals included) and on
// rotary halves that are not a multiple of 8.
func TestSIMDKernelsMatchGo(t *testing.T) {
	if !hasSIMD() {
		t.Skip("no SIMD kernels on this machine")
	}
	rng := rand.New(rand.NewPCG(21, 22))
	kinds := map[chunk.DType]kernelKind{chunk.BF16: kernelBF16NeoX, chunk.F16: kernelF16NeoX, chunk.F32: kernelF32NeoX}
	for dt, kind := range kinds {
		for _, shape := range []struct{ hd, rot int }{{16, 16}, {20, 20}, {64, 48}, {128, 128}, {96, 32}} {
			spec := testSpec(chunk.RopeNeoX, shape.hd, shape.rot, chunk.RopeScaling{Type: "yarn", Factor: 8, OriginalMaxPositions: 4096})
			tab, err := NewRopeTable(spec, 4096)
			if err != nil {
				t.Fatal(err)
			}
			mk := func(simd, avx512, nt bool) *plan {
				return &plan{Job: Job{Rope: tab, SrcDType: dt, Layout: CacheLayout{HeadDim: shape.hd, DType: dt}},
					srcES: dt.Size(), kernel: kind, simd: simd, avx512: avx512, nt: nt}
			}
			slow := mk(false, false, false)
			// The NT kernels need 32-byte aligned halves.
			ntOK := shape.rot%32 == 0
			others := []*plan{mk(true, false, false), mk(true, false, ntOK)}
			if hasAVX512() {
				others = append(others, mk(true, true, false), mk(true, true, ntOK))
			}
			es := dt.Size()
			src := make([]byte, shape.hd*es)
			a, b := aligned(len(src)), make([]byte, len(src))
			x := make([]float32, shape.hd)
			for n := 0; n < 200; n++ {
				for i := range src {
					src[i] = byte(rng.Uint32())
				}
				if n%2 == 0 { // mostly ordinary values in every other round
					for i := 0; i < shape.hd; i++ {
						copy(src[i*es:], encode(nil, dt, float32(rng.NormFloat64())))
					}
				}
				c, s := tab.Row(rng.IntN(tab.MaxPositions()))
				slow.rotKey(b, src, c, s, x)
				for _, fast := range others {
					fast.rotKey(a, src, c, s, x)
					sfence()
					checkSame(t, fast, dt, shape.hd, a, b, src)
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
			t.Fatalf("%v hd %d rotary %d (avx512 %v nt %v) dim %d: simd %x, go %x (src %x)", dt, hd, p.Rope.rotary,
				p.avx512, p.nt, i, a[i*es:(i+1)*es], b[i*es:(i+1)*es], src)
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
	for _, n := range []int{64, 128, 256, 4096} {
		dst := aligned(n + 64)
		for i := range dst {
			dst[i] = 0xee
		}
		copyNT(&dst[0], &src[0], n)
		sfence()
		if string(dst[:n]) != string(src[:n]) {
			t.Fatalf("copyNT %d bytes: wrong copy", n)
		}
		for _, g := range dst[n:] {
			if g != 0xee {
				t.Fatalf("copyNT %d bytes wrote past the end", n)
			}
		}
	}
}
