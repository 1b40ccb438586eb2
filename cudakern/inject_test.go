package cudakern

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// encode rounds v into dtype dt (fp8 unscaled) and appends it.
func encode(b []byte, dt chunk.DType, v float32) []byte {
	switch dt {
	case chunk.F32:
		u := math.Float32bits(v)
		return append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
	case chunk.F16:
		u := chunk.F32ToF16(v)
		return append(b, byte(u), byte(u>>8))
	case chunk.BF16:
		u := chunk.F32ToBF16(v)
		return append(b, byte(u), byte(u>>8))
	case chunk.FP8E4M3:
		return append(b, chunk.F32ToFP8E4M3(v))
	}
	panic(dt)
}

// decode widens element i of b in dtype dt exactly.
func decode(b []byte, dt chunk.DType, i int) float64 {
	switch dt {
	case chunk.F32:
		o := 4 * i
		return float64(math.Float32frombits(uint32(b[o]) | uint32(b[o+1])<<8 | uint32(b[o+2])<<16 | uint32(b[o+3])<<24))
	case chunk.F16:
		return float64(chunk.F16ToF32(uint16(b[2*i]) | uint16(b[2*i+1])<<8))
	case chunk.BF16:
		return float64(chunk.BF16ToF32(uint16(b[2*i]) | uint16(b[2*i+1])<<8))
	case chunk.FP8E4M3:
		return float64(chunk.FP8E4M3ToF32(b[i]))
	}
	panic(dt)
}

// randKV returns n random elements in dtype dt with log-normal channel
// magnitudes (fp8 values stay in range).
func randKV(rng *rand.Rand, dt chunk.DType, n int) []byte {
	b := make([]byte, 0, n*dt.Size())
	for i := 0; i < n; i++ {
		v := rng.NormFloat64() * math.Exp(rng.NormFloat64())
		if dt == chunk.FP8E4M3 {
			v = math.Max(-400, math.Min(400, v*10))
		}
		b = encode(b, dt, float32(v))
	}
	return b
}

// elemIndex is the test's own layout arithmetic (row-major strides of each
// order's tensor shape), kept independent of CacheLayout.Offset: element
// index of (kv, slot, head, 0).
func elemIndex(l pagedkv.CacheLayout, kv, slot, head int) int {
	blk, off := slot/l.BlockSize, slot%l.BlockSize
	var dims, idx []int
	switch l.Order {
	case pagedkv.NHD:
		dims, idx = []int{2, l.NumBlocks, l.BlockSize, l.KVHeads}, []int{kv, blk, off, head}
	case pagedkv.HND:
		dims, idx = []int{2, l.NumBlocks, l.KVHeads, l.BlockSize}, []int{kv, blk, head, off}
	case pagedkv.BlockNHD:
		dims, idx = []int{l.NumBlocks, 2, l.BlockSize, l.KVHeads}, []int{blk, kv, off, head}
	case pagedkv.BlockHND:
		dims, idx = []int{l.NumBlocks, 2, l.KVHeads, l.BlockSize}, []int{blk, kv, head, off}
	default:
		panic("elemIndex: order " + l.Order.String())
	}
	e := 0
	for i := range dims {
		e = e*dims[i] + idx[i]
	}
	return e * l.HeadDim
}

// written marks the bytes of the head vectors a job writes.
func written(j *Job) []bool {
	l := j.Layout
	m := make([]bool, l.LayerBytes())
	row := l.HeadDim * l.DType.Size()
	for _, s := range j.Slots {
		if s < 0 {
			continue
		}
		for kv := 0; kv < 2; kv++ {
			for h := 0; h < l.KVHeads; h++ {
				o := elemIndex(l, kv, s, h) * l.DType.Size()
				for i := o; i < o+row; i++ {
					m[i] = true
				}
			}
		}
	}
	return m
}

type jobCase struct {
	spec      chunk.ModelSpec
	srcDT     chunk.DType
	srcScale  float32
	layout    pagedkv.CacheLayout
	tokens    int
	srcHeads  int
	lo, hi    int
	pos       int
	layers    int
	skipEvery int
}

