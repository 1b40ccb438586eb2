//go:build cgo

package kern

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

var dtypes = []chunk.DType{chunk.F32, chunk.F16, chunk.BF16, chunk.FP8E4M3}

func spec(style chunk.RopeStyle, headDim, rotary int, sc chunk.RopeScaling) chunk.ModelSpec {
	return chunk.ModelSpec{
		Family: "llama", Layers: 2, KVHeads: 4, HeadDim: headDim, DType: chunk.BF16,
		RopeStyle: style, RopeTheta: 10000, RotaryDim: rotary, Scaling: sc,
	}
}

type variant struct {
	name string
	spec chunk.ModelSpec
}

// variants are cudakern's test variants: every scaling type and pairing,
// full and partial rotary.
func variants() []variant {
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
	var out []variant
	for _, style := range []chunk.RopeStyle{chunk.RopeNeoX, chunk.RopeGPTJ} {
		for _, rot := range []int{0, 32} {
			for _, s := range scalings {
				name := style.String() + "/" + s.name
				if rot != 0 {
					name += "/partial"
				}
				out = append(out, variant{name, spec(style, 64, rot, s.sc)})
			}
		}
	}
	return out
}

// sameElems compares two layers of dtype dt element by element, any NaN
// matching any NaN (a NaN's payload follows operand order, which differs
// between the Go, assembly and CUDA kernels). It returns the first
// differing element index, or -1.
func sameElems(a, b []byte, dt chunk.DType) int {
	es := dt.Size()
	for i := 0; i < len(a)/es; i++ {
		x, y := a[i*es:(i+1)*es], b[i*es:(i+1)*es]
		if string(x) == string(y) {
			continue
		}
		var nx, ny bool
		switch dt {
		case chunk.F32:
			nx = math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(x))))
			ny = math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(y))))
		case chunk.F16:
			u, v := binary.LittleEndian.Uint16(x), binary.LittleEndian.Uint16(y)
			nx, ny = u&0x7fff > 0x7c00, v&0x7fff > 0x7c00
		case chunk.BF16:
			u, v := binary.LittleEndian.Uint16(x), binary.LittleEndian.Uint16(y)
			nx, ny = u&0x7fff > 0x7f80, v&0x7fff > 0x7f80
		case chunk.FP8E4M3:
			nx, ny = x[0]&0x7f == 0x7f, y[0]&0x7f == 0x7f
		}
		if !nx || !ny {
			return i
		}
	}
	return -1
}

