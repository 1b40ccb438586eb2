package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/cputime"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/tests/harness"
	"github.com/kvmesh/kvmesh/workload"
)

// linkRateFlags configure the codec x link-rate run (-linkrate).
type linkRateFlags struct {
	kvmeshd string    // kvmeshd binary ("" builds one)
	rates   []float64 // emulated link rates in Gbit/s; 0: unpaced loopback
	codecs  []chunk.Codec
	k       int // chunks per request
	reps    int // timed requests per codec and rate
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("link rate %q: want Gbit/s, e.g. 1,10,25 (0: unpaced)", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// The model of the run: tests/inject's TTFT benchmark model (4 layers, 2 KV
// heads of 64, bf16: 2 KiB of KV a token), 24-token chunks keyed by a
// 20-token window, a 16-token question.
const (
	lrFactTokens = 24
	lrWindow     = 20
	lrQuery      = 16
	lrWarm       = 2 // untimed requests per codec and rate
)

func linkRateModel() engine.ModelConfig {
	return engine.ModelConfig{
		ModelType: "llama", HiddenSize: 256, IntermediateSize: 768, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 64, VocabSize: 2048, RMSNormEps: 1e-5,
		RopeTheta: 500000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 8192, DType: chunk.BF16,
	}
}

// lrCodec is one codec's chunks: the same k facts' KV encoded in it, under
// facts of its own (so every codec has its own keys).
type lrCodec struct {
	codec  chunk.Codec
	facts  [][]uint32
	blobs  [][]byte
	stored int64         // entry bytes of the k chunks
	decode time.Duration // one goroutine decoding all k entries (best of 3)
}

// lrResult is a codec at a rate: remote (chunks on n2 only) and local
// (chunks on n1, the engine's node) TTFT, sorted.
type lrResult struct {
	remote, local []time.Duration
	peerBytes     float64 // entry bytes n1 fetched from peers per remote request
	localPeer     float64 // the same for local requests (0 unless a chunk moved)
}

// runLinkRate measures remote-hit TTFT at k chunks for each codec at each
// emulated link rate: 3 kvmeshd processes paced with -peer-link-rate, an
// engine in this process whose cache is registered with n1, the chunks
// stored on n2 only, so n1 fetches every byte over one paced link.
func runLinkRate(ctx context.Context, f linkRateFlags, progress func(string)) error {
	dir, err := os.MkdirTemp("", "kvmesh-linkrate-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if f.kvmeshd == "" {
		progress("building kvmeshd")
		if f.kvmeshd, err = harness.Build(ctx, dir); err != nil {
			return err
		}
	}
	loadStart := loadAvg()
	mc := linkRateModel()
	e, shm, err := linkRateEngine(filepath.Join(dir, "model"), mc)
	if err != nil {
		return err
	}
	defer func() {
		e.Close()
		_ = shm.Close()
	}()
	rng := rand.New(rand.NewPCG(5, 6))
	toks := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(rng.IntN(mc.VocabSize))
		}
		return out
	}
	query := toks(lrQuery)
	// far: chunks only on n2; near: the same codec's chunks (other
	// facts) on n1 only, the local-hit reference.
	var far, near []*lrCodec
	for _, c := range f.codecs {
		for _, set := range []*[]*lrCodec{&far, &near} {
			lc, err := linkRateChunks(ctx, e, c, f.k, toks)
			if err != nil {
				return err
			}
			*set = append(*set, lc)
		}
	}
	raw := int64(f.k * lrFactTokens * e.Spec().KVBytesPerToken())
	xfer, err := loopbackCost(ctx, int(raw))
	if err != nil {
		return fmt.Errorf("loopback reference: %w", err)
	}
	progress(fmt.Sprintf("plain gRPC stream on loopback: %.2f CPU-s per GB, both ends", xfer*1e9))
	results := make(map[float64][]lrResult)
	for _, rate := range f.rates {
		progress(fmt.Sprintf("link %s: starting 3 kvmeshd", rateName(rate)))
		res, err := linkRatePoint(ctx, f, e, shm, dir, rate, far, near, query)
		if err != nil {
			return fmt.Errorf("link %s: %w", rateName(rate), err)
		}
		for i, c := range f.codecs {
			progress(fmt.Sprintf("  %s: remote p50 %s ms (%.2f MB from peers a request), local p50 %s ms", c, ms(pct(res[i].remote, 0.5)),
				res[i].peerBytes/1e6, ms(pct(res[i].local, 0.5))))
		}
		results[rate] = res
	}
	fmt.Print(linkRateMarkdown(f, far, raw, xfer, results, loadStart, loadAvg()))
	return nil
}

