//go:build cuda

package gpu

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// These tests need a CUDA device (scripts/device/gpu-check.sh runs them);
// the same arithmetic is checked on the CPU by cudakern/kern's tests.

var dtypes = []chunk.DType{chunk.F32, chunk.F16, chunk.BF16, chunk.FP8E4M3}

func open(t testing.TB) *Injector {
	t.Helper()
	in, err := Open(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	t.Logf("device %s", in.Device())
	return in
}

func spec(style chunk.RopeStyle, rotary int, sc chunk.RopeScaling) chunk.ModelSpec {
	return chunk.ModelSpec{Family: "llama", Layers: 2, KVHeads: 4, HeadDim: 64, DType: chunk.BF16,
		RopeStyle: style, RopeTheta: 10000, RotaryDim: rotary, Scaling: sc}
}

var specs = []chunk.ModelSpec{
	spec(chunk.RopeNeoX, 0, chunk.RopeScaling{}),
	spec(chunk.RopeGPTJ, 32, chunk.RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 2048}),
	spec(chunk.RopeNeoX, 32, chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}),
	spec(chunk.RopeGPTJ, 0, chunk.RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: 1024}),
	spec(chunk.RopeNeoX, 0, chunk.RopeScaling{Type: "linear", Factor: 4}),
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func values(rng *rand.Rand, dt chunk.DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := 0; i < n; i++ {
		v := float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()))
		switch dt {
		case chunk.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case chunk.F16:
			binary.LittleEndian.PutUint16(b[2*i:], chunk.F32ToF16(v))
		case chunk.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], chunk.F32ToBF16(v))
		case chunk.FP8E4M3:
			b[i] = chunk.F32ToFP8E4M3(max(-400, min(400, 10*v)))
		}
	}
	return b
}

// isNaN reports whether element bits x of dt are a NaN (whose payload may
// differ between the CPU and the device).
func isNaN(x []byte, dt chunk.DType) bool {
	switch dt {
	case chunk.F32:
		return math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(x))))
	case chunk.F16:
		return binary.LittleEndian.Uint16(x)&0x7fff > 0x7c00
	case chunk.BF16:
		return binary.LittleEndian.Uint16(x)&0x7fff > 0x7f80
	}
	return x[0]&0x7f == 0x7f
}

func same(t *testing.T, want, got []byte, dt chunk.DType) {
	t.Helper()
	es := dt.Size()
	for i := 0; i < len(want); i += es {
		x, y := want[i:i+es], got[i:i+es]
		if string(x) != string(y) && !(isNaN(x, dt) && isNaN(y, dt)) {
			t.Fatalf("element %d: CPU % x, GPU % x", i/es, x, y)
		}
	}
}

func job(rng *rand.Rand, tab *cudakern.RopeTable, src chunk.DType, lay pagedkv.CacheLayout, tokens, heads, layers int, bits bool) *cudakern.Job {
	n := layers * 2 * tokens * heads * lay.HeadDim
	s := values(rng, src, n)
	if bits {
		s = randBytes(rng, n*src.Size())
	}
	slots := make([]int, tokens)
	perm := rng.Perm(lay.Slots())
	for i := range slots {
		slots[i] = perm[i%len(perm)]
		if i%5 == 4 {
			slots[i] = -1
		}
	}
	dst := make([][]byte, layers)
	for i := range dst {
		dst[i] = randBytes(rng, lay.LayerBytes())
	}
	return &cudakern.Job{Rope: tab, Src: s, SrcDType: src, SrcKScale: 0.25, SrcVScale: 3, Tokens: tokens,
		SrcHeads: heads, HeadLo: 1, HeadHi: 1 + lay.KVHeads, Pos: 2900, Slots: slots, Layout: lay, Dst: dst}
}

func clone(j *cudakern.Job) *cudakern.Job {
	c := *j
	c.Dst = make([][]byte, len(j.Dst))
	for i, d := range j.Dst {
		c.Dst[i] = append([]byte(nil), d...)
	}
	return &c
}

// TestGPUInjectMatchesCPU: every dtype pair and order, on values and on
// arbitrary bits, through the host-memory path (copy in, kernel, copy out).
func TestGPUInjectMatchesCPU(t *testing.T) {
	in := open(t)
	cpu := cudakern.NewInjector(cudakern.Config{Workers: 2})
	defer cpu.Close()
	rng := rand.New(rand.NewPCG(29, 10))
	var tabs cudakern.RopeTables
	n := 0
	for _, s := range dtypes {
		for _, d := range dtypes {
			for _, order := range pagedkv.Orders() {
				for _, bits := range []bool{false, true} {
					sp := specs[n%len(specs)]
					n++
					tab, err := tabs.Get(sp, 3000)
					if err != nil {
						t.Fatal(err)
					}
					lay := pagedkv.CacheLayout{Order: order, NumBlocks: 9, BlockSize: 16, KVHeads: 2, HeadDim: 64, DType: d, KScale: 0.5, VScale: 3}
					j := job(rng, tab, s, lay, 77, 4, 3, bits)
					g := clone(j)
					if err := cpu.Inject(context.Background(), j); err != nil {
						t.Fatal(err)
					}
					if err := in.Inject(context.Background(), g); err != nil {
						t.Fatal(err)
					}
					for l := range j.Dst {
						same(t, j.Dst[l], g.Dst[l], d)
					}
				}
			}
		}
	}
}

