package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/huff0"
)

// The lossless codec splits each element into byte planes so that the
// exponent, which KV tensors concentrate on a few values, lands in a plane of
// its own, and entropy-codes every plane with huff0, storing a plane raw when
// it does not shrink (the mantissa planes, in practice).
//
// Planes per dtype (u is the element's bits):
//
//	bf16: exponent (u>>7)&0xff | sign<<7 | mantissa u&0x7f
//	f16:  high byte u>>8 (sign, exponent, 2 mantissa bits) | low byte
//	f32:  exponent (u>>23)&0xff | sign<<7 | mantissa bits 22..16 | bits 15..8 | bits 7..0
//
// Putting the whole bf16 exponent in one byte is never worse than coding the
// high byte: H(exp) <= 1 + H(exp>>1), and the sign is close to a fair coin.
//
// Why huff0 and not zstd: the planes have no repeated strings for LZ77 to
// find, only a skewed byte histogram, which is what huff0 codes. Measured by
// BenchmarkExponentPlane on the synthetic Llama-shaped chunk (one layer's
// exponent plane; 2-core VM; GB/s per CPU-second, encode/decode):
//
//	bf16 exponent plane   huff0 2.86x 0.6/1.4   zstd fastest 2.44x 0.15/0.75
//	                      zstd default 2.34x 0.07/0.5   better 2.37x 0.07/0.7
//	f16 high-byte plane   huff0 1.38x 0.7-0.9/1.3   zstd better 1.38x 0.3-0.45/1.1
//	                      (zstd fastest and default leave it raw: 1.00x)
//
// huff0 wins on ratio and speed everywhere, so the codec uses huff0 alone.
//
// Layer layout: the K half then the V half, each cut into blocks of
// losslessBlock elements (the last one shorter); per block, per plane:
//
//	mode u8   (planeRaw, planeRLE, planeHuff1X, planeHuff4X)
//	length u32 LE of the body
//	body      (raw bytes; the one repeated byte; a huff0 table and stream)
//
// Block sizes follow from the Shape, so a decoder knows every plane's
// decoded size before it reads a byte and allocates nothing from the blob.
const losslessBlock = 1 << 16

const (
	planeRaw    = 0
	planeRLE    = 1
	planeHuff1X = 2
	planeHuff4X = 3
)

// Blocks shorter than this use huff0's single-stream format; 4X needs a few
// bytes of jump table and pays off on larger blocks.
const huff4XMin = 1 << 12

type planeCodec struct{ dt DType }

// planeScratch holds one block of every plane; pooled so that encode and
// decode do not allocate per call.
type planeScratch struct {
	planes [4][losslessBlock]byte
	huff   huff0.Scratch
	dec    huffDecoder
}

var planeScratchPool = sync.Pool{New: func() any {
	s := &planeScratch{}
	s.huff.Reuse = huff0.ReusePolicyNone
	return s
}}

func (c planeCodec) encode(dst, raw []byte, sh Shape) ([]byte, error) {
	es := c.dt.Size()
	n := len(raw) / es
	if n*es != len(raw) || n%2 != 0 {
		return dst, fmt.Errorf("%w: layer of %d bytes for %v", ErrInvalidEntry, len(raw), c.dt)
	}
	s := planeScratchPool.Get().(*planeScratch)
	defer planeScratchPool.Put(s)
	half := n / 2
	for h := 0; h < 2; h++ {
		for b := h * half; b < (h+1)*half; b += losslessBlock {
			m := min(losslessBlock, (h+1)*half-b)
			split(&s.planes, raw[b*es:(b+m)*es], c.dt)
			for p := 0; p < es; p++ {
				dst = appendPlane(dst, s.planes[p][:m], &s.huff)
			}
		}
	}
	return dst, nil
}

// appendPlane appends one plane block in the smallest of its encodings.
func appendPlane(dst, plane []byte, hs *huff0.Scratch) []byte {
	var out []byte
	var err error
	mode := byte(planeHuff4X)
	if len(plane) >= huff4XMin {
		out, _, err = huff0.Compress4X(plane, hs)
	} else {
		mode = planeHuff1X
		out, _, err = huff0.Compress1X(plane, hs)
	}
	switch {
	case err == nil:
	case errors.Is(err, huff0.ErrUseRLE):
		mode, out = planeRLE, plane[:1]
	default: // incompressible, or anything else: raw is always valid
		mode, out = planeRaw, plane
	}
	dst = append(dst, mode)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(out)))
	return append(dst, out...)
}

