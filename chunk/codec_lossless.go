package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/klauspost/compress/huff0"
)

// The lossless codec splits each element into planes so that the exponent,
// which KV tensors concentrate on a few values, lands in a plane of its own,
// and entropy-codes every plane with huff0, storing a plane raw when it does
// not shrink (the mantissa planes, in practice).
//
// Planes per dtype (u is the element's bits):
//
//	bf16: exponent (u>>7)&0xff | sign<<7 | mantissa u&0x7f
//	f16:  exponent (u>>10)&0x1f | low byte u&0xff | sign and mantissa bits 9, 8
//	f32:  exponent (u>>23)&0xff | sign<<7 | mantissa bits 22..16 | bits 15..8 | bits 7..0
//
// Putting the whole exponent in one plane is never worse than coding the
// high byte: H(exp) <= 1 + H(exp>>1), and the sign is close to a fair coin.
// The f16 sign and the top two mantissa bits are close to incompressible,
// so they are packed three bits an element (the bits plane, below) and the
// exponent plane alone is entropy-coded: under 3 bits a symbol, which
// huffDecoder decodes several symbols a lookup.
//
// The f16 layout is the second one: layers written before it (f16 planes
// of the high byte u>>8 and the low byte) start with a plane mode byte
// (0-3); a layer in today's f16 layout starts with layoutF16Exp, which no
// plane mode equals, so a decoder tells the two apart by a layer's first
// byte and both stay readable. bf16 and f32 layers have one layout and no
// such byte.
//
// The f16 bits plane holds, per group of 16 elements of a block (the last
// group of a block zero-padded), three u16 LE words: the signs (bit 15),
// mantissa bits 9 and mantissa bits 8, element j of the group in bit j of
// each word: 6 bytes per 16 elements.
//
// Why huff0 and not zstd: the planes have no repeated strings for LZ77 to
// find, only a skewed byte histogram, which is what huff0 codes. Measured by
// BenchmarkExponentPlane on the synthetic Llama-shaped chunk (one layer's
// exponent plane; 2-core VM; GB/s per CPU-second, encode/decode):
//
//	bf16 exponent plane   huff0 2.86x 0.6/1.4   zstd fastest 2.44x 0.15/0.75
//	                      zstd default 2.34x 0.07/0.5   better 2.37x 0.07/0.7
//	f16 high-byte plane   huff0 1.38x 0.7-0.9/1.3   zstd better 1.38x 0.3-0.45/1.1
//	(the layout before    (zstd fastest and default leave it raw: 1.00x)
//	layoutF16Exp)
//
// huff0 wins on ratio and speed everywhere, so the codec uses huff0 alone.
//
// Layer layout: for f16 the byte layoutF16Exp; then the K half then the V
// half, each cut into blocks of losslessBlock elements (the last one
// shorter); per block, per plane:
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

// Blocks shorter than this use huff0's single-stream format (1X); the
// others its four-stream format (4X), whose jump table and three more
// stream ends cost about 8 bytes and whose streams decode side by side:
// huff0 decodes a 3072-symbol exponent plane about twice as fast in 4X,
// table included (the planes of a small model's short chunk: 1.2 ns a
// symbol against 2.7+). Blocks written before 4X went down to this size
// have 1X up to 4095 symbols; decoders read both at any size.
const huff4XMin = 1 << 9

// layoutF16Exp starts every f16 layer in the exponent layout (the planes
// exponent, low byte, bits); it is no plane mode.
const layoutF16Exp = 0x10

// planeLayout is how a layer's elements are cut into planes.
type planeLayout uint8

const (
	// layoutBytes: the byte planes of the table above, and for f16 the
	// high and the low byte (the first f16 layout).
	layoutBytes planeLayout = iota
	// layoutExp16: f16 as exponent, low byte and bits planes.
	layoutExp16
)

// planes returns how many planes a block of m elements has in layout l and
// each one's size in bytes.
func (l planeLayout) planes(dt DType, m int) (np int, size [4]int) {
	if l == layoutExp16 {
		return 3, [4]int{m, m, f16BitsBytes(m)}
	}
	return dt.Size(), [4]int{m, m, m, m}
}