// devAlloc copies b into new device memory on the injector's thread.
func devAlloc(t testing.TB, in *Injector, b []byte) uint64 {
	t.Helper()
	var p cu.DevicePtr
	err := in.do(func() error {
		var err error
		if p, err = cu.MemAlloc(int64(max(len(b), 1))); err != nil {
			return err
		}
		if err := cu.MemcpyHtoD(p, unsafe.Pointer(unsafe.SliceData(b)), int64(len(b))); err != nil {
			return err
		}
		// The injector's stream does not wait for the legacy stream's DMA.
		return cu.Synchronize()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.do(func() error { return cu.MemFree(p) }) })
	return uint64(p)
}

func devRead(t testing.TB, in *Injector, p uint64, b []byte) {
	t.Helper()
	if err := in.do(func() error {
		return cu.MemcpyDtoH(unsafe.Pointer(unsafe.SliceData(b)), cu.DevicePtr(p), int64(len(b)))
	}); err != nil {
		t.Fatal(err)
	}
}

// TestGPUDecodeInjectMatchesCPU: codec payloads in device memory decoded,
// rotated and scattered in one pass into a device cache of each order equal
// chunk's decoder then the CPU Injector; LayerDone sees every layer in order.
func TestGPUDecodeInjectMatchesCPU(t *testing.T) {
	in := open(t)
	cpu := cudakern.NewInjector(cudakern.Config{Workers: 2})
	defer cpu.Close()
	rng := rand.New(rand.NewPCG(29, 11))
	sp := specs[1]
	tab, err := cudakern.NewRopeTable(sp, 3000)
	if err != nil {
		t.Fatal(err)
	}
	orders := pagedkv.Orders()
	n := 0
	for _, codec := range []chunk.Codec{chunk.CodecInt8, chunk.CodecInt4, chunk.CodecFP8} {
		for _, edt := range []chunk.DType{chunk.F32, chunk.F16, chunk.BF16} {
			order := orders[n%len(orders)]
			n++
			toks := make([]uint32, 100)
			for i := range toks {
				toks[i] = rng.Uint32() % 32000
			}
			fp := sp.Fingerprint()
			e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: chunk.StandaloneContext()},
				DType: edt, Layers: 2, KVHeads: 3, HeadDim: 64, Tokens: toks, KV: values(rng, edt, 2*2*100*3*64)}
			blob, err := chunk.Encode(nil, e, codec)
			if err != nil {
				t.Fatal(err)
			}
			hd, err := chunk.ParseHeader(blob, chunk.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			dec, err := chunk.Decode(blob, chunk.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			lay := pagedkv.CacheLayout{Order: order, NumBlocks: 8, BlockSize: 16, KVHeads: 2, HeadDim: 64, DType: chunk.BF16}
			j := job(rng, tab, edt, lay, 100, 3, 2, false)
			j.Src, j.SrcKScale, j.SrcVScale = dec.KV, 0, 0
			var tgt Target
			tgt.Codec = codec
			for l := 0; l < 2; l++ {
				p, err := hd.LayerPayload(blob, l)
				if err != nil {
					t.Fatal(err)
				}
				tgt.Src = append(tgt.Src, devAlloc(t, in, p))
				tgt.Dst = append(tgt.Dst, devAlloc(t, in, j.Dst[l]))
			}
			var done []int
			tgt.LayerDone = func(l int) { done = append(done, l) }
			dj := *j
			dj.Src = nil
			if err := in.InjectDevice(context.Background(), &dj, tgt); err != nil {
				t.Fatal(err)
			}
			if err := cpu.Inject(context.Background(), j); err != nil {
				t.Fatal(err)
			}
			if len(done) != 2 || done[0] != 0 || done[1] != 1 {
				t.Fatalf("LayerDone saw %v", done)
			}
			for l := range j.Dst {
				got := make([]byte, len(j.Dst[l]))
				devRead(t, in, tgt.Dst[l], got)
				same(t, j.Dst[l], got, lay.DType)
			}
		}
	}
}

