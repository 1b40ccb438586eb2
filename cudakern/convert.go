package cudakern

import (
	"encoding/binary"
	"math"

	"github.com/kvmesh/kvmesh/chunk"
)

// loadF32 widens len(dst) elements of src in dtype dt into dst. fp8 values
// are multiplied by scale (x = fp8 * scale); other dtypes ignore it.
func loadF32(dst []float32, src []byte, dt chunk.DType, scale float32) {
	switch dt {
	case chunk.F32:
		src = src[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case chunk.BF16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case chunk.F16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = chunk.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case chunk.FP8E4M3:
		src = src[:len(dst)]
		for i := range dst {
			dst[i] = chunk.FP8E4M3ToF32(src[i]) * scale
		}
	default:
		panic("cudakern: loadF32 of " + dt.String())
	}
}

// storeF32 rounds src once into dst in dtype dt. fp8 stores fp8(x / scale),
// dividing (not multiplying by a reciprocal) as vLLM's scaled conversion does.
func storeF32(dst []byte, src []float32, dt chunk.DType, scale float32) {
	switch dt {
	case chunk.F32:
		dst = dst[:4*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case chunk.BF16:
		dst = dst[:2*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], chunk.F32ToBF16(v))
		}
	case chunk.F16:
		dst = dst[:2*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], chunk.F32ToF16(v))
		}
	case chunk.FP8E4M3:
		dst = dst[:len(src)]
		for i, v := range src {
			dst[i] = chunk.F32ToFP8E4M3(v / scale)
		}
	default:
		panic("cudakern: storeF32 of " + dt.String())
	}
}
