package inject

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/pinned"
)

// tierDevice is a DeviceLocal over a kvtier store, as the node's is: its
// GPU tier lends entries on device, and nowhere else. It counts the host
// reads (Get) that reach the store.
type tierDevice struct {
	*kvtier.Store
	device int
	gets   atomic.Int64
	skew   uint64 // added to the addresses lent (a copy the kernel cannot read)
}

func (l *tierDevice) Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error) {
	l.gets.Add(1)
	return l.Store.Get(ctx, key)
}

func (l *tierDevice) GetDevice(ctx context.Context, key chunk.Key, device int, codecs []chunk.Codec) (DeviceCopy, error) {
	if device != l.device {
		return DeviceCopy{}, fmt.Errorf("the GPU tier is on device %d, not %d", l.device, device)
	}
	h, err := l.Store.GetDevice(ctx, key, codecs...)
	if err != nil {
		return DeviceCopy{}, err
	}
	return DeviceCopy{Ptr: uint64(h.Ptr) + l.skew, Header: h.Header, Release: h.Release}, nil
}

// refetcher is a TierFetcher that is a Refetcher: it counts the refetches
// and finds nothing on the replicas.
type refetcher struct {
	TierFetcher
	n atomic.Int64
}

func (f *refetcher) Refetch(context.Context, chunk.Key, chunk.Key, error) (Fetched, error) {
	f.n.Add(1)
	return Fetched{Match: chunk.MatchMiss}, nil
}

// deviceFixture is a Service whose Fetcher reads a kvtier store with a GPU
// tier in a kvtier.HostSlab (its device addresses are host addresses), and
// a cache registered by CUDA IPC whose stand-in device kernel (fakeIPC)
// reads its sources at those addresses.
type deviceFixture struct {
	st      *kvtier.Store
	local   *tierDevice
	fetcher *refetcher
	s       *Service
	reg     *prometheus.Registry
	id      CacheID
	ipc     *fakeIPC
	spec    chunk.ModelSpec
	lay     pagedkv.CacheLayout
	lo, hi  int
	want    [][]byte // the cache as direct CPU injection leaves it
	before  [][]byte
	req     *Request
	keys    []chunk.Key // the stored key of each chunk of req
	rng     *rand.Rand
	rope    *cudakern.RopeTable
	inj     *cudakern.Injector
}

type deviceSetup struct {
	gpuBytes  int64 // the GPU tier's slab; 0: no GPU tier
	gpuDevice int   // the tier's device; the cache is on device 1
	src, dst  chunk.DType
	order     pagedkv.Order
	lo, hi    int // the cache's heads of the model's 4
}

func newDeviceFixture(t *testing.T, ds deviceSetup) *deviceFixture {
	t.Helper()
	x := &deviceFixture{spec: testSpec(ds.src), lo: ds.lo, hi: ds.hi, rng: rand.New(rand.NewPCG(29, uint64(ds.dst)))}
	if x.hi == 0 {
		x.hi = x.spec.KVHeads
	}
	cfg := kvtier.Config{DRAMBytes: 8 << 20, Logger: slog.New(slog.DiscardHandler)}
	var slab *kvtier.HostSlab
	if ds.gpuBytes > 0 {
		slab = kvtier.NewHostSlab(ds.gpuBytes)
		dev, err := kvtier.NewSlabDevice(slab, kvtier.SlabConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dev.Close() }) // after the store's Close
		cfg.GPU = dev
	}
	st, err := kvtier.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	x.st, x.local = st, &tierDevice{Store: st, device: ds.gpuDevice}
	gpu := &fakeGPU{}
	if slab != nil {
		gpu.mem = slab.At
	}
	x.fetcher = &refetcher{TierFetcher: TierFetcher{Local: x.local}}
	x.s = newService(t, x.fetcher, x.spec, func(c *Config) { c.GPU = gpu })
	x.reg = prometheus.NewRegistry()
	x.reg.MustRegister(x.s)
	x.lay = pagedkv.CacheLayout{Order: ds.order, NumBlocks: 12, BlockSize: 16, KVHeads: x.hi - x.lo, HeadDim: x.spec.HeadDim, DType: ds.dst}
	if ds.dst == chunk.FP8E4M3 {
		x.lay.KScale, x.lay.VScale = 0.5, 2
	}
	d := Descriptor{Fingerprint: x.spec.Fingerprint(), Layers: x.spec.Layers, HeadLo: ds.lo, HeadHi: ds.hi, MaxPositions: 4096}
	x.id, x.ipc = registerFakeIPC(t, x.s, d, x.lay, 1)
	fillPattern(x.ipc.layers, 0x5a)
	x.want = cloneLayers(x.ipc.layers)
	x.before = cloneLayers(x.ipc.layers)
	if x.rope, err = cudakern.NewRopeTable(x.spec, 4096); err != nil {
		t.Fatal(err)
	}
	x.inj = cudakern.NewInjector(cudakern.Config{Workers: 1})
	t.Cleanup(x.inj.Close)
	x.req = &Request{Cache: x.id}
	return x
}