// linkRateEngine writes a random model of mc and starts an engine whose
// paged cache is a memfd the nodes can map.
func linkRateEngine(dir string, mc engine.ModelConfig) (*engine.Engine, *inject.ShmCache, error) {
	if _, err := engine.WriteRandomModel(dir, mc, 7, 1); err != nil {
		return nil, nil, err
	}
	w, err := engine.LoadWeights(dir)
	if err != nil {
		return nil, nil, err
	}
	var shm *inject.ShmCache
	e, err := engine.New(w, engine.Config{Workers: 2, CacheTokens: 4096, KVDType: mc.DType, TokenizerID: "kvmesh-bench-linkrate",
		CacheMemory: func(layers int, lay pagedkv.CacheLayout) ([][]byte, error) {
			var err error
			if shm, err = inject.CreateShm("", layers, []pagedkv.CacheLayout{lay}); err != nil {
				return nil, err
			}
			return shm.Layers, nil
		}})
	if err != nil {
		return nil, nil, fmt.Errorf("engine with a shared-memory cache: %w", err)
	}
	return e, shm, nil
}

// linkRateChunks makes k facts, their KV from the engine (each keyed by
// the window of the facts before it), encoded in c, and times one
// goroutine decoding all of them.
func linkRateChunks(ctx context.Context, e *engine.Engine, c chunk.Codec, k int, toks func(int) []uint32) (*lrCodec, error) {
	lc := &lrCodec{codec: c}
	for i := range k {
		lc.facts = append(lc.facts, toks(lrFactTokens))
		ent, err := e.EncodeWindow(ctx, lc.facts[:i], lrWindow, lc.facts[i])
		if err != nil {
			return nil, err
		}
		blob, err := chunk.Encode(nil, ent, c)
		if err != nil {
			return nil, err
		}
		lc.blobs = append(lc.blobs, blob)
		lc.stored += int64(len(blob))
	}
	if c == chunk.CodecRaw {
		return lc, nil // injection reads a raw entry's layers in place
	}
	// As the node's injection decodes: a layer at a time into a reused
	// buffer, the header parsed once per entry.
	// The best of 20 passes (a few ms each): on a loaded machine most
	// passes lose a time slice to another process.
	lc.decode = time.Duration(math.MaxInt64)
	var buf []byte
	for range 20 {
		t0 := time.Now()
		for _, b := range lc.blobs {
			hd, err := chunk.ParseHeader(b, chunk.DefaultLimits)
			if err != nil {
				return nil, err
			}
			lb := hd.Shape.LayerBytes()
			if cap(buf) < lb {
				buf = make([]byte, lb)
			}
			for l := range hd.Shape.Layers {
				if err := chunk.DecodeRange(buf[:lb], b, &hd, chunk.Range{LayerLo: l, LayerHi: l + 1}, nil); err != nil {
					return nil, err
				}
			}
		}
		lc.decode = min(lc.decode, time.Since(t0))
	}
	return lc, nil
}

// sink receives Put streams into one reused buffer and drops them: the
// plain gRPC stream the loopback reference times.
type sink struct {
	api.UnimplementedClientServer
	mu  sync.Mutex
	buf []byte
}

func (s *sink) Put(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) error {
	var hdr api.PutHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if uint64(cap(s.buf)) < hdr.BlobBytes {
		s.buf = make([]byte, hdr.BlobBytes)
	}
	if err := api.RecvBody(st, s.buf[:hdr.BlobBytes]); err != nil {
		return err
	}
	return st.SendAndClose(&api.PutResponse{})
}

