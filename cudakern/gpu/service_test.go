//go:build cuda

package gpu

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/pinned"
)

// d2dCase is what both processes of TestGPUServiceDeviceToDevice build
// from one seed: a model, one entry per device codec, the request's chunks
// (heads [1,3) of 4, slots -1) and the engine cache's layout and guard
// bytes.
type d2dCase struct {
	spec   chunk.ModelSpec
	lay    pagedkv.CacheLayout
	blobs  [][]byte
	chunks []pagedkv.InjectChunk
	guard  [][]byte
}

func newD2DCase(t testing.TB) d2dCase {
	rng := rand.New(rand.NewPCG(29, 15))
	c := d2dCase{spec: specs[2]}
	c.lay = pagedkv.CacheLayout{Order: pagedkv.HND, NumBlocks: 16, BlockSize: 16, KVHeads: 2, HeadDim: 64, DType: chunk.BF16}
	fp := c.spec.Fingerprint()
	perm := rng.Perm(c.lay.Slots())
	for i, codec := range cudakern.DeviceCodecs() {
		n := 30 + 13*i
		toks := make([]uint32, n)
		for k := range toks {
			toks[k] = rng.Uint32() % 32000
		}
		cx := chunk.PrefixContext(chunk.ID{Lo: uint64(i + 1)})
		e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, toks), Context: cx},
			DType: c.spec.DType, Layers: c.spec.Layers, KVHeads: c.spec.KVHeads, HeadDim: c.spec.HeadDim, Tokens: toks,
			KV: values(rng, c.spec.DType, c.spec.Layers*2*n*c.spec.KVHeads*c.spec.HeadDim)}
		blob, err := chunk.Encode(nil, e, codec)
		if err != nil {
			t.Fatal(err)
		}
		slots := perm[:n:n]
		perm = perm[n:]
		slots[n/3] = -1
		c.blobs = append(c.blobs, blob)
		c.chunks = append(c.chunks, pagedkv.InjectChunk{Key: chunk.Key{Context: cx}, Tokens: toks, Pos: 100 * (i + 1), Slots: slots})
	}
	for range c.spec.Layers {
		c.guard = append(c.guard, randBytes(rng, c.lay.LayerBytes()))
	}
	return c
}

// TestGPUServiceDeviceToDevice: the whole path on a device. An engine
// process exports its cache layers by CUDA IPC; a second process (this
// binary again, as the node) holds the entries in its GPU tier (kvtier's
// CUDA slab), registers the cache with an inject.Service over this
// package's Driver, and injects: every hit goes device to device (the
// Service's counter says so, the store lends nothing on the host). The
// engine's memory then holds the CPU path's bits.
func TestGPUServiceDeviceToDevice(t *testing.T) {
	if h := os.Getenv("KVMESH_D2D_HANDLES"); h != "" {
		d2dNode(t, h)
		return
	}
	in := open(t)
	c := newD2DCase(t)
	var hs []string
	var mem []uint64
	for _, g := range c.guard {
		p := devAlloc(t, in, g)
		h, err := in.exportIPC(p)
		if err != nil {
			t.Fatal(err)
		}
		mem, hs = append(mem, p), append(hs, hex.EncodeToString(h))
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^TestGPUServiceDeviceToDevice$", "-test.v", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), "KVMESH_D2D_HANDLES="+strings.Join(hs, ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the node process: %v\n%s", err, out)
	}
	t.Logf("the node process:\n%s", out)
	cpu := cudakern.NewInjector(cudakern.Config{Workers: 2})
	defer cpu.Close()
	tab, err := cudakern.NewRopeTable(c.spec, 3000)
	if err != nil {
		t.Fatal(err)
	}
	want := c.guard
	for i, blob := range c.blobs {
		e, err := chunk.Decode(blob, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		ch := c.chunks[i]
		j := cudakern.Job{Rope: tab, Src: e.KV, SrcDType: e.DType, Tokens: len(e.Tokens), SrcHeads: e.KVHeads,
			HeadLo: 1, HeadHi: 3, Pos: ch.Pos, Slots: ch.Slots, Layout: c.lay, Dst: want}
		if err := cpu.Inject(context.Background(), &j); err != nil {
			t.Fatal(err)
		}
	}
	for l, p := range mem {
		got := make([]byte, len(want[l]))
		devRead(t, in, p, got)
		same(t, want[l], got, c.lay.DType)
	}
}

// tierLocal is the node's inject.DeviceLocal over its store (node's
// gpuLocal), its GPU tier on device 0; it counts host reads.
type tierLocal struct {
	*kvtier.Store
	gets *atomic.Int64
}

func (l tierLocal) Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error) {
	l.gets.Add(1)
	return l.Store.Get(ctx, key)
}

func (l tierLocal) GetDevice(ctx context.Context, key chunk.Key, device int, codecs []chunk.Codec) (inject.DeviceCopy, error) {
	if device != 0 {
		return inject.DeviceCopy{}, fmt.Errorf("the GPU tier is on device 0, not %d", device)
	}
	h, err := l.Store.GetDevice(ctx, key, codecs...)
	if err != nil {
		return inject.DeviceCopy{}, err
	}
	return inject.DeviceCopy{Ptr: uint64(h.Ptr), Header: h.Header, Release: h.Release}, nil
}

func d2dNode(t *testing.T, handles string) {
	ctx := t.Context()
	c := newD2DCase(t)
	var hs [][]byte
	for _, s := range strings.Split(handles, ",") {
		h, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	slab, err := kvtier.OpenCUDA(kvtier.CUDAConfig{Bytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer slab.Close()
	st, err := kvtier.Open(kvtier.Config{DRAMBytes: 16 << 20, GPU: slab, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, b := range c.blobs {
		if _, err := st.Put(ctx, b, kvtier.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var gets atomic.Int64
	svc, err := inject.New(inject.Config{Fetcher: inject.TierFetcher{Local: tierLocal{Store: st, gets: &gets}},
		GPU: Driver{}, Workers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(svc)
	t.Logf("injection kernel: %s", svc.Kernel())
	id, err := svc.Register(ctx, inject.Descriptor{Fingerprint: c.spec.Fingerprint(), Spec: c.spec, Layers: c.spec.Layers,
		Layouts: []pagedkv.CacheLayout{c.lay}, HeadLo: 1, HeadHi: 3, MaxPositions: 3000,
		Memory: inject.Memory{Kind: inject.MemoryCUDAIPC, Device: 0, IPCHandles: hs}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := svc.Inject(ctx, &inject.Request{Cache: id, Chunks: c.chunks})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Results {
		if r.Match != chunk.MatchExact {
			t.Errorf("chunk %d: %v (%v)", i, r.Match, r.Reason)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var device float64
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_inject_device_chunks_total" {
			device = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if device != float64(len(c.chunks)) || gets.Load() != 0 {
		t.Errorf("%v chunks written device to device, %d host reads; want %d and 0", device, gets.Load(), len(c.chunks))
	}
	s := st.Stats()
	if s.Tiers[kvtier.TierGPU].Entries != len(c.blobs) || s.Tiers[kvtier.TierGPU].PinnedBytes != 0 {
		t.Errorf("GPU tier: %d entries (want %d), %d bytes pinned", s.Tiers[kvtier.TierGPU].Entries, len(c.blobs), s.Tiers[kvtier.TierGPU].PinnedBytes)
	}
	if err := svc.Unregister(id); err != nil {
		t.Error(err)
	}
}
