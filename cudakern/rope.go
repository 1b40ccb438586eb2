package cudakern

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/kvmesh/kvmesh/chunk"
)

// Errors callers branch on. Every error this package returns wraps one of
// them or pagedkv.ErrInvalidLayout (a malformed cache layout).
var (
	// ErrInvalidSpec: the model spec cannot build a RoPE table.
	ErrInvalidSpec = errors.New("cudakern: invalid spec")
	// ErrInvalidJob: a request does not fit its source, table or destination
	// (sizes, dtypes, head range, slot out of range, positions beyond the
	// table). Nothing was written.
	ErrInvalidJob = errors.New("cudakern: invalid request")
	// ErrClosed: the Injector was closed.
	ErrClosed = errors.New("cudakern: injector closed")
)

// MaxTablePositions bounds NewRopeTable's maxPositions (a table of 2^22
// positions with rotary dim 128 is 1 GiB).
const MaxTablePositions = 1 << 22

// RopeTable holds the inverse frequencies of a ModelSpec and the cos/sin of
// every position below MaxPositions. It is immutable and safe for concurrent
// use.
//
// inv_freq is computed in float64 following transformers'
// modeling_rope_utils and rounded once to float32. PyTorch evaluates the
// default inv_freq in float32 (base ** (arange/dim) then 1/x), which can
// differ from ours by an ulp of inv_freq; we prefer the correctly rounded
// value because it is the same on every machine and in every language.
type RopeTable struct {
	spec    chunk.ModelSpec
	headDim int
	rotary  int
	half    int
	neox    bool
	invFreq []float32
	attn    float64 // YaRN attention factor (1 otherwise)
	invAttn float32 // 1/attn^2, to undo a rotation
	maxPos  int
	simd    bool // RotateF32 may use the AVX2 kernel (same bits)
	// cs holds one row per position: cos[0:half] then sin[0:half].
	cs []float32
}

// NewRopeTable builds the table of spec for positions 0..maxPositions-1.
// Positions at or beyond the limit still rotate correctly through RotateF32
// (computed on the fly, bit-identical), but the Injector requires them in the
// table.
//
// Dynamic NTK scaling depends on the total sequence length L; the table uses
// L = max(maxPositions, Scaling.MaxPositions), which is what transformers
// computes for a forward pass whose longest position is maxPositions-1. Build
// the table with the sequence's total length.
func NewRopeTable(spec chunk.ModelSpec, maxPositions int) (*RopeTable, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	if maxPositions <= 0 || maxPositions > MaxTablePositions {
		return nil, fmt.Errorf("%w: max positions %d out of range 1..%d", ErrInvalidSpec, maxPositions, MaxTablePositions)
	}
	inv, attn, err := invFreq(spec, maxPositions)
	if err != nil {
		return nil, err
	}
	t := &RopeTable{
		spec:    spec,
		headDim: spec.HeadDim,
		rotary:  spec.Rotary(),
		half:    spec.Rotary() / 2,
		neox:    spec.RopeStyle == chunk.RopeNeoX,
		attn:    attn,
		invAttn: float32(1 / (attn * attn)),
		maxPos:  maxPositions,
		simd:    hasSIMD(),
	}
	t.invFreq = make([]float32, len(inv))
	for i, f := range inv {
		t.invFreq[i] = float32(f)
	}
	t.cs = make([]float32, maxPositions*2*t.half)
	for p := 0; p < maxPositions; p++ {
		row := t.cs[p*2*t.half : (p+1)*2*t.half]
		t.fillRow(row[:t.half], row[t.half:], p)
	}
	return t, nil
}

// fillRow computes cos and sin of position pos (any int, in the table or
// not). This is the only place cos/sin are computed.
func (t *RopeTable) fillRow(cos, sin []float32, pos int) {
	fp := float32(pos)
	for i, f := range t.invFreq {
		// The angle is a float32 product, as in HF (inv_freq @ position_ids
		// in float32) and vLLM's cos_sin_cache.
		angle := float64(fp * f)
		s, c := math.Sincos(angle)
		cos[i] = float32(c * t.attn)
		sin[i] = float32(s * t.attn)
	}
}

