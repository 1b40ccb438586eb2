package chunk

import "fmt"

// DType is the element type of a tensor.
type DType uint8

// Tensor element types. The zero value is invalid so that a forgotten field
// is caught rather than read as float32.
const (
	DTypeInvalid DType = iota
	F32
	F16
	BF16
	FP8E4M3
)

// Size is the number of bytes one element occupies.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	case FP8E4M3:
		return 1
	}
	return 0
}

// Valid reports whether d names a known element type.
func (d DType) Valid() bool { return d.Size() != 0 }

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	case FP8E4M3:
		return "fp8e4m3"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType accepts our names and the safetensors / torch spellings.
func ParseDType(s string) (DType, error) {
	switch s {
	case "f32", "F32", "float32", "torch.float32":
		return F32, nil
	case "f16", "F16", "float16", "torch.float16", "half":
		return F16, nil
	case "bf16", "BF16", "bfloat16", "torch.bfloat16":
		return BF16, nil
	case "fp8e4m3", "F8_E4M3", "float8_e4m3fn":
		return FP8E4M3, nil
	}
	return DTypeInvalid, fmt.Errorf("%w: unknown dtype %q", ErrInvalidSpec, s)
}
