package chaos

// TestRestartChaos: restarts at volume. Real kvmeshd processes hold a few
// hundred MB each (default 3 nodes x 300 MB) while writers
// store unique entries of 64 KiB - 1 MiB and readers check the bytes they
// read; the faults are paced only by readiness, as an operator's script
// would pace them: a rolling restart (SIGTERM, start, wait for /readyz,
// next node at once), back-to-back kill -9s of each node (kill, start,
// /readyz, next), two-node failures (two nodes killed together, never
// more than two down, R=3 W=2 by default), then, with a disk tier, a
// full-cluster restart (SIGTERM every node, start them all) and a node
// restarted with a tenth of its tier files damaged. The checker counts acknowledged
// writes that no longer read back (must be 0) and reads of other bytes
// (must be 0), and reports each node's time to ready and the time to full
// replication (every acknowledged key on R replicas) after each fault.
//
// The environment sizes it (`make soak` runs a larger one):
// KVMESH_RESTART_NODES (3), KVMESH_RESTART_MB per node (300),
// KVMESH_RESTART_DISK (the -disk flag: kvmeshd's default, auto, unless
// set; "0" runs DRAM-only nodes, whose every restart is a full refill),
// KVMESH_RESTART_PAIRS (two-node failures; 1), KVMESH_RESTART_REPORT (a
// file the report is also written to).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// Bounds of the restart run: failure bounds, not speed targets.
const (
	restartReadyBound = 3 * time.Minute // one node: start to /readyz 200
	// fullReplBound: a fault healed (every node ready) to every
	// acknowledged key on R replicas. The startup pull makes a restarted
	// node whole before it is ready; what is left is the writes acked by
	// W replicas while a node was away, which hints deliver within
	// seconds of its return.
	fullReplBound  = 60 * time.Second
	restartWriters = 4
	restartReaders = 2
	minEntryTokens = 16  // 64 KiB at restartSpec's 4 KiB a token
	maxEntryTokens = 256 // 1 MiB
)

// restartSpec is 4 KiB of K and V a token, so entries are 64 KiB - 1 MiB.
func restartSpec() chunk.ModelSpec {
	return chunk.ModelSpec{Family: "llama", Layers: 8, KVHeads: 2, HeadDim: 64, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 5e5, TokenizerID: "restart-chaos"}
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		t.Fatalf("%s=%q: want a count", name, s)
	}
	return v
}

// restartRun is one run of TestRestartChaos.
type restartRun struct {
	t     *testing.T
	procs []*harness.Proc
	cl    *client.Client
	conns map[string]*grpc.ClientConn
	rf    int
	pool  []byte // the bytes entries' K and V are cut from

	mu      sync.Mutex
	acked   []ackedEntry
	bytes   int64 // acknowledged bytes
	failed  int   // puts that failed (not acknowledged; may be present)
	wrong   []string
	reads   int
	readErr int

	report []string
	// atW are samples of how long an acknowledged key stayed on fewer
	// than R replicas after its Put returned, split by whether a fault
	// was under way (faultAtW) or not.
	atW, faultAtW []time.Duration
	inFault       atomic.Bool
	samples       sync.WaitGroup
	connMu        sync.Mutex
}

type ackedEntry struct {
	key  chunk.Key
	blob []byte
	sum  uint64
}

// entry is entry i: unique tokens (so a unique key), K and V cut from the
// pool, raw (the run sets the cluster codec to raw, so the bytes read
// back are those written, and the test process does not spend its CPU on
// compression under the race detector).
func (rr *restartRun) entry(seed uint64, i int) (chunk.Key, []byte, uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	spec := restartSpec()
	n := minEntryTokens + rng.IntN(maxEntryTokens-minEntryTokens+1)
	tokens := make([]uint32, n)
	tokens[0], tokens[1] = uint32(i), uint32(i>>32)
	for j := 2; j < n; j++ {
		tokens[j] = rng.Uint32N(150000)
	}
	fp := spec.Fingerprint()
	e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: chunk.StandaloneContext()},
		DType: spec.DType, Layers: spec.Layers, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, Tokens: tokens}
	size := e.Layers * e.LayerBytes()
	off := rng.IntN(len(rr.pool) - size)
	e.KV = rr.pool[off : off+size]
	blob, err := chunk.Encode(nil, e, chunk.CodecRaw)
	if err != nil {
		panic(err)
	}
	hd, err := chunk.ParseHeader(blob, chunk.Limits{})
	if err != nil {
		panic(err)
	}
	return e.Key, blob, hd.Checksum
}

