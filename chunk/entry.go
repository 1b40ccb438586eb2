package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Errors a decoder returns; every decode failure wraps one of them.
var (
	// ErrCorrupt: the blob is truncated, inconsistent or fails a checksum.
	ErrCorrupt = errors.New("chunk: corrupt entry")
	// ErrTooLarge: the blob or its header exceeds the configured Limits.
	ErrTooLarge = errors.New("chunk: entry exceeds limits")
	// ErrUnsupported: a version or codec this build does not know.
	ErrUnsupported = errors.New("chunk: unsupported entry")
	// ErrInvalidEntry: an Entry to encode, or a range to read, is malformed.
	ErrInvalidEntry = errors.New("chunk: invalid entry")
)

// Magic starts every encoded entry.
const Magic = "KVMC"

// Version is the entry format version this package writes.
const Version = 1

// Entry is a decoded chunk: its key, its tokens, and its pre-RoPE K and V in
// the canonical layout [layer][K|V][token][kv_head][head_dim] in DType.
type Entry struct {
	Key     Key
	DType   DType
	Layers  int
	KVHeads int
	HeadDim int
	Tokens  []uint32
	KV      []byte
}

// LayerBytes is the raw size of one layer's K and V.
func (e *Entry) LayerBytes() int { return 2 * len(e.Tokens) * e.KVHeads * e.HeadDim * e.DType.Size() }

// Shape is the tensor geometry an entry header declares.
type Shape struct {
	DType   DType
	Tokens  int
	Layers  int
	KVHeads int
	HeadDim int
}

// LayerBytes is the raw size of one layer's K and V.
func (s Shape) LayerBytes() int { return 2 * s.Tokens * s.KVHeads * s.HeadDim * s.DType.Size() }

// RawBytes is the raw size of all layers.
func (s Shape) RawBytes() int { return s.Layers * s.LayerBytes() }

// Limits bound what a decoder accepts, so a hostile header cannot make it
// allocate. The zero value means DefaultLimits.
type Limits struct {
	MaxBlobBytes int // encoded size
	MaxRawBytes  int // decoded tensor size
	MaxTokens    int
	MaxLayers    int
	MaxKVHeads   int
	MaxHeadDim   int
}

// DefaultLimits fit any current model: 256 MiB raw per entry (a 4096-token
// chunk of Llama-3.1-70B in bf16 is 1.25 GiB, so raise it for such chunks).
var DefaultLimits = Limits{
	MaxBlobBytes: 512 << 20,
	MaxRawBytes:  256 << 20,
	MaxTokens:    1 << 16,
	MaxLayers:    1024,
	MaxKVHeads:   1024,
	MaxHeadDim:   4096,
}

func (l Limits) orDefault() Limits {
	if l == (Limits{}) {
		return DefaultLimits
	}
	return l
}

// Fixed header layout (little-endian); docs/ARCHITECTURE.md shows it.
//
//	0  magic "KVMC"       4   version u16    6  codec u8   7  dtype u8
//	8  fingerprint 16     24  content ID 16
//	40 context kind u8    41  pad 3          44 window u32
//	48 context ID 16
//	64 tokens u32  68 layers u32  72 kv heads u32  76 head dim u32
//	80 payload bytes u64
//	88 layer table: per layer (offset u64, encoded length u64, checksum u64)
//	   token IDs: tokens × u32
//	   header checksum u64: xxhash64 of every byte before it
//	   payload: the layers' encoded bytes, in order
//
// The header checksum covers the layer checksums, so it is also the
// checksum of the whole entry (Header.Checksum).
const (
	fixedHeaderBytes = 88
	layerRefBytes    = 24
)

// LayerRef locates one encoded layer within the payload.
type LayerRef struct {
	Offset   uint64
	Length   uint64
	Checksum uint64
}

// Header is the parsed head of an encoded entry.
type Header struct {
	Key      Key
	Codec    Codec
	Shape    Shape
	Layers   []LayerRef
	Tokens   []uint32 // aliases nothing: copied out of the blob
	Checksum uint64   // checksum of the whole entry
	// PayloadStart is where the payload begins in the blob; BlobBytes is
	// the blob's total size.
	PayloadStart int
	BlobBytes    int
}