// TestGPURefusals: targets that do not match the job write nothing.
func TestGPURefusals(t *testing.T) {
	in := open(t)
	rng := rand.New(rand.NewPCG(29, 12))
	tab, err := cudakern.NewRopeTable(specs[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 2, BlockSize: 16, KVHeads: 2, HeadDim: 64, DType: chunk.BF16}
	j := job(rng, tab, chunk.BF16, lay, 8, 2, 1, false)
	j.Pos, j.HeadLo, j.HeadHi = 0, 0, 0
	ok := devAlloc(t, in, j.Dst[0])
	for _, tgt := range []Target{
		{Src: []uint64{ok, ok}, Dst: []uint64{ok}},
		{Src: []uint64{0}, Dst: []uint64{ok}},
		{Src: []uint64{ok + 1}, Dst: []uint64{ok}},
		{Codec: chunk.CodecLossless, Src: []uint64{ok}, Dst: []uint64{ok}},
	} {
		if err := in.InjectDevice(context.Background(), j, tgt); !errors.Is(err, cudakern.ErrInvalidJob) {
			t.Errorf("target %+v: %v, want ErrInvalidJob", tgt, err)
		}
	}
}

// benchJob is 8 layers of a Llama-3-8B-like cache: 8 KV heads of 128
// dims, bf16, 4096 tokens injected into slots 0..4095; its bytes are the
// raw K and V the job writes.
const benchTokens, benchLayers = 4096, 8

var benchSpec = chunk.ModelSpec{Family: "llama", Layers: benchLayers, KVHeads: 8, HeadDim: 128, DType: chunk.BF16,
	RopeStyle: chunk.RopeNeoX, RopeTheta: 500000}

// benchHost holds the host side of each codec's benchJob, made once: the
// testing package calls a benchmark's body for every b.N it tries, and
// making 128 MiB of values and encoding them takes seconds of CPU, which
// the device run's time limit cannot spare.
var benchHost struct {
	sync.Mutex
	raw  []byte
	srcs map[chunk.Codec][][]byte
}

// benchSources returns each layer's source bytes of codec (raw layers, or
// the codec's layer payloads) and the raw bytes they encode.
func benchSources(b *testing.B, codec chunk.Codec) ([][]byte, []byte) {
	h := &benchHost
	h.Lock()
	defer h.Unlock()
	if h.raw == nil {
		h.raw = values(rand.New(rand.NewPCG(1, 2)), chunk.BF16, benchLayers*2*benchTokens*8*128)
		h.srcs = map[chunk.Codec][][]byte{}
	}
	if s, ok := h.srcs[codec]; ok {
		return s, h.raw
	}
	raw := h.raw
	lb := len(raw) / benchLayers
	srcs := make([][]byte, benchLayers)
	for l := range srcs {
		srcs[l] = raw[l*lb : (l+1)*lb]
	}
	if codec != chunk.CodecRaw {
		toks := make([]uint32, benchTokens)
		fp := benchSpec.Fingerprint()
		e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: chunk.StandaloneContext()},
			DType: chunk.BF16, Layers: benchLayers, KVHeads: 8, HeadDim: 128, Tokens: toks, KV: raw}
		blob, err := chunk.Encode(nil, e, codec)
		if err != nil {
			b.Fatal(err)
		}
		hd, err := chunk.ParseHeader(blob, chunk.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		for l := range srcs {
			if srcs[l], err = hd.LayerPayload(blob, l); err != nil {
				b.Fatal(err)
			}
		}
	}
	h.srcs[codec] = srcs
	return srcs, raw
}

func benchJob(b *testing.B, in *Injector, codec chunk.Codec) (*cudakern.Job, Target, int64) {
	const tokens, layers = benchTokens, benchLayers
	tab, err := cudakern.NewRopeTable(benchSpec, tokens)
	if err != nil {
		b.Fatal(err)
	}
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: tokens / 16, BlockSize: 16, KVHeads: 8, HeadDim: 128, DType: chunk.BF16}
	slots := make([]int, tokens)
	for i := range slots {
		slots[i] = i
	}
	srcs, raw := benchSources(b, codec)
	j := &cudakern.Job{Rope: tab, SrcDType: chunk.BF16, Tokens: tokens, SrcHeads: 8, Slots: slots, Layout: lay,
		Dst: make([][]byte, layers)}
	t := Target{Codec: codec}
	for l := range j.Dst {
		j.Dst[l] = make([]byte, lay.LayerBytes())
		t.Src = append(t.Src, devAlloc(b, in, srcs[l]))
		t.Dst = append(t.Dst, devAlloc(b, in, j.Dst[l]))
	}
	return j, t, int64(len(raw))
}

// BenchmarkGPUInject: rotate + scatter (raw) and fused dequant + rotate +
// scatter (int8, int4, fp8) of 8 bf16 layers, device to device.
func BenchmarkGPUInject(b *testing.B) {
	in := open(b)
	for _, codec := range []chunk.Codec{chunk.CodecRaw, chunk.CodecInt8, chunk.CodecInt4, chunk.CodecFP8} {
		b.Run(codec.String(), func(b *testing.B) {
			j, tgt, n := benchJob(b, in, codec)
			b.SetBytes(n)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := in.InjectDevice(context.Background(), j, tgt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGPUCopy: a device-to-device copy of the same bytes, the
// reference BenchmarkGPUInject is read against.
func BenchmarkGPUCopy(b *testing.B) {
	in := open(b)
	const n = 8 * 2 * 4096 * 8 * 128 * 2
	src, dst := devAlloc(b, in, make([]byte, n)), devAlloc(b, in, make([]byte, n))
	b.SetBytes(n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		err := in.do(func() error {
			if err := cu.MemcpyDtoDAsync(cu.DevicePtr(dst), cu.DevicePtr(src), n, in.stream); err != nil {
				return err
			}
			return in.stream.Synchronize()
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