func (rr *restartRun) logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	rr.t.Log(msg)
	rr.mu.Lock()
	rr.report = append(rr.report, msg)
	rr.mu.Unlock()
}

func TestRestartChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("restart chaos: starts kvmeshd processes holding hundreds of MB")
	}
	nodes := envInt(t, "KVMESH_RESTART_NODES", 3)
	perNode := int64(envInt(t, "KVMESH_RESTART_MB", 300)) << 20
	pairs := envInt(t, "KVMESH_RESTART_PAIRS", 1)
	disk := os.Getenv("KVMESH_RESTART_DISK")
	if disk == "" {
		disk = "auto" // kvmeshd's default
	}
	if nodes < 3 {
		t.Fatalf("KVMESH_RESTART_NODES=%d: at least 3", nodes)
	}
	var hosts []string
	for i := range nodes {
		hosts = append(hosts, fmt.Sprintf("127.0.0.%d", 61+i))
	}
	if err := harness.Bindable(hosts...); err != nil {
		t.Skipf("restart chaos: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 55*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin, err := harness.Build(ctx, dir)
	if err != nil {
		t.Skip(err)
	}
	rr := &restartRun{t: t, conns: make(map[string]*grpc.ClientConn), pool: make([]byte, 8<<20)}
	seedRng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for i := range rr.pool {
		rr.pool[i] = byte(seedRng.Uint32())
	}
	seed := seedRng.Uint64()
	// DRAM for the node's share (the fill, then a fifth more during the
	// faults) with room to spare: nothing is evicted.
	dram := fmt.Sprintf("%dM", 2*perNode>>20+128)
	common := []string{"-local-timing", "-dead-grace", "1h", "-dram", dram, "-disk", disk, "-rpc-timeout", "3s",
		"-bootstrap-expect", strconv.Itoa(nodes)}
	for i, h := range hosts {
		args := common
		if i > 0 {
			args = append(slices.Clone(common), "-join", rr.procs[0].Addr("gossip"))
		}
		id := fmt.Sprintf("n%d", i+1)
		p := harness.NewProc(harness.ProcConfig{Bin: bin, ID: id, Host: h, DataDir: filepath.Join(dir, id),
			LogPath: filepath.Join(dir, id+".log"), Args: args})
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		rr.procs = append(rr.procs, p)
	}
	t.Cleanup(func() {
		for _, p := range rr.procs {
			p.Kill()
		}
		for _, cc := range rr.conns {
			_ = cc.Close()
		}
		if t.Failed() {
			// The logs outlive the run's folder (its data dirs do not).
			keep := filepath.Join(os.TempDir(), fmt.Sprintf("kvmesh-restart-chaos-%d", time.Now().Unix()))
			if err := os.MkdirAll(keep, 0o755); err == nil {
				for _, p := range rr.procs {
					if b, err := os.ReadFile(p.LogPath()); err == nil {
						_ = os.WriteFile(filepath.Join(keep, filepath.Base(p.LogPath())), b, 0o644)
					}
				}
				t.Logf("node logs kept in %s", keep)
			}
		}
	})
	for _, p := range rr.procs {
		if _, err := rr.waitReady(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	var seeds []string
	for _, p := range rr.procs {
		seeds = append(seeds, p.Addr("grpc"))
	}
	rr.cl, err = client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 5 * time.Second, Attempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer rr.cl.Close()
	cc, err := rr.conn(rr.procs[0].Addr("grpc"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.NewAdminClient(cc).SetSettings(ctx, &api.SetSettingsRequest{Codec: "raw"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rr.cl.RegisterModel(ctx, restartSpec()); err != nil {
		t.Fatal(err)
	}
	info, err := rr.cl.ClusterInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rr.rf = int(info.ReplicationFactor)
	// The unique bytes that put perNode on each node.
	target := perNode * int64(nodes) / int64(rr.rf)
	rr.logf("restart chaos (seed %d): %d nodes, R=%d W=%d, -disk %s, %d MB a node (%d MB of unique entries of 64 KiB - 1 MiB), %d writers, %d readers",
		seed, nodes, info.ReplicationFactor, info.WriteQuorum, disk, perNode>>20, target>>20, restartWriters, restartReaders)

	// Fill to 90% of the target at full speed, then keep writing (paced)
	// and reading through every fault.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var next atomic.Int64
	var pace atomic.Bool
	fillStart := time.Now()
	filled := make(chan struct{})
	var fillOnce sync.Once
	for range restartWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if pace.Load() {
					// During the faults: a steady trickle, up to a
					// fifth of the target again (the nodes' DRAM holds it
					// all, so nothing is evicted).
					select {
					case <-stop:
						return
					case <-time.After(500 * time.Millisecond):
					}
					rr.mu.Lock()
					full := rr.bytes >= target*6/5
					rr.mu.Unlock()
					if full {
						continue
					}
				}
				i := int(next.Add(1))
				key, blob, sum := rr.entry(seed, i)
				pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := rr.cl.Put(pctx, blob)
				cancel()
				rr.mu.Lock()
				if err != nil {
					rr.failed++
				} else {
					rr.acked = append(rr.acked, ackedEntry{key: key, blob: blob, sum: sum})
					rr.bytes += int64(len(blob))
					if len(rr.acked)%8 == 0 {
						rr.samples.Add(1)
						go rr.sampleAtW(ctx, ackedEntry{key: key, sum: sum}, time.Now())
					}
				}
				done := rr.bytes >= target*9/10
				rr.mu.Unlock()
				if done {
					fillOnce.Do(func() { close(filled) })
				}
			}
		}()
	}
	for r := range restartReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(1000+r)))
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				rr.mu.Lock()
				if len(rr.acked) == 0 {
					rr.mu.Unlock()
					continue
				}
				e := rr.acked[rng.IntN(len(rr.acked))]
				rr.mu.Unlock()
				gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				got, err := rr.cl.Get(gctx, e.key)
				cancel()
				rr.mu.Lock()
				rr.reads++
				switch {
				case err != nil:
					rr.readErr++
				case !bytes.Equal(got, e.blob):
					rr.wrong = append(rr.wrong, fmt.Sprintf("read %v: %d bytes, written %d", e.key, len(got), len(e.blob)))
				}
				rr.mu.Unlock()
			}
		}()
	}
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()
	select {
	case <-filled:
	case <-ctx.Done():
		t.Fatal("fill did not finish")
	}
	pace.Store(true)
	rr.mu.Lock()
	fillBytes, fillKeys := rr.bytes, len(rr.acked)
	rr.mu.Unlock()
	took := time.Since(fillStart)
	rr.logf("fill: %d entries, %d MB acknowledged in %.1fs (%.1f MB/s; every node stores R/N of it)",
		fillKeys, fillBytes>>20, took.Seconds(), float64(fillBytes)/(1<<20)/took.Seconds())
	rr.fullReplication(ctx, "after the fill")

	// Rolling restart, paced only by readiness.
	rr.inFault.Store(true)
	for _, p := range rr.procs {
		if err := p.Terminate(60 * time.Second); err != nil {
			t.Errorf("%s: unclean exit after SIGTERM: %v", p.ID(), err)
		}
		rr.restartAndWait(ctx, p, "rolling restart (SIGTERM)")
	}
	rr.inFault.Store(false)
	rr.fullReplication(ctx, "after the rolling restart")
	rr.inFault.Store(true)

	// Back-to-back kill -9 of each node, paced only by readiness.
	for _, p := range rr.procs {
		p.Kill()
		rr.restartAndWait(ctx, p, "kill -9")
	}
	rr.inFault.Store(false)
	rr.fullReplication(ctx, "after the kill -9 sequence")

	// Two-node failures: two nodes killed together, restarted together.
	prng := rand.New(rand.NewPCG(seed, 99))
	for k := range pairs {
		perm := prng.Perm(nodes)
		a, b := rr.procs[perm[0]], rr.procs[perm[1]]
		rr.inFault.Store(true)
		a.Kill()
		b.Kill()
		rr.logf("two-node failure %d: kill -9 %s and %s", k+1, a.ID(), b.ID())
		time.Sleep(2 * time.Second)
		var twg sync.WaitGroup
		for _, p := range []*harness.Proc{a, b} {
			twg.Add(1)
			go func() {
				defer twg.Done()
				rr.restartAndWait(ctx, p, "two-node failure")
			}()
		}
		twg.Wait()
		rr.inFault.Store(false)
		rr.fullReplication(ctx, fmt.Sprintf("after two-node failure %d", k+1))
	}

	if disk != "0" {
		rr.fullRestart(ctx)
		rr.fullReplication(ctx, "after the full-cluster restart")
		rr.damageTier(ctx, filepath.Join(dir, rr.procs[0].ID()), rr.procs[0])
		rr.fullReplication(ctx, "after the damaged tier files")
	} else {
		rr.logf("full-cluster restart and damaged tier files: skipped (-disk 0 keeps nothing across them)")
	}

	halt()
	rr.samples.Wait()
	p50, pmax := Percentiles(rr.atW)
	f50, fmax := Percentiles(rr.faultAtW)
	rr.logf("time at fewer than R copies after an acknowledged Put: no fault under way %d samples p50 %v max %v; during faults %d samples p50 %v max %v",
		len(rr.atW), p50.Round(time.Millisecond), pmax.Round(time.Millisecond), len(rr.faultAtW), f50.Round(time.Millisecond), fmax.Round(time.Millisecond))
	rr.check(ctx)
	if path := os.Getenv("KVMESH_RESTART_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(strings.Join(rr.report, "\n")+"\n"), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func (rr *restartRun) conn(addr string) (*grpc.ClientConn, error) {
	rr.connMu.Lock()
	defer rr.connMu.Unlock()
	if cc := rr.conns[addr]; cc != nil {
		return cc, nil
	}
	// Reconnect within a second of a node's return: gRPC's default backoff
	// (up to 2 minutes) would time the checker's own reconnection, not
	// the cluster's replication.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: 2 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec()), grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	rr.conns[addr] = cc
	return cc, nil
}