// buildJob makes a job with random source bytes, random distinct slots (a
// few -1) and destination layers full of random guard bytes.
func buildJob(t testing.TB, rng *rand.Rand, c jobCase, tab *RopeTable) (*Job, [][]byte) {
	t.Helper()
	src := randKV(rng, c.srcDT, c.layers*2*c.tokens*c.srcHeads*c.layout.HeadDim)
	perm := rng.Perm(c.layout.Slots())
	slots := make([]int, c.tokens)
	for i := range slots {
		slots[i] = perm[i%len(perm)]
		if c.skipEvery > 0 && i%c.skipEvery == c.skipEvery-1 {
			slots[i] = -1
		}
	}
	dst := make([][]byte, c.layers)
	guard := make([][]byte, c.layers)
	for i := range dst {
		dst[i] = aligned(c.layout.LayerBytes()) // lets the NT kernels run
		for k := range dst[i] {
			dst[i][k] = byte(rng.Uint32())
		}
		guard[i] = append([]byte(nil), dst[i]...)
	}
	return &Job{
		Rope: tab, Src: src, SrcDType: c.srcDT, SrcKScale: c.srcScale, SrcVScale: c.srcScale,
		Tokens: c.tokens, SrcHeads: c.srcHeads, HeadLo: c.lo, HeadHi: c.hi, Pos: c.pos,
		Slots: slots, Layout: c.layout, Dst: dst,
	}, guard
}

// checkJob verifies every written element against the float64 reference
// and every other byte against its guard copy. It returns how many K
// elements missed the plain 1-ulp bound (only possible under cancellation)
// of how many rotated K elements it checked.
func checkJob(t *testing.T, j *Job, guard [][]byte) (over1, total int) {
	t.Helper()
	l := j.Layout
	hd := l.HeadDim
	es := l.DType.Size()
	ks, vs := l.Scales()
	srcKS, srcVS := float32(1), float32(1)
	if j.SrcDType == chunk.FP8E4M3 {
		if j.SrcKScale != 0 {
			srcKS = j.SrcKScale
		}
		if j.SrcVScale != 0 {
			srcVS = j.SrcVScale
		}
	}
	lo := j.HeadLo
	spec := j.Rope.Spec()
	attn := j.Rope.AttentionFactor()
	mask := written(j)
	srcRow := hd * j.SrcDType.Size()
	layerBytes := 2 * j.Tokens * j.SrcHeads * srcRow
	for layer, d := range j.Dst {
		for i := range d {
			if !mask[i] && d[i] != guard[layer][i] {
				t.Fatalf("layer %d byte %d outside the named slots changed", layer, i)
			}
		}
		src := j.Src[layer*layerBytes:]
		last := map[int]int{} // slot -> the token that wins it
		for tok, slot := range j.Slots {
			last[slot] = tok
		}
		for tok, slot := range j.Slots {
			if slot < 0 || last[slot] != tok {
				continue
			}
			for h := 0; h < l.KVHeads; h++ {
				kOff := ((tok*j.SrcHeads + lo + h) * hd)
				vOff := kOff + j.Tokens*j.SrcHeads*hd
				x := make([]float64, hd)
				for i := range x {
					// The dequantized input is the float32 product fp8*scale.
					x[i] = float64(float32(decode(src, j.SrcDType, kOff+i)) * srcKS)
				}
				ref := refRotate64(j.Rope, x, j.Pos+tok)
				kd := d[elemIndex(l, 0, slot, h)*es:]
				vd := d[elemIndex(l, 1, slot, h)*es:]
				for i := 0; i < hd; i++ {
					got := decode(kd, l.DType, i) * float64(ks)
					pair := pairOf(spec, i)
					if pair < 0 {
						exp := decode(encode(nil, l.DType, float32(x[i])/ks), l.DType, 0) * float64(ks)
						if got != exp && !(math.IsNaN(got) && math.IsNaN(exp)) {
							t.Fatalf("layer %d tok %d head %d dim %d (pass-through): got %v want %v", layer, tok, h, i, got, exp)
						}
						continue
					}
					r := ref[i] / float64(ks)
					e := math.Abs(got/float64(ks) - r)
					tol := rotTolerance(l.DType, r, x[i], x[pair], attn/float64(ks))
					if l.DType == chunk.FP8E4M3 && math.Abs(r) > chunk.FP8E4M3Max {
						tol = math.Inf(1) // saturates
					}
					if e > tol {
						t.Fatalf("layer %d tok %d head %d dim %d: got %v, reference %v (err %g > tol %g)", layer, tok, h, i, got/float64(ks), r, e, tol)
					}
					total++
					if e > ulp(l.DType, math.Abs(r)) {
						over1++
					}
				}
				for i := 0; i < hd; i++ {
					v := float32(decode(src, j.SrcDType, vOff+i)) * srcVS
					want := encode(nil, l.DType, v/vs)
					if !bytes.Equal(vd[i*es:(i+1)*es], want) {
						t.Fatalf("layer %d tok %d head %d V dim %d: got %x want %x (%v)", layer, tok, h, i, vd[i*es:(i+1)*es], want, v)
					}
				}
			}
		}
	}
	return over1, total
}

