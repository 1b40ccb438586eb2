//go:build cuda

package gpu

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// ipcJob is the job both processes of TestGPUIPCSecondProcess build from
// one seed: bf16 into an HND bf16 cache, layer 0 of an IPC cache.
func ipcJob(t testing.TB) *cudakern.Job {
	rng := rand.New(rand.NewPCG(29, 13))
	tab, err := cudakern.NewRopeTable(specs[2], 3000)
	if err != nil {
		t.Fatal(err)
	}
	lay := pagedkv.CacheLayout{Order: pagedkv.HND, NumBlocks: 6, BlockSize: 16, KVHeads: 2, HeadDim: 64, DType: chunk.BF16}
	return job(rng, tab, chunk.BF16, lay, 50, 4, 1, false)
}

// TestGPUIPCSecondProcess: an engine process exports its cache by CUDA IPC;
// a second process (this test binary again, as the node) opens the handle
// and injects into it; the engine's memory then holds the CPU Injector's
// bytes.
func TestGPUIPCSecondProcess(t *testing.T) {
	if h := os.Getenv("KVMESH_IPC_HANDLE"); h != "" {
		ipcChild(t, h)
		return
	}
	in := open(t)
	j := ipcJob(t)
	cacheMem := devAlloc(t, in, j.Dst[0]) // the guard bytes
	handle, err := in.exportIPC(cacheMem)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^TestGPUIPCSecondProcess$", "-test.v", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), "KVMESH_IPC_HANDLE="+hex.EncodeToString(handle))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the second process: %v\n%s", err, out)
	}
	t.Logf("the second process:\n%s", out)
	cpu := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer cpu.Close()
	if err := cpu.Inject(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(j.Dst[0]))
	devRead(t, in, cacheMem, got)
	same(t, j.Dst[0], got, j.Layout.DType)
}

func ipcChild(t *testing.T, h string) {
	handle, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	j := ipcJob(t)
	// An allocation too small for its layer is refused (and unmapped).
	// The offset is far past the allocation: the size the driver reports
	// for a mapping may be rounded up (logged below).
	if _, err := (Driver{}).OpenIPC(0, [][]byte{handle}, []int64{1 << 30}, []int{j.Layout.LayerBytes()}); err == nil {
		t.Error("an allocation too small for the layer at offset 1 GiB was opened")
	} else {
		t.Logf("refused as it should be: %v", err)
	}
	dc, err := (Driver{}).OpenIPC(0, [][]byte{handle}, nil, []int{j.Layout.LayerBytes()})
	if err != nil {
		t.Fatal(err)
	}
	c := dc.(*IPCCache)
	t.Logf("the %d-byte allocation's IPC mapping: %d bytes by cuMemGetAddressRange", j.Layout.LayerBytes(), c.sizes[0])
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	j.Dst = [][]byte{nil}
	if err := c.Inject(context.Background(), j, 0); err != nil {
		t.Fatal(err)
	}
}