// waitReady waits for p's /readyz to answer 200 and returns how long it
// took.
func (rr *restartRun) waitReady(ctx context.Context, p *harness.Proc) (time.Duration, error) {
	start := time.Now()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Addr("http")+"/readyz", nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start), nil
			}
		}
		if time.Since(start) > restartReadyBound {
			return 0, fmt.Errorf("%s not ready %v after its start (log %s)", p.ID(), restartReadyBound, p.LogPath())
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// restartAndWait starts p again and waits until it is ready, reporting
// the time.
func (rr *restartRun) restartAndWait(ctx context.Context, p *harness.Proc, fault string) {
	start := time.Now()
	if err := p.Start(ctx); err != nil {
		rr.t.Errorf("%s: restart %s: %v", fault, p.ID(), err)
		return
	}
	if _, err := rr.waitReady(ctx, p); err != nil {
		rr.t.Errorf("%s: %v", fault, err)
		return
	}
	entries := int64(-1)
	for try := 0; try < 5 && entries < 0; try++ {
		if st, err := rr.cl.Stats(ctx, p.Addr("grpc")); err == nil {
			entries = int64(st.Entries)
		} else {
			time.Sleep(200 * time.Millisecond)
		}
	}
	rr.logf("%s: %s ready %.1fs after its start, holding %d entries", fault, p.ID(), time.Since(start).Seconds(), entries)
}

// fullRestart stops every node with SIGTERM (each spills its DRAM to
// its disk tier), then starts them all again together: an upgrade. No
// node is left to pull from, so what each kept on disk is all there is.
func (rr *restartRun) fullRestart(ctx context.Context) {
	rr.inFault.Store(true)
	defer rr.inFault.Store(false)
	var wg sync.WaitGroup
	for _, p := range rr.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Terminate(90 * time.Second); err != nil {
				rr.t.Errorf("full restart: %s: unclean exit after SIGTERM: %v", p.ID(), err)
			}
		}()
	}
	wg.Wait()
	rr.logf("full-cluster restart: every node stopped with SIGTERM")
	for _, p := range rr.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rr.restartAndWait(ctx, p, "full-cluster restart")
		}()
	}
	wg.Wait()
}

