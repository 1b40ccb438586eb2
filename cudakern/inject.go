package cudakern

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// Config configures an Injector.
type Config struct {
	// Workers is the number of goroutines a call is split over, the calling
	// goroutine included. 0 means runtime.GOMAXPROCS(0).
	Workers int
	// NoSIMD forces the portable Go kernels even where the AVX2 ones can
	// run (they give the same bits; this exists for tests and benchmarks).
	NoSIMD bool
	// NoAVX512 keeps to the AVX2 kernels (same bits).
	NoAVX512 bool
}

// Job is one fused rotate-and-scatter request: layers of one chunk, from its
// canonical bytes into one paged cache. The Injector reads it and writes only
// Dst.
type Job struct {
	// Rope is the model's table. Its HeadDim must equal Layout.HeadDim and
	// Pos+Tokens must not exceed its MaxPositions.
	Rope *RopeTable
	// Src holds len(Dst) consecutive layers of the chunk in the canonical
	// layout [layer][K|V][token][head][head_dim], SrcHeads heads, in
	// SrcDType (F32, F16, BF16, or FP8E4M3 for a dequantization fused into
	// the pass). K is pre-RoPE.
	Src      []byte
	SrcDType chunk.DType
	// SrcKScale and SrcVScale dequantize an FP8E4M3 source (x = fp8 *
	// scale); 0 means 1. Ignored for other dtypes.
	SrcKScale, SrcVScale float32
	// Tokens is the chunk's length; token t goes to position Pos+t and slot
	// Slots[t].
	Tokens   int
	SrcHeads int
	// HeadLo and HeadHi select the source heads [HeadLo, HeadHi) that land on
	// destination heads 0..HeadHi-HeadLo-1 (a tensor-parallel rank's slice);
	// HeadHi-HeadLo must equal Layout.KVHeads. Both zero means all SrcHeads.
	HeadLo, HeadHi int
	// Pos is the absolute position of token 0 (>= 0).
	Pos int
	// Slots maps token t to slot block*BlockSize+offset of the cache, or -1
	// to skip it. If two tokens name the same slot the later token wins.
	Slots []int
	// Layout describes every layer of Dst.
	Layout pagedkv.CacheLayout
	// Dst holds one slice per layer of Src, each Layout.LayerBytes() long.
	// They must not overlap each other or Src.
	Dst [][]byte
}

// plan is a validated Job with everything the inner loops need derived once.
type plan struct {
	Job
	heads     int // destination heads
	srcES     int
	dstES     int
	srcRow    int // bytes of one source head vector
	srcTok    int // bytes between tokens in Src
	srcLayer  int // bytes of one source layer
	srcV      int // offset of V within a source layer
	srcKScale float32
	srcVScale float32
	dstKScale float32
	dstVScale float32
	copyV     bool // V bytes pass through unchanged
	kernel    kernelKind
	simd      bool // the AVX2 kernels may run
	avx512    bool // and the AVX-512 ones
	bf16      bool // and the AVX512-BF16 ones
	nt        bool // and store with non-temporal hints (see useNT)
	wide      rotAsm
	narrow    rotAsm
	wideN     int
	narrowN   int
	scalar    rotScalar
	fp8K      fp8Path         // single-pass kernel for K, if any (see pickFP8)
	fp8V      fp8Path         // and for V
	kArg      float32         // the scale argument of the fp8 kernels for K
	vArg      float32         // and for V
	kDiv      int             // nonzero: the fp8 K store divides by kArg
	vDiv      int             // and the V store by vArg
	dst       pagedkv.Strides // the layout's strides, derived once
	tiles     int             // token tiles per layer
	items     int             // layers * tiles
	cancel    <-chan struct{}
}

// Validate checks j completely. Inject calls it first and writes nothing when
// it fails.
func (j *Job) Validate() error {
	_, err := j.plan()
	return err
}

func (j *Job) plan() (plan, error) { return j.planSrc(true, false) }