func validateShape(s Shape, lim Limits) error {
	switch {
	case !s.DType.Valid() || s.DType == FP8E4M3:
		return fmt.Errorf("%w: dtype %v", ErrInvalidEntry, s.DType)
	case s.Tokens <= 0 || s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0:
		return fmt.Errorf("%w: empty shape %+v", ErrInvalidEntry, s)
	case s.Tokens > lim.MaxTokens || s.Layers > lim.MaxLayers || s.KVHeads > lim.MaxKVHeads || s.HeadDim > lim.MaxHeadDim:
		return fmt.Errorf("%w: shape %+v", ErrTooLarge, s)
	}
	// Multiply step by step, stopping as soon as the product passes the
	// limit, so that no Limits (however large) can make it overflow.
	raw, maxRaw := uint64(2*s.DType.Size()), uint64(max(lim.MaxRawBytes, 0))
	for _, f := range [...]int{s.Tokens, s.KVHeads, s.HeadDim, s.Layers} {
		if raw > maxRaw/uint64(f) {
			return fmt.Errorf("%w: shape %+v exceeds %d raw bytes", ErrTooLarge, s, lim.MaxRawBytes)
		}
		raw *= uint64(f)
	}
	return nil
}

// Shape returns the entry's geometry.
func (e *Entry) Shape() Shape {
	return Shape{DType: e.DType, Tokens: len(e.Tokens), Layers: e.Layers, KVHeads: e.KVHeads, HeadDim: e.HeadDim}
}

// Validate checks that the entry is encodable.
func (e *Entry) Validate() error {
	if err := validateShape(e.Shape(), DefaultLimits); err != nil && !errors.Is(err, ErrTooLarge) {
		return err
	}
	if err := CheckKey(e.Key, e.Tokens); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEntry, err)
	}
	if e.Key.Context.Kind == ContextOpaque {
		return fmt.Errorf("%w: %w: an opaque key on a chunk (EncodeOpaque writes opaque values)", ErrInvalidEntry, ErrNonCanonical)
	}
	if len(e.KV) != e.Shape().RawBytes() {
		return fmt.Errorf("%w: %d KV bytes, shape needs %d", ErrInvalidEntry, len(e.KV), e.Shape().RawBytes())
	}
	return nil
}

// Encode appends the encoded entry to dst with the given codec.
func Encode(dst []byte, e *Entry, c Codec) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return dst, err
	}
	lb := e.Shape().LayerBytes()
	return encodeLayers(dst, e.Key, e.Tokens, e.Shape(), c, func(l int) ([]byte, error) { return e.KV[l*lb : (l+1)*lb], nil })
}

