package inject

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// pipeFixture is a service with an in-process cache of a deeper model and
// a request of n stored chunks, with the expected cache after it.
type pipeFixture struct {
	s      *Service
	f      *memFetcher
	id     CacheID
	mem    [][]byte
	before [][]byte
	want   [][]byte
	req    *Request
}

func newPipeFixture(t *testing.T, layers, n int, codec chunk.Codec, mod func(*Config)) *pipeFixture {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(layers), uint64(n)))
	spec := testSpec(chunk.BF16)
	spec.Layers = layers
	fp := spec.Fingerprint()
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: (n*24+15)/16 + 1, BlockSize: 16, KVHeads: 4, HeadDim: 16, DType: chunk.BF16}
	px := &pipeFixture{f: newMemFetcher()}
	px.s = newService(t, px.f, spec, mod)
	px.mem = layersOf(layers, lay)
	var err error
	px.id, err = px.s.RegisterInProcess(t.Context(), Descriptor{Fingerprint: fp, Layers: layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 8192}, px.mem)
	if err != nil {
		t.Fatal(err)
	}
	fillPattern(px.mem, 0x33)
	px.before = cloneLayers(px.mem)
	px.want = cloneLayers(px.mem)
	rope, _ := cudakern.NewRopeTable(spec, 8192)
	inj := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer inj.Close()
	sizes := make([]int, n)
	for i := range sizes {
		sizes[i] = 24
	}
	slots := slotPlan(rng, lay.Slots(), sizes, false)
	px.req = &Request{Cache: px.id}
	for i := range sizes {
		toks := randTokens(rng, 24)
		cx := chunk.StandaloneContext()
		blob := px.f.put(t, synthEntry(rng, spec, toks, cx), codec)
		pos := 24 * i
		directInject(t, inj, rope, blob, lay, 0, 4, pos, slots[i], px.want)
		px.req.Chunks = append(px.req.Chunks, pagedkv.InjectChunk{Key: chunk.Key{Context: cx}, Tokens: toks, Pos: pos, Slots: slots[i]})
	}
	return px
}

// TestProgressInLayerOrder: OnLayer comes once per layer, in order, and
// when it says layer l, layer l of every chunk is already in the cache.
func TestProgressInLayerOrder(t *testing.T) {
	for _, ahead := range []int{1, 2, 5} {
		t.Run(fmt.Sprintf("ahead-%d", ahead), func(t *testing.T) {
			codec := chunk.CodecRaw
			if ahead == 2 {
				codec = chunk.CodecLossless
			}
			px := newPipeFixture(t, 7, 12, codec, func(c *Config) { c.LayersAhead = ahead; c.Workers = 3 })
			next := 0
			px.req.OnLayer = func(l int) {
				if l != next {
					t.Errorf("layer %d reported, want %d", l, next)
				}
				next++
				equalLayers(t, fmt.Sprintf("at progress %d", l), px.mem[:l+1], px.want[:l+1])
			}
			resp, err := px.s.Inject(t.Context(), px.req)
			if err != nil {
				t.Fatal(err)
			}
			if next != 7 {
				t.Fatalf("%d layers reported, want 7", next)
			}
			for i, r := range resp.Results {
				if r.Match != chunk.MatchExact {
					t.Fatalf("chunk %d: %v (%v)", i, r.Match, r.Reason)
				}
			}
			equalLayers(t, "cache", px.mem, px.want)
		})
	}
}

// TestCancel: a cancel during the pipeline, during fetches, or before the
// call stops cleanly: the context's error, every blob released, layers
// reported before the cancel fully written, no goroutine left, and the
// service still serves.
func TestCancel(t *testing.T) {
	t.Run("pipeline", func(t *testing.T) {
		px := newPipeFixture(t, 6, 10, chunk.CodecRaw, nil)
		base := runtime.NumGoroutine()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		reported := -1
		px.req.OnLayer = func(l int) {
			reported = l
			if l == 1 {
				cancel()
			}
		}
		if _, err := px.s.Inject(ctx, px.req); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		if reported != 1 {
			t.Errorf("last layer reported %d, want 1", reported)
		}
		equalLayers(t, "reported layers", px.mem[:2], px.want[:2])
		if px.f.out.Load() != 0 {
			t.Errorf("%d blobs not released", px.f.out.Load())
		}
		testutil.WaitFor(t, "the goroutine count back to where it was", func() bool { return runtime.NumGoroutine() <= base })
		px.req.OnLayer = nil
		if _, err := px.s.Inject(t.Context(), px.req); err != nil {
			t.Fatal(err)
		}
		equalLayers(t, "after a later request", px.mem, px.want)
	})
	t.Run("fetch", func(t *testing.T) {
		px := newPipeFixture(t, 3, 5, chunk.CodecRaw, nil)
		px.f.block = true
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			for px.f.inFlight.Load() < 5 {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
		if _, err := px.s.Inject(ctx, px.req); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		equalLayers(t, "cache", px.mem, px.before)
	})
	t.Run("before", func(t *testing.T) {
		px := newPipeFixture(t, 3, 5, chunk.CodecRaw, nil)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := px.s.Inject(ctx, px.req); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		equalLayers(t, "cache", px.mem, px.before)
		if px.f.out.Load() != 0 {
			t.Errorf("%d blobs not released", px.f.out.Load())
		}
	})
	t.Run("close", func(t *testing.T) {
		px := newPipeFixture(t, 3, 5, chunk.CodecRaw, nil)
		px.f.block = true
		errc := make(chan error, 1)
		go func() {
			_, err := px.s.Inject(t.Context(), px.req)
			errc <- err
		}()
		for px.f.inFlight.Load() < 5 {
			time.Sleep(time.Millisecond)
		}
		if err := px.s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, ErrClosed) || !errors.Is(err, context.Canceled) {
			t.Fatalf("inject during close: %v", err)
		}
		if _, err := px.s.Inject(t.Context(), px.req); !errors.Is(err, ErrClosed) {
			t.Fatalf("inject after close: %v", err)
		}
	})
}

