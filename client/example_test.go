package client_test

import (
	"context"
	"errors"
	"log"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// An engine registers its GPU cache by CUDA IPC and, where the node cannot
// open the handles, falls back to a shared-memory cache of the same
// layout: the node writes hits there, and the engine copies the rows
// written (the slots of the hits, layer by layer) to its GPU before its
// model reads them. The handles come from the engine's cudaIpcGetMemHandle.
func ExampleClient_RegisterCache_sharedMemoryFallback() {
	ctx := context.Background()
	c, err := client.New(ctx, client.Config{Seeds: []string{"127.0.0.1:7000"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 1024, BlockSize: 16, KVHeads: 8, HeadDim: 128, DType: chunk.BF16}
	handles := make([][]byte, 32) // one cudaIpcMemHandle_t per layer, from the engine
	reg := client.CacheRegistration{Fingerprint: chunk.Fingerprint{Lo: 1}, Layers: 32, Layouts: []pagedkv.CacheLayout{lay},
		CUDA: &client.CUDAMemory{Device: 0, Handles: handles}}
	inj, err := c.RegisterCache(ctx, "127.0.0.1:7000", reg)
	if errors.Is(err, client.ErrNoCUDAIPC) {
		// Host staging: page-lock shm.Layers for the GPU (cudaHostRegister),
		// and after InjectLayered reports layer l, copy the hits' slots of
		// shm.Layers[l] to the device.
		shm, serr := inject.CreateShm("", reg.Layers, reg.Layouts)
		if serr != nil {
			log.Fatal(serr)
		}
		defer shm.Close()
		reg.CUDA, reg.File, reg.Offsets = nil, shm.Memory.File, shm.Memory.Offsets
		inj, err = c.RegisterCache(ctx, "127.0.0.1:7000", reg)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer inj.Close(ctx)
}