// add stores an entry per size in codec, asks for each in the request (some
// slots -1) and applies direct CPU injection of it to want.
func (x *deviceFixture) add(t *testing.T, codec chunk.Codec, sizes ...int) {
	t.Helper()
	at := 0
	for _, ch := range x.req.Chunks {
		at += len(ch.Slots)
	}
	perm := x.rng.Perm(x.lay.Slots())[at:]
	for i, n := range sizes {
		toks := randTokens(x.rng, n)
		cx := chunk.PrefixContext(chunk.ID{Lo: uint64(len(x.req.Chunks) + 1)})
		e := synthEntry(x.rng, x.spec, toks, cx)
		blob := encode(t, e, codec)
		x.keys = append(x.keys, e.Key)
		if _, err := x.st.Put(t.Context(), blob, kvtier.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		slots := perm[:n]
		perm = perm[n:]
		if i%2 == 1 {
			slots[n/2] = -1
		}
		ch := pagedkv.InjectChunk{Key: chunk.Key{Context: cx}, Tokens: toks, Pos: x.rng.IntN(4096 - n), Slots: slots}
		directInject(t, x.inj, x.rope, blob, x.lay, x.lo, x.hi, ch.Pos, ch.Slots, x.want)
		x.req.Chunks = append(x.req.Chunks, ch)
	}
}

// inject runs the request and checks every chunk is EXACT and the cache
// holds what direct injection wrote.
func (x *deviceFixture) inject(t *testing.T) {
	t.Helper()
	resp, err := x.s.Inject(t.Context(), x.req)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Results {
		if r.Match != chunk.MatchExact {
			t.Fatalf("chunk %d: %v (%v)", i, r.Match, r.Reason)
		}
	}
	equalLayers(t, "cache", x.ipc.layers, x.want)
	x.unpinned(t)
}

// unpinned fails when the store still holds a pin.
func (x *deviceFixture) unpinned(t *testing.T) {
	t.Helper()
	for _, ts := range x.st.Stats().Tiers {
		if ts.PinnedBytes != 0 {
			t.Fatalf("tier %v: %d bytes still pinned", ts.Tier, ts.PinnedBytes)
		}
	}
}

func (x *deviceFixture) deviceChunks(t *testing.T) float64 {
	t.Helper()
	mfs, err := x.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return counterValue(t, mfs, "kvmesh_inject_device_chunks_total", "")
}

// TestDeviceToDevice: exact local hits in (or promoted to) the GPU tier on
// the cache's device are written by the device kernel from their device
// copies, with no host read of the entry, and the cache then equals
// direct CPU injection of the same chunks: raw and int8, int4 and fp8
// payloads, a tensor-parallel head range, slots -1, every cache dtype and
// both orders.
func TestDeviceToDevice(t *testing.T) {
	for ci, tc := range []struct {
		codec    chunk.Codec
		src, dst chunk.DType
		order    pagedkv.Order
		lo, hi   int
	}{
		{chunk.CodecRaw, chunk.BF16, chunk.BF16, pagedkv.NHD, 1, 3},
		{chunk.CodecRaw, chunk.F32, chunk.FP8E4M3, pagedkv.HND, 0, 0},
		{chunk.CodecInt8, chunk.BF16, chunk.F32, pagedkv.HND, 2, 4},
		{chunk.CodecInt4, chunk.F16, chunk.F16, pagedkv.NHD, 1, 3},
		{chunk.CodecFP8, chunk.BF16, chunk.BF16, pagedkv.NHD, 0, 2},
		{chunk.CodecFP8, chunk.F32, chunk.FP8E4M3, pagedkv.HND, 0, 0},
	} {
		t.Run(fmt.Sprintf("%v-%v-to-%v-%v-heads%d-%d", tc.codec, tc.src, tc.dst, tc.order, tc.lo, tc.hi), func(t *testing.T) {
			x := newDeviceFixture(t, deviceSetup{gpuBytes: 4 << 20, gpuDevice: 1, src: tc.src, dst: tc.dst, order: tc.order, lo: tc.lo, hi: tc.hi})
			x.add(t, tc.codec, 1, 17, 33, 8, 70)
			if ci%2 == 1 {
				// Already in the GPU tier, not promoted by the request.
				for _, k := range x.keys {
					h, err := x.st.GetDevice(t.Context(), k)
					if err != nil {
						t.Fatal(err)
					}
					h.Release()
				}
			}
			x.inject(t)
			n := int64(len(x.req.Chunks))
			if got := x.ipc.fromDevice.Load(); got != n*int64(x.spec.Layers) {
				t.Errorf("%d layers written from device sources, want %d", got, n*int64(x.spec.Layers))
			}
			if x.ipc.host.Load() != 0 || x.local.gets.Load() != 0 {
				t.Errorf("host path taken: %d layers from host sources, %d host reads", x.ipc.host.Load(), x.local.gets.Load())
			}
			if got := x.deviceChunks(t); got != float64(n) {
				t.Errorf("kvmesh_inject_device_chunks_total %v, want %d", got, n)
			}
			if st := x.st.Stats(); st.Tiers[kvtier.TierGPU].Entries != int(n) {
				t.Errorf("%d entries in the GPU tier, want %d", st.Tiers[kvtier.TierGPU].Entries, n)
			}
		})
	}
}

// TestDeviceHostPath: what cannot be served from a device copy takes the
// host path, with the same bytes: a cache on another device than the GPU
// tier, no GPU tier, an entry too large for the tier, a codec without a
// device decoder (not moved to the tier), an approximate hit.
func TestDeviceHostPath(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  deviceSetup
		codec  chunk.Codec
		approx bool
	}{
		{"other-device", deviceSetup{gpuBytes: 4 << 20, gpuDevice: 0}, chunk.CodecRaw, false},
		{"no-gpu-tier", deviceSetup{gpuDevice: 1}, chunk.CodecInt8, false},
		{"tier-too-small", deviceSetup{gpuBytes: 1024, gpuDevice: 1}, chunk.CodecRaw, false},
		{"lossless", deviceSetup{gpuBytes: 4 << 20, gpuDevice: 1}, chunk.CodecLossless, false},
		{"approximate", deviceSetup{gpuBytes: 4 << 20, gpuDevice: 1}, chunk.CodecRaw, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup.src, tc.setup.dst, tc.setup.order, tc.setup.lo, tc.setup.hi = chunk.BF16, chunk.BF16, pagedkv.HND, 1, 3
			x := newDeviceFixture(t, tc.setup)
			x.add(t, tc.codec, 9, 40, 3)
			if tc.approx {
				for i := range x.req.Chunks {
					x.req.Chunks[i].Key.Context = chunk.PrefixContext(chunk.ID{Lo: 1000 + uint64(i)})
				}
			}
			resp, err := x.s.Inject(t.Context(), x.req)
			if err != nil {
				t.Fatal(err)
			}
			want := chunk.MatchExact
			if tc.approx {
				want = chunk.MatchApproximate
			}
			for i, r := range resp.Results {
				if r.Match != want {
					t.Fatalf("chunk %d: %v (%v), want %v", i, r.Match, r.Reason, want)
				}
			}
			equalLayers(t, "cache", x.ipc.layers, x.want)
			x.unpinned(t)
			if x.ipc.fromDevice.Load() != 0 || x.deviceChunks(t) != 0 {
				t.Errorf("%d layers written from device sources", x.ipc.fromDevice.Load())
			}
			if got, wantHost := x.ipc.host.Load(), int64(len(x.req.Chunks)*x.spec.Layers); got != wantHost {
				t.Errorf("%d layers from host sources, want %d", got, wantHost)
			}
			if st := x.st.Stats(); tc.setup.gpuBytes > 0 && st.Tiers[kvtier.TierGPU].Entries != 0 {
				t.Errorf("%d entries moved to the GPU tier for nothing", st.Tiers[kvtier.TierGPU].Entries)
			}
		})
	}
}

