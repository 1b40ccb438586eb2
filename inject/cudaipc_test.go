package inject

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// fakeIPC stands in for cudakern/gpu's CUDA IPC caches: the "device
// memory" its handles open is host layers, which it writes with the CPU
// Injector through the calls the service makes on a device cache, after
// checking each job as the device path does. Its device sources are read
// through mem, which resolves a "device address" as a kernel would (a
// kvtier.HostSlab's At: the GPU tier's addresses are host ones).
type fakeIPC struct {
	layers  [][]byte
	inj     *cudakern.Injector
	mem     func(p uint64, n int) ([]byte, error)
	device  int
	handles [][]byte
	offsets []int64
	sizes   []int
	closed  bool
	// host and fromDevice count the layers written from host and from
	// device sources.
	host, fromDevice atomic.Int64
	// fail, when set, is what InjectDevice returns. pinned, when set, says
	// how many device bytes the store holds pinned: unpinnedReads counts
	// the device reads that found none.
	fail          error
	pinned        func() int64
	unpinnedReads atomic.Int64
}

func (f *fakeIPC) open(device int, handles [][]byte, offsets []int64, sizes []int) (cudakern.DeviceCache, error) {
	if len(handles) != len(f.layers) {
		return nil, fmt.Errorf("%d handles for %d layers", len(handles), len(f.layers))
	}
	for l, n := range sizes {
		if n != len(f.layers[l]) {
			return nil, fmt.Errorf("layer %d: size %d, memory %d", l, n, len(f.layers[l]))
		}
	}
	f.device, f.handles, f.offsets, f.sizes = device, handles, offsets, sizes
	f.inj = cudakern.NewInjector(cudakern.Config{Workers: 1})
	return f, nil
}

func (f *fakeIPC) Inject(ctx context.Context, j *cudakern.Job, layer int) error {
	if len(j.Dst) != 1 || j.Dst[0] != nil {
		return errors.New("a device job names its layer by one nil Dst")
	}
	if _, err := cudakern.DeviceJobOf(j, chunk.CodecRaw); err != nil {
		return err
	}
	f.host.Add(1)
	h := *j
	h.Dst = [][]byte{f.layers[layer]}
	return f.inj.Inject(ctx, &h)
}

// InjectDevice reads the layer at src as the kernel does: a raw layer, or
// a codec payload of every source head decoded (by chunk's decoder, the
// reference the kernel is held to bit for bit) into the job's heads. The
// device checks no checksum; the tier did when the entry entered it.
func (f *fakeIPC) InjectDevice(ctx context.Context, j *cudakern.Job, layer int, src uint64, codec chunk.Codec) error {
	if len(j.Dst) != 1 || j.Dst[0] != nil || j.Src != nil {
		return errors.New("a device job names its layer by one nil Dst and has no host source")
	}
	if _, err := cudakern.DeviceJobOf(j, codec); err != nil {
		return err
	}
	if f.mem == nil {
		return errors.New("the stand-in device has no memory to read sources from")
	}
	sh := chunk.Shape{DType: j.SrcDType, Tokens: j.Tokens, Layers: 1, KVHeads: j.SrcHeads, HeadDim: j.Layout.HeadDim}
	n := sh.LayerBytes()
	if codec != chunk.CodecRaw {
		n = cudakern.EncodedLayerBytes(codec, sh.DType, sh.Tokens, sh.KVHeads, sh.HeadDim)
	}
	p, err := f.mem(src, n)
	if err != nil {
		return err
	}
	f.fromDevice.Add(1)
	if f.pinned != nil && f.pinned() == 0 {
		f.unpinnedReads.Add(1)
	}
	if f.fail != nil {
		return f.fail
	}
	h := *j
	h.Src, h.Dst = p, [][]byte{f.layers[layer]}
	if codec != chunk.CodecRaw {
		lo, hi := j.HeadLo, j.HeadHi
		if hi == 0 {
			hi = j.SrcHeads
		}
		hd := chunk.Header{Codec: codec, Shape: sh, PayloadStart: 0, BlobBytes: n,
			Layers: []chunk.LayerRef{{Offset: 0, Length: uint64(n), Checksum: xxhash.Sum64(p)}}}
		rg := chunk.Range{LayerLo: 0, LayerHi: 1, HeadLo: lo, HeadHi: hi}
		h.Src = make([]byte, rg.RangeBytes(sh))
		if err := chunk.DecodeRange(h.Src, p, &hd, rg, nil); err != nil {
			return err
		}
		h.SrcHeads, h.HeadLo, h.HeadHi = hi-lo, 0, 0
	}
	return f.inj.Inject(ctx, &h)
}