// planSrc is plan; rawSrc false leaves j.Src unchecked, for a device job
// whose source layers are codec payloads the caller sizes; devDst true
// leaves the Dst layers' bytes unchecked (nil: device memory), only their
// count.
func (j *Job) planSrc(rawSrc, devDst bool) (plan, error) {
	p := plan{Job: *j}
	bad := func(format string, a ...any) (plan, error) {
		return plan{}, fmt.Errorf("%w: %s", ErrInvalidJob, fmt.Sprintf(format, a...))
	}
	if j.Rope == nil {
		return bad("no rope table")
	}
	l := j.Layout
	if err := l.Validate(); err != nil {
		return plan{}, err
	}
	if l.HeadDim != j.Rope.HeadDim() {
		return bad("layout head dim %d, rope table head dim %d", l.HeadDim, j.Rope.HeadDim())
	}
	switch j.SrcDType {
	case chunk.F32, chunk.F16, chunk.BF16, chunk.FP8E4M3:
	default:
		return bad("source dtype %v", j.SrcDType)
	}
	p.srcKScale, p.srcVScale = 1, 1
	if j.SrcDType == chunk.FP8E4M3 {
		for _, s := range []float32{j.SrcKScale, j.SrcVScale} {
			if s < 0 || math.IsNaN(float64(s)) || math.IsInf(float64(s), 0) {
				return bad("source fp8 scale %v must be finite and >= 0", s)
			}
		}
		if j.SrcKScale != 0 {
			p.srcKScale = j.SrcKScale
		}
		if j.SrcVScale != 0 {
			p.srcVScale = j.SrcVScale
		}
	}
	p.dstKScale, p.dstVScale = l.Scales()
	if j.Tokens < 0 || j.Tokens > MaxTablePositions {
		return bad("tokens %d", j.Tokens)
	}
	if len(j.Slots) != j.Tokens {
		return bad("%d slots for %d tokens", len(j.Slots), j.Tokens)
	}
	if j.SrcHeads <= 0 || j.SrcHeads > 1<<16 {
		return bad("source heads %d", j.SrcHeads)
	}
	lo, hi := j.HeadLo, j.HeadHi
	if lo == 0 && hi == 0 {
		hi = j.SrcHeads
	}
	if lo < 0 || lo >= hi || hi > j.SrcHeads {
		return bad("head range [%d,%d) of %d source heads", lo, hi, j.SrcHeads)
	}
	if hi-lo != l.KVHeads {
		return bad("head range [%d,%d) has %d heads, layout has %d", lo, hi, hi-lo, l.KVHeads)
	}
	p.HeadLo, p.HeadHi, p.heads = lo, hi, hi-lo
	if j.Pos < 0 || (j.Tokens > 0 && j.Pos > j.Rope.MaxPositions()-j.Tokens) {
		return bad("positions [%d,%d) beyond the table's %d", j.Pos, j.Pos+j.Tokens, j.Rope.MaxPositions())
	}
	if len(j.Dst) > 1<<16 {
		return bad("%d layers", len(j.Dst))
	}
	p.srcES, p.dstES = j.SrcDType.Size(), l.DType.Size()
	p.srcRow = l.HeadDim * p.srcES
	p.srcTok = j.SrcHeads * p.srcRow
	p.srcV = j.Tokens * p.srcTok
	p.srcLayer = 2 * p.srcV
	// Tokens < 2^22, heads < 2^16, head dim <= 4096, 4 bytes: srcLayer <
	// 2^53, so only the product with the layer count can overflow.
	if len(j.Dst) > 0 && p.srcLayer > math.MaxInt/len(j.Dst) {
		return bad("source too large")
	}
	if rawSrc && len(j.Src) != len(j.Dst)*p.srcLayer {
		return bad("source of %d bytes, %d layers of %d tokens need %d", len(j.Src), len(j.Dst), j.Tokens, len(j.Dst)*p.srcLayer)
	}
	lb := l.LayerBytes()
	for i, d := range j.Dst {
		if len(d) != lb && !devDst {
			return bad("destination layer %d of %d bytes, layout needs %d", i, len(d), lb)
		}
	}
	if err := checkSlots(l, j.Slots); err != nil {
		return plan{}, err
	}
	p.copyV = j.SrcDType == l.DType && (l.DType != chunk.FP8E4M3 || p.srcVScale == p.dstVScale)
	if j.SrcDType == chunk.BF16 && l.DType == chunk.BF16 && !j.Rope.neox {
		p.kernel = kernelBF16GPTJ
	}
	if j.SrcDType == l.DType && j.Rope.neox {
		switch l.DType {
		case chunk.BF16:
			p.kernel = kernelBF16NeoX
		case chunk.F16:
			p.kernel = kernelF16NeoX
		case chunk.F32:
			p.kernel = kernelF32NeoX
		}
	}
	p.dst = l.Strides()
	p.tiles = (j.Tokens + tileTokens - 1) / tileTokens
	p.items = len(j.Dst) * p.tiles
	return p, nil
}