// randBits is n elements of arbitrary bits: NaN, Inf and subnormals
// included.
func randBits(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// randValues is n elements of dt with log-normal magnitudes (fp8 in range).
func randValues(rng *rand.Rand, dt chunk.DType, n int) []byte {
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

type jobCase struct {
	srcDT    chunk.DType
	layout   pagedkv.CacheLayout
	tokens   int
	srcHeads int
	lo, hi   int
	pos      int
	layers   int
	skip     int  // every skip-th token has slot -1
	bits     bool // arbitrary source bits instead of values
}

// build makes a job with random distinct slots (a few -1; slots fill
// blocks partly) and destination layers of random guard bytes; it returns
// the job and a copy of the destination for the host run.
func build(rng *rand.Rand, c jobCase, tab *cudakern.RopeTable, src []byte) (*cudakern.Job, [][]byte) {
	perm := rng.Perm(c.layout.Slots())
	slots := make([]int, c.tokens)
	for i := range slots {
		slots[i] = perm[i%len(perm)]
		if c.skip > 0 && i%c.skip == c.skip-1 {
			slots[i] = -1
		}
	}
	dst := make([][]byte, c.layers)
	host := make([][]byte, c.layers)
	for i := range dst {
		dst[i] = randBits(rng, c.layout.LayerBytes())
		host[i] = append([]byte(nil), dst[i]...)
	}
	var srcScale float32
	if c.srcDT == chunk.FP8E4M3 {
		srcScale = 0.25
	}
	return &cudakern.Job{
		Rope: tab, Src: src, SrcDType: c.srcDT, SrcKScale: srcScale, SrcVScale: 3,
		Tokens: c.tokens, SrcHeads: c.srcHeads, HeadLo: c.lo, HeadHi: c.hi, Pos: c.pos,
		Slots: slots, Layout: c.layout, Dst: dst,
	}, host
}

// compare runs j on the CPU Injector (the reference) and through inject.h
// with codec payloads layers (nil: j.Src's raw layers), and fails on any
// element that differs.
func compare(t *testing.T, in *cudakern.Injector, j *cudakern.Job, host [][]byte, codec chunk.Codec, payloads [][]byte) {
	t.Helper()
	dj, err := cudakern.DeviceJobOf(j, codec)
	if err != nil {
		t.Fatal(err)
	}
	if payloads == nil {
		lb := len(j.Src) / len(j.Dst)
		for l := range j.Dst {
			payloads = append(payloads, j.Src[l*lb:(l+1)*lb])
		}
	}
	if err := in.Inject(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	cs := j.CosSin(nil)
	for _, lanes := range []int{1, 7} {
		out := make([][]byte, len(host))
		for i := range host {
			out[i] = append([]byte(nil), host[i]...)
		}
		if bits := Run(dj, payloads, out, j.Slots, cs, lanes); bits != 0 {
			t.Fatalf("error bits %#x", bits)
		}
		for l := range out {
			if i := sameElems(j.Dst[l], out[l], j.Layout.DType); i >= 0 {
				es := j.Layout.DType.Size()
				t.Fatalf("lanes %d layer %d element %d (of %d): CPU % x, host build of the kernel % x",
					lanes, l, i, len(out[l])/es, j.Dst[l][i*es:(i+1)*es], out[l][i*es:(i+1)*es])
			}
		}
	}
}

func TestHostLayout(t *testing.T) {
	if err := LayoutError(); err != nil {
		t.Fatal(err)
	}
}

// TestHostInjectMatchesCPU: every source and cache dtype, every order,
// every rope variant, on values and on arbitrary bits.
func TestHostInjectMatchesCPU(t *testing.T) {
	in := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer in.Close()
	rng := rand.New(rand.NewPCG(29, 1))
	vs := variants()
	var tabs cudakern.RopeTables
	n := 0
	for _, srcDT := range dtypes {
		for _, dstDT := range dtypes {
			for _, order := range pagedkv.Orders() {
				for _, bits := range []bool{false, true} {
					v := vs[n%len(vs)]
					n++
					name := srcDT.String() + "->" + dstDT.String() + "/" + order.String() + "/" + v.name
					if bits {
						name += "/bits"
					}
					t.Run(name, func(t *testing.T) {
						tab, err := tabs.Get(v.spec, 3000)
						if err != nil {
							t.Fatal(err)
						}
						lay := pagedkv.CacheLayout{Order: order, NumBlocks: 7, BlockSize: 4, KVHeads: 2, HeadDim: 64, DType: dstDT}
						if dstDT == chunk.FP8E4M3 {
							lay.KScale, lay.VScale = 0.5, 3 // V: the source's scale, so fp8 V copies
						}
						c := jobCase{srcDT: srcDT, layout: lay, tokens: 13, srcHeads: 4, lo: 1, hi: 3, pos: 2900, layers: 2, skip: 5, bits: bits}
						elems := c.layers * 2 * c.tokens * c.srcHeads * lay.HeadDim
						src := randValues(rng, srcDT, elems)
						if bits {
							src = randBits(rng, elems*srcDT.Size())
						}
						j, host := build(rng, c, tab, src)
						compare(t, in, j, host, chunk.CodecRaw, nil)
					})
				}
			}
		}
	}
}

// TestHostInjectLargePositions: positions far beyond the others, every
// variant, both pairings' cos/sin rows from the table's own float64 math.
func TestHostInjectLargePositions(t *testing.T) {
	in := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer in.Close()
	rng := rand.New(rand.NewPCG(29, 2))
	for i, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			tab, err := cudakern.NewRopeTable(v.spec, 65600)
			if err != nil {
				t.Fatal(err)
			}
			dt := dtypes[i%len(dtypes)]
			lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 3, BlockSize: 16, KVHeads: 4, HeadDim: 64, DType: chunk.BF16}
			c := jobCase{srcDT: dt, layout: lay, tokens: 40, srcHeads: 4, pos: 65560, layers: 1, skip: 7}
			j, host := build(rng, c, tab, randValues(rng, dt, 2*c.tokens*c.srcHeads*lay.HeadDim))
			compare(t, in, j, host, chunk.CodecRaw, nil)
		})
	}
}

