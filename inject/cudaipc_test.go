package inject

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// fakeIPC stands in for cudakern/gpu's CUDA IPC caches: the "device
// memory" its handles open is host layers, which it writes with the CPU
// Injector through the calls the service makes on a device cache, after
// checking each job as the device path does.
type fakeIPC struct {
	layers  [][]byte
	inj     *cudakern.Injector
	device  int
	handles [][]byte
	offsets []int64
	sizes   []int
	closed  bool
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
	h := *j
	h.Dst = [][]byte{f.layers[layer]}
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
type fakeGPU struct{ next *fakeIPC }

func (g *fakeGPU) Kernel(int) (cudakern.Kernel, string, error) {
	return nil, "", errors.New("the stand-in GPU has no kernel")
}

func (g *fakeGPU) OpenIPC(device int, handles [][]byte, offsets []int64, sizes []int) (cudakern.DeviceCache, error) {
	f := g.next
	if f == nil {
		return nil, errors.New("no stand-in device cache armed")
	}
	g.next = nil
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
// a fakeIPC as the device cache. s must have a fakeGPU (withFakeGPU).
func registerIPC(t *testing.T, s *Service, d Descriptor, lay pagedkv.CacheLayout) (CacheID, [][]byte) {
	t.Helper()
	g, ok := s.cfg.GPU.(*fakeGPU)
	if !ok {
		t.Fatal("registerIPC: the Service has no stand-in GPU (newService with withFakeGPU)")
	}
	f := &fakeIPC{layers: layersOf(d.Layers, lay)}
	g.next = f
	d.Memory = ipcMemory(d.Layers)
	d.Memory.Device = 1
	id, err := s.Register(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	if f.device != 1 || len(f.handles) != d.Layers || f.offsets != nil {
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
	return id, f.layers
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
