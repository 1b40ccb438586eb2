package cudakern

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// FuzzInject drives Inject with arbitrary geometry, head ranges, slots and
// buffer sizes. Whatever the input: a rejected job writes nothing, and an
// accepted one writes exactly the named slots, each within the reference
// tolerance.
func FuzzInject(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 3, 1, 2, 0, 2, 5, 0, 0, 0, 0, 1, 2, 3, 4, 5})
	f.Add([]byte{1, 0x31, 2, 7, 0, 3, 2, 4, 1, 3, 9, 1, 2, 0xfe, 3, 0xff, 7, 1, 0, 2})
	f.Add([]byte{3, 0x22, 1, 0, 5, 1, 0, 1, 9, 9, 4, 0, 0, 0x80, 0x7f, 3})
	f.Add([]byte{2, 0x13, 3, 3, 3, 2, 1, 3, 0, 3, 12, 2, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	// Byte 0's bit 0x40: K and V inside each block (BlockNHD, BlockHND).
	f.Add([]byte{0x40, 0x22, 3, 3, 3, 2, 1, 3, 0, 3, 12, 2, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{0x4a, 0x13, 2, 2, 5, 2, 2, 4, 1, 3, 9, 2, 7, 0xff, 3, 9, 1, 2, 0, 11})
	in := NewInjector(Config{Workers: 2})
	f.Cleanup(in.Close)
	// A second injector stores non-temporally whatever the size, so the NT
	// kernels meet the fuzzer too.
	inNT := NewInjector(Config{Workers: 2})
	inNT.ntMin = 0
	f.Cleanup(inNT.Close)
	dts := []chunk.DType{chunk.F32, chunk.F16, chunk.BF16, chunk.FP8E4M3, 0}
	hds := []int{2, 8, 16, 18, 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		at := func(i int) int {
			if i < len(data) {
				return int(data[i])
			}
			return 0
		}
		style := chunk.RopeNeoX
		if at(0)&1 == 1 {
			style = chunk.RopeGPTJ
		}
		order := pagedkv.NHD
		switch at(0) & 0x42 {
		case 2:
			order = pagedkv.HND
		case 0x40:
			order = pagedkv.BlockNHD
		case 0x42:
			order = pagedkv.BlockHND
		}
		hd := hds[at(2)%len(hds)]
		rot := 0
		if at(0)&4 != 0 {
			rot = 2
		}
		spec := testSpec(style, hd, rot, chunk.RopeScaling{})
		tab, err := NewRopeTable(spec, 40)
		if err != nil {
			t.Fatal(err)
		}
		lay := pagedkv.CacheLayout{Order: order, NumBlocks: 1 + at(3)%4, BlockSize: 1 + at(4)%8, KVHeads: 1 + at(5)%3,
			HeadDim: hd, DType: dts[(at(1)>>4)%len(dts)], KScale: float32(at(6)%3) / 2}
		srcDT := dts[(at(1)&15)%len(dts)]
		srcHeads := 1 + at(7)%4
		tokens := at(10) % 13
		layers := at(11) % 3
		c := jobCase{srcDT: chunk.F16, layout: lay, tokens: tokens, srcHeads: srcHeads, layers: layers}
		if lay.Validate() != nil || !srcDT.Valid() {
			// buildJob needs a valid layout and dtype; the job gets the
			// broken ones after.
			c.layout.DType, c.layout.Order = chunk.F16, pagedkv.NHD
		} else {
			c.srcDT = srcDT
		}
		j, guard := buildJob(t, rand.New(rand.NewPCG(uint64(len(data)), 1)), c, tab)
		j.Layout, j.SrcDType = lay, srcDT
		j.HeadLo, j.HeadHi = at(8)%6-1, at(9)%6-1
		j.Pos = at(12) % 40
		for i := range j.Slots {
			j.Slots[i] = int(int8(at(13+i))) % (lay.NumBlocks*lay.BlockSize + 2)
		}
		if d := at(1) >> 7; d != 0 && len(j.Src) > 0 {
			j.Src = j.Src[:len(j.Src)-1]
		}
		inj := in
		if at(0)&8 != 0 {
			inj = inNT
		}
		err = inj.Inject(t.Context(), j)
		if err != nil {
			if !errors.Is(err, ErrInvalidJob) && !errors.Is(err, pagedkv.ErrInvalidLayout) {
				t.Fatalf("unexpected error class: %v", err)
			}
			for l := range j.Dst {
				if !bytes.Equal(j.Dst[l], guard[l]) {
					t.Fatalf("rejected job (%v) wrote layer %d", err, l)
				}
			}
			return
		}
		checkJob(t, j, guard)
	})
}
