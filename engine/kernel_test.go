package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
)

// countingGPU is a GPU whose kernel is a CPU Injector that counts its jobs
// (or, with err set, a GPU whose device does not answer).
type countingGPU struct {
	err  error
	jobs atomic.Int64
}

type countingKernel struct {
	*cudakern.Injector
	g *countingGPU
}

func (k countingKernel) Inject(ctx context.Context, j *cudakern.Job) error {
	k.g.jobs.Add(1)
	return k.Injector.Inject(ctx, j)
}

func (g *countingGPU) Kernel(int) (cudakern.Kernel, string, error) {
	if g.err != nil {
		return nil, "", g.err
	}
	return countingKernel{cudakern.NewInjector(cudakern.Config{Workers: 1}), g}, "counting gpu", nil
}

func (g *countingGPU) OpenIPC(int, [][]byte, []int64, []int) (cudakern.DeviceCache, error) {
	return nil, errors.New("no IPC here")
}

// TestEngineInjectsOnGPU: with Config.GPU the engine's own injections go
// through the GPU's kernel, and give the logits the CPU Injector gives;
// with a GPU that does not answer, the CPU Injector does the work.
func TestEngineInjectsOnGPU(t *testing.T) {
	ctx := t.Context()
	c := variants()[sortedNames(variants())[0]]
	dir := t.TempDir()
	if _, err := WriteRandomModel(dir, c, 5, 1); err != nil {
		t.Fatal(err)
	}
	w, err := LoadWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	run := func(g cudakern.GPU) []float32 {
		e, err := New(w, Config{Workers: 2, CacheTokens: 1024, GPU: g, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		r := randTokens(rand.New(rand.NewPCG(3, 4)), 40, e.cfg.VocabSize)
		ch, query := r[:30], r[30:]
		en, err := e.Encode(ctx, nil, ch, chunk.StandaloneContext(), EncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		store := NewMemStore(chunk.CodecRaw)
		if err := store.Put(ctx, en); err != nil {
			t.Fatal(err)
		}
		got, err := e.Run(ctx, store, Request{StartPos: 7, Segments: []Segment{{Tokens: ch, Chunk: true}, {Tokens: query}}})
		if err != nil {
			t.Fatal(err)
		}
		if got.Injected != len(ch) {
			t.Fatalf("injected %d tokens, want %d", got.Injected, len(ch))
		}
		return got.Logits
	}
	cpu := run(nil)
	g := &countingGPU{}
	if got := run(g); !slices.Equal(got, cpu) {
		t.Fatal("logits with the GPU's kernel differ from the CPU Injector's")
	}
	if g.jobs.Load() == 0 {
		t.Fatal("the engine did not inject through the GPU's kernel")
	}
	dead := &countingGPU{err: errors.New("no device")}
	if got := run(dead); !slices.Equal(got, cpu) {
		t.Fatal("logits with a GPU that does not answer differ from the CPU Injector's")
	}
}