var allDTypes = []chunk.DType{chunk.F32, chunk.F16, chunk.BF16, chunk.FP8E4M3}

func TestInjectMatchesReference(t *testing.T) {
	for _, nt := range []bool{false, true} {
		name := "cached-stores"
		if nt {
			name = "nt-stores"
		}
		t.Run(name, func(t *testing.T) { testInjectMatchesReference(t, nt) })
	}
}

func testInjectMatchesReference(t *testing.T, nt bool) {
	in := NewInjector(Config{Workers: 3})
	defer in.Close()
	if nt {
		in.ntMin = 0 // every aligned job takes the non-temporal kernels
	}
	rng := rand.New(rand.NewPCG(11, 12))
	vs := variants()
	var tabs RopeTables
	n := 0
	for _, srcDT := range allDTypes {
		for _, dstDT := range allDTypes {
			for _, order := range pagedkv.Orders() {
				v := vs[n%len(vs)]
				n++
				name := srcDT.String() + "->" + dstDT.String() + "/" + order.String() + "/" + v.name
				t.Run(name, func(t *testing.T) {
					tab, err := tabs.Get(v.spec, 3000)
					if err != nil {
						t.Fatal(err)
					}
					lay := pagedkv.CacheLayout{Order: order, NumBlocks: 7, BlockSize: 4, KVHeads: 2, HeadDim: 64, DType: dstDT}
					var srcScale float32
					if dstDT == chunk.FP8E4M3 {
						lay.KScale, lay.VScale = 0.5, 2
					}
					if srcDT == chunk.FP8E4M3 {
						srcScale = 0.25
					}
					c := jobCase{spec: v.spec, srcDT: srcDT, srcScale: srcScale, layout: lay, tokens: 13, srcHeads: 4,
						lo: 1, hi: 3, pos: 2900, layers: 2, skipEvery: 5}
					j, guard := buildJob(t, rng, c, tab)
					if nt && hasSIMD() && srcDT == dstDT && dstDT != chunk.FP8E4M3 && v.spec.RopeStyle == chunk.RopeNeoX {
						p, err := j.plan()
						if err != nil {
							t.Fatal(err)
						}
						p.simd = true
						if !p.useNT(0) {
							t.Fatal("this job should take the NT kernels")
						}
					}
					if err := in.Inject(t.Context(), j); err != nil {
						t.Fatal(err)
					}
					over, total := checkJob(t, j, guard)
					t.Logf("%d of %d K elements beyond 1 ulp (cancellation)", over, total)
					// 16-bit and fp8 destinations: one ulp, except where x*cos
					// and y*sin cancel to far below the pair's norm.
					if dstDT != chunk.F32 && over*10000 > total {
						t.Errorf("%d of %d K elements beyond 1 ulp", over, total)
					}
				})
			}
		}
	}
}