// TestFetchBound: at most FetchParallel fetches run at once.
func TestFetchBound(t *testing.T) {
	px := newPipeFixture(t, 2, 40, chunk.CodecRaw, func(c *Config) { c.FetchParallel = 3 })
	if _, err := px.s.Inject(t.Context(), px.req); err != nil {
		t.Fatal(err)
	}
	if m := px.f.maxIn.Load(); m > 3 || m < 1 {
		t.Fatalf("%d concurrent fetches, bound 3", m)
	}
	equalLayers(t, "cache", px.mem, px.want)
}

// TestUnregisterDuringInject: an inject that holds the cache finishes
// writing it; the registration is gone for the next.
func TestUnregisterDuringInject(t *testing.T) {
	px := newPipeFixture(t, 4, 6, chunk.CodecRaw, nil)
	px.req.OnLayer = func(l int) {
		if l == 0 {
			if err := px.s.Unregister(px.id); err != nil {
				t.Error(err)
			}
		}
	}
	if _, err := px.s.Inject(t.Context(), px.req); err != nil {
		t.Fatal(err)
	}
	equalLayers(t, "cache", px.mem, px.want)
	if _, err := px.s.Inject(t.Context(), px.req); !errors.Is(err, ErrUnknownCache) {
		t.Fatalf("err %v, want ErrUnknownCache", err)
	}
}

// TestConcurrentRequests: requests into several caches at once share the
// workers and each gets exactly its bytes.
func TestConcurrentRequests(t *testing.T) {
	px := newPipeFixture(t, 3, 8, chunk.CodecLossless, nil)
	mems := [][][]byte{px.mem}
	for i := 0; i < 3; i++ {
		m := cloneLayers(px.before)
		lay := px.s.caches[px.id].layouts[0]
		id, err := px.s.RegisterInProcess(t.Context(), Descriptor{Fingerprint: px.s.caches[px.id].desc.Fingerprint,
			Layers: 3, Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 8192}, m)
		if err != nil {
			t.Fatal(err)
		}
		mems = append(mems, m)
		defer func(id CacheID) { _ = px.s.Unregister(id) }(id)
	}
	var wg sync.WaitGroup
	for i := range mems {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := *px.req
			req.Cache = CacheID(int(px.id) + i)
			for rep := 0; rep < 3; rep++ {
				if _, err := px.s.Inject(t.Context(), &req); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for i, m := range mems {
		equalLayers(t, fmt.Sprintf("cache %d", i), m, px.want)
	}
}

// TestFaultIsAnError: a shared file shrunk under the node's mapping makes
// the inject fail with ErrFault instead of crashing the node.
func TestFaultIsAnError(t *testing.T) {
	spec := testSpec(chunk.F32)
	fp := spec.Fingerprint()
	f := newMemFetcher()
	s := newService(t, f, spec, nil)
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 64, BlockSize: 16, KVHeads: 4, HeadDim: 16, DType: chunk.F32}
	path := fmt.Sprintf("/dev/shm/kvmesh-inject-fault-%d", os.Getpid())
	sc, err := CreateShm(path, spec.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	id, err := s.Register(t.Context(), Descriptor{Fingerprint: fp, Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 4096, Memory: sc.Memory})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	toks := randTokens(rng, 40)
	f.put(t, synthEntry(rng, spec, toks, chunk.StandaloneContext()), chunk.CodecRaw)
	slots := make([]int, 40)
	for i := range slots {
		slots[i] = lay.Slots() - 40 + i // the last pages of the file
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	_, err = s.Inject(t.Context(), &Request{Cache: id, Chunks: []pagedkv.InjectChunk{{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: toks, Pos: 0, Slots: slots}}})
	if !errors.Is(err, ErrFault) {
		t.Fatalf("err %v, want ErrFault", err)
	}
	if f.out.Load() != 0 {
		t.Errorf("%d blobs not released", f.out.Load())
	}
}

func counterValue(t *testing.T, mfs []*dto.MetricFamily, name, label string) float64 {
	t.Helper()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no metric %s{%s}", name, label)
	return 0
}

// TestMetrics: the collector registers and counts what responses say.
func TestMetrics(t *testing.T) {
	px := newPipeFixture(t, 5, 4, chunk.CodecLossless, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(px.s)
	miss := pagedkv.InjectChunk{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: []uint32{1, 2, 3}, Pos: 0, Slots: []int{-1, -1, -1}}
	px.req.Chunks = append(px.req.Chunks, miss)
	resp, err := px.s.Inject(t.Context(), px.req)
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, label string
		want        float64
	}{
		{"kvmesh_inject_requests_total", "", 1},
		{"kvmesh_inject_chunks_total", "exact", 4},
		{"kvmesh_inject_chunks_total", "miss", 1},
		{"kvmesh_inject_written_bytes_total", "", float64(resp.WrittenBytes)},
		{"kvmesh_inject_decoded_bytes_total", "", float64(resp.DecodedBytes)},
		{"kvmesh_inject_layer_seconds", "", 5},
		{"kvmesh_inject_request_seconds", "", 1},
		{"kvmesh_inject_registered_caches", "", 1},
	} {
		if got := counterValue(t, mfs, c.name, c.label); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.label, got, c.want)
		}
	}
	if resp.WrittenBytes != 4*24*5*2*4*16*2 || resp.DecodedBytes != resp.WrittenBytes {
		t.Errorf("written %d, decoded %d", resp.WrittenBytes, resp.DecodedBytes)
	}
}