// maxBits is the longest mean code (bits a symbol) of a huff0 coding of
// plane p that encoders keep. The low byte and bits planes of the f16
// exponent layout are close to incompressible: a coding that saves a few
// bytes would cost a decode through huff0's decoder, so they are coded
// only where huffDecoder takes them (huffMultiMaxBits) and otherwise
// stored raw, which decodes for free.
func (l planeLayout) maxBits(p int) int {
	if l == layoutExp16 && p > 0 {
		return huffMultiMaxBits
	}
	return 8
}

// f16BitsBytes is the size of the bits plane of m f16 elements.
func f16BitsBytes(m int) int { return 6 * ((m + 15) / 16) }

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

// encode writes f16 in the exponent layout and the other dtypes in byte
// planes.
func (c planeCodec) encode(dst, raw []byte, sh Shape) ([]byte, error) {
	l := layoutBytes
	if c.dt == F16 {
		l = layoutExp16
	}
	return c.encodeLayout(dst, raw, l)
}

// encodeLayout is encode in layout l (tests write the first f16 layout
// with it, which decoders still read).
func (c planeCodec) encodeLayout(dst, raw []byte, l planeLayout) ([]byte, error) {
	es := c.dt.Size()
	n := len(raw) / es
	if n*es != len(raw) || n%2 != 0 || (l == layoutExp16 && c.dt != F16) {
		return dst, fmt.Errorf("%w: layer of %d bytes for %v", ErrInvalidEntry, len(raw), c.dt)
	}
	s := planeScratchPool.Get().(*planeScratch)
	defer planeScratchPool.Put(s)
	if l == layoutExp16 {
		dst = append(dst, layoutF16Exp)
	}
	half := n / 2
	for h := 0; h < 2; h++ {
		for b := h * half; b < (h+1)*half; b += losslessBlock {
			m := min(losslessBlock, (h+1)*half-b)
			np, size := l.planes(c.dt, m)
			if l == layoutExp16 {
				splitF16Exp(&s.planes, raw[b*es:(b+m)*es])
			} else {
				split(&s.planes, raw[b*es:(b+m)*es], c.dt)
			}
			for p := 0; p < np; p++ {
				dst = appendPlane(dst, s.planes[p][:size[p]], &s.huff, l.maxBits(p))
			}
		}
	}
	return dst, nil
}