// Injector runs Jobs over a fixed set of worker goroutines. Calls are
// serialized (one Job at a time uses all workers); it is safe for concurrent
// use. Close stops the workers.
type Injector struct {
	workers int
	simd    bool
	avx512  bool
	bf16    bool
	ntMin   int // ntMinBytes; tests lower it to cover the NT kernels

	mu     sync.Mutex // held for a whole call; guards closed and p
	closed bool
	p      plan

	next    atomic.Int64 // next work item of the current call
	stopped atomic.Bool  // the current call's context was cancelled

	start chan struct{}
	done  chan struct{}
	quit  chan struct{}
	wg    sync.WaitGroup

	scratch [][]float32 // one head vector per worker
}

// scratchFloats is the size of a worker's scratch vector: the conversion
// path widens up to this many elements of one token's heads at once (16
// heads of 256 dims, 64 KiB).
const scratchFloats = 16384

// NewInjector starts cfg.Workers-1 goroutines (the caller is the last
// worker).
func NewInjector(cfg Config) *Injector {
	w := cfg.Workers
	if w <= 0 {
		w = runtime.GOMAXPROCS(0)
	}
	in := &Injector{
		workers: w,
		simd:    !cfg.NoSIMD && hasSIMD(),
		avx512:  !cfg.NoSIMD && !cfg.NoAVX512 && hasAVX512(),
		bf16:    !cfg.NoSIMD && !cfg.NoAVX512 && hasAVX512BF16(),
		ntMin:   ntMinBytes,
		start:   make(chan struct{}, w),
		done:    make(chan struct{}, w),
		quit:    make(chan struct{}),
		scratch: make([][]float32, w),
	}
	for i := range in.scratch {
		in.scratch[i] = make([]float32, scratchFloats)
	}
	for i := 1; i < w; i++ {
		in.wg.Add(1)
		go in.loop(i)
	}
	return in
}

// Workers is the number of workers a call is split over.
func (in *Injector) Workers() int { return in.workers }

// Close stops the workers and waits for them. Later calls return ErrClosed.
func (in *Injector) Close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return
	}
	in.closed = true
	close(in.quit)
	in.wg.Wait()
}

func (in *Injector) loop(id int) {
	defer in.wg.Done()
	for {
		select {
		case <-in.quit:
			return
		case <-in.start:
			in.work(id)
			in.done <- struct{}{}
		}
	}
}

// Inject validates j, then rotates the keys of every layer of j.Src to
// positions Pos.., converts keys and values to the cache dtype and writes
// them into the named slots of j.Dst, in one pass over the bytes, split into
// (layer, token tile) items over the workers. It does not allocate.
//
// An invalid j returns an error wrapping ErrInvalidJob or pagedkv.ErrInvalidLayout
// with nothing written. If ctx is cancelled during the call, Inject returns
// its error and the named slots may be partly written; no other byte is.
func (in *Injector) Inject(ctx context.Context, j *Job) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := j.plan()
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return ErrClosed
	}
	if p.items == 0 || p.Tokens == 0 {
		return nil
	}
	p.cancel = ctx.Done()
	p.simd = in.simd
	p.avx512 = in.avx512
	p.bf16 = in.bf16
	p.nt = p.useNT(in.ntMin)
	p.pick()
	in.p = p
	in.next.Store(0)
	in.stopped.Store(false)
	helpers := min(in.workers, p.items) - 1
	for i := 0; i < helpers; i++ {
		in.start <- struct{}{}
	}
	in.work(0)
	for i := 0; i < helpers; i++ {
		<-in.done
	}
	in.p = plan{}
	if in.stopped.Load() {
		return ctx.Err()
	}
	return nil
}

