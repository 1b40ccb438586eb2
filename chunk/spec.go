package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// ErrInvalidSpec is returned for a ModelSpec that cannot describe a model.
var ErrInvalidSpec = errors.New("chunk: invalid model spec")

// RopeStyle says which elements of a head vector RoPE rotates together.
type RopeStyle uint8

const (
	// RopeNeoX pairs x[i] with x[i+rotary_dim/2] (HF rotate_half: Llama,
	// Mistral, Qwen2, Qwen3; vLLM is_neox_style=True).
	RopeNeoX RopeStyle = 1
	// RopeGPTJ pairs x[2i] with x[2i+1] (interleaved).
	RopeGPTJ RopeStyle = 2
)

func (s RopeStyle) String() string {
	switch s {
	case RopeNeoX:
		return "neox"
	case RopeGPTJ:
		return "gptj"
	}
	return fmt.Sprintf("rope(%d)", uint8(s))
}

// RopeScaling names a transformers rope_type and its parameters. Fields a type
// does not use must be zero (Validate refuses anything else) so the
// fingerprint does not depend on noise.
type RopeScaling struct {
	// Type is "" or "default" (none), "linear", "llama3", "yarn" or "dynamic".
	Type string
	// Factor is the scaling factor of linear, llama3, yarn and dynamic.
	Factor float64
	// LowFreqFactor and HighFreqFactor are llama3's.
	LowFreqFactor  float64
	HighFreqFactor float64
	// OriginalMaxPositions is original_max_position_embeddings (llama3,
	// yarn). For yarn it is the omax of the correction range.
	OriginalMaxPositions int
	// BetaFast and BetaSlow are yarn's (0 means the defaults 32 and 1).
	BetaFast float64
	BetaSlow float64
	// AttentionFactor is yarn's mscale (0 means 0.1*ln(factor)+1).
	AttentionFactor float64
	// MaxPositions is max_position_embeddings (dynamic NTK).
	MaxPositions int
}

// ModelSpec is everything that changes the bytes of a chunk's KV. Two models
// with equal specs produce interchangeable chunks; anything else must differ
// somewhere in the spec (WeightsRevision and Salt exist for that).
type ModelSpec struct {
	Family    string // "llama", "mistral", "qwen2", "qwen3", ...
	Layers    int
	KVHeads   int
	HeadDim   int
	DType     DType // dtype of the stored K and V: F32, F16 or BF16
	RopeStyle RopeStyle
	RopeTheta float64
	// RotaryDim is the number of leading head dims RoPE rotates (partial
	// rotary); 0 means HeadDim.
	RotaryDim       int
	Scaling         RopeScaling
	WeightsRevision string
	TokenizerID     string
	Salt            string // adapter name, tenant salt, anything else
}

// Rotary returns the rotary dimension with the 0 default applied.
func (s ModelSpec) Rotary() int {
	if s.RotaryDim == 0 {
		return s.HeadDim
	}
	return s.RotaryDim
}

// Limits of a ModelSpec that Validate enforces, so that one model has one
// fingerprint: nothing is truncated by the canonical encoding.
const (
	// MaxSpecString bounds each string field, in bytes (valid UTF-8).
	MaxSpecString = 256
	// MaxSpecPositions bounds the position fields of a scaling
	// (OriginalMaxPositions, MaxPositions): they travel as int32.
	MaxSpecPositions = 1<<31 - 1
)

// scalingFields names, per scaling type, the RopeScaling fields it uses;
// Validate refuses a non-zero value in any other, so the same scaling
// cannot be spelled with noise that changes the fingerprint.
var scalingFields = map[string][]string{
	"":        nil,
	"default": nil,
	"linear":  {"factor"},
	"dynamic": {"factor", "max_positions"},
	"llama3":  {"factor", "low_freq_factor", "high_freq_factor", "original_max_positions"},
	"yarn":    {"factor", "original_max_positions", "beta_fast", "beta_slow", "attention_factor"},
}

// fields lists sc's fields by their JSON names, in declaration order.
func (sc RopeScaling) fields() []struct {
	name string
	f    float64 // the value; integers are exact in a float64 below 2^53
} {
	return []struct {
		name string
		f    float64
	}{
		{"factor", sc.Factor}, {"low_freq_factor", sc.LowFreqFactor}, {"high_freq_factor", sc.HighFreqFactor},
		{"original_max_positions", float64(sc.OriginalMaxPositions)}, {"beta_fast", sc.BetaFast},
		{"beta_slow", sc.BetaSlow}, {"attention_factor", sc.AttentionFactor}, {"max_positions", float64(sc.MaxPositions)},
	}
}