// loopbackCost streams n bytes at a time over a plain gRPC connection on
// loopback, both ends in this process with kvmesh's transport settings,
// and returns the CPU seconds both ends spend per byte: the transport's
// share of moving a request's chunks, which no link rate removes.
func loopbackCost(ctx context.Context, n int) (float64, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := grpc.NewServer(append(api.ServerOptions(), grpc.ForceServerCodecV2(api.Codec()))...)
	api.RegisterClientServer(srv, &sink{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	dialOpts, err := client.DialOptions(client.Config{})
	if err != nil {
		return 0, err
	}
	cc, err := grpc.NewClient(lis.Addr().String(), dialOpts...)
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	c := api.NewClientClient(cc)
	blob := make([]byte, n)
	put := func() error {
		st, err := c.Put(ctx, grpc.ForceCodecV2(api.Codec()))
		if err != nil {
			return err
		}
		if err := api.SendHeader(st, &api.PutHeader{BlobBytes: uint64(n)}); err != nil {
			return err
		}
		if err := api.SendBody(st, mem.SliceBuffer(blob), api.DefaultFrameBytes); err != nil {
			return err
		}
		_, err = st.CloseAndRecv()
		return err
	}
	if err := put(); err != nil { // connection up, buffers allocated
		return 0, err
	}
	const rounds = 40
	cpu0 := cputime.Process()
	for range rounds {
		if err := put(); err != nil {
			return 0, err
		}
	}
	return (cputime.Process() - cpu0).Seconds() / float64(rounds*n), nil
}

// gbit is bytes per second of a link of g Gbit/s.
func gbit(g float64) int64 { return int64(g * 1e9 / 8) }

func rateName(g float64) string {
	if g == 0 {
		return "unpaced"
	}
	return strconv.FormatFloat(g, 'f', -1, 64) + " Gbit/s"
}

// linkRatePoint starts a cluster paced at rate, stores the chunks and
// times requests, codecs alternating request by request.
func linkRatePoint(ctx context.Context, f linkRateFlags, e *engine.Engine, shm *inject.ShmCache, dir string, rate float64, far, near []*lrCodec, query []uint32) ([]lrResult, error) {
	// No anti-entropy and no startup pull: n1 and n3 (owners of every key
	// at R=3) must not copy the chunks stored only on n2.
	extra := []string{"-anti-entropy", "off", "-startup-pull=false"}
	if rate > 0 {
		extra = append(extra, "-peer-link-rate", strconv.FormatInt(gbit(rate), 10))
	}
	ndir := filepath.Join(dir, "r"+strconv.FormatFloat(rate, 'f', -1, 64))
	if err := os.MkdirAll(ndir, 0o755); err != nil {
		return nil, err
	}
	nodes, err := startNodesArgs(ctx, f.kvmeshd, ndir, 3, "256M", extra)
	defer func() {
		var wg sync.WaitGroup
		for _, p := range nodes {
			wg.Go(func() { _ = p.Terminate(15 * time.Second) })
		}
		wg.Wait()
	}()
	if err != nil {
		return nil, err
	}
	var seeds []string
	for _, p := range nodes {
		seeds = append(seeds, p.Addr("grpc"))
	}
	cl, err := client.New(ctx, client.Config{Seeds: seeds})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	spec := e.Spec()
	if _, err := retry(ctx, func() (chunk.Fingerprint, error) { return cl.RegisterModel(ctx, spec) }); err != nil {
		return nil, fmt.Errorf("register model: %w", err)
	}
	// The ring must hold all three before the chunks go in: a ring change
	// afterwards would move them. A node that has not seen the model yet
	// refuses a direct put for a moment: retry.
	if _, err := retry(ctx, func() (bool, error) {
		if err := cl.Refresh(ctx); err != nil {
			return false, err
		}
		if n := cl.Ring().Len(); n != 3 {
			return false, fmt.Errorf("ring of %d nodes", n)
		}
		return true, nil
	}); err != nil {
		return nil, err
	}
	for i := range far {
		// On n2 only: every remote byte crosses the one paced connection
		// from n1 to n2 (chunks spread over n2 and n3 would cross two
		// links at once, twice the emulated rate).
		for j, blob := range far[i].blobs {
			if _, err := retry(ctx, func() (bool, error) { return true, putDirect(ctx, nodes[1].Addr("grpc"), blob, keyOf(blob)) }); err != nil {
				return nil, fmt.Errorf("store chunk %d on %s: %w", j, nodes[1].ID(), err)
			}
		}
		for _, blob := range near[i].blobs {
			if _, err := retry(ctx, func() (bool, error) { return true, putDirect(ctx, nodes[0].Addr("grpc"), blob, keyOf(blob)) }); err != nil {
				return nil, err
			}
		}
	}
	lay, _ := e.CacheMemory()
	inj, err := cl.RegisterCache(ctx, nodes[0].Addr("grpc"), client.CacheRegistration{Fingerprint: e.Fingerprint(), Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, File: shm.Memory.File, Offsets: shm.Memory.Offsets})
	if err != nil {
		return nil, err
	}
	defer inj.Close(context.WithoutCancel(ctx))
	prompt := func(facts [][]uint32) []engine.Segment {
		var segs []engine.Segment
		for _, t := range facts {
			segs = append(segs, engine.Segment{Tokens: t, Chunk: true})
		}
		return append(segs, engine.Segment{Tokens: query})
	}
	res := make([]lrResult, len(far))
	fetched := make([]float64, len(far)) // peer bytes of the timed remote requests
	for rep := range lrWarm + f.reps {
		for i := range far {
			for _, way := range []struct {
				facts [][]uint32
				into  *[]time.Duration
			}{{far[i].facts, &res[i].remote}, {near[i].facts, &res[i].local}} {
				before, err := peerFetched(ctx, nodes[0].Addr("http"))
				if err != nil {
					return nil, err
				}
				t0 := time.Now()
				resp, err := e.RunInjected(ctx, inj, engine.Request{Segments: prompt(way.facts)})
				d := time.Since(t0)
				if err != nil {
					return nil, err
				}
				after, err := peerFetched(ctx, nodes[0].Addr("http"))
				if err != nil {
					return nil, err
				}
				if rep >= lrWarm {
					if way.into == &res[i].remote {
						fetched[i] += after - before
					} else {
						res[i].localPeer += after - before
					}
				}
				if want := f.k * lrFactTokens; resp.Injected != want {
					return nil, fmt.Errorf("%s: injected %d of %d tokens", far[i].codec, resp.Injected, want)
				}
				if rep >= lrWarm {
					*way.into = append(*way.into, d)
				}
			}
		}
	}
	for i := range res {
		// Whole byte counts summed, then divided: summing per-request
		// shares of them would round under the stored size.
		res[i].peerBytes = fetched[i] / float64(f.reps)
		if res[i].localPeer > 0 || fetched[i] < float64(f.reps)*float64(far[i].stored) {
			return nil, fmt.Errorf("%s: remote requests fetched %.0f bytes from peers of %d; local ones %.0f: chunks moved",
				far[i].codec, res[i].peerBytes, far[i].stored, res[i].localPeer)
		}
		slices.Sort(res[i].remote)
		slices.Sort(res[i].local)
	}
	return res, nil
}

// peerFetched is n1's kvmesh_inject_fetched_bytes_total{source="peer"}.
func peerFetched(ctx context.Context, httpAddr string) (float64, error) {
	return fetchedFrom(ctx, httpAddr, "peer")
}

func fetchedFrom(ctx context.Context, httpAddr, source string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `kvmesh_inject_fetched_bytes_total{source="`+source+`"} `); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, sc.Err()
}

func keyOf(blob []byte) chunk.Key {
	hd, err := chunk.ParseHeader(blob, chunk.DefaultLimits)
	if err != nil {
		return chunk.Key{}
	}
	return hd.Key
}

// putDirect stores blob on the node at addr only (a replica write), so
// that the other nodes must fetch it from there.
func putDirect(ctx context.Context, addr string, blob []byte, key chunk.Key) error {
	dialOpts, err := client.DialOptions(client.Config{})
	if err != nil {
		return err
	}
	cc, err := grpc.NewClient(addr, dialOpts...)
	if err != nil {
		return err
	}
	defer cc.Close()
	return api.PutDirect(ctx, cc, blob, key)
}

func pct(d []time.Duration, q float64) time.Duration { return workload.Quantile(d, q) }

func linkRateMarkdown(f linkRateFlags, cs []*lrCodec, raw int64, xfer float64, results map[float64][]lrResult, loadStart, loadEnd string) string {
	var b strings.Builder
	tokens := f.k * lrFactTokens
	fmt.Fprintf(&b, "3 kvmeshd processes on loopback, each pacing the connections it dials to its peers with -peer-link-rate; an engine (4 layers, "+
		"2 KV heads x 64, bf16: %d B of KV a token) whose cache is registered with n1; k=%d chunks of %d tokens (%.2f MB raw) stored on n2 "+
		"only (remote: every byte crosses the paced n1-n2 link) or on n1 only (local); %d requests per cell after %d warm-up, codecs alternating request by request. "+
		"%d CPUs (%s), load %s -> %s.\n\n",
		raw/int64(tokens), f.k, lrFactTokens, float64(raw)/1e6, f.reps, lrWarm, runtime.NumCPU(), cpuModel(), loadStart, loadEnd)
	b.WriteString("Remote-hit TTFT p50 ms (p90), then remote minus local p50 ms, at each link rate:\n\n| codec | bytes/token | MB from peers | decode GB/s (1 core) |")
	for _, r := range f.rates {
		fmt.Fprintf(&b, " %s | %s -local |", rateName(r), rateName(r))
	}
	b.WriteString(" accuracy |\n|---|---:|---:|---:|")
	for range f.rates {
		b.WriteString("---:|---:|")
	}
	b.WriteString("---|\n")
	for i, c := range cs {
		fmt.Fprintf(&b, "| %s | %.0f | %.2f | %s |", c.codec, float64(c.stored)/float64(tokens), results[f.rates[0]][i].peerBytes/1e6, decodeCell(raw, c))
		for _, r := range f.rates {
			res := results[r][i]
			fmt.Fprintf(&b, " %s (%s) | %+.1f |", ms(pct(res.remote, 0.5)), ms(pct(res.remote, 0.9)),
				float64((pct(res.remote, 0.5)-pct(res.local, 0.5)).Microseconds())/1e3)
		}
		b.WriteString(" see docs/bench/ACCURACY.md |\n")
	}
	// Fastest codec at each rate, by remote p50.
	b.WriteString("| fastest remote p50 | | | |")
	for _, r := range f.rates {
		best := 0
		for i := range cs {
			if pct(results[r][i].remote, 0.5) < pct(results[r][best].remote, 0.5) {
				best = i
			}
		}
		fmt.Fprintf(&b, " %s | |", cs[best].codec)
	}
	b.WriteString(" |\n")
	b.WriteString("\nLocal-hit TTFT p50 ms (the same codec's chunks on n1; no link crossed):\n\n| codec |")
	for _, r := range f.rates {
		fmt.Fprintf(&b, " %s run |", rateName(r))
	}
	b.WriteString("\n|---|")
	for range f.rates {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for i, c := range cs {
		fmt.Fprintf(&b, "| %s |", c.codec)
		for _, r := range f.rates {
			fmt.Fprintf(&b, " %s |", ms(pct(results[r][i].local, 0.5)))
		}
		b.WriteString("\n")
	}
	// A codec beats raw on a link of L bytes/s when the bytes it saves
	// cost more to move than decoding costs: per token,
	// (B_raw - B_c) (1/L + x) > B_raw / D_c, x the transport's CPU seconds
	// per byte. So L < L* = 1 / (B_raw / (D_c (B_raw - B_c)) - x), and a
	// codec whose decode costs less than the transport work it saves
	// (denominator <= 0) wins at any rate. With x = 0: L* = D_c (1 - B_c/B_raw).
	fmt.Fprintf(&b, "\nThe transport's own cost, a plain gRPC stream of %.2f MB on loopback with kvmesh's settings, both ends in one process: "+
		"x = %.2f CPU-s per GB (%.1f Gbit/s a core).\n\n", float64(raw)/1e6, xfer*1e9, 8/(xfer*1e9))
	rawIdx := -1
	for i, c := range cs {
		if c.codec == chunk.CodecRaw {
			rawIdx = i
		}
	}
	b.WriteString("Crossover: a codec beats raw on links slower than L* = 1 / (B_raw / (D (B_raw - B)) - x) (D its one-core decode rate, " +
		"B/B_raw its size against raw, x the transport's CPU per byte; with x = 0, L* = D (1 - B/B_raw)); " +
		"from the run: L* = (B_raw - B) / (local TTFT of the codec - local TTFT of raw), local p50s averaged over the runs (x not included):\n\n" +
		"| codec | B/B_raw | L* (x = 0), Gbit/s | L* (x measured), Gbit/s | L* from local TTFT, Gbit/s |\n|---|---:|---:|---:|---:|\n")
	gb := func(bytesPerSec float64) string {
		if bytesPerSec <= 0 || math.IsInf(bytesPerSec, 1) {
			return "any"
		}
		return strconv.FormatFloat(bytesPerSec*8/1e9, 'f', 1, 64)
	}
	for i, c := range cs {
		if i == rawIdx {
			continue
		}
		ratio := float64(c.stored) / float64(raw)
		d := decodeRate(raw, c) * 1e9
		withX := math.Inf(1)
		if den := 1/(d*(1-ratio)) - xfer; den > 0 {
			withX = 1 / den
		}
		measured := "-"
		if rawIdx >= 0 {
			var dt float64
			for _, r := range f.rates {
				dt += (pct(results[r][i].local, 0.5) - pct(results[r][rawIdx].local, 0.5)).Seconds() / float64(len(f.rates))
			}
			measured = "any"
			if dt > 0 {
				measured = gb(float64(raw-c.stored) / dt)
			}
		}
		fmt.Fprintf(&b, "| %s | %.3f | %s | %s | %s |\n", c.codec, ratio, gb(d*(1-ratio)), gb(withX), measured)
	}
	return b.String()
}

// decodeRate is raw GB out per second of one goroutine decoding c (+Inf
// for raw, which injection reads in place).
func decodeRate(raw int64, c *lrCodec) float64 {
	if c.decode <= 0 {
		return math.Inf(1)
	}
	return float64(raw) / 1e9 / c.decode.Seconds()
}

func decodeCell(raw int64, c *lrCodec) string {
	if c.decode <= 0 {
		return "- (read in place)"
	}
	return strconv.FormatFloat(decodeRate(raw, c), 'f', 2, 64)
}
