package client

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestRegisterCacheCUDA: a cache in device memory registers by its IPC
// handles (MEMORY_KIND_CUDA_IPC, device, offsets) without the cache
// socket; a registration naming both or neither memory is refused before
// any call.
func TestRegisterCacheCUDA(t *testing.T) {
	_, fakes := startFakes(t, 1)
	c := newTestClient(t, fakes[0].addr)
	fi := &fakeInjector{} // no cache socket: the IPC path must not ask for one
	addr := serveInjector(t, fi)

	fp := chunk.Fingerprint{Lo: 5, Hi: 6}
	lay := pagedkv.CacheLayout{Order: pagedkv.HND, NumBlocks: 8, BlockSize: 16, KVHeads: 2, HeadDim: 16, DType: chunk.BF16}
	h0, h1 := bytes.Repeat([]byte{1}, 64), bytes.Repeat([]byte{2}, 64)
	reg := CacheRegistration{Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}, Offsets: []int64{0, 4096},
		CUDA: &CUDAMemory{Device: 3, Handles: [][]byte{h0, h1}}}
	inj, err := c.RegisterCache(t.Context(), addr, reg)
	if err != nil {
		t.Fatal(err)
	}
	fi.mu.Lock()
	r := fi.reg
	fi.mu.Unlock()
	if r.MemoryKind != api.MemoryKind_MEMORY_KIND_CUDA_IPC || r.Device != 3 || len(r.IpcHandles) != 2 ||
		!bytes.Equal(r.IpcHandles[0], h0) || !bytes.Equal(r.IpcHandles[1], h1) || !slices.Equal(r.Offsets, []int64{0, 4096}) ||
		r.MemoryHandle != nil || api.FingerprintFromProto(r.Fingerprint) != fp {
		t.Fatalf("registration sent %v", r)
	}
	if err := inj.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	fi.mu.Lock()
	fi.reg = nil
	fi.mu.Unlock()
	for name, bad := range map[string]CacheRegistration{
		"no memory":    {Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}},
		"both":         {Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}, CUDA: reg.CUDA, File: os.Stdin},
		"device":       {Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}, CUDA: &CUDAMemory{Device: -1, Handles: [][]byte{h0, h1}}},
		"one handle":   {Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}, CUDA: &CUDAMemory{Handles: [][]byte{h0}}},
		"short handle": {Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}, CUDA: &CUDAMemory{Handles: [][]byte{h0, h1[:8]}}},
	} {
		_, err := c.RegisterCache(t.Context(), addr, bad)
		if err == nil || errors.Is(err, ErrNoCUDAIPC) {
			t.Errorf("%s: registration answered %v, want a refusal that is not ErrNoCUDAIPC", name, err)
		}
	}
	fi.mu.Lock()
	defer fi.mu.Unlock()
	if fi.reg != nil {
		t.Errorf("a refused registration reached the node: %v", fi.reg)
	}
}

// TestRegisterCacheCUDARefused: a node that cannot open the IPC handles
// (Unimplemented: no device kernel; InvalidArgument: its device refused
// them) answers an error that is ErrNoCUDAIPC and keeps the node's
// status, so a caller can fall back to shared memory; other refusals
// are not ErrNoCUDAIPC.
func TestRegisterCacheCUDARefused(t *testing.T) {
	_, fakes := startFakes(t, 1)
	c := newTestClient(t, fakes[0].addr)
	fi := &fakeInjector{}
	addr := serveInjector(t, fi)

	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 8, BlockSize: 16, KVHeads: 2, HeadDim: 16, DType: chunk.F16}
	reg := CacheRegistration{Fingerprint: chunk.Fingerprint{Lo: 5, Hi: 6}, Layers: 1, Layouts: []pagedkv.CacheLayout{lay},
		CUDA: &CUDAMemory{Handles: [][]byte{bytes.Repeat([]byte{1}, api.IPCHandleBytes)}}}
	for _, tc := range []struct {
		code     codes.Code
		fallBack bool
	}{
		{codes.Unimplemented, true},
		{codes.InvalidArgument, true},
		{codes.PermissionDenied, false}, // another machine: shared memory is refused too
		{codes.ResourceExhausted, false},
	} {
		fi.mu.Lock()
		fi.regErr = status.Error(tc.code, "refused")
		fi.mu.Unlock()
		_, err := c.RegisterCache(t.Context(), addr, reg)
		if err == nil {
			t.Fatalf("%v: registered", tc.code)
		}
		if errors.Is(err, ErrNoCUDAIPC) != tc.fallBack || status.Code(err) != tc.code {
			t.Errorf("%v: %v (ErrNoCUDAIPC %v, code %v), want ErrNoCUDAIPC %v", tc.code, err,
				errors.Is(err, ErrNoCUDAIPC), status.Code(err), tc.fallBack)
		}
	}
}