func (c planeCodec) decode(dst, enc []byte, sh Shape) error {
	es := c.dt.Size()
	n := len(dst) / es
	if n*es != len(dst) || n%2 != 0 {
		return fmt.Errorf("%w: layer of %d bytes for %v", ErrInvalidEntry, len(dst), c.dt)
	}
	s := planeScratchPool.Get().(*planeScratch)
	defer planeScratchPool.Put(s)
	var planes [4][]byte
	half := n / 2
	for h := 0; h < 2; h++ {
		for b := h * half; b < (h+1)*half; b += losslessBlock {
			m := min(losslessBlock, (h+1)*half-b)
			for p := 0; p < es; p++ {
				var err error
				planes[p], enc, err = readPlane(enc, s.planes[p][:m], s)
				if err != nil {
					return fmt.Errorf("%w: block at element %d, plane %d: %v", ErrCorrupt, b, p, err)
				}
			}
			merge(dst[b*es:(b+m)*es], &planes, c.dt)
		}
	}
	if len(enc) != 0 {
		return fmt.Errorf("%w: %d trailing bytes in lossless layer", ErrCorrupt, len(enc))
	}
	return nil
}

// huffMultiMaxBits is the largest mean code length (bits a symbol, table
// included) of the blocks that huffDecoder decodes.
const huffMultiMaxBits = 4

// readPlane decodes the plane block at the start of enc into buf (whose
// length is the block size) and returns the plane, which may alias enc, and
// the rest of enc. 4X blocks of huff4XMin bytes or more and short codes
// go through huffDecoder, the others through huff0's decoder.
func readPlane(enc, buf []byte, s *planeScratch) (plane, rest []byte, err error) {
	if len(enc) < 5 {
		return nil, nil, errors.New("truncated plane header")
	}
	mode := enc[0]
	ln := binary.LittleEndian.Uint32(enc[1:])
	enc = enc[5:]
	if uint64(ln) > uint64(len(enc)) {
		return nil, nil, fmt.Errorf("plane of %d bytes, %d left", ln, len(enc))
	}
	body, rest := enc[:ln], enc[ln:]
	m := len(buf)
	switch mode {
	case planeRaw:
		if len(body) != m {
			return nil, nil, fmt.Errorf("raw plane of %d bytes, want %d", len(body), m)
		}
		return body, rest, nil
	case planeRLE:
		if len(body) != 1 {
			return nil, nil, fmt.Errorf("rle plane of %d bytes", len(body))
		}
		for i := range buf {
			buf[i] = body[0]
		}
		return buf, rest, nil
	case planeHuff4X:
		// huffDecoder pays off where a lookup finds several codes: the
		// bf16 exponent plane (under 3 bits a symbol), not the f16 high
		// byte (about 6).
		if m < huff4XMin || len(body) > huffMultiMaxBits*m/8 {
			break
		}
		data, err := s.dec.readTable(body)
		if err != nil {
			return nil, nil, err
		}
		if err := s.dec.decompress4X(buf, data); err != nil {
			return nil, nil, err
		}
		return buf, rest, nil
	}
	switch mode {
	case planeHuff1X, planeHuff4X:
		hs := &s.huff
		_, data, err := huff0.ReadTable(body, hs)
		if err != nil {
			return nil, nil, err
		}
		var out []byte
		if mode == planeHuff4X {
			out, err = hs.Decoder().Decompress4X(buf[:0:m], data)
		} else {
			out, err = hs.Decoder().Decompress1X(buf[:0:m], data)
		}
		if err != nil {
			return nil, nil, err
		}
		if len(out) != m {
			return nil, nil, fmt.Errorf("huff0 plane decoded to %d bytes, want %d", len(out), m)
		}
		return out, rest, nil
	}
	return nil, nil, fmt.Errorf("plane mode %d", mode)
}

// split scatters the elements of raw into byte planes.
func split(planes *[4][losslessBlock]byte, raw []byte, dt DType) {
	switch dt {
	case BF16:
		n := len(raw) / 2
		raw = raw[:2*n]
		p0, p1 := planes[0][:n], planes[1][:n]
		for i := range p0 {
			u := binary.LittleEndian.Uint16(raw[2*i:])
			p0[i] = byte(u >> 7)
			p1[i] = byte(u>>8)&0x80 | byte(u)&0x7f
		}
	case F16:
		n := len(raw) / 2
		raw = raw[:2*n]
		p0, p1 := planes[0][:n], planes[1][:n]
		for i := range p0 {
			u := binary.LittleEndian.Uint16(raw[2*i:])
			p0[i] = byte(u >> 8)
			p1[i] = byte(u)
		}
	case F32:
		n := len(raw) / 4
		p0, p1, p2, p3 := planes[0][:n], planes[1][:n], planes[2][:n], planes[3][:n]
		for i := range p0 {
			u := binary.LittleEndian.Uint32(raw[4*i:])
			p0[i] = byte(u >> 23)
			p1[i] = byte(u>>24)&0x80 | byte(u>>16)&0x7f
			p2[i] = byte(u >> 8)
			p3[i] = byte(u)
		}
	}
}

