//go:build cuda

package gpu

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestGPUTierInjectDevice: entries in the GPU tier (kvtier's CUDA slab,
// allocated by its own goroutine in the device's primary context) are
// injected device to device into a cache in device memory by an IPCCache's
// InjectDevice, one launch per layer from the entry's address plus the
// layer's offset in the header the tier kept; the cache then holds the
// bits of the CPU path (chunk's decoder, the CPU Injector) for raw, int8,
// int4 and fp8 entries, a head range and slots -1.
func TestGPUTierInjectDevice(t *testing.T) {
	ctx := context.Background()
	in := open(t)
	slab, err := kvtier.OpenCUDA(kvtier.CUDAConfig{Bytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slab.Close() }) // after the store's Close
	st, err := kvtier.Open(kvtier.Config{DRAMBytes: 16 << 20, GPU: slab, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cpu := cudakern.NewInjector(cudakern.Config{Workers: 2})
	defer cpu.Close()
	rng := rand.New(rand.NewPCG(29, 14))
	sp := specs[2]
	tab, err := cudakern.NewRopeTable(sp, 3000)
	if err != nil {
		t.Fatal(err)
	}
	orders := pagedkv.Orders()
	for n, codec := range []chunk.Codec{chunk.CodecRaw, chunk.CodecInt8, chunk.CodecInt4, chunk.CodecFP8} {
		edt := []chunk.DType{chunk.BF16, chunk.F16, chunk.F32, chunk.BF16}[n]
		lay := pagedkv.CacheLayout{Order: orders[n%len(orders)], NumBlocks: 8, BlockSize: 16, KVHeads: 2, HeadDim: 64,
			DType: dtypes[n], KScale: 0.5, VScale: 3}
		t.Run(codec.String()+"/"+edt.String()+"->"+lay.DType.String()+"/"+lay.Order.String(), func(t *testing.T) {
			toks := make([]uint32, 70)
			for i := range toks {
				toks[i] = rng.Uint32() % 32000
			}
			fp := sp.Fingerprint()
			e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: chunk.StandaloneContext()},
				DType: edt, Layers: 2, KVHeads: 4, HeadDim: 64, Tokens: toks, KV: values(rng, edt, 2*2*70*4*64)}
			blob, err := chunk.Encode(nil, e, codec)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Put(ctx, blob, kvtier.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			h, err := st.GetDevice(ctx, e.Key, cudakern.DeviceCodecs()...)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := chunk.Decode(blob, chunk.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			j := job(rng, tab, edt, lay, 70, 4, 2, false) // heads [1,3) of 4, slots -1
			j.Src, j.SrcKScale, j.SrcVScale = dec.KV, 0, 0
			c := &IPCCache{in: in}
			for l := range j.Dst {
				c.layers = append(c.layers, devAlloc(t, in, j.Dst[l]))
			}
			for l := range j.Dst {
				dj := *j
				dj.Src, dj.Dst = nil, [][]byte{nil}
				src := uint64(h.Ptr) + uint64(h.Header.PayloadStart) + h.Header.Layers[l].Offset
				if err := c.InjectDevice(ctx, &dj, l, src, h.Header.Codec); err != nil {
					t.Fatal(err)
				}
			}
			h.Release()
			if err := cpu.Inject(ctx, j); err != nil {
				t.Fatal(err)
			}
			for l := range j.Dst {
				got := make([]byte, len(j.Dst[l]))
				devRead(t, in, c.layers[l], got)
				same(t, j.Dst[l], got, lay.DType)
			}
			if p := st.Stats().Tiers[kvtier.TierGPU].PinnedBytes; p != 0 {
				t.Fatalf("%d device bytes still pinned", p)
			}
		})
	}
}