// TestDeviceHitMismatch: a device copy whose header does not fit the cache
// (another head count under the cache's fingerprint) is read again on the
// host, fails verification there and is refetched once, as any local entry
// that does not fit: a MISS, the cache untouched, nothing pinned.
func TestDeviceHitMismatch(t *testing.T) {
	x := newDeviceFixture(t, deviceSetup{gpuBytes: 4 << 20, gpuDevice: 1, src: chunk.BF16, dst: chunk.BF16, order: pagedkv.NHD})
	other := x.spec
	other.KVHeads = 2
	toks := randTokens(x.rng, 12)
	e := synthEntry(x.rng, other, toks, chunk.StandaloneContext())
	e.Key.Fingerprint, e.Key.Content = x.spec.Fingerprint(), chunk.ContentID(x.spec.Fingerprint(), toks)
	if _, err := x.st.Put(t.Context(), encode(t, e, chunk.CodecInt8), kvtier.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := x.st.GetDevice(t.Context(), e.Key)
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	x.req.Chunks = []pagedkv.InjectChunk{{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: toks, Slots: x.rng.Perm(x.lay.Slots())[:12]}}
	resp, err := x.s.Inject(t.Context(), x.req)
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Results[0]; r.Match != chunk.MatchMiss {
		t.Fatalf("%v (%v), want a MISS", r.Match, r.Reason)
	}
	equalLayers(t, "cache", x.ipc.layers, x.before)
	x.unpinned(t)
	if x.ipc.fromDevice.Load()+x.ipc.host.Load() != 0 {
		t.Errorf("%d layers written", x.ipc.fromDevice.Load()+x.ipc.host.Load())
	}
	if x.local.gets.Load() != 1 || x.fetcher.n.Load() != 1 {
		t.Errorf("%d host reads and %d refetches, want 1 and 1", x.local.gets.Load(), x.fetcher.n.Load())
	}
}

// TestDeviceUnreadableFallsBack: a device copy the kernel cannot read
// (raw f32 layers at addresses not aligned for f32) is not refetched as
// corrupt: the entry is read on the host and injected from there, EXACT.
func TestDeviceUnreadableFallsBack(t *testing.T) {
	x := newDeviceFixture(t, deviceSetup{gpuBytes: 4 << 20, gpuDevice: 1, src: chunk.F32, dst: chunk.BF16, order: pagedkv.NHD, lo: 1, hi: 4})
	x.local.skew = 2
	x.add(t, chunk.CodecRaw, 5, 19)
	x.inject(t)
	if x.ipc.fromDevice.Load() != 0 || x.fetcher.n.Load() != 0 {
		t.Errorf("%d layers from device sources, %d refetches; want none", x.ipc.fromDevice.Load(), x.fetcher.n.Load())
	}
	if got, want := x.ipc.host.Load(), int64(2*x.spec.Layers); got != want || x.local.gets.Load() != 2 {
		t.Errorf("%d layers from host sources (want %d), %d host reads (want 2)", got, want, x.local.gets.Load())
	}
}

// TestDevicePinsReleased: the device copies stay pinned while the kernels
// read them and are released however the request ends: a device error (a
// MISS), and a cancellation after the first layer.
func TestDevicePinsReleased(t *testing.T) {
	t.Run("device-error", func(t *testing.T) {
		x := newDeviceFixture(t, deviceSetup{gpuBytes: 4 << 20, gpuDevice: 1, src: chunk.BF16, dst: chunk.BF16, order: pagedkv.NHD})
		x.add(t, chunk.CodecInt4, 10, 20)
		x.ipc.fail = errDeviceTest
		x.ipc.pinned = func() int64 { return x.st.Stats().Tiers[kvtier.TierGPU].PinnedBytes }
		resp, err := x.s.Inject(t.Context(), x.req)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range resp.Results {
			if r.Match != chunk.MatchMiss || !errors.Is(r.Reason, errDeviceTest) {
				t.Errorf("chunk %d: %v (%v), want a MISS from the device's error", i, r.Match, r.Reason)
			}
		}
		if x.ipc.fromDevice.Load() == 0 || x.ipc.unpinnedReads.Load() != 0 {
			t.Errorf("%d device reads, %d of them with nothing pinned", x.ipc.fromDevice.Load(), x.ipc.unpinnedReads.Load())
		}
		x.unpinned(t)
	})
	t.Run("cancelled", func(t *testing.T) {
		x := newDeviceFixture(t, deviceSetup{gpuBytes: 4 << 20, gpuDevice: 1, src: chunk.BF16, dst: chunk.F16, order: pagedkv.HND})
		x.add(t, chunk.CodecRaw, 10, 20, 30)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		x.req.OnLayer = func(int) { cancel() }
		if _, err := x.s.Inject(ctx, x.req); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled inject: %v", err)
		}
		x.unpinned(t)
		if x.ipc.fromDevice.Load() == 0 {
			t.Error("nothing was written from device sources before the cancellation")
		}
	})
}

var errDeviceTest = errors.New("the stand-in device failed")