// encodeLayers appends the entry of a valid key, tokens and shape whose
// raw layer l is layer(l) (read before the next call) to dst.
func encodeLayers(dst []byte, key Key, tokens []uint32, sh Shape, c Codec, layer func(l int) ([]byte, error)) ([]byte, error) {
	if key.Context.Kind == ContextOpaque && c.Lossy() {
		// Opaque values keep every byte (chunk/opaque.go).
		return dst, fmt.Errorf("%w: opaque entry in the lossy codec %v", ErrInvalidEntry, c)
	}
	lc, err := c.impl(sh.DType)
	if err != nil {
		return dst, err
	}
	start := len(dst)
	headerLen := fixedHeaderBytes + layerRefBytes*sh.Layers + 4*sh.Tokens + 8
	dst = append(dst, make([]byte, headerLen)...)
	h := dst[start:]
	copy(h, Magic)
	binary.LittleEndian.PutUint16(h[4:], Version)
	h[6] = byte(c)
	h[7] = byte(sh.DType)
	putID(h[8:], ID(key.Fingerprint))
	putID(h[24:], key.Content)
	h[40] = byte(key.Context.Kind)
	binary.LittleEndian.PutUint32(h[44:], key.Context.Window)
	putID(h[48:], key.Context.ID)
	binary.LittleEndian.PutUint32(h[64:], uint32(sh.Tokens))
	binary.LittleEndian.PutUint32(h[68:], uint32(sh.Layers))
	binary.LittleEndian.PutUint32(h[72:], uint32(sh.KVHeads))
	binary.LittleEndian.PutUint32(h[76:], uint32(sh.HeadDim))
	tok := h[fixedHeaderBytes+layerRefBytes*sh.Layers:]
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(tok[4*i:], t)
	}
	payloadStart := len(dst)
	for l := 0; l < sh.Layers; l++ {
		raw, err := layer(l)
		if err != nil {
			return dst[:start], err
		}
		off := len(dst)
		dst, err = lc.encode(dst, raw, sh)
		if err != nil {
			return dst[:start], err
		}
		h = dst[start:] // dst may have moved
		ref := h[fixedHeaderBytes+layerRefBytes*l:]
		binary.LittleEndian.PutUint64(ref, uint64(off-payloadStart))
		binary.LittleEndian.PutUint64(ref[8:], uint64(len(dst)-off))
		binary.LittleEndian.PutUint64(ref[16:], xxhash.Sum64(dst[off:]))
	}
	binary.LittleEndian.PutUint64(h[80:], uint64(len(dst)-payloadStart))
	sumAt := headerLen - 8
	binary.LittleEndian.PutUint64(h[sumAt:], xxhash.Sum64(h[:sumAt]))
	return dst, nil
}

func putID(b []byte, id ID) {
	binary.LittleEndian.PutUint64(b, id.Lo)
	binary.LittleEndian.PutUint64(b[8:], id.Hi)
}

func getID(b []byte) ID {
	return ID{Lo: binary.LittleEndian.Uint64(b), Hi: binary.LittleEndian.Uint64(b[8:])}
}

// PeekCodec returns the codec named by the first bytes of an entry that
// is still arriving; false until prefix holds them, or when prefix does
// not start an entry of this version. It checks nothing else: ParseHeader
// or Verify does, on the whole entry.
func PeekCodec(prefix []byte) (Codec, bool) {
	if len(prefix) < 8 || string(prefix[:4]) != Magic || binary.LittleEndian.Uint16(prefix[4:]) != Version {
		return 0, false
	}
	return Codec(prefix[6]), true
}