// TestInjectEqualsEnginePath: the fused pass gives the same bits as the
// engine's own path (widen, RotateF32, ScatterF32), for every variant.
func TestInjectEqualsEnginePath(t *testing.T) {
	in := NewInjector(Config{Workers: 2})
	defer in.Close()
	rng := rand.New(rand.NewPCG(13, 14))
	var tabs RopeTables
	for _, v := range variants() {
		for _, dt := range []chunk.DType{chunk.BF16, chunk.F16, chunk.F32} {
			t.Run(v.name+"/"+dt.String(), func(t *testing.T) {
				tab, err := tabs.Get(v.spec, 512)
				if err != nil {
					t.Fatal(err)
				}
				lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: 4, HeadDim: 64, DType: dt}
				c := jobCase{srcDT: dt, layout: lay, tokens: 40, srcHeads: 4, pos: 100, layers: 1}
				j, _ := buildJob(t, rng, c, tab)
				if err := in.Inject(t.Context(), j); err != nil {
					t.Fatal(err)
				}
				hd := lay.HeadDim
				k := make([]float32, c.tokens*lay.KVHeads*hd)
				vv := make([]float32, len(k))
				for i := range k {
					k[i] = float32(decode(j.Src, dt, i))
					vv[i] = float32(decode(j.Src, dt, len(k)+i))
				}
				for tok := 0; tok < c.tokens; tok++ {
					for h := 0; h < lay.KVHeads; h++ {
						tab.RotateF32(k[(tok*lay.KVHeads+h)*hd:(tok*lay.KVHeads+h+1)*hd], c.pos+tok)
					}
				}
				want := make([]byte, lay.LayerBytes())
				if err := ScatterF32(want, lay, 0, j.Slots, k); err != nil {
					t.Fatal(err)
				}
				if err := ScatterF32(want, lay, 1, j.Slots, vv); err != nil {
					t.Fatal(err)
				}
				mask := written(j)
				for i := range want {
					if mask[i] && want[i] != j.Dst[0][i] {
						t.Fatalf("byte %d: fused %#x, engine path %#x", i, j.Dst[0][i], want[i])
					}
				}
			})
		}
	}
}

func TestInjectWorkersAgree(t *testing.T) {
	spec := testSpec(chunk.RopeNeoX, 128, 0, chunk.RopeScaling{})
	tab, err := NewRopeTable(spec, 1024)
	if err != nil {
		t.Fatal(err)
	}
	lay := pagedkv.CacheLayout{Order: pagedkv.HND, NumBlocks: 8, BlockSize: 16, KVHeads: 4, HeadDim: 128, DType: chunk.BF16}
	c := jobCase{srcDT: chunk.BF16, layout: lay, tokens: 100, srcHeads: 8, lo: 4, hi: 8, pos: 500, layers: 3, skipEvery: 7}
	var first [][]byte
	for _, w := range []int{1, 2, 3, 8} {
		in := NewInjector(Config{Workers: w})
		rng := rand.New(rand.NewPCG(15, 16)) // same job every time
		j, _ := buildJob(t, rng, c, tab)
		if err := in.Inject(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		in.Close()
		if first == nil {
			first = j.Dst
			continue
		}
		for l := range first {
			if !bytes.Equal(first[l], j.Dst[l]) {
				t.Fatalf("workers %d: layer %d differs from workers 1", w, l)
			}
		}
	}
}

func TestInjectInvalid(t *testing.T) {
	in := NewInjector(Config{Workers: 2})
	defer in.Close()
	spec := testSpec(chunk.RopeNeoX, 64, 0, chunk.RopeScaling{})
	tab, err := NewRopeTable(spec, 256)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewRopeTable(testSpec(chunk.RopeNeoX, 32, 0, chunk.RopeScaling{}), 256)
	if err != nil {
		t.Fatal(err)
	}
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 8, KVHeads: 2, HeadDim: 64, DType: chunk.F16}
	base := jobCase{srcDT: chunk.BF16, layout: lay, tokens: 10, srcHeads: 4, lo: 2, hi: 4, pos: 3, layers: 2}
	cases := []struct {
		name string
		mut  func(*Job)
		want error
	}{
		{"no table", func(j *Job) { j.Rope = nil }, ErrInvalidJob},
		{"table head dim", func(j *Job) { j.Rope = other }, ErrInvalidJob},
		{"slot too big", func(j *Job) { j.Slots[3] = 32 }, ErrInvalidJob},
		{"slot below -1", func(j *Job) { j.Slots[9] = -2 }, ErrInvalidJob},
		{"slots short", func(j *Job) { j.Slots = j.Slots[:9] }, ErrInvalidJob},
		{"head range beyond heads", func(j *Job) { j.HeadLo, j.HeadHi = 3, 5 }, ErrInvalidJob},
		{"head range negative", func(j *Job) { j.HeadLo, j.HeadHi = -1, 1 }, ErrInvalidJob},
		{"head range width", func(j *Job) { j.HeadLo, j.HeadHi = 1, 4 }, ErrInvalidJob},
		{"all heads but layout has 2", func(j *Job) { j.HeadLo, j.HeadHi = 0, 0 }, ErrInvalidJob},
		{"source short", func(j *Job) { j.Src = j.Src[:len(j.Src)-1] }, ErrInvalidJob},
		{"source long", func(j *Job) { j.Src = append(j.Src, 0, 0) }, ErrInvalidJob},
		{"source dtype", func(j *Job) { j.SrcDType = chunk.F32 }, ErrInvalidJob},
		{"source dtype invalid", func(j *Job) { j.SrcDType = 0 }, ErrInvalidJob},
		{"destination layer short", func(j *Job) { j.Dst[1] = j.Dst[1][:len(j.Dst[1])-2] }, ErrInvalidJob},
		{"destination layer missing", func(j *Job) { j.Dst = j.Dst[:1] }, ErrInvalidJob},
		{"layout dtype", func(j *Job) { j.Layout.DType = chunk.F32 }, ErrInvalidJob},
		{"layout blocks", func(j *Job) { j.Layout.NumBlocks = 3 }, ErrInvalidJob},
		{"layout order", func(j *Job) { j.Layout.Order = 0 }, pagedkv.ErrInvalidLayout},
		{"layout zero block size", func(j *Job) { j.Layout.BlockSize = 0 }, pagedkv.ErrInvalidLayout},
		{"layout huge", func(j *Job) { j.Layout.NumBlocks = 1 << 40 }, pagedkv.ErrInvalidLayout},
		{"positions beyond table", func(j *Job) { j.Pos = 250 }, ErrInvalidJob},
		{"negative position", func(j *Job) { j.Pos = -1 }, ErrInvalidJob},
		{"fp8 scale NaN", func(j *Job) {
			j.Layout.DType = chunk.FP8E4M3
			j.Layout.KScale = float32(math.NaN())
		}, pagedkv.ErrInvalidLayout},
		{"source fp8 scale negative", func(j *Job) {
			j.SrcDType = chunk.FP8E4M3
			j.Src = j.Src[:len(j.Src)/2]
			j.SrcKScale = -1
		}, ErrInvalidJob},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(17, 18))
			j, guard := buildJob(t, rng, base, tab)
			c.mut(j)
			err := in.Inject(t.Context(), j)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			for l := range j.Dst {
				if !bytes.Equal(j.Dst[l], guard[l][:len(j.Dst[l])]) {
					t.Fatalf("layer %d written by a rejected job", l)
				}
			}
		})
	}
}

