// Package inject holds the real-process end-to-end test of node-side KV
// injection: three kvmeshd processes on loopback addresses, an engine in
// the test process whose paged KV cache is a shared-memory file registered
// with one node, and chunks the nodes fetch, rotate and write into it.
package inject

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/tests/harness"
)

var hosts = []string{"127.0.0.41", "127.0.0.42", "127.0.0.43"}

type cluster struct {
	procs []*harness.Proc
	cl    *client.Client
}

// buildKvmeshd compiles kvmeshd into a test directory. The build has its
// own bound, outside the test's: on a busy machine (CI runs other
// packages' tests alongside) it can take minutes, which must not be taken
// from the cluster's steps.
func buildKvmeshd(t testing.TB) string {
	t.Helper()
	if err := harness.Bindable(hosts...); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	bin, err := harness.Build(ctx, t.TempDir())
	if errors.Is(err, harness.ErrNoGo) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// startCluster runs three kvmeshd processes of bin (R=3: every node holds
// every entry written through the client) and waits until they agree.
func startCluster(t testing.TB, ctx context.Context, bin string) *cluster {
	t.Helper()
	dir := t.TempDir()
	var err error
	c := &cluster{}
	t.Cleanup(func() {
		for _, p := range c.procs {
			_ = p.Terminate(5 * time.Second)
		}
	})
	for i, h := range hosts {
		id := fmt.Sprintf("n%d", i+1)
		// No startup pull: a fresh node's pull retries with backoff while
		// its peers come up, and a late round would copy to n1 the chunks
		// the tests place on n2 and n3 only for n1 to fetch.
		args := []string{"-local-timing", "-dram", "128M", "-rpc-timeout", "2s", "-bootstrap-expect", "3", "-startup-pull=false"}
		if i > 0 {
			args = append(args, "-join", c.procs[0].Addr("gossip"))
		}
		p := harness.NewProc(harness.ProcConfig{Bin: bin, ID: id, Host: h, DataDir: filepath.Join(dir, id),
			LogPath: filepath.Join(dir, id+".log"), Args: args})
		c.procs = append(c.procs, p)
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var seeds []string
	for _, p := range c.procs {
		seeds = append(seeds, p.Addr("grpc"))
	}
	c.cl, err = client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.cl.Close() })
	for {
		ok := true
		info, err := c.cl.ClusterInfo(ctx)
		if err != nil || info.LeaderId == "" || len(info.Members) != 3 {
			ok = false
		}
		if ok {
			if err := c.cl.Refresh(ctx); err == nil && c.cl.Ring().Len() == 3 {
				return c
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("cluster never converged: %v", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// putDirect stores blob on the node at addr only (a replica write), so
// the other nodes must fetch it from there.
func putDirect(ctx context.Context, addr string, blob []byte, key chunk.Key) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		return err
	}
	defer cc.Close()
	return api.PutDirect(ctx, cc, blob, key)
}

// heldDirect reports whether the node at addr holds key in its own store.
func heldDirect(ctx context.Context, addr string, key chunk.Key) bool {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		return false
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := api.NewClientClient(cc).Get(ctx, &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_ENTRY, Direct: true})
	if err != nil {
		return false
	}
	_, err = st.Recv()
	return err == nil
}

// fetchedBytes scrapes kvmesh_inject_fetched_bytes_total of a node.
func fetchedBytes(t testing.TB, httpAddr, source string) float64 {
	t.Helper()
	return metric(t, httpAddr, `kvmesh_inject_fetched_bytes_total{source="`+source+`"}`)
}

// metric is the value of one series on the node's /metrics (0 if absent).
func metric(t testing.TB, httpAddr, series string) float64 {
	t.Helper()
	m, err := harness.Scrape(t.Context(), httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	return m[series]
}

func tinyModel() engine.ModelConfig {
	return engine.ModelConfig{
		ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 16, VocabSize: 256, RMSNormEps: 1e-5,
		RopeTheta: 10000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 4096, DType: chunk.F32,
	}
}

// newEngine writes a random model, loads it through the real loader and
// starts an engine whose cache is a memfd the nodes can map.
func newEngine(t testing.TB, mc engine.ModelConfig, kv chunk.DType) (*engine.Engine, *inject.ShmCache) {
	t.Helper()
	dir := t.TempDir()
	if _, err := engine.WriteRandomModel(dir, mc, 7, 1); err != nil {
		t.Fatal(err)
	}
	w, err := engine.LoadWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	var shm *inject.ShmCache
	e, err := engine.New(w, engine.Config{Workers: 2, CacheTokens: 4096, KVDType: kv, TokenizerID: "e2e",
		CacheMemory: func(layers int, lay pagedkv.CacheLayout) ([][]byte, error) {
			var err error
			shm, err = inject.CreateShm("", layers, []pagedkv.CacheLayout{lay})
			if err != nil {
				return nil, err
			}
			return shm.Layers, nil
		}})
	if err != nil {
		t.Skipf("shared-memory cache: %v", err)
	}
	t.Cleanup(func() {
		e.Close()
		_ = shm.Close()
	})
	return e, shm
}

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// TestInjectEndToEnd: EXACT chunks injected by a node give prefill's
// logits; an APPROXIMATE one is reported as such (and repaired at r=100%
// gives prefill's logits); a missing one is a MISS and prefilled; chunks
// held only by other nodes are fetched from them; a replica killed
// mid-request makes the node use another replica or answer MISS, and the
// logits stay prefill's.
func TestInjectEndToEnd(t *testing.T) {
	testutil.SkipIfShort(t, "builds kvmeshd and starts 3 processes")
	bin := buildKvmeshd(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, bin)
	e, shm := newEngine(t, tinyModel(), chunk.F32)
	spec, fp := e.Spec(), e.Fingerprint()
	if _, err := c.cl.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	lay, _ := e.CacheMemory()
	local := c.procs[0]
	inj, err := c.cl.RegisterCache(ctx, local.Addr("grpc"), client.CacheRegistration{Fingerprint: fp, Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 4096, File: shm.Memory.File, Offsets: shm.Memory.Offsets})
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close(t.Context())

	rng := rand.New(rand.NewPCG(3, 4))
	toks := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(rng.IntN(256))
		}
		return out
	}
	// Segments: text, four chunks, text. Chunk 3 is stored standalone
	// (APPROXIMATE), chunk 5 (added below) never.
	segs := []engine.Segment{{Tokens: toks(7)}, {Tokens: toks(21), Chunk: true}, {Tokens: toks(16), Chunk: true},
		{Tokens: toks(9), Chunk: true}, {Tokens: toks(30), Chunk: true}, {Tokens: toks(12), Chunk: true}, {Tokens: toks(6)}}
	var all [][]uint32
	for _, s := range segs {
		all = append(all, s.Tokens)
	}
	encode := func(i int, standalone bool) (*chunk.Entry, []byte) {
		var ent *chunk.Entry
		var err error
		if standalone {
			ent, err = e.EncodeStandalone(ctx, all[i])
		} else {
			ent, err = e.EncodeAfterPrefix(ctx, all[:i], all[i])
		}
		if err != nil {
			t.Fatal(err)
		}
		blob, err := chunk.Encode(nil, ent, chunk.CodecRaw)
		if err != nil {
			t.Fatal(err)
		}
		return ent, blob
	}
	var stored []chunk.Key
	for _, i := range []int{1, 2, 3, 4} {
		ent, blob := encode(i, i == 3)
		if _, err := c.cl.Put(ctx, blob); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, ent.Key)
	}
	// Puts return at W=2; "exact" below checks that n1 read from its own
	// store, so wait for n1's copies (the third replica write, or its
	// hint, may still be on the way).
	for _, k := range stored {
		testutil.WaitFor(t, fmt.Sprintf("%v on n1", k), func() bool { return heldDirect(ctx, local.Addr("grpc"), k) })
	}

	// check runs req injected and prefilled; want nil accepts EXACT or
	// MISS for every chunk (n of them).
	check := func(t *testing.T, name string, req engine.Request, want []chunk.Match, tol float64) *engine.Response {
		t.Helper()
		pre, err := e.Run(ctx, nil, engine.Request{StartPos: req.StartPos, Segments: req.Segments})
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.RunInjected(ctx, inj, req)
		if err != nil {
			t.Fatal(err)
		}
		nChunks := 0
		for _, s := range req.Segments {
			if s.Chunk {
				nChunks++
			}
		}
		if len(got.Chunks) != nChunks {
			t.Fatalf("%s: %d chunk results, want %d", name, len(got.Chunks), nChunks)
		}
		for j, cr := range got.Chunks {
			if want == nil {
				if cr.Match == chunk.MatchApproximate {
					t.Errorf("%s: chunk %d reported APPROXIMATE", name, j)
				}
				continue
			}
			if cr.Match != want[j] {
				t.Errorf("%s: chunk %d (segment %d) %v, want %v", name, j, cr.Segment, cr.Match, want[j])
			}
		}
		if d := maxAbsDiff(got.Logits, pre.Logits); d > tol {
			t.Errorf("%s: max |logit diff| vs prefill %.3g > %g", name, d, tol)
		}
		if want != nil {
			// The layered run (layer l computed once layer l is written)
			// is bit-identical to waiting for the whole injection.
			seq, err := e.RunInjected(ctx, waitAll{inj}, req)
			if err != nil {
				t.Fatal(err)
			}
			if d := maxAbsDiff(got.Logits, seq.Logits); d != 0 || got.TokenLayers != seq.TokenLayers || !slices.Equal(got.Chunks, seq.Chunks) {
				t.Errorf("%s: layered run differs from the sequential one: logits by %g, %d vs %d token-layers, chunks %v vs %v",
					name, d, got.TokenLayers, seq.TokenLayers, got.Chunks, seq.Chunks)
			}
		}
		return got
	}
	E, A, M := chunk.MatchExact, chunk.MatchApproximate, chunk.MatchMiss

	t.Run("exact", func(t *testing.T) {
		exact := append([]engine.Segment(nil), segs...)
		exact[3].Chunk, exact[5].Chunk = false, false
		for _, start := range []int{0, 45, 700} {
			got := check(t, fmt.Sprintf("start %d", start), engine.Request{StartPos: start, Segments: exact}, []chunk.Match{E, E, E}, 1e-4)
			if want := len(all[1]) + len(all[2]) + len(all[4]); got.Injected != want {
				t.Errorf("start %d: %d tokens injected, want %d", start, got.Injected, want)
			}
		}
		if b := fetchedBytes(t, local.Addr("http"), "local"); b <= 0 {
			t.Errorf("local fetched bytes %v, want > 0", b)
		}
	})

	t.Run("approximate-and-miss", func(t *testing.T) {
		// r=0: the approximate chunk is used as stored; r=1 repairs it
		// fully, and the miss is prefilled, so the logits are prefill's.
		check(t, "r=0", engine.Request{StartPos: 11, Segments: segs}, []chunk.Match{E, E, A, E, M}, math.Inf(1))
		check(t, "r=1", engine.Request{StartPos: 11, Segments: segs, Recompute: 1}, []chunk.Match{E, E, A, E, M}, 1e-4)
	})

	// Chunks stored on n2 and n3 only: n1 fetches them from a peer.
	remote := func(n int) []engine.Segment {
		rs := []engine.Segment{{Tokens: toks(5)}}
		for range n {
			rs = append(rs, engine.Segment{Tokens: toks(10 + rng.IntN(20)), Chunk: true})
		}
		rs = append(rs, engine.Segment{Tokens: toks(4)})
		var rt [][]uint32
		for _, s := range rs {
			rt = append(rt, s.Tokens)
		}
		for i := 1; i <= n; i++ {
			ent, err := e.EncodeAfterPrefix(ctx, rt[:i], rt[i])
			if err != nil {
				t.Fatal(err)
			}
			blob, err := chunk.Encode(nil, ent, chunk.CodecLossless)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range c.procs[1:] {
				if err := putDirect(ctx, p.Addr("grpc"), blob, ent.Key); err != nil {
					t.Fatal(err)
				}
			}
		}
		return rs
	}
	exactN := func(n int) []chunk.Match {
		out := make([]chunk.Match, n)
		for i := range out {
			out[i] = E
		}
		return out
	}

	t.Run("remote", func(t *testing.T) {
		rs := remote(4)
		before := fetchedBytes(t, local.Addr("http"), "peer")
		check(t, "remote", engine.Request{StartPos: 3, Segments: rs}, exactN(4), 1e-4)
		if after := fetchedBytes(t, local.Addr("http"), "peer"); after <= before {
			t.Errorf("peer fetched bytes %v -> %v, want growth (n1 pulled %v keys from its peers)", before, after,
				metric(t, local.Addr("http"), "kvmesh_replication_pull_keys_total"))
		}
	})

	t.Run("replica-killed", func(t *testing.T) {
		rs := remote(6)
		// Kill n2 while n1 serves the request: every chunk is then EXACT
		// (from n3) or MISS (prefilled); either way the logits are
		// prefill's, since no wrong byte reaches the cache.
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			c.procs[1].Kill()
		}()
		check(t, "during kill", engine.Request{StartPos: 20, Segments: rs}, nil, 1e-4)
		<-killed
		// With n2 dead, n1 finds every chunk on n3.
		check(t, "after kill", engine.Request{StartPos: 20, Segments: rs}, exactN(6), 1e-4)
	})
}