// damageTier stops p with SIGTERM, damages some of the disk tier files in
// its data directory dataDir (a bit flipped in some, others truncated),
// and starts it again: the start must drop them, and the startup pull
// fetch them back from the other replicas before p is ready.
func (rr *restartRun) damageTier(ctx context.Context, dataDir string, p *harness.Proc) {
	rr.inFault.Store(true)
	defer rr.inFault.Store(false)
	if err := p.Terminate(90 * time.Second); err != nil {
		rr.t.Errorf("damaged tier: %s: unclean exit after SIGTERM: %v", p.ID(), err)
	}
	var files []string
	_ = filepath.WalkDir(filepath.Join(dataDir, "tier"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".kvc") {
			files = append(files, path)
		}
		return nil
	})
	flipped, cut := 0, 0
	for i, f := range files {
		if i%10 != 0 { // every tenth file
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil || len(b) < 2 {
			continue
		}
		if i%20 == 0 {
			b[len(b)/2] ^= 0x08
			flipped++
		} else {
			b = b[:len(b)/2]
			cut++
		}
		if err := os.WriteFile(f, b, 0o644); err != nil {
			rr.t.Errorf("damaged tier: %v", err)
		}
	}
	rr.logf("damaged tier: %s down, %d of its %d tier files damaged (%d with a bit flipped, %d truncated)", p.ID(), flipped+cut, len(files), flipped, cut)
	rr.restartAndWait(ctx, p, "damaged tier files")
	if m, err := harness.Scrape(ctx, p.Addr("http")); err == nil {
		if got := int(m[`kvtier_damaged_total{tier="disk"}`]); got != flipped+cut {
			rr.t.Errorf("damaged tier: %s counts %d damaged files (kvtier_damaged_total), %d were damaged", p.ID(), got, flipped+cut)
		}
	}
}