func TestInjectCancelledAndClosed(t *testing.T) {
	in := NewInjector(Config{Workers: 2})
	spec := testSpec(chunk.RopeGPTJ, 64, 0, chunk.RopeScaling{})
	tab, err := NewRopeTable(spec, 256)
	if err != nil {
		t.Fatal(err)
	}
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 8, KVHeads: 2, HeadDim: 64, DType: chunk.BF16}
	j, guard := buildJob(t, rand.New(rand.NewPCG(1, 1)), jobCase{srcDT: chunk.BF16, layout: lay, tokens: 10, srcHeads: 2, layers: 2}, tab)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := in.Inject(ctx, j); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v", err)
	}
	for l := range j.Dst {
		if !bytes.Equal(j.Dst[l], guard[l]) {
			t.Fatalf("layer %d written by a cancelled call", l)
		}
	}
	in.Close()
	in.Close()
	if err := in.Inject(t.Context(), j); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: err = %v", err)
	}
}

func TestInjectNoAlloc(t *testing.T) {
	in := NewInjector(Config{Workers: 2})
	defer in.Close()
	spec := testSpec(chunk.RopeNeoX, 128, 0, chunk.RopeScaling{})
	tab, err := NewRopeTable(spec, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, dt := range allDTypes {
		lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: 4, HeadDim: 128, DType: dt}
		j, _ := buildJob(t, rand.New(rand.NewPCG(2, 2)), jobCase{srcDT: chunk.BF16, layout: lay, tokens: 32, srcHeads: 4, layers: 4}, tab)
		if a := testing.AllocsPerRun(5, func() {
			if err := in.Inject(ctx, j); err != nil {
				t.Fatal(err)
			}
		}); a != 0 {
			t.Errorf("%v: %v allocations per call", dt, a)
		}
	}
}