// entry makes an entry of tokens tokens, layers layers and heads heads of
// log-normal values in dt.
func entry(rng *rand.Rand, s chunk.ModelSpec, dt chunk.DType, tokens, layers, heads int) *chunk.Entry {
	toks := make([]uint32, tokens)
	for i := range toks {
		toks[i] = rng.Uint32() % 32000
	}
	fp := s.Fingerprint()
	return &chunk.Entry{
		Key:   chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: chunk.StandaloneContext()},
		DType: dt, Layers: layers, KVHeads: heads, HeadDim: s.HeadDim, Tokens: toks,
		KV: randValues(rng, dt, layers*2*tokens*heads*s.HeadDim),
	}
}

// TestHostDecodeInjectMatchesCPU: int8, int4 and fp8 payloads of f32, f16
// and bf16 entries decoded in the kernel's pass equal chunk's decoder
// followed by the CPU Injector, into every cache dtype and every order.
// 70 tokens cover a second, partial key group; head dim 80 a partial value
// group.
func TestHostDecodeInjectMatchesCPU(t *testing.T) {
	in := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer in.Close()
	rng := rand.New(rand.NewPCG(29, 3))
	vs := append(variants(), variant{"neox/hd80/partial", spec(chunk.RopeNeoX, 80, 48, chunk.RopeScaling{})})
	var tabs cudakern.RopeTables
	orders := pagedkv.Orders()
	n := 0
	for _, codec := range []chunk.Codec{chunk.CodecInt8, chunk.CodecInt4, chunk.CodecFP8} {
		for _, edt := range []chunk.DType{chunk.F32, chunk.F16, chunk.BF16} {
			for _, dstDT := range dtypes {
				// Shifted once per (codec, entry dtype): every cache
				// dtype meets every order.
				order := orders[(n+n/len(dtypes))%len(orders)]
				v := vs[n%len(vs)]
				if n%7 == 0 {
					v = vs[len(vs)-1]
				}
				n++
				t.Run(codec.String()+"/"+edt.String()+"->"+dstDT.String()+"/"+order.String()+"/"+v.name, func(t *testing.T) {
					tab, err := tabs.Get(v.spec, 3000)
					if err != nil {
						t.Fatal(err)
					}
					e := entry(rng, v.spec, edt, 70, 2, 3)
					blob, err := chunk.Encode(nil, e, codec)
					if err != nil {
						t.Fatal(err)
					}
					hd, err := chunk.ParseHeader(blob, chunk.Limits{})
					if err != nil {
						t.Fatal(err)
					}
					var payloads [][]byte
					for l := 0; l < e.Layers; l++ {
						p, err := hd.LayerPayload(blob, l)
						if err != nil {
							t.Fatal(err)
						}
						if want := cudakern.EncodedLayerBytes(codec, edt, 70, 3, v.spec.HeadDim); len(p) != want {
							t.Fatalf("layer payload of %d bytes, EncodedLayerBytes says %d", len(p), want)
						}
						payloads = append(payloads, p)
					}
					dec, err := chunk.Decode(blob, chunk.Limits{})
					if err != nil {
						t.Fatal(err)
					}
					lay := pagedkv.CacheLayout{Order: order, NumBlocks: 5, BlockSize: 16, KVHeads: 2, HeadDim: v.spec.HeadDim, DType: dstDT}
					if dstDT == chunk.FP8E4M3 {
						lay.KScale, lay.VScale = 0.5, 0.75
					}
					c := jobCase{srcDT: edt, layout: lay, tokens: 70, srcHeads: 3, lo: 1, hi: 3, pos: 2000, layers: 2, skip: 9}
					j, host := build(rng, c, tab, dec.KV)
					compare(t, in, j, host, codec, payloads)
				})
			}
		}
	}
}