// ntMinBytes is the smallest call that stores with non-temporal hints. A
// large inject streams through memory far beyond the caches, and ordinary
// stores would first read every destination line (a third more traffic); a
// small one is better left in cache for the attention that reads it next.
const ntMinBytes = 4 << 20

// useNT reports whether the SIMD kernels should store non-temporally: the
// job is large, its kernels have NT forms (a same-dtype NeoX kernel, or a
// bf16 or fp8 destination), and every destination row and half row is
// aligned for the vector stores (64 bytes for AVX-512's).
func (p *plan) useNT(minBytes int) bool {
	if !p.simd || p.Rope.half%16 != 0 {
		return false
	}
	if p.kernel == kernelGeneric && p.Layout.DType != chunk.FP8E4M3 && (p.Layout.DType != chunk.BF16 || !p.bf16) {
		return false
	}
	row := p.Layout.HeadDim * p.dstES
	if row%64 != 0 || len(p.Dst)*2*p.Tokens*p.heads*row < minBytes {
		return false
	}
	align := uintptr(32)
	if p.avx512 {
		if p.Rope.half*p.dstES%64 != 0 {
			return false
		}
		align = 64
	}
	for _, d := range p.Dst {
		if uintptr(unsafe.Pointer(unsafe.SliceData(d)))%align != 0 {
			return false
		}
	}
	return true
}

// work takes items until none is left or the call is cancelled.
func (in *Injector) work(id int) {
	p := &in.p
	x := in.scratch[id]
	for {
		if p.cancel != nil {
			select {
			case <-p.cancel:
				in.stopped.Store(true)
				return
			default:
			}
		}
		k := int(in.next.Add(1) - 1)
		if k >= p.items {
			return
		}
		p.item(k/p.tiles, k%p.tiles, x)
		if p.nt {
			sfence()
		}
	}
}

// tileTokens is the number of tokens in one work item. A worker walks its
// tile token by token over all heads, so it reads the source sequentially
// (one token's heads are contiguous) and, in NHD and BlockNHD, writes
// whole slots; an item of (layer, head) would read with a stride of all
// heads and defeat the hardware prefetchers. 16 tokens of a Llama-8B layer
// are 64 KiB.
const tileTokens = 16

// offset is CacheLayout.Offset(kv, slot, 0) from the plan's strides.
func (p *plan) offset(kv, slot int) int { return p.dst.Offset(kv, slot, 0) }

// item rotates and scatters tokens [tile*tileTokens, ...) of one layer,
// every head of the range: one kernel call per token for K, one for V.
func (p *plan) item(layer, tile int, x []float32) {
	t := p.Rope
	src := p.Src[layer*p.srcLayer : (layer+1)*p.srcLayer]
	dst := p.Dst[layer]
	lo := tile * tileTokens
	hi := min(lo+tileTokens, p.Tokens)
	// K of the whole tile, then V: two streams at a time (source and
	// destination) instead of four.
	for tok := lo; tok < hi; tok++ {
		slot := p.Slots[tok]
		if slot < 0 {
			continue
		}
		c, s := t.Row(p.Pos + tok)
		ks := tok*p.srcTok + p.HeadLo*p.srcRow
		p.rotHeads(dst[p.offset(0, slot):], src[ks:], c, s, x, p.heads, p.dst.Head)
	}
	for tok := lo; tok < hi; tok++ {
		slot := p.Slots[tok]
		if slot < 0 {
			continue
		}
		vs := p.srcV + tok*p.srcTok + p.HeadLo*p.srcRow
		p.putV(dst[p.offset(1, slot):], src[vs:], x, p.heads, p.dst.Head)
	}
}
