package cudakern

import (
	"math"
	"math/rand/v2"
	"testing"

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
			tab, err := NewRopeTable(spec, 1<<15)
			if err != nil {
				t.Fatal(err)
			}
			mk := func(simd bool) *plan {
				return &plan{Job: Job{Rope: tab, SrcDType: dt, Layout: CacheLayout{HeadDim: shape.hd, DType: dt}},
					srcES: dt.Size(), kernel: kind, simd: simd}
			}
			fast, slow := mk(true), mk(false)
			es := dt.Size()
			src := make([]byte, shape.hd*es)
			a, b := make([]byte, len(src)), make([]byte, len(src))
			x := make([]float32, shape.hd)
			for n := 0; n < 600; n++ {
				for i := range src {
					src[i] = byte(rng.Uint32())
				}
				if n%2 == 0 { // mostly ordinary values in every other round
					for i := 0; i < shape.hd; i++ {
						copy(src[i*es:], encode(nil, dt, float32(rng.NormFloat64())))
					}
				}
				c, s := tab.Row(rng.IntN(tab.MaxPositions()))
				fast.rotKey(a, src, c, s, x)
				slow.rotKey(b, src, c, s, x)
				for i := 0; i < shape.hd; i++ {
					va, vb := decode(a, dt, i), decode(b, dt, i)
					if math.IsNaN(va) && math.IsNaN(vb) {
						continue // NaN payloads may follow operand order
					}
					if string(a[i*es:(i+1)*es]) != string(b[i*es:(i+1)*es]) {
						t.Fatalf("%v hd %d rot %d dim %d: simd %x, go %x (src %x)", dt, shape.hd, shape.rot, i,
							a[i*es:(i+1)*es], b[i*es:(i+1)*es], src)
					}
				}
			}
		}
	}
}
