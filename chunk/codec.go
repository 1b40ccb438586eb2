package chunk

import "fmt"

// Codec names how an entry's layers are encoded.
type Codec uint8

// Codecs. Lossy codecs decode to the entry's dtype with the error bound their
// doc states (codec_quant.go has the derivation). Groups are 64 tokens of one
// channel for keys and 64 dims of one token and head for values; s is the
// group's stored scale and ulp the spacing of the dtype at the result.
const (
	CodecInvalid Codec = iota
	// CodecRaw stores the canonical bytes.
	CodecRaw
	// CodecLossless splits byte planes and huff0-codes them; bit-exact
	// (about 1.48x on bf16 KV, 1.16x on f16).
	CodecLossless
	// CodecInt8 is KIVI-style grouped int8 (keys per channel, values per
	// token): |x̂-x| <= s/2 + ulp, s ~= (max-min)/255. About 1.88x vs 16-bit.
	CodecInt8
	// CodecInt4 is the same with 15 levels: |x̂-x| <= s/2 + ulp,
	// s ~= (max-min)/15. About 3.56x vs 16-bit.
	CodecInt4
	// CodecFP8 is e4m3 with a scale s >= max|x|/448 per group:
	// |x̂-x| <= max(|x|/16, s/1024) + ulp. About 1.94x vs 16-bit.
	CodecFP8
)

func (c Codec) String() string {
	switch c {
	case CodecRaw:
		return "raw"
	case CodecLossless:
		return "lossless"
	case CodecInt8:
		return "int8"
	case CodecInt4:
		return "int4"
	case CodecFP8:
		return "fp8"
	}
	return fmt.Sprintf("codec(%d)", uint8(c))
}

// ParseCodec parses a codec name as String writes it.
func ParseCodec(s string) (Codec, error) {
	for c := CodecRaw; c <= CodecFP8; c++ {
		if c.String() == s {
			return c, nil
		}
	}
	return CodecInvalid, fmt.Errorf("%w: unknown codec %q", ErrUnsupported, s)
}

// Lossy reports whether decoding may differ from what was encoded.
func (c Codec) Lossy() bool { return c == CodecInt8 || c == CodecInt4 || c == CodecFP8 }

// layerCodec encodes one layer ([K|V][token][kv_head][head_dim] in the
// entry dtype) independently of the others, so a reader can decode a layer
// range alone.
type layerCodec interface {
	// encode appends the encoding of raw to dst.
	encode(dst, raw []byte, sh Shape) ([]byte, error)
	// decode writes exactly sh.LayerBytes() bytes into dst; it must return
	// an error wrapping ErrCorrupt, never panic, on any enc.
	decode(dst, enc []byte, sh Shape) error
}

// check reports whether impl(dt) succeeds, without building the interface.
func (c Codec) check(dt DType) error {
	if (dt != F32 && dt != F16 && dt != BF16) || c < CodecRaw || c > CodecFP8 {
		return fmt.Errorf("%w: codec %v for %v", ErrUnsupported, c, dt)
	}
	return nil
}

func (c Codec) impl(dt DType) (layerCodec, error) {
	if dt != F32 && dt != F16 && dt != BF16 {
		return nil, fmt.Errorf("%w: codec %v for %v", ErrUnsupported, c, dt)
	}
	switch c {
	case CodecRaw:
		return rawCodec{}, nil
	case CodecLossless:
		return planeCodec{dt: dt}, nil
	case CodecInt8:
		return quantCodec{dt: dt, kind: quantInt8}, nil
	case CodecInt4:
		return quantCodec{dt: dt, kind: quantInt4}, nil
	case CodecFP8:
		return quantCodec{dt: dt, kind: quantFP8}, nil
	}
	return nil, fmt.Errorf("%w: codec %v for %v", ErrUnsupported, c, dt)
}

// decodeLayer is impl(dt).decode without the interface, whose conversion
// of a quantCodec value allocates on every call (DecodeRange runs once per
// layer on the inject path). c and dt have passed check.
func (c Codec) decodeLayer(dt DType, dst, enc []byte, sh Shape) error {
	switch c {
	case CodecRaw:
		return rawCodec{}.decode(dst, enc, sh)
	case CodecLossless:
		return planeCodec{dt: dt}.decode(dst, enc, sh)
	case CodecInt8:
		return quantCodec{dt: dt, kind: quantInt8}.decode(dst, enc, sh)
	case CodecInt4:
		return quantCodec{dt: dt, kind: quantInt4}.decode(dst, enc, sh)
	case CodecFP8:
		return quantCodec{dt: dt, kind: quantFP8}.decode(dst, enc, sh)
	}
	return fmt.Errorf("%w: codec %v for %v", ErrUnsupported, c, dt)
}

type rawCodec struct{}

func (rawCodec) encode(dst, raw []byte, _ Shape) ([]byte, error) { return append(dst, raw...), nil }

func (rawCodec) decode(dst, enc []byte, sh Shape) error {
	if len(enc) != len(dst) {
		return fmt.Errorf("%w: raw layer of %d bytes, want %d", ErrCorrupt, len(enc), len(dst))
	}
	copy(dst, enc)
	return nil
}

// StoredCodec is the codec an entry encoded with from is stored in where
// the cluster's codec is cluster: cluster, unless from is lossy (a lossy
// entry is never quantised again, which would add a second error) or
// cluster is not a codec.
func StoredCodec(from, cluster Codec) Codec {
	if from.Lossy() || cluster < CodecRaw || cluster > CodecFP8 {
		return from
	}
	return cluster
}

// Transcode returns blob encoded in StoredCodec(its codec, to): blob itself
// when that is its codec already, else a new blob of the same entry (a new
// checksum). Encoding is deterministic, so the same entry sent in raw or in
// lossless transcodes to the same bytes.
func Transcode(blob []byte, to Codec, lim Limits) ([]byte, error) {
	hd, err := ParseHeader(blob, lim)
	if err != nil {
		return nil, err
	}
	return TranscodeParsed(blob, &hd, to)
}

// TranscodeParsed is Transcode of a blob whose header hd was parsed
// already (ParseHeader or Verify). It goes a layer at a time: each layer's
// checksum is checked as it is decoded into one layer of scratch, and the
// entry is never held decoded whole.
func TranscodeParsed(blob []byte, hd *Header, to Codec) ([]byte, error) {
	if StoredCodec(hd.Codec, to) == hd.Codec {
		return blob, nil
	}
	if err := hd.Codec.check(hd.Shape.DType); err != nil {
		return nil, err
	}
	sh := hd.Shape
	raw := make([]byte, sh.LayerBytes())
	// Room for the raw size: no codec's output is much larger, so the
	// result is not copied as it grows.
	dst := make([]byte, 0, hd.PayloadStart+sh.RawBytes()+sh.RawBytes()/64)
	return encodeLayers(dst, hd.Key, hd.Tokens, sh, to, func(l int) ([]byte, error) {
		p, err := hd.LayerPayload(blob, l)
		if err != nil {
			return nil, err
		}
		if err := hd.Codec.decodeLayer(sh.DType, raw, p, sh); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		return raw, nil
	})
}