// merge is the inverse of split; every plane holds len(raw)/dt.Size() bytes.
// 16-bit elements go through the AVX2 kernels where useAVX2, 16 at a time,
// and mergeGo does the rest.
func merge(raw []byte, planes *[4][]byte, dt DType) {
	n := len(raw) / 2
	if k := n &^ 15; useAVX2 && dt != F32 && k > 0 {
		p0, p1 := planes[0][:n], planes[1][:n]
		if dt == BF16 {
			mergeBF16AVX2(&raw[0], &p0[0], &p1[0], k)
		} else {
			mergeF16AVX2(&raw[0], &p0[0], &p1[0], k)
		}
		rest := [4][]byte{p0[k:], p1[k:]}
		mergeGo(raw[2*k:2*n], &rest, dt)
		return
	}
	mergeGo(raw, planes, dt)
}

// mergeGo is merge in Go: the kernels' reference. The 16-bit cases take
// eight elements per step: one 8-byte load from each plane, whose bytes
// spread into 16-bit lanes (spread) and combine into two 8-byte stores.
func mergeGo(raw []byte, planes *[4][]byte, dt DType) {
	switch dt {
	case BF16:
		n := len(raw) / 2
		raw = raw[:2*n]
		p0, p1 := planes[0][:n], planes[1][:n]
		// Sign and mantissa bytes in place (sign at bit 15 of each
		// element, mantissa at bits 0-6), exponents shifted in.
		const sign, mant = 0x0080_0080_0080_0080, 0x007f_007f_007f_007f
		for len(p0) >= 8 && len(p1) >= 8 && len(raw) >= 16 {
			e, sm := binary.LittleEndian.Uint64(p0), binary.LittleEndian.Uint64(p1)
			x, s := spread(uint32(e)), spread(uint32(sm))
			binary.LittleEndian.PutUint64(raw, s&sign<<8|x<<7|s&mant)
			x, s = spread(uint32(e>>32)), spread(uint32(sm>>32))
			binary.LittleEndian.PutUint64(raw[8:], s&sign<<8|x<<7|s&mant)
			raw, p0, p1 = raw[16:], p0[8:], p1[8:]
		}
		for i := range p0 {
			e, sm := uint16(p0[i]), uint16(p1[i])
			binary.LittleEndian.PutUint16(raw[2*i:], sm&0x80<<8|e<<7|sm&0x7f)
		}
	case F16:
		n := len(raw) / 2
		raw = raw[:2*n]
		p0, p1 := planes[0][:n], planes[1][:n]
		for len(p0) >= 8 && len(p1) >= 8 && len(raw) >= 16 {
			hi, lo := binary.LittleEndian.Uint64(p0), binary.LittleEndian.Uint64(p1)
			binary.LittleEndian.PutUint64(raw, spread(uint32(hi))<<8|spread(uint32(lo)))
			binary.LittleEndian.PutUint64(raw[8:], spread(uint32(hi>>32))<<8|spread(uint32(lo>>32)))
			raw, p0, p1 = raw[16:], p0[8:], p1[8:]
		}
		for i := range p0 {
			binary.LittleEndian.PutUint16(raw[2*i:], uint16(p0[i])<<8|uint16(p1[i]))
		}
	case F32:
		n := len(raw) / 4
		p0, p1, p2, p3 := planes[0][:n], planes[1][:n], planes[2][:n], planes[3][:n]
		for i := range p0 {
			sm := uint32(p1[i])
			u := sm&0x80<<24 | uint32(p0[i])<<23 | sm&0x7f<<16 | uint32(p2[i])<<8 | uint32(p3[i])
			binary.LittleEndian.PutUint32(raw[4*i:], u)
		}
	}
}

// spread puts the four bytes of x in the low bytes of four 16-bit lanes,
// byte 0 in lane 0.
func spread(x uint32) uint64 {
	v := uint64(x)
	v = (v | v<<16) & 0x0000_ffff_0000_ffff
	return (v | v<<8) & 0x00ff_00ff_00ff_00ff
}