// underReplicated returns how many of keys some replica lacks (by
// checksum, from each node's digest of those keys), on the client's ring
// (refreshed first if refresh).
func (rr *restartRun) underReplicated(ctx context.Context, keys []ackedEntry, refresh bool) (int, error) {
	if refresh {
		if err := rr.cl.Refresh(ctx); err != nil {
			return 0, err
		}
	}
	rg := rr.cl.Ring()
	byID := make(map[string]string)
	for _, p := range rr.procs {
		byID[p.ID()] = p.Addr("grpc")
	}
	ask := make(map[string][]ackedEntry)
	for _, e := range keys {
		for _, m := range rg.Replicas(e.key.Content, rr.rf) {
			ask[m.ID] = append(ask[m.ID], e)
		}
	}
	copies := make(map[chunk.Key]int)
	for id, es := range ask {
		cc, err := rr.conn(byID[id])
		if err != nil {
			return 0, err
		}
		pc := api.NewPeerClient(cc)
		for len(es) > 0 {
			batch := es[:min(len(es), 256)]
			es = es[len(batch):]
			req := &api.DigestRequest{}
			want := make(map[chunk.Key]uint64, len(batch))
			for _, e := range batch {
				req.Keys = append(req.Keys, api.ProtoKey(e.key))
				want[e.key] = e.sum
			}
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := pc.Digest(dctx, req)
			cancel()
			if err != nil {
				return 0, fmt.Errorf("digest of %s: %w", id, err)
			}
			for _, it := range resp.Items {
				k, err := api.KeyFromProto(it.Key)
				// A store that only says it holds a key answers checksum 0.
				if err == nil && !it.Deleted && (it.Checksum == 0 || want[k] == it.Checksum) {
					copies[k]++
				}
			}
		}
	}
	under := 0
	for _, e := range keys {
		if copies[e.key] < rr.rf {
			under++
		}
	}
	return under, nil
}