// TestHostDecodeRejects: the payloads chunk's decoder rejects as corrupt
// set the kernel's error bits.
func TestHostDecodeRejects(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 4))
	s := spec(chunk.RopeNeoX, 64, 0, chunk.RopeScaling{})
	tab, err := cudakern.NewRopeTable(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		codec chunk.Codec
		bad   func(p []byte)
		bit   uint32
	}{
		// The first K group's zero is a NaN (bf16 0x7fc0).
		{"int8 NaN zero", chunk.CodecInt8, func(p []byte) { p[0], p[1] = 0xc0, 0x7f }, cudakern.DeviceErrParams},
		// Its scale is negative.
		{"int4 negative scale", chunk.CodecInt4, func(p []byte) { p[3] |= 0x80 }, cudakern.DeviceErrParams},
		// Code 0 of K is an fp8 NaN.
		{"fp8 NaN code", chunk.CodecFP8, func(p []byte) { p[2*64*2] = 0x7f }, cudakern.DeviceErrFP8NaN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := entry(rng, s, chunk.BF16, 8, 1, 2)
			blob, err := chunk.Encode(nil, e, tc.codec)
			if err != nil {
				t.Fatal(err)
			}
			hd, err := chunk.ParseHeader(blob, chunk.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			p, err := hd.LayerPayload(blob, 0)
			if err != nil {
				t.Fatal(err)
			}
			p = append([]byte(nil), p...)
			tc.bad(p)
			lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 1, BlockSize: 8, KVHeads: 2, HeadDim: 64, DType: chunk.BF16}
			j := &cudakern.Job{Rope: tab, SrcDType: chunk.BF16, Tokens: 8, SrcHeads: 2, Slots: []int{0, 1, 2, 3, 4, 5, 6, 7},
				Layout: lay, Dst: [][]byte{make([]byte, lay.LayerBytes())}}
			dj, err := cudakern.DeviceJobOf(j, tc.codec)
			if err != nil {
				t.Fatal(err)
			}
			if got := Run(dj, [][]byte{p}, j.Dst, j.Slots, j.CosSin(nil), 1); got&tc.bit == 0 {
				t.Fatalf("error bits %#x, want %#x set", got, tc.bit)
			}
		})
	}
}

// TestHostCompactMatchesCPU: the host-memory path of the CUDA injector
// (CompactJob on the device, ScatterCompact on the host) gives the CPU
// Injector's cache, duplicate slots included, in every order.
func TestHostCompactMatchesCPU(t *testing.T) {
	in := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer in.Close()
	rng := rand.New(rand.NewPCG(29, 5))
	vs := variants()
	for i, order := range pagedkv.Orders() {
		src, dst := dtypes[i%len(dtypes)], dtypes[len(dtypes)-1-i%len(dtypes)]
		v := vs[3*i%len(vs)]
		tab, err := cudakern.NewRopeTable(v.spec, 100)
		if err != nil {
			t.Fatal(err)
		}
		lay := pagedkv.CacheLayout{Order: order, NumBlocks: 4, BlockSize: 8, KVHeads: 2, HeadDim: 64, DType: dst, KScale: 2, VScale: 0.5}
		c := jobCase{srcDT: src, layout: lay, tokens: 20, srcHeads: 3, lo: 1, hi: 3, pos: 50, layers: 2, skip: 6}
		j, host := build(rng, c, tab, randValues(rng, src, 2*2*20*3*64))
		j.Slots[7] = j.Slots[3] // the later token wins
		cj := cudakern.CompactJob(j)
		dj, err := cudakern.DeviceJobOf(&cj, chunk.CodecRaw)
		if err != nil {
			t.Fatal(err)
		}
		if bits := Run(dj, [][]byte{j.Src[:len(j.Src)/2], j.Src[len(j.Src)/2:]}, cj.Dst, cj.Slots, cj.CosSin(nil), 3); bits != 0 {
			t.Fatalf("error bits %#x", bits)
		}
		hj := *j
		hj.Dst = host
		cudakern.ScatterCompact(&hj, &cj)
		if err := in.Inject(context.Background(), j); err != nil {
			t.Fatal(err)
		}
		for l := range host {
			if k := sameElems(j.Dst[l], host[l], dst); k >= 0 {
				t.Fatalf("%v->%v %v layer %d element %d differs", src, dst, order, l, k)
			}
		}
	}
}
