package chunk

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// synthKV fills an entry's KV with values shaped like real attention KV:
// Gaussian per element, with a log-normal scale per (layer, head, dim)
// channel; keys get a few outlier channels per head, 10-30x larger, as
// pre-RoPE keys of Llama-family models have (the reason KIVI quantizes keys
// per channel); values are closer to unit scale with milder channel spread.
func synthKV(rng *rand.Rand, e *Entry) {
	sh := e.Shape()
	es := sh.DType.Size()
	chans := sh.KVHeads * sh.HeadDim
	kScale := make([]float64, chans)
	vScale := make([]float64, chans)
	e.KV = make([]byte, sh.RawBytes())
	put := func(at int, v float64) {
		switch sh.DType {
		case F32:
			binary.LittleEndian.PutUint32(e.KV[at:], math.Float32bits(float32(v)))
		case F16:
			binary.LittleEndian.PutUint16(e.KV[at:], F32ToF16(float32(v)))
		case BF16:
			binary.LittleEndian.PutUint16(e.KV[at:], F32ToBF16(float32(v)))
		}
	}
	lb := sh.LayerBytes()
	for l := 0; l < sh.Layers; l++ {
		for c := range kScale {
			kScale[c] = math.Exp(0.5*rng.NormFloat64() - 0.5)
			if rng.IntN(32) == 0 {
				kScale[c] *= 10 + 20*rng.Float64()
			}
			vScale[c] = 0.3 * math.Exp(0.3*rng.NormFloat64())
		}
		base := l * lb
		for t := 0; t < sh.Tokens; t++ {
			for c := 0; c < chans; c++ {
				put(base+(t*chans+c)*es, kScale[c]*rng.NormFloat64())
				put(base+lb/2+(t*chans+c)*es, vScale[c]*rng.NormFloat64())
			}
		}
	}
}

// synthEntry returns an entry of the given shape with synthetic KV.
func synthEntry(rng *rand.Rand, dt DType, tokens, layers, heads, dim int) *Entry {
	e := testEntry(rng, dt, tokens, layers, heads, dim)
	synthKV(rng, e)
	return e
}

// elemF64 reads element i of a raw tensor.
func elemF64(raw []byte, i int, dt DType) float64 {
	switch dt {
	case F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
	case F16:
		return float64(F16ToF32(binary.LittleEndian.Uint16(raw[2*i:])))
	}
	return float64(BF16ToF32(binary.LittleEndian.Uint16(raw[2*i:])))
}

// mantBits is the number of stored mantissa bits of dt.
func mantBits(dt DType) int {
	switch dt {
	case F32:
		return 23
	case F16:
		return 10
	}
	return 7
}

// ulpOf is the spacing of dt at |v| (its smallest subnormal step near zero).
func ulpOf(dt DType, v float64) float64 {
	minExp := map[DType]int{F32: -126, F16: -14, BF16: -126}[dt]
	_, e := math.Frexp(math.Abs(v)) // |v| in [2^(e-1), 2^e)
	e = max(e-1, minExp)
	return math.Ldexp(1, e-mantBits(dt))
}

// quantGroupsOf maps every element of a layer to its quantization group,
// recomputed independently of the codec: keys group over quantGroupTokens
// tokens per channel, values over quantGroupDims dims per token within a
// head.
func quantGroupsOf(sh Shape) []int {
	chans := sh.KVHeads * sh.HeadDim
	half := sh.Tokens * chans
	groupOf := make([]int, 2*half)
	ng := 0
	for i := 0; i < half; i++ { // keys: (token group, channel)
		groupOf[i] = i/chans/quantGroupTokens*chans + i%chans
		ng = max(ng, groupOf[i]+1)
	}
	dg := (sh.HeadDim + quantGroupDims - 1) / quantGroupDims
	for j := 0; j < half; j++ { // values: (token, head, dim group)
		t, h, d := j/chans, j%chans/sh.HeadDim, j%sh.HeadDim
		groupOf[half+j] = ng + (t*sh.KVHeads+h)*dg + d/quantGroupDims
	}
	return groupOf
}

// lossyBounds returns the error bound the codec documents for every element
// of a raw layer.
func lossyBounds(c Codec, raw []byte, sh Shape) []float64 {
	dt := sh.DType
	groupOf := quantGroupsOf(sh)
	n := len(groupOf)
	bounds := make([]float64, n)
	lo, hi, amax := make([]float64, n), make([]float64, n), make([]float64, n)
	for g := range lo {
		lo[g], hi[g] = math.Inf(1), math.Inf(-1)
	}
	for i := 0; i < n; i++ {
		g, v := groupOf[i], elemF64(raw, i, dt)
		lo[g], hi[g], amax[g] = min(lo[g], v), max(hi[g], v), max(amax[g], math.Abs(v))
	}
	up := 1 + math.Ldexp(1, -mantBits(dt)) // scale rounded up in dt
	tiny := ulpOf(dt, 0)                   // a scale below the smallest normal
	for i := range bounds {
		g, x := groupOf[i], math.Abs(elemF64(raw, i, dt))
		switch c {
		case CodecInt8, CodecInt4:
			levels := 255.0
			if c == CodecInt4 {
				levels = 15
			}
			s := (hi[g]-lo[g])/levels*up + tiny
			bounds[i] = s/2 + ulpOf(dt, x+s)
		case CodecFP8:
			s := amax[g]/FP8E4M3Max*up + tiny
			bounds[i] = max(x/16, s/1024)*(1+1e-6) + ulpOf(dt, x*1.07+s)
		}
	}
	return bounds
}