// invFreq returns the float64 inverse frequencies (len rotary/2) and the
// attention factor of spec, following transformers' modeling_rope_utils.
func invFreq(spec chunk.ModelSpec, seqLen int) ([]float64, float64, error) {
	dim := spec.Rotary()
	half := dim / 2
	base := spec.RopeTheta
	sc := spec.Scaling
	inv := make([]float64, half)
	def := func(base float64) {
		for i := range inv {
			inv[i] = 1 / math.Pow(base, float64(2*i)/float64(dim))
		}
	}
	attn := 1.0
	switch sc.Type {
	case "", "default":
		def(base)
	case "linear":
		def(base)
		for i := range inv {
			inv[i] /= sc.Factor
		}
	case "dynamic":
		// _compute_dynamic_ntk_parameters with seq_len = max(L, max_pos).
		l := float64(max(seqLen, sc.MaxPositions))
		mp := float64(sc.MaxPositions)
		b := base * math.Pow(sc.Factor*l/mp-(sc.Factor-1), float64(dim)/float64(dim-2))
		if dim == 2 || !(b > 1) || math.IsInf(b, 0) {
			return nil, 0, fmt.Errorf("%w: dynamic NTK base %v for dim %d", ErrInvalidSpec, b, dim)
		}
		def(b)
	case "llama3":
		def(base)
		old := float64(sc.OriginalMaxPositions)
		lowWL := old / sc.LowFreqFactor
		highWL := old / sc.HighFreqFactor
		for i, f := range inv {
			wl := 2 * math.Pi / f
			switch {
			case wl > lowWL:
				inv[i] = f / sc.Factor
			case wl < highWL:
				inv[i] = f
			default:
				s := (old/wl - sc.LowFreqFactor) / (sc.HighFreqFactor - sc.LowFreqFactor)
				inv[i] = (1-s)*f/sc.Factor + s*f
			}
		}
	case "yarn":
		// _compute_yarn_parameters with omax = original_max_position_embeddings
		// (pinned: some transformers versions use max_position_embeddings)
		// and truncate = true.
		betaFast, betaSlow := sc.BetaFast, sc.BetaSlow
		if betaFast == 0 {
			betaFast = 32
		}
		if betaSlow == 0 {
			betaSlow = 1
		}
		omax := float64(sc.OriginalMaxPositions)
		corrDim := func(rot float64) float64 {
			return float64(dim) * math.Log(omax/(rot*2*math.Pi)) / (2 * math.Log(base))
		}
		low := math.Max(math.Floor(corrDim(betaFast)), 0)
		high := math.Min(math.Ceil(corrDim(betaSlow)), float64(dim-1))
		if low == high {
			high += 0.001
		}
		for i := range inv {
			posFreq := math.Pow(base, float64(2*i)/float64(dim))
			extra := 1 / posFreq
			inter := 1 / (sc.Factor * posFreq)
			ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
			ext := 1 - ramp
			inv[i] = inter*(1-ext) + extra*ext
		}
		attn = sc.AttentionFactor
		if attn == 0 {
			attn = 1
			if sc.Factor > 1 {
				attn = 0.1*math.Log(sc.Factor) + 1
			}
		}
	default:
		return nil, 0, fmt.Errorf("%w: rope scaling %q", ErrInvalidSpec, sc.Type)
	}
	for i, f := range inv {
		if !(f > 0) || math.IsInf(f, 0) {
			return nil, 0, fmt.Errorf("%w: inv_freq[%d] = %v", ErrInvalidSpec, i, f)
		}
	}
	return inv, attn, nil
}

// Spec returns the spec the table was built for.
func (t *RopeTable) Spec() chunk.ModelSpec { return t.spec }

// MaxPositions is the number of positions the table holds.
func (t *RopeTable) MaxPositions() int { return t.maxPos }

// HeadDim is the length of the head vectors RotateF32 takes.
func (t *RopeTable) HeadDim() int { return t.headDim }

// RotaryDim is the number of leading dims that rotate.
func (t *RopeTable) RotaryDim() int { return t.rotary }

// AttentionFactor is the factor multiplied into cos and sin (YaRN), else 1.
func (t *RopeTable) AttentionFactor() float64 { return t.attn }

// InvFreq returns a copy of the float32 inverse frequencies (len RotaryDim/2).
func (t *RopeTable) InvFreq() []float32 { return append([]float32(nil), t.invFreq...) }

// Row returns the cos and sin of pos (len RotaryDim/2 each), aliasing the
// table; the caller must not modify them. pos must be in [0, MaxPositions).
func (t *RopeTable) Row(pos int) (cos, sin []float32) {
	row := t.cs[pos*2*t.half : (pos+1)*2*t.half : (pos+1)*2*t.half]
	return row[:t.half:t.half], row[t.half:]
}

// Rows returns every row of the table, position p's cos then sin at
// [p*RotaryDim, (p+1)*RotaryDim), aliasing the table (the CUDA injector
// uploads it once); the caller must not modify it.
func (t *RopeTable) Rows() []float32 { return t.cs[:len(t.cs):len(t.cs)] }

// rowBuf holds cos and sin computed on the fly for positions outside the
// table; 2048 covers every head dim chunk.ModelSpec allows.
type rowBuf [2 * 2048]float32