// appendPlane appends one plane block in the smallest of its encodings,
// keeping a huff0 coding only where it takes at most maxBits bits a symbol
// (table included): 8 keeps any that shrinks the plane.
func appendPlane(dst, plane []byte, hs *huff0.Scratch, maxBits int) []byte {
	var out []byte
	var err error
	mode := byte(planeHuff4X)
	if maxBits < 8 && len(plane) >= 64*entropyStride && entropyBits(plane, entropyStride) > float64(maxBits)+0.5 {
		// No Huffman code is shorter than the entropy: huff0 could only
		// find a coding this plane does not keep. The estimate reads
		// every entropyStride-th byte (counting every byte cost a fifth
		// of an f16 encode); the margin covers its error.
		err = huff0.ErrIncompressible
	} else if len(plane) >= huff4XMin {
		out, _, err = huff0.Compress4X(plane, hs)
	} else {
		mode = planeHuff1X
		out, _, err = huff0.Compress1X(plane, hs)
	}
	switch {
	case err == nil && 8*len(out) <= maxBits*len(plane):
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
	l := layoutBytes
	if c.dt == F16 && len(enc) > 0 && enc[0] == layoutF16Exp {
		l, enc = layoutExp16, enc[1:]
	}
	s := planeScratchPool.Get().(*planeScratch)
	defer planeScratchPool.Put(s)
	var planes [4][]byte
	half := n / 2
	for h := 0; h < 2; h++ {
		for b := h * half; b < (h+1)*half; b += losslessBlock {
			m := min(losslessBlock, (h+1)*half-b)
			np, size := l.planes(c.dt, m)
			for p := 0; p < np; p++ {
				var err error
				planes[p], enc, err = readPlane(enc, s.planes[p][:size[p]], s)
				if err != nil {
					return fmt.Errorf("%w: block at element %d, plane %d: %v", ErrCorrupt, b, p, err)
				}
			}
			out := dst[b*es : (b+m)*es]
			if l == layoutBytes {
				merge(out, &planes, c.dt)
			} else if !mergeF16Exp(out, planes[0], planes[1], planes[2]) {
				return fmt.Errorf("%w: block at element %d: f16 exponent over 31 or bits past the block", ErrCorrupt, b)
			}
		}
	}
	if len(enc) != 0 {
		return fmt.Errorf("%w: %d trailing bytes in lossless layer", ErrCorrupt, len(enc))
	}
	return nil
}

// huffMultiMin is the smallest block that huffDecoder decodes. Its table
// (every 11-bit window's codes) costs about as much as huff0's decoder
// spends on 30000 exponent symbols more than huffDecoder, so smaller blocks
// go to huff0's decoder (measured per CPU-second on exponent planes of the
// synthetic Llama chunk, table and decode, huffDecoder against huff0's
// decoder: 16384 symbols 1.26 ns a symbol against 0.87, 32768 0.74
// against 0.79, 65536 0.56 against 0.76).
const huffMultiMin = 1 << 15

// huffMultiMaxBits is the largest mean code length (bits a symbol, table
// included) of the blocks that huffDecoder decodes.
const huffMultiMaxBits = 4

// readPlane decodes the plane block at the start of enc into buf (whose
// length is the block size) and returns the plane, which may alias enc, and
// the rest of enc. 4X blocks of huffMultiMin bytes or more and short codes
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
		// exponent planes (under 3 bits a symbol), not the f16 high byte
		// of the first f16 layout (about 6); and where the block is long
		// enough to pay for its table (huffMultiMin).
		if m < huffMultiMin || len(body) > huffMultiMaxBits*m/8 {
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

// entropyStride is the sampling of appendPlane's entropy estimate.
const entropyStride = 8

// entropyBits is the empirical entropy, in bits a byte, of every
// stride-th byte of plane.
func entropyBits(plane []byte, stride int) float64 {
	var count [256]uint32
	for i := 0; i < len(plane); i += stride {
		count[plane[i]]++
	}
	n := float64((len(plane) + stride - 1) / stride)
	h := 0.0
	for _, c := range count {
		if c != 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return h
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

// splitF16Exp scatters the f16 elements of raw into the planes of the
// exponent layout: exponents, low bytes, and the bits plane. Whole groups
// go four elements per 8-byte load.
func splitF16Exp(planes *[4][losslessBlock]byte, raw []byte) {
	n := len(raw) / 2
	exp, lo, bits := planes[0][:n], planes[1][:n], planes[2][:f16BitsBytes(n)]
	g := 0
	for ; g+16 <= n; g += 16 {
		var sign, m9, m8 uint16
		for q := 0; q < 16; q += 4 {
			v := binary.LittleEndian.Uint64(raw[2*(g+q):])
			binary.LittleEndian.PutUint32(exp[g+q:], unspread(v>>10&0x001f_001f_001f_001f))
			binary.LittleEndian.PutUint32(lo[g+q:], unspread(v&0x00ff_00ff_00ff_00ff))
			sign |= gather4(v>>15) << q
			m9 |= gather4(v>>9) << q
			m8 |= gather4(v>>8) << q
		}
		w := bits[6*g/16:]
		binary.LittleEndian.PutUint16(w, sign)
		binary.LittleEndian.PutUint16(w[2:], m9)
		binary.LittleEndian.PutUint16(w[4:], m8)
	}
	if g == n {
		return
	}
	var sign, m9, m8 uint16
	for j := 0; g+j < n; j++ {
		i := g + j
		u := binary.LittleEndian.Uint16(raw[2*i:])
		exp[i] = byte(u>>10) & 0x1f
		lo[i] = byte(u)
		sign |= u >> 15 << j
		m9 |= u >> 9 & 1 << j
		m8 |= u >> 8 & 1 << j
	}
	w := bits[6*g/16:]
	binary.LittleEndian.PutUint16(w, sign)
	binary.LittleEndian.PutUint16(w[2:], m9)
	binary.LittleEndian.PutUint16(w[4:], m8)
}

// unspread is the inverse of spread: the low bytes of the four 16-bit
// lanes of v (whose high bytes are zero), lane 0 in byte 0.
func unspread(v uint64) uint32 {
	v = (v | v>>8) & 0x0000_ffff_0000_ffff
	return uint32(v | v>>16)
}

// gather4 returns bit 0 of the four 16-bit lanes of v in bits 0-3: one
// product puts lane i's bit (at 16i) at 48+i, and no other term reaches
// bit 48.
func gather4(v uint64) uint16 {
	const lanes, m = 0x0001_0001_0001_0001, 1<<48 | 1<<33 | 1<<18 | 1<<3
	return uint16((v & lanes) * m >> 48 & 0xf)
}

// mergeF16Exp is the inverse of splitF16Exp: it writes the len(raw)/2
// elements whose planes are exp, lo (that many bytes each) and bits
// (f16BitsBytes of them). It reports false where no split gives the
// planes: an exponent over 31, or a set bit past the last element. Whole
// groups of 16 go through the AVX2 kernel where useAVX2, and
// mergeF16ExpGo does the rest.
func mergeF16Exp(raw, exp, lo, bits []byte) bool {
	n := len(raw) / 2
	ok := true
	if k := n &^ 15; useAVX2 && k > 0 {
		exp, lo, bits = exp[:n], lo[:n], bits[:f16BitsBytes(n)]
		ok = !mergeF16ExpAVX2(&raw[0], &exp[0], &lo[0], &bits[0], k)
		raw, exp, lo, bits = raw[2*k:2*n], exp[k:], lo[k:], bits[6*k/16:]
	}
	return mergeF16ExpGo(raw, exp, lo, bits) && ok
}

// mergeF16ExpGo is mergeF16Exp in Go: the kernel's reference. It writes
// every element even where it reports false, as the kernel does (an
// exponent's bit 5 lands on the sign, its bits 6 and 7 shift out). Whole
// groups go four elements per 8-byte store, the last partial group one
// element at a time.
func mergeF16ExpGo(raw, exp, lo, bits []byte) bool {
	n := len(raw) / 2
	raw, exp, lo, bits = raw[:2*n], exp[:n], lo[:n], bits[:f16BitsBytes(n)]
	var or uint32
	g := 0
	for ; g+16 <= n; g += 16 {
		w, e, l, r := bits[6*g/16:6*g/16+6], exp[g:g+16], lo[g:g+16], raw[2*g:2*g+32]
		sign := uint64(binary.LittleEndian.Uint16(w))
		m9 := uint64(binary.LittleEndian.Uint16(w[2:]))
		m8 := uint64(binary.LittleEndian.Uint16(w[4:]))
		for q := 0; q < 16; q += 4 {
			e4 := binary.LittleEndian.Uint32(e[q : q+4])
			or |= e4
			v := spread(e4)&0x003f_003f_003f_003f<<10 | spread(binary.LittleEndian.Uint32(l[q:q+4])) |
				scatter4(sign>>q)<<15 | scatter4(m9>>q)<<9 | scatter4(m8>>q)<<8
			binary.LittleEndian.PutUint64(r[2*q:2*q+8], v)
		}
	}
	ok := or&0xe0e0_e0e0 == 0
	if g == n {
		return ok
	}
	w := bits[6*g/16:]
	sign := binary.LittleEndian.Uint16(w)
	m9 := binary.LittleEndian.Uint16(w[2:])
	m8 := binary.LittleEndian.Uint16(w[4:])
	k := n - g
	ok = ok && (sign|m9|m8)>>k == 0
	for j := 0; j < k; j++ {
		e := exp[g+j]
		ok = ok && e < 32
		u := sign>>j&1<<15 | uint16(e)<<10 | m9>>j&1<<9 | m8>>j&1<<8 | uint16(lo[g+j])
		binary.LittleEndian.PutUint16(raw[2*(g+j):], u)
	}
	return ok
}

// scatter4 is the inverse of gather4: bits 0-3 of x in bit 0 of four
// 16-bit lanes. One product puts bit i at 16i (among others that no lane
// bit holds).
func scatter4(x uint64) uint64 {
	const m, lanes = 1 | 1<<15 | 1<<30 | 1<<45, 0x0001_0001_0001_0001
	return x & 0xf * m & lanes
}