// Validate reports the first reason s cannot describe a model. It also
// refuses what would give one model two fingerprints: a scaling field the
// scaling type does not use set to anything but zero, an integer the
// canonical encoding would truncate, a string over MaxSpecString bytes or
// not UTF-8. (-0.0 needs no refusal: the encoding writes it as 0.)
func (s ModelSpec) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, a...))
	}
	for _, f := range []struct{ name, v string }{{"family", s.Family}, {"scaling type", s.Scaling.Type},
		{"weights revision", s.WeightsRevision}, {"tokenizer id", s.TokenizerID}, {"salt", s.Salt}} {
		if len(f.v) > MaxSpecString || !utf8.ValidString(f.v) {
			return bad("%s of %d bytes: must be UTF-8 of at most %d bytes", f.name, len(f.v), MaxSpecString)
		}
	}
	switch {
	case s.Family == "":
		return bad("family is empty")
	case s.Layers <= 0 || s.Layers > 1024:
		return bad("layers %d out of range 1..1024", s.Layers)
	case s.KVHeads <= 0 || s.KVHeads > 1024:
		return bad("kv heads %d out of range 1..1024", s.KVHeads)
	case s.HeadDim <= 0 || s.HeadDim > 4096 || s.HeadDim%2 != 0:
		return bad("head dim %d must be even and in 2..4096", s.HeadDim)
	case s.DType != F32 && s.DType != F16 && s.DType != BF16:
		return bad("dtype %v: KV must be f32, f16 or bf16", s.DType)
	case s.RopeStyle != RopeNeoX && s.RopeStyle != RopeGPTJ:
		return bad("rope style %v", s.RopeStyle)
	case !(s.RopeTheta > 1) || math.IsInf(s.RopeTheta, 0):
		return bad("rope theta %v must be finite and > 1", s.RopeTheta)
	case s.RotaryDim < 0 || s.RotaryDim > s.HeadDim || s.RotaryDim%2 != 0:
		return bad("rotary dim %d must be even and at most head dim %d", s.RotaryDim, s.HeadDim)
	}
	sc := s.Scaling
	used, known := scalingFields[sc.Type]
	if !known {
		return bad("unknown rope scaling type %q", sc.Type)
	}
	for _, f := range sc.fields() {
		switch {
		case !slices.Contains(used, f.name) && f.f != 0:
			return bad("%q scaling does not use %s (%v): it must be 0", sc.Type, f.name, f.f)
		case math.IsNaN(f.f) || math.IsInf(f.f, 0) || f.f < 0:
			return bad("scaling %s %v must be finite and not negative", f.name, f.f)
		}
	}
	if sc.OriginalMaxPositions > MaxSpecPositions || sc.MaxPositions > MaxSpecPositions {
		return bad("scaling positions %d, %d out of range 0..%d", sc.OriginalMaxPositions, sc.MaxPositions, MaxSpecPositions)
	}
	switch sc.Type {
	case "linear", "dynamic":
		if !(sc.Factor > 0) {
			return bad("%s scaling needs factor > 0", sc.Type)
		}
		if sc.Type == "dynamic" && sc.MaxPositions <= 0 {
			return bad("dynamic scaling needs max positions")
		}
	case "llama3":
		if !(sc.Factor > 0) || !(sc.LowFreqFactor > 0) || !(sc.HighFreqFactor > sc.LowFreqFactor) || sc.OriginalMaxPositions <= 0 {
			return bad("llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor, original max positions")
		}
	case "yarn":
		if !(sc.Factor > 0) || sc.OriginalMaxPositions <= 0 {
			return bad("yarn scaling needs factor > 0 and original max positions")
		}
	}
	return nil
}

// Fingerprint is the 128-bit name of a ModelSpec.
type Fingerprint struct{ Lo, Hi uint64 }

func (f Fingerprint) String() string { return fmt.Sprintf("%016x%016x", f.Hi, f.Lo) }

// IsZero reports whether f is unset.
func (f Fingerprint) IsZero() bool { return f.Lo == 0 && f.Hi == 0 }

// specMagic starts the canonical encoding; the version lets it change.
const specMagic = "kvmesh-spec-v1"

// Seeds of the two fingerprint lanes (docs/KEYS.md).
const (
	seedSpecLo uint64 = 0x6b766d6573682d30 // "kvmesh-0"
	seedSpecHi uint64 = 0x6b766d6573682d31 // "kvmesh-1"
)

// CanonicalEncoding is the byte string the fingerprint hashes: the magic,
// then every field in declaration order; strings as a uint32 LE length and
// their bytes, integers as uint32 LE, floats as IEEE-754 float64 bits LE,
// enums as one byte. The scaling type "" is written as "default",
// RotaryDim 0 as HeadDim, and -0.0 as 0.0, so equivalent specs encode the
// same. Only a spec that passes Validate has a meaningful encoding (an
// integer out of Validate's ranges would be truncated).
func (s ModelSpec) CanonicalEncoding() []byte {
	b := make([]byte, 0, 160)
	str := func(v string) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	u32 := func(v int) { b = binary.LittleEndian.AppendUint32(b, uint32(v)) }
	f64 := func(v float64) {
		if v == 0 {
			v = 0 // -0.0 and 0.0 are one value: one encoding
		}
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	str(specMagic)
	str(s.Family)
	u32(s.Layers)
	u32(s.KVHeads)
	u32(s.HeadDim)
	b = append(b, byte(s.DType), byte(s.RopeStyle))
	f64(s.RopeTheta)
	u32(s.Rotary())
	sc := s.Scaling
	if sc.Type == "" {
		sc.Type = "default"
	}
	str(sc.Type)
	f64(sc.Factor)
	f64(sc.LowFreqFactor)
	f64(sc.HighFreqFactor)
	u32(sc.OriginalMaxPositions)
	f64(sc.BetaFast)
	f64(sc.BetaSlow)
	f64(sc.AttentionFactor)
	u32(sc.MaxPositions)
	str(s.WeightsRevision)
	str(s.TokenizerID)
	str(s.Salt)
	return b
}

// Fingerprint hashes the canonical encoding with two seeded xxhash64 lanes.
func (s ModelSpec) Fingerprint() Fingerprint {
	enc := s.CanonicalEncoding()
	return Fingerprint{Lo: xxhash64Seed(seedSpecLo, enc), Hi: xxhash64Seed(seedSpecHi, enc)}
}

func xxhash64Seed(seed uint64, b []byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	_, _ = d.Write(b)
	return d.Sum64()
}

// KVBytesPerToken is the size of one token's K and V over all layers and
// heads in the model dtype.
func (s ModelSpec) KVBytesPerToken() int {
	return 2 * s.Layers * s.KVHeads * s.HeadDim * s.DType.Size()
}