// ParseHeader reads and verifies the header of blob (not the payload). It
// allocates only the layer table and token IDs, both bounded by lim. A key
// that does not name the entry (CheckKey) is refused with an error wrapping
// both ErrCorrupt and ErrNonCanonical; so are non-zero reserved bytes.
func ParseHeader(blob []byte, lim Limits) (Header, error) {
	lim = lim.orDefault()
	var hd Header
	if len(blob) > lim.MaxBlobBytes {
		return hd, fmt.Errorf("%w: blob of %d bytes", ErrTooLarge, len(blob))
	}
	if len(blob) < fixedHeaderBytes {
		return hd, fmt.Errorf("%w: %d bytes is shorter than a header", ErrCorrupt, len(blob))
	}
	if string(blob[:4]) != Magic {
		return hd, fmt.Errorf("%w: bad magic %q", ErrCorrupt, blob[:4])
	}
	if v := binary.LittleEndian.Uint16(blob[4:]); v != Version {
		return hd, fmt.Errorf("%w: version %d", ErrUnsupported, v)
	}
	hd.Codec = Codec(blob[6])
	u32 := func(at int) int { return int(binary.LittleEndian.Uint32(blob[at:])) }
	hd.Shape = Shape{DType: DType(blob[7]), Tokens: u32(64), Layers: u32(68), KVHeads: u32(72), HeadDim: u32(76)}
	if err := validateShape(hd.Shape, lim); err != nil {
		if errors.Is(err, ErrInvalidEntry) {
			return hd, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		return hd, err
	}
	if err := hd.Codec.check(hd.Shape.DType); err != nil {
		return hd, err
	}
	headerLen := fixedHeaderBytes + layerRefBytes*hd.Shape.Layers + 4*hd.Shape.Tokens + 8
	if len(blob) < headerLen {
		return hd, fmt.Errorf("%w: truncated header", ErrCorrupt)
	}
	sumAt := headerLen - 8
	hd.Checksum = binary.LittleEndian.Uint64(blob[sumAt:])
	if xxhash.Sum64(blob[:sumAt]) != hd.Checksum {
		return hd, fmt.Errorf("%w: header checksum mismatch", ErrCorrupt)
	}
	hd.Key = Key{
		Fingerprint: Fingerprint(getID(blob[8:])),
		Content:     getID(blob[24:]),
		Context:     Context{Kind: ContextKind(blob[40]), Window: binary.LittleEndian.Uint32(blob[44:]), ID: getID(blob[48:])},
	}
	if blob[41]|blob[42]|blob[43] != 0 {
		return hd, fmt.Errorf("%w: reserved header bytes %x are not zero", ErrCorrupt, blob[41:44])
	}
	if err := hd.Key.Context.CheckCanonical(); err != nil {
		return hd, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	payload := binary.LittleEndian.Uint64(blob[80:])
	if payload != uint64(len(blob)-headerLen) {
		return hd, fmt.Errorf("%w: payload of %d bytes, blob holds %d", ErrCorrupt, payload, len(blob)-headerLen)
	}
	hd.PayloadStart, hd.BlobBytes = headerLen, len(blob)
	hd.Layers = make([]LayerRef, hd.Shape.Layers)
	var next uint64
	for l := range hd.Layers {
		ref := blob[fixedHeaderBytes+layerRefBytes*l:]
		r := LayerRef{Offset: binary.LittleEndian.Uint64(ref), Length: binary.LittleEndian.Uint64(ref[8:]), Checksum: binary.LittleEndian.Uint64(ref[16:])}
		if r.Offset != next || r.Length > payload-r.Offset {
			return hd, fmt.Errorf("%w: layer %d at %d+%d outside payload", ErrCorrupt, l, r.Offset, r.Length)
		}
		next = r.Offset + r.Length
		hd.Layers[l] = r
	}
	if next != payload {
		return hd, fmt.Errorf("%w: layers cover %d of %d payload bytes", ErrCorrupt, next, payload)
	}
	tok := blob[fixedHeaderBytes+layerRefBytes*hd.Shape.Layers:]
	hd.Tokens = make([]uint32, hd.Shape.Tokens)
	for i := range hd.Tokens {
		hd.Tokens[i] = binary.LittleEndian.Uint32(tok[4*i:])
	}
	// Every reader and every write path parses the header: checking the
	// key here means no path can store or serve an entry under a name its
	// tokens do not give.
	if err := CheckKey(hd.Key, hd.Tokens); err != nil {
		return hd, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if hd.Key.Context.Kind == ContextOpaque {
		if err := checkOpaque(&hd); err != nil {
			return hd, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
	}
	return hd, nil
}

// LayerPayload returns the encoded bytes of layer l after checking them
// against their checksum. It aliases blob.
func (hd *Header) LayerPayload(blob []byte, l int) ([]byte, error) {
	if l < 0 || l >= len(hd.Layers) || len(blob) != hd.BlobBytes {
		return nil, fmt.Errorf("%w: layer %d of %d", ErrInvalidEntry, l, len(hd.Layers))
	}
	r := hd.Layers[l]
	p := blob[hd.PayloadStart+int(r.Offset) : hd.PayloadStart+int(r.Offset+r.Length)]
	if xxhash.Sum64(p) != r.Checksum {
		return nil, fmt.Errorf("%w: layer %d checksum mismatch", ErrCorrupt, l)
	}
	return p, nil
}

// Range selects layers [LayerLo, LayerHi) and KV heads [HeadLo, HeadHi). The
// zero Range means everything.
type Range struct {
	LayerLo, LayerHi int
	HeadLo, HeadHi   int
}

// Resolve fills the zero bounds of r from s and checks it.
func (r Range) Resolve(s Shape) (Range, error) {
	if r.LayerHi == 0 {
		r.LayerHi = s.Layers
	}
	if r.HeadHi == 0 {
		r.HeadHi = s.KVHeads
	}
	if r.LayerLo < 0 || r.LayerLo >= r.LayerHi || r.LayerHi > s.Layers || r.HeadLo < 0 || r.HeadLo >= r.HeadHi || r.HeadHi > s.KVHeads {
		return r, fmt.Errorf("%w: range layers [%d,%d) heads [%d,%d) of %d layers, %d heads", ErrInvalidEntry, r.LayerLo, r.LayerHi, r.HeadLo, r.HeadHi, s.Layers, s.KVHeads)
	}
	return r, nil
}

// RangeBytes is the raw size of r's slice of an entry of shape s.
func (r Range) RangeBytes(s Shape) int {
	return (r.LayerHi - r.LayerLo) * 2 * s.Tokens * (r.HeadHi - r.HeadLo) * s.HeadDim * s.DType.Size()
}

// DecodeRange decodes the selected layers and heads of blob into dst in the
// canonical layout restricted to the range ([layer][K|V][token][head][dim]
// over the selected layers and heads), decoding only the selected layers.
// scratch, if it holds a layer, avoids an allocation for codecs that cannot
// write heads in place; it may be nil.
func DecodeRange(dst []byte, blob []byte, hd *Header, r Range, scratch []byte) error {
	r, err := r.Resolve(hd.Shape)
	if err != nil {
		return err
	}
	if len(dst) != r.RangeBytes(hd.Shape) {
		return fmt.Errorf("%w: dst of %d bytes, range needs %d", ErrInvalidEntry, len(dst), r.RangeBytes(hd.Shape))
	}
	if err := hd.Codec.check(hd.Shape.DType); err != nil {
		return err
	}
	sh := hd.Shape
	lb := sh.LayerBytes()
	allHeads := r.HeadLo == 0 && r.HeadHi == sh.KVHeads
	if !allHeads && len(scratch) < lb {
		scratch = make([]byte, lb)
	}
	out := dst
	for l := r.LayerLo; l < r.LayerHi; l++ {
		p, err := hd.LayerPayload(blob, l)
		if err != nil {
			return err
		}
		if allHeads {
			if err := hd.Codec.decodeLayer(sh.DType, out[:lb], p, sh); err != nil {
				return fmt.Errorf("layer %d: %w", l, err)
			}
			out = out[lb:]
			continue
		}
		if err := hd.Codec.decodeLayer(sh.DType, scratch[:lb], p, sh); err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		out = copyHeads(out, scratch[:lb], sh, r.HeadLo, r.HeadHi)
	}
	return nil
}

// copyHeads appends (by writing into out) heads [lo,hi) of a raw layer and
// returns the rest of out.
func copyHeads(out, layer []byte, sh Shape, lo, hi int) []byte {
	es := sh.DType.Size()
	row := sh.HeadDim * es
	tokStride := sh.KVHeads * row
	n := (hi - lo) * row
	for kv := 0; kv < 2; kv++ {
		base := kv * sh.Tokens * tokStride
		for t := 0; t < sh.Tokens; t++ {
			src := layer[base+t*tokStride+lo*row:]
			copy(out[:n], src[:n])
			out = out[n:]
		}
	}
	return out
}

// Decode verifies and decodes a whole entry.
func Decode(blob []byte, lim Limits) (*Entry, error) {
	hd, err := ParseHeader(blob, lim)
	if err != nil {
		return nil, err
	}
	e := &Entry{Key: hd.Key, DType: hd.Shape.DType, Layers: hd.Shape.Layers, KVHeads: hd.Shape.KVHeads,
		HeadDim: hd.Shape.HeadDim, Tokens: hd.Tokens, KV: make([]byte, hd.Shape.RawBytes())}
	if err := DecodeRange(e.KV, blob, &hd, Range{}, nil); err != nil {
		return nil, err
	}
	return e, nil
}

// Verify checks every checksum of blob without decoding it.
func Verify(blob []byte, lim Limits) (Header, error) {
	hd, err := ParseHeader(blob, lim)
	if err != nil {
		return hd, err
	}
	for l := range hd.Layers {
		if _, err := hd.LayerPayload(blob, l); err != nil {
			return hd, err
		}
	}
	return hd, nil
}
