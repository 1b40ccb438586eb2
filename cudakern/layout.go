package cudakern

import (
	"fmt"

	"github.com/kvmesh/kvmesh/pagedkv"
)

// checkSlots validates a slot mapping against l: every slot is -1 (skipped)
// or in [0, Slots()).
func checkSlots(l pagedkv.CacheLayout, slots []int) error {
	n := l.Slots()
	for i, s := range slots {
		if s < -1 || s >= n {
			return fmt.Errorf("%w: slot[%d] = %d out of range -1..%d", ErrInvalidJob, i, s, n-1)
		}
	}
	return nil
}

// GatherF32 reads the head vectors (kv, slots[i], head) of one layer into dst
// as float32 in the order [i][head][dim] (the canonical order), dequantizing
// fp8 with the layout's scale. A slot of -1 reads as zeros. kv is 0 for K and
// 1 for V. It checks everything before writing dst.
func GatherF32(dst []float32, layer []byte, l pagedkv.CacheLayout, kv int, slots []int) error {
	if err := checkIO(l, len(layer), kv, slots, len(dst)); err != nil {
		return err
	}
	ks, vs := l.Scales()
	scale := ks
	if kv == 1 {
		scale = vs
	}
	hd, es := l.HeadDim, l.DType.Size()
	k := hostISA()
	for i, s := range slots {
		for h := 0; h < l.KVHeads; h++ {
			out := dst[(i*l.KVHeads+h)*hd : (i*l.KVHeads+h+1)*hd]
			if s < 0 {
				clear(out)
				continue
			}
			off := l.Offset(kv, s, h)
			loadF32(out, layer[off:off+hd*es], l.DType, scale, k)
		}
	}
	return nil
}

// ScatterF32 writes src, float32 head vectors in the order [i][head][dim],
// into (kv, slots[i], head) of one layer, rounding once to the layout's dtype
// (fp8: fp8(x / scale)). Slots of -1 are skipped. The engine uses it to store
// keys it rotated itself and values of a fresh prefill. It checks everything
// before writing the layer.
func ScatterF32(layer []byte, l pagedkv.CacheLayout, kv int, slots []int, src []float32) error {
	if err := checkIO(l, len(layer), kv, slots, len(src)); err != nil {
		return err
	}
	ks, vs := l.Scales()
	scale := ks
	if kv == 1 {
		scale = vs
	}
	hd, es := l.HeadDim, l.DType.Size()
	k := hostISA()
	for i, s := range slots {
		if s < 0 {
			continue
		}
		for h := 0; h < l.KVHeads; h++ {
			off := l.Offset(kv, s, h)
			storeF32(layer[off:off+hd*es], src[(i*l.KVHeads+h)*hd:(i*l.KVHeads+h+1)*hd], l.DType, scale, false, k)
		}
	}
	return nil
}

func checkIO(l pagedkv.CacheLayout, layerBytes, kv int, slots []int, f32s int) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if layerBytes != l.LayerBytes() {
		return fmt.Errorf("%w: layer of %d bytes, layout needs %d", ErrInvalidJob, layerBytes, l.LayerBytes())
	}
	if kv != 0 && kv != 1 {
		return fmt.Errorf("%w: kv %d must be 0 (K) or 1 (V)", ErrInvalidJob, kv)
	}
	if want := len(slots) * l.KVHeads * l.HeadDim; f32s != want {
		return fmt.Errorf("%w: %d floats for %d slots, need %d", ErrInvalidJob, f32s, len(slots), want)
	}
	return checkSlots(l, slots)
}