// TestLayoutOffsets: Offset agrees with row-major strides, and the head
// vectors tile the layer exactly once.
func TestLayoutOffsets(t *testing.T) {
	for _, order := range pagedkv.Orders() {
		for _, dt := range allDTypes {
			l := pagedkv.CacheLayout{Order: order, NumBlocks: 3, BlockSize: 5, KVHeads: 3, HeadDim: 4, DType: dt}
			if err := l.Validate(); err != nil {
				t.Fatal(err)
			}
			seen := make([]int, l.LayerBytes())
			row := l.HeadDim * dt.Size()
			// The Injector's own strides (plan.offset, plan.dst).
			tab, err := NewRopeTable(testSpec(chunk.RopeNeoX, l.HeadDim, 0, chunk.RopeScaling{}), 16)
			if err != nil {
				t.Fatal(err)
			}
			j := Job{Rope: tab, SrcDType: dt, SrcHeads: l.KVHeads, Layout: l, Dst: [][]byte{make([]byte, l.LayerBytes())}}
			p, err := j.plan()
			if err != nil {
				t.Fatal(err)
			}
			for kv := 0; kv < 2; kv++ {
				for s := 0; s < l.Slots(); s++ {
					if got, want := p.offset(kv, s)+2*p.dst.Head, l.Offset(kv, s, 2); got != want {
						t.Fatalf("%v %v (%d,%d,2): plan offset %d, layout %d", order, dt, kv, s, got, want)
					}
					for h := 0; h < l.KVHeads; h++ {
						o := l.Offset(kv, s, h)
						if o != elemIndex(l, kv, s, h)*dt.Size() {
							t.Fatalf("%v %v (%d,%d,%d): offset %d, strides give %d", order, dt, kv, s, h, o, elemIndex(l, kv, s, h)*dt.Size())
						}
						for i := o; i < o+row; i++ {
							seen[i]++
						}
					}
				}
			}
			for i, n := range seen {
				if n != 1 {
					t.Fatalf("%v %v: byte %d covered %d times", order, dt, i, n)
				}
			}
		}
	}
}

func TestGatherScatter(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	for _, order := range pagedkv.Orders() {
		for _, dt := range allDTypes {
			t.Run(order.String()+"/"+dt.String(), func(t *testing.T) {
				l := pagedkv.CacheLayout{Order: order, NumBlocks: 5, BlockSize: 4, KVHeads: 3, HeadDim: 8, DType: dt, KScale: 0.5, VScale: 0.25}
				layer := make([]byte, l.LayerBytes())
				for i := range layer {
					layer[i] = byte(rng.Uint32())
				}
				guard := append([]byte(nil), layer...)
				slots := []int{7, -1, 0, 19, 3}
				src := make([]float32, len(slots)*l.KVHeads*l.HeadDim)
				for i := range src {
					src[i] = float32(rng.NormFloat64() * 3)
				}
				for kv := 0; kv < 2; kv++ {
					if err := ScatterF32(layer, l, kv, slots, src); err != nil {
						t.Fatal(err)
					}
				}
				j := &Job{Slots: slots, Layout: l}
				mask := written(j)
				for i := range layer {
					if !mask[i] && layer[i] != guard[i] {
						t.Fatalf("byte %d outside the slots changed", i)
					}
				}
				got := make([]float32, len(src))
				for kv := 0; kv < 2; kv++ {
					if err := GatherF32(got, layer, l, kv, slots); err != nil {
						t.Fatal(err)
					}
					ks, vs := l.Scales()
					scale := []float32{ks, vs}[kv]
					for i, v := range src {
						want := float32(decode(encode(nil, dt, v/scale), dt, 0)) * scale
						if slots[i/(l.KVHeads*l.HeadDim)] < 0 {
							want = 0
						}
						if got[i] != want {
							t.Fatalf("kv %d element %d: got %v want %v", kv, i, got[i], want)
						}
					}
				}
				// Errors leave everything untouched.
				snap := append([]byte(nil), layer...)
				for _, bad := range []error{
					ScatterF32(layer, l, 2, slots, src),
					ScatterF32(layer, l, 0, []int{0, 1, 2, 3, 20}, src),
					ScatterF32(layer, l, 0, slots, src[1:]),
					ScatterF32(layer[1:], l, 0, slots, src),
					GatherF32(got[1:], layer, l, 0, slots),
				} {
					if !errors.Is(bad, ErrInvalidJob) {
						t.Fatalf("err = %v, want ErrInvalidJob", bad)
					}
				}
				if !bytes.Equal(snap, layer) {
					t.Fatal("a rejected scatter wrote")
				}
			})
		}
	}
}
