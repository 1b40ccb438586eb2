package cudakern

import (
	"fmt"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// DeviceJob is a Job as the CUDA kernels read it: inject.h's kvm_job, field
// for field (the same sizes and order, so its bytes are the kernel's
// argument). DeviceJobOf fills everything but the five addresses, which
// the caller sets to memory the kernel can read: on a GPU, device
// addresses; in the host check, host ones.
type DeviceJob struct {
	// Src points at Layers addresses, each one layer's source bytes: raw
	// canonical K|V, or a codec's encoded layer payload.
	Src uint64
	// Dst points at Layers addresses, each one layer of the cache.
	Dst uint64
	// Slots points at Tokens int64 slots (-1: skip the token).
	Slots uint64
	// CS points at Tokens rows of 2*Half float32: cos then sin of position
	// Pos+t, the RopeTable's own rows (so no cos or sin is computed on the
	// device).
	CS uint64
	// Err points at a uint32 the kernel ORs error bits into (DeviceErr*).
	Err       uint64
	NumBlocks int64
	Layers    int32
	Tokens    int32
	SrcHeads  int32
	HeadLo    int32
	Heads     int32
	HeadDim   int32
	Half      int32
	Rotary    int32
	NeoX      int32
	SrcDType  int32
	DstDType  int32
	Codec     int32 // deviceRaw, deviceInt8, deviceInt4 or deviceFP8
	Order     int32
	BlockSize int32
	CopyV     int32
	SrcKScale float32
	SrcVScale float32
	DstKScale float32
	DstVScale float32
	_         int32
}

// The error bits of DeviceJob.Err (inject.h's KVM_ERR_*): a codec payload
// that chunk's decoder rejects as corrupt.
const (
	DeviceErrParams  = 1 // a non-finite or negative group parameter
	DeviceErrFP8NaN  = 2 // an fp8 NaN code
	DeviceErrPadding = 4 // an int4 padding nibble set
)

// The source encodings of DeviceJob.Codec (inject.h's KVM_RAW...).
const (
	deviceRaw  = 0
	deviceInt8 = 1
	deviceInt4 = 2
	deviceFP8  = 3
)

// deviceCodec maps a chunk codec to the kernels' source encoding. The
// lossless codec's entropy decoding stays on the CPU.
func deviceCodec(c chunk.Codec) (int32, bool) {
	switch c {
	case chunk.CodecRaw:
		return deviceRaw, true
	case chunk.CodecInt8:
		return deviceInt8, true
	case chunk.CodecInt4:
		return deviceInt4, true
	case chunk.CodecFP8:
		return deviceFP8, true
	}
	return 0, false
}

// DeviceJobOf checks j as Inject does and returns the kernels' view of it,
// addresses zero. With codec chunk.CodecRaw the source layers are raw
// canonical layers (j.Src, checked, or device memory when j.Src is nil); with CodecInt8, CodecInt4 or CodecFP8 each
// source layer is that codec's encoded payload of one layer of an entry in
// j.SrcDType (F32, F16 or BF16) with j.SrcHeads heads and j.Tokens tokens,
// EncodedLayerBytes long (j.Src is not read), decoded in the same pass.
func DeviceJobOf(j *Job, codec chunk.Codec) (DeviceJob, error) {
	c, ok := deviceCodec(codec)
	if !ok {
		return DeviceJob{}, fmt.Errorf("%w: codec %v has no device decoder", ErrInvalidJob, codec)
	}
	if c != deviceRaw && j.SrcDType != chunk.F32 && j.SrcDType != chunk.F16 && j.SrcDType != chunk.BF16 {
		return DeviceJob{}, fmt.Errorf("%w: %v payload of a %v entry", ErrInvalidJob, codec, j.SrcDType)
	}
	devDst := len(j.Dst) > 0
	for _, d := range j.Dst {
		devDst = devDst && d == nil
	}
	p, err := j.planSrc(c == deviceRaw && j.Src != nil, devDst)
	if err != nil {
		return DeviceJob{}, err
	}
	t, l := p.Rope, p.Layout
	return DeviceJob{
		NumBlocks: int64(l.NumBlocks),
		Layers:    int32(len(p.Dst)),
		Tokens:    int32(p.Tokens),
		SrcHeads:  int32(p.SrcHeads),
		HeadLo:    int32(p.HeadLo),
		Heads:     int32(p.heads),
		HeadDim:   int32(l.HeadDim),
		Half:      int32(t.half),
		Rotary:    int32(t.rotary),
		NeoX:      int32(b2i(t.neox)),
		SrcDType:  int32(p.SrcDType),
		DstDType:  int32(l.DType),
		Codec:     c,
		Order:     int32(l.Order),
		BlockSize: int32(l.BlockSize),
		CopyV:     int32(b2i(p.copyV)),
		SrcKScale: p.srcKScale,
		SrcVScale: p.srcVScale,
		DstKScale: p.dstKScale,
		DstVScale: p.dstVScale,
	}, nil
}

// A Dst of nil layers (all of them) names device memory the caller
// passes the kernel: only their count is checked.

// EncodedLayerBytes is the size of one layer's payload of a quantizing
// codec (chunk's quantized layer: group parameters and codes of K, then
// of V), as DeviceJobOf's codec sources must be. It is 0 for other codecs.
func EncodedLayerBytes(codec chunk.Codec, dt chunk.DType, tokens, heads, headDim int) int {
	c, ok := deviceCodec(codec)
	if !ok || c == deviceRaw {
		return 0
	}
	params := 2
	if c == deviceFP8 {
		params = 1
	}
	elems := tokens * heads * headDim
	codes := elems
	if c == deviceInt4 {
		codes = (elems + 1) / 2
	}
	ps := params * dt.Size()
	kGroups := (tokens + 63) / 64 * heads * headDim
	vGroups := tokens * heads * ((headDim + 63) / 64)
	return ps*(kGroups+vGroups) + 2*codes
}

// CosSin appends the cos/sin rows of j's positions (Tokens rows of cos
// then sin, RotaryDim/2 each: DeviceJob.CS) to dst. j must be valid.
func (j *Job) CosSin(dst []float32) []float32 {
	for t := 0; t < j.Tokens; t++ {
		c, s := j.Rope.Row(j.Pos + t)
		dst = append(append(dst, c...), s...)
	}
	return dst
}

// CompactJob is j writing into a compact cache instead of j.Layout: the
// same dtype, scales and heads, one slot per token (slot t for token t, -1
// where j skips it), NHD, in new Dst layers. It writes exactly the head
// vectors j writes, Tokens*KVHeads*HeadDim elements of K and of V per
// layer, and ScatterCompact puts them into j's slots. It is the CUDA
// injector's path for a cache in host memory: only those bytes cross the
// bus.
func CompactJob(j *Job) Job {
	l := j.Layout
	c := *j
	c.Layout = compactLayout(j)
	c.Slots = make([]int, j.Tokens)
	for t, s := range j.Slots {
		c.Slots[t] = t
		if s < 0 {
			c.Slots[t] = -1
		}
	}
	c.Layout.KScale, c.Layout.VScale = l.KScale, l.VScale
	c.Dst = make([][]byte, len(j.Dst))
	for i := range c.Dst {
		c.Dst[i] = make([]byte, c.Layout.LayerBytes())
	}
	return c
}

func compactLayout(j *Job) pagedkv.CacheLayout {
	l := j.Layout
	return pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: max(j.Tokens, 1), BlockSize: 1, KVHeads: l.KVHeads, HeadDim: l.HeadDim, DType: l.DType}
}

// ScatterCompact copies the head vectors c (CompactJob(j), run) wrote into
// j.Dst, token by token, so that of two tokens naming one slot the later
// wins, as in Inject.
func ScatterCompact(j, c *Job) {
	l, cl := j.Layout, compactLayout(j)
	row := l.HeadDim * l.DType.Size()
	for li, d := range j.Dst {
		o := c.Dst[li]
		for t, s := range j.Slots {
			if s < 0 {
				continue
			}
			for kv := 0; kv < 2; kv++ {
				for h := 0; h < l.KVHeads; h++ {
					from := cl.Offset(kv, t, h)
					copy(d[l.Offset(kv, s, h):][:row], o[from:from+row])
				}
			}
		}
	}
}
