package chunk

import "fmt"

// Codec names how an entry's layers are encoded.
type Codec uint8

// Codecs. Lossy codecs decode to the entry's dtype with the error bound their
// doc states.
const (
	CodecInvalid  Codec = iota
	CodecRaw            // the canonical bytes
	CodecLossless       // byte planes split, exponent plane entropy-coded
	CodecInt8           // KIVI-style grouped int8: keys per channel, values per token
	CodecInt4           // KIVI-style grouped int4
	CodecFP8            // fp8 e4m3 with a per-group scale
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

type rawCodec struct{}

func (rawCodec) encode(dst, raw []byte, _ Shape) ([]byte, error) { return append(dst, raw...), nil }

func (rawCodec) decode(dst, enc []byte, sh Shape) error {
	if len(enc) != len(dst) {
		return fmt.Errorf("%w: raw layer of %d bytes, want %d", ErrCorrupt, len(enc), len(dst))
	}
	copy(dst, enc)
	return nil
}