func (f *fakeIPC) Close() error {
	f.inj.Close()
	f.closed = true
	return nil
}

// fakeGPU is the stand-in cudakern.GPU of a Service under test: it has no
// kernel (the workers take the CPU Injector, as with a GPU that does not
// answer), and OpenIPC opens the fakeIPC registerIPC armed.
type fakeGPU struct {
	next *fakeIPC
	// mem is the device memory the opened caches' kernels read (nil: none).
	mem func(p uint64, n int) ([]byte, error)
}

func (g *fakeGPU) Kernel(int) (cudakern.Kernel, string, error) {
	return nil, "", errors.New("the stand-in GPU has no kernel")
}

func (g *fakeGPU) OpenIPC(device int, handles [][]byte, offsets []int64, sizes []int) (cudakern.DeviceCache, error) {
	f := g.next
	if f == nil {
		return nil, errors.New("no stand-in device cache armed")
	}
	g.next = nil
	f.mem = g.mem
	return f.open(device, handles, offsets, sizes)
}

// withFakeGPU is newService's Config change that gives the Service a
// fakeGPU (when on), for caches registered by registerIPC.
func withFakeGPU(on bool) func(*Config) {
	return func(c *Config) {
		if on {
			c.GPU = &fakeGPU{}
		}
	}
}

// registerIPC registers host layers of lay through the CUDA IPC path with
// a fakeIPC as the device cache, on device 1. s must have a fakeGPU
// (withFakeGPU).
func registerIPC(t *testing.T, s *Service, d Descriptor, lay pagedkv.CacheLayout) (CacheID, [][]byte) {
	t.Helper()
	id, f := registerFakeIPC(t, s, d, lay, 1)
	return id, f.layers
}

// registerFakeIPC is registerIPC on device, returning the stand-in cache.
func registerFakeIPC(t *testing.T, s *Service, d Descriptor, lay pagedkv.CacheLayout, device int) (CacheID, *fakeIPC) {
	t.Helper()
	g, ok := s.cfg.GPU.(*fakeGPU)
	if !ok {
		t.Fatal("registerIPC: the Service has no stand-in GPU (newService with withFakeGPU)")
	}
	f := &fakeIPC{layers: layersOf(d.Layers, lay)}
	g.next = f
	d.Layouts = []pagedkv.CacheLayout{lay}
	d.Memory = ipcMemory(d.Layers)
	d.Memory.Device = device
	id, err := s.Register(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	if f.device != device || len(f.handles) != d.Layers || f.offsets != nil {
		t.Fatalf("the device kernel got device %d, %d handles, offsets %v", f.device, len(f.handles), f.offsets)
	}
	t.Cleanup(func() {
		if err := s.Unregister(id); err != nil && !errors.Is(err, ErrUnknownCache) {
			t.Error(err)
		}
		if !f.closed {
			t.Error("unregistering did not close the device cache")
		}
	})
	return id, f
}

// ipcMemory is a CUDA IPC registration of n layers with distinct handles.
func ipcMemory(n int) Memory {
	h := make([][]byte, n)
	for i := range h {
		h[i] = make([]byte, cudakern.IPCHandleBytes)
		h[i][0] = byte(i + 1)
	}
	return Memory{Kind: MemoryCUDAIPC, IPCHandles: h}
}

// kernelGPU is a GPU whose kernels are CPU Injectors; it counts them.
type kernelGPU struct {
	fakeGPU
	opened atomic.Int32
}

func (g *kernelGPU) Kernel(int) (cudakern.Kernel, string, error) {
	g.opened.Add(1)
	return cudakern.NewInjector(cudakern.Config{Workers: 1}), "counting gpu", nil
}

// TestGPUWorkers: only GPUWorkers of the workers open a GPU kernel (one by
// default), the others take the CPU Injector, and Kernel names the GPU's.
func TestGPUWorkers(t *testing.T) {
	spec := testSpec(chunk.BF16)
	for _, tc := range []struct{ workers, gpuWorkers, want int }{{4, 0, 1}, {4, 3, 3}, {2, 8, 2}} {
		g := &kernelGPU{}
		s := newService(t, newMemFetcher(), spec, func(c *Config) {
			c.Workers, c.GPUWorkers, c.GPU = tc.workers, tc.gpuWorkers, g
		})
		if got := int(g.opened.Load()); got != tc.want {
			t.Errorf("%d workers, GPUWorkers %d: %d GPU kernels opened, want %d", tc.workers, tc.gpuWorkers, got, tc.want)
		}
		if s.Kernel() != "counting gpu" {
			t.Errorf("Kernel() = %q, want the GPU's", s.Kernel())
		}
	}
}