// RotateF32 rotates one head vector x (len HeadDim) in place to position pos:
// pairs (i, i+rotary/2) for NeoX, (2i, 2i+1) for GPT-J, dims >= RotaryDim
// unchanged. pos outside [0, MaxPositions) is computed on the fly with the
// same bits. It panics if len(x) != HeadDim.
func (t *RopeTable) RotateF32(x []float32, pos int) {
	if len(x) != t.headDim {
		panic(fmt.Sprintf("cudakern: RotateF32 of %d dims, table has %d", len(x), t.headDim))
	}
	if pos >= 0 && pos < t.maxPos {
		c, s := t.Row(pos)
		t.rotate(x, c, s)
		return
	}
	var buf rowBuf
	c, s := buf[:t.half], buf[t.half:2*t.half]
	t.fillRow(c, s, pos)
	t.rotate(x, c, s)
}

// UnrotateF32 undoes RotateF32(x, pos) (up to rounding): it rotates by -pos
// and divides out the attention factor twice (once for cos, once for sin).
func (t *RopeTable) UnrotateF32(x []float32, pos int) {
	if len(x) != t.headDim {
		panic(fmt.Sprintf("cudakern: UnrotateF32 of %d dims, table has %d", len(x), t.headDim))
	}
	var buf rowBuf
	var c, s []float32
	if pos >= 0 && pos < t.maxPos {
		c, s = t.Row(pos)
	} else {
		c, s = buf[:t.half], buf[t.half:2*t.half]
		t.fillRow(c, s, pos)
	}
	k := t.invAttn
	if t.neox {
		a, b := x[:t.half], x[t.half:t.rotary]
		for i := range c {
			x0, x1 := a[i], b[i]
			a[i] = (float32(x0*c[i]) + float32(x1*s[i])) * k
			b[i] = (float32(x1*c[i]) - float32(x0*s[i])) * k
		}
		return
	}
	for i := range c {
		x0, x1 := x[2*i], x[2*i+1]
		x[2*i] = (float32(x0*c[i]) + float32(x1*s[i])) * k
		x[2*i+1] = (float32(x1*c[i]) - float32(x0*s[i])) * k
	}
}

// rotate applies one row to x in float32.
func (t *RopeTable) rotate(x []float32, c, s []float32) {
	t.rotateN(x, c, s, 1, isa{avx2: t.simd})
}

// rotateN applies one row to count consecutive head vectors of x in
// float32, with the widest kernels k allows (all give the same bits).
func (t *RopeTable) rotateN(x []float32, c, s []float32, count int, k isa) {
	hd, half := t.headDim, t.half
	x = x[:count*hd]
	from := 0
	if k.avx2 {
		// In place: every block of pairs is loaded before it is stored.
		p := (*byte)(unsafe.Pointer(&x[0]))
		switch {
		case !t.neox:
			if from = half &^ 3; from > 0 {
				rotGPTJF32AVX2(p, p, &c[0], &s[0], from, half, count, 4*hd, 4*hd)
			}
		case k.avx512 && half >= 16:
			from = half &^ 15
			rotNeoXF32AVX512(p, p, &c[0], &s[0], from, half, count, 4*hd, 4*hd)
		case half >= 8:
			from = half &^ 7
			rotNeoXF32AVX2(p, p, &c[0], &s[0], from, half, count, 4*hd, 4*hd)
		}
		if from == half {
			return
		}
	}
	for h := 0; h < count; h++ {
		v := x[h*hd : (h+1)*hd]
		if t.neox {
			rotNeoX(v[from:half], v[half+from:t.rotary], c[from:], s[from:])
		} else {
			rotGPTJ(v[2*from:t.rotary], c[from:], s[from:])
		}
	}
}

// rotNeoX rotates pairs (a[i], b[i]). The explicit float32 conversions stop
// the compiler from fusing a multiply into the subtraction, so the result is
// the same on every architecture.
func rotNeoX(a, b, c, s []float32) {
	n := len(c)
	a, b, s = a[:n], b[:n], s[:n]
	for i := 0; i < n; i++ {
		x0, x1 := a[i], b[i]
		a[i] = float32(x0*c[i]) - float32(x1*s[i])
		b[i] = float32(x1*c[i]) + float32(x0*s[i])
	}
}

// rotGPTJ rotates pairs (x[2i], x[2i+1]).
func rotGPTJ(x, c, s []float32) {
	n := len(c)
	x, s = x[:2*n], s[:n]
	for i := 0; i < n; i++ {
		x0, x1 := x[2*i], x[2*i+1]
		x[2*i] = float32(x0*c[i]) - float32(x1*s[i])
		x[2*i+1] = float32(x1*c[i]) + float32(x0*s[i])
	}
}
