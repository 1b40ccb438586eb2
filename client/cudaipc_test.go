package client

import (
	"bytes"
	"net"
	"os"
	"slices"
	"testing"

	"google.golang.org/grpc"

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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fi := &fakeInjector{} // no cache socket: the IPC path must not ask for one
	srv := grpc.NewServer(grpc.ForceServerCodecV2(api.Codec()))
	api.RegisterInjectorServer(srv, fi)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	fp := chunk.Fingerprint{Lo: 5, Hi: 6}
	lay := pagedkv.CacheLayout{Order: pagedkv.HND, NumBlocks: 8, BlockSize: 16, KVHeads: 2, HeadDim: 16, DType: chunk.BF16}
	h0, h1 := bytes.Repeat([]byte{1}, 64), bytes.Repeat([]byte{2}, 64)
	reg := CacheRegistration{Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}, Offsets: []int64{0, 4096},
		CUDA: &CUDAMemory{Device: 3, Handles: [][]byte{h0, h1}}}
	inj, err := c.RegisterCache(t.Context(), lis.Addr().String(), reg)
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
	for _, bad := range []CacheRegistration{
		{Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}},
		{Fingerprint: fp, Layers: 2, Layouts: []pagedkv.CacheLayout{lay}, CUDA: reg.CUDA, File: os.Stdin},
	} {
		if _, err := c.RegisterCache(t.Context(), lis.Addr().String(), bad); err == nil {
			t.Errorf("registration with file %v and CUDA %v accepted", bad.File != nil, bad.CUDA != nil)
		}
	}
}