// sampleAtW measures how long e, acknowledged at acked, stays on fewer
// than R replicas (the third copy is a write still in flight, or a hint
// waiting for its replica's return).
func (rr *restartRun) sampleAtW(ctx context.Context, e ackedEntry, acked time.Time) {
	defer rr.samples.Done()
	fault := rr.inFault.Load()
	var last error
	for time.Since(acked) < 2*fullReplBound {
		under, err := rr.underReplicated(ctx, []ackedEntry{e}, false)
		if err != nil {
			last = err
		} else if under > 0 {
			last = fmt.Errorf("%d below R", under)
		}
		if err == nil && under == 0 {
			d := time.Since(acked)
			rr.mu.Lock()
			if fault || rr.inFault.Load() {
				rr.faultAtW = append(rr.faultAtW, d)
			} else {
				rr.atW = append(rr.atW, d)
			}
			rr.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	rr.logf("key %v still below R copies %v after its Put: %v", e.key, time.Since(acked).Round(time.Second), last)
	rr.mu.Lock()
	rr.faultAtW = append(rr.faultAtW, time.Since(acked))
	rr.mu.Unlock()
}

// fullReplication waits until every key acknowledged so far is on R
// replicas and reports how long that took.
func (rr *restartRun) fullReplication(ctx context.Context, after string) {
	rr.mu.Lock()
	keys := slices.Clone(rr.acked)
	rr.mu.Unlock()
	start := time.Now()
	first := -1
	for {
		under, err := rr.underReplicated(ctx, keys, true)
		if err == nil && first < 0 {
			first = under
		}
		if err == nil && under == 0 {
			rr.logf("full replication %s: %.1fs (%d keys below R=%d at first look, of %d)", after, time.Since(start).Seconds(), first, rr.rf, len(keys))
			return
		}
		if time.Since(start) > fullReplBound {
			rr.t.Errorf("full replication %s: %d of %d acknowledged keys still below R=%d after %v (last error %v)", after, under, len(keys), rr.rf, fullReplBound, err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// check reads every acknowledged entry back: a miss is a lost write, other
// bytes a wrong read.
func (rr *restartRun) check(ctx context.Context) {
	var lost []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan ackedEntry)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range next {
				gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				got, err := rr.cl.Get(gctx, e.key)
				cancel()
				mu.Lock()
				switch {
				case err != nil:
					lost = append(lost, fmt.Sprintf("%v: %v", e.key, err))
				case !bytes.Equal(got, e.blob):
					rr.wrong = append(rr.wrong, fmt.Sprintf("final read %v: %d bytes, written %d", e.key, len(got), len(e.blob)))
				}
				mu.Unlock()
			}
		}()
	}
	for _, e := range rr.acked {
		next <- e
	}
	close(next)
	wg.Wait()
	rr.logf("result: %d acknowledged writes (%d MB), %d failed puts; lost=%d wrong=%d; %d reads under load (%d errors)",
		len(rr.acked), rr.bytes>>20, rr.failed, len(lost), len(rr.wrong), rr.reads, rr.readErr)
	for i, l := range lost {
		if i == 10 {
			break
		}
		rr.t.Errorf("lost acknowledged write %s", l)
	}
	for i, w := range rr.wrong {
		if i == 10 {
			break
		}
		rr.t.Errorf("wrong read: %s", w)
	}
	if len(lost) > 0 || len(rr.wrong) > 0 {
		rr.t.Errorf("lost=%d wrong=%d", len(lost), len(rr.wrong))
	}
}
