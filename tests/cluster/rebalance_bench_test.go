//go:build linux

package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/daemon"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// BenchmarkRebalance10G measures a rebalance: three kvmeshd
// processes on loopback hold KVMESH_REBALANCE_BYTES of distinct raw chunks
// (R=1, DRAM tier), then a fourth joins. It reports the wall time until the
// rebalance is complete by the nodes' own metrics (every node holds exactly
// the entries the new ring gives it and no rebalance is pending), the bytes
// moved (kvmesh_replication_rebalance_bytes_moved_total) against the ideal
// (a quarter of the data, and the newcomer's exact rendezvous share), Get
// latency before and during the rebalance, and each node's peak RSS.
//
// It runs only when asked, once:
//
//	KVMESH_REBALANCE_BYTES=10G go test -run '^$' -bench Rebalance10G -benchtime 1x -timeout 60m -v ./tests/cluster
//
// Optional: KVMESH_REBALANCE_CHUNK_TOKENS (16: 2 MiB chunks of a
// Llama-3-8B-shaped f16 model), KVMESH_REBALANCE_DRAM (per-node DRAM
// budget, default 1.5x a node's third plus 512 MiB), KVMESH_REBALANCE_BASELINE
// (15s of Gets before the join), KVMESH_REBALANCE_WRITERS (4),
// KVMESH_REBALANCE_TIER=disk (the data on a disk tier behind 256 MiB of
// DRAM), KVMESH_REBALANCE_PPROF=DIR (20 s CPU profiles of r1 and r4 from
// the start of the rebalance), KVMESH_REBALANCE_TIMEOUT (50m).
func BenchmarkRebalance10G(b *testing.B) {
	total := envBytes(b, "KVMESH_REBALANCE_BYTES", 0)
	if total == 0 {
		b.Skip("set KVMESH_REBALANCE_BYTES (e.g. 10G) to run the rebalance benchmark")
	}
	ntok := int(envBytes(b, "KVMESH_REBALANCE_CHUNK_TOKENS", 16))
	writers := int(envBytes(b, "KVMESH_REBALANCE_WRITERS", 4))
	baseline := envDuration(b, "KVMESH_REBALANCE_BASELINE", 15*time.Second)
	spec := chunk.ModelSpec{Family: "llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: chunk.F16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 5e5, TokenizerID: "rebalance-bench"}
	blobSize := probeBlobSize(b, spec, ntok)
	nchunks := int(total / int64(blobSize))
	// The DRAM tier holds everything by default; KVMESH_REBALANCE_TIER=disk
	// puts a small DRAM tier in front of a disk tier that holds the data.
	onDisk := os.Getenv("KVMESH_REBALANCE_TIER") == "disk"
	dram := envBytes(b, "KVMESH_REBALANCE_DRAM", total/2+512<<20)
	tierArgs := []string{"-dram", strconv.FormatInt(dram, 10)}
	tierDesc := fmt.Sprintf("DRAM tier only (budget %d MiB/node)", dram>>20)
	if onDisk {
		dram = envBytes(b, "KVMESH_REBALANCE_DRAM", 256<<20)
		disk := total/2 + 512<<20
		tierArgs = []string{"-dram", strconv.FormatInt(dram, 10), "-disk", strconv.FormatInt(disk, 10)}
		tierDesc = fmt.Sprintf("disk tier (budget %d MiB/node) behind %d MiB of DRAM", disk>>20, dram>>20)
	}

	hosts := []string{"127.0.0.51", "127.0.0.52", "127.0.0.53", "127.0.0.54"}
	checkBindable(b, hosts...)
	bin := buildKvmeshd(b)
	common := append([]string{"-bootstrap-expect", "3", "-dead-grace", "1h", "-rpc-timeout", "30s"}, tierArgs...)
	// Extra kvmeshd flags, to benchmark variants (e.g. "-rebalance-recv-streams 2").
	common = append(common, strings.Fields(os.Getenv("KVMESH_REBALANCE_ARGS"))...)
	var nodes []*harness.Proc
	for i, h := range hosts[:3] {
		args := slices.Clone(common)
		if i > 0 {
			args = append(args, "-join", nodes[0].Addr("gossip"))
		}
		nodes = append(nodes, start(b, bin, fmt.Sprintf("r%d", i+1), h, b.TempDir(), args...))
	}

	ctx, cancel := context.WithTimeout(b.Context(), envDuration(b, "KVMESH_REBALANCE_TIMEOUT", 50*time.Minute))
	defer cancel()
	c, err := client.New(ctx, client.Config{Seeds: []string{nodes[0].Addr("grpc"), nodes[1].Addr("grpc")},
		RPCTimeout: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	info := waitMembers(ctx, b, c, 3)
	setR1(ctx, b, info.LeaderGrpcAddr)
	for _, n := range nodes {
		waitRF(ctx, b, n.Addr("grpc"), 1)
	}
	if err := c.Refresh(ctx); err != nil || c.ReplicationFactor() != 1 {
		b.Fatalf("client still sees R=%d: %v", c.ReplicationFactor(), err)
	}
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		b.Fatal(err)
	}

	// Ingest: parallel raw puts of distinct chunks.
	keys := make([]chunk.Key, nchunks)
	var next atomic.Int64
	var wg sync.WaitGroup
	var ingestErr error
	var errOnce sync.Once
	t0 := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w)+1, 7))
			var blob []byte
			for {
				i := int(next.Add(1)) - 1
				if i >= nchunks || ctx.Err() != nil {
					return
				}
				k, bl, err := benchEntry(rng, spec, ntok, blob[:0])
				blob = bl
				if err == nil {
					_, err = c.Put(ctx, blob)
				}
				if err != nil {
					errOnce.Do(func() { ingestErr = fmt.Errorf("put %d: %w", i, err) })
					cancel()
					return
				}
				keys[i] = k
			}
		}()
	}
	wg.Wait()
	if ingestErr != nil {
		b.Fatal(ingestErr)
	}
	ingest := time.Since(t0)
	totalBytes := int64(nchunks) * int64(blobSize)
	b.Logf("ingested %d chunks of %d bytes (%.2f GiB) in %v: %.0f MiB/s", nchunks, blobSize,
		float64(totalBytes)/(1<<30), ingest.Round(time.Millisecond), float64(totalBytes)/(1<<20)/ingest.Seconds())

	before := scrapeAll(ctx, b, nodes)
	var sumEntries int64
	for _, m := range before {
		sumEntries += int64(m.tiers("kvtier_entries"))
	}
	if sumEntries != int64(nchunks) {
		b.Fatalf("after ingest the nodes hold %d entries, want %d (evictions? raise KVMESH_REBALANCE_DRAM)", sumEntries, nchunks)
	}

	// Gets of random ingested keys run from here to the end; the samples
	// are split by time into "before the join" and "during the rebalance".
	rd := &reader{c: c, keys: keys}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan struct{})
	go func() { defer close(rdone); rd.run(rctx) }()
	time.Sleep(baseline)

	tJoin := time.Now()
	n4 := start(b, bin, "r4", hosts[3], b.TempDir(), append([]string{"-join", nodes[0].Addr("gossip")}, common[2:]...)...)
	nodes = append(nodes, n4)

	// The new ring: wait until the client sees 4 members, then compute
	// where every key belongs.
	info4 := waitMembers(ctx, b, c, 4)
	rg := c.Ring()
	if rg.Len() != 4 {
		b.Fatalf("client ring has %d members after ClusterInfo listed 4", rg.Len())
	}
	want := map[string]int64{}
	for _, k := range keys {
		want[rg.Replicas(k.Content, 1)[0].ID]++
	}
	idealShare := want["r4"] * int64(blobSize)

	// Completion by metrics: every node on the 4-member ring, holding
	// exactly its expected entries, nothing pending.
	var tRing, tDone time.Time
	peakRSS := map[string]float64{}
	var last, atRing []metricSet
	var profWG sync.WaitGroup
	defer profWG.Wait()
	type point struct {
		at    time.Time
		moved []float64 // per node
	}
	var timeline []point
	for {
		ms := scrapeAll(ctx, b, nodes)
		last = ms
		pt := point{at: time.Now()}
		for _, m := range ms {
			pt.moved = append(pt.moved, m.get("kvmesh_replication_rebalance_bytes_moved_total"))
		}
		timeline = append(timeline, pt)
		ringOK, entriesOK, pending := true, true, 0.0
		for i, m := range ms {
			if m.get("kvmesh_meta_ring_members") != 4 {
				ringOK = false
			}
			if int64(m.tiers("kvtier_entries")) != want[nodes[i].ID()] {
				entriesOK = false
			}
			pending += m.get("kvmesh_replication_rebalance_pending")
			peakRSS[nodes[i].ID()] = max(peakRSS[nodes[i].ID()], m.get("process_resident_memory_bytes"))
		}
		if ringOK && tRing.IsZero() {
			tRing, atRing = time.Now(), ms
			if dir := os.Getenv("KVMESH_REBALANCE_PPROF"); dir != "" {
				for _, n := range []*harness.Proc{nodes[0], n4} {
					profWG.Add(1)
					go func() {
						defer profWG.Done()
						if err := cpuProfile(ctx, n.Addr("http"), filepath.Join(dir, n.ID()+".pprof"), 20*time.Second); err != nil {
							b.Logf("profile %s: %v", n.ID(), err)
						}
					}()
				}
			}
		}
		if ringOK && entriesOK && pending == 0 {
			tDone = time.Now()
			break
		}
		select {
		case <-ctx.Done():
			b.Fatalf("rebalance not complete: epoch %v, entries %v, want %v", info4.Epoch, entriesOf(last), want)
		case <-time.After(200 * time.Millisecond):
		}
	}
	// A short tail of Gets on the settled ring.
	time.Sleep(2 * time.Second)
	rcancel()
	<-rdone

	after := scrapeAll(ctx, b, nodes)
	var moved, keysMoved, dropped, repairs float64
	for _, m := range after {
		moved += m.get("kvmesh_replication_rebalance_bytes_moved_total")
		keysMoved += m.get("kvmesh_replication_rebalance_keys_moved_total")
		dropped += m.get("kvmesh_replication_rebalance_keys_dropped_total")
		repairs += m.get("kvmesh_replication_repairs_done_total")
	}

	// Old owners dropped what moved: sample moved keys directly on them.
	owner := map[chunk.Key]string{}
	for i, k := range keys {
		if i%7 == 0 {
			owner[k] = rg.Replicas(k.Content, 1)[0].ID
		}
	}
	var stale, checked int
	for k, id := range owner {
		if id != "r4" || checked >= 64 {
			continue
		}
		checked++
		for _, n := range nodes[:3] {
			if _, err := getDirect(ctx, n.Addr("grpc"), k); err == nil {
				stale++
			}
		}
		if _, err := getDirect(ctx, n4.Addr("grpc"), k); err != nil {
			b.Errorf("moved key %v not on r4: %v", k, err)
		}
	}
	if stale > 0 {
		b.Errorf("%d moved keys still on an old owner", stale)
	}

	ring := tDone.Sub(tRing)
	b.ReportMetric(tDone.Sub(tJoin).Seconds(), "s-join-to-done")
	b.ReportMetric(ring.Seconds(), "s-ring-to-done")
	b.ReportMetric(moved/float64(totalBytes/4), "x-ideal-quarter")
	b.ReportMetric(moved/float64(idealShare), "x-ideal-share")
	b.ReportMetric(moved/(1<<20)/max(ring.Seconds(), 1e-3), "MiB/s")
	var cpuAll float64
	for i := range nodes {
		cpuAll += last[i].get("process_cpu_seconds_total") - atRing[i].get("process_cpu_seconds_total")
	}
	b.ReportMetric(cpuAll/(moved/(1<<30)), "cpu-s/GiB-moved")

	var sb strings.Builder
	fmt.Fprintf(&sb, "\nmachine: %s; %d chunks x %d B = %.2f GiB, R=1, W=1, %s, raw codec\n",
		machine(), nchunks, blobSize, float64(totalBytes)/(1<<30), tierDesc)
	fmt.Fprintf(&sb, "ingest: %v (%.0f MiB/s, %d writers)\n", ingest.Round(time.Millisecond), float64(totalBytes)/(1<<20)/ingest.Seconds(), writers)
	fmt.Fprintf(&sb, "join -> ring of 4: %v; ring -> rebalance complete: %v; join -> complete: %v\n",
		tRing.Sub(tJoin).Round(time.Millisecond), ring.Round(time.Millisecond), tDone.Sub(tJoin).Round(time.Millisecond))
	fmt.Fprintf(&sb, "moved %.1f MiB in %.0f keys (%.1f MiB/s over ring->complete); ideal 1/4 = %.1f MiB (x%.3f); r4's rendezvous share = %.1f MiB (x%.3f); dropped %.0f keys; repairs %.0f\n",
		moved/(1<<20), keysMoved, moved/(1<<20)/max(ring.Seconds(), 1e-3), float64(totalBytes/4)/(1<<20), moved/float64(totalBytes/4),
		float64(idealShare)/(1<<20), moved/float64(idealShare), dropped, repairs)
	pb, pd, pdm, pds, pa := rd.split(tJoin, tDone, func(i int) bool { return rg.Replicas(keys[i].Content, 1)[0].ID == "r4" })
	fmt.Fprintf(&sb, "Get (one %d B chunk, 1 reader) before: %s\n", blobSize, pb)
	fmt.Fprintf(&sb, "Get during rebalance (join -> complete): %s\n", pd)
	fmt.Fprintf(&sb, "  of keys that move to r4: %s\n", pdm)
	fmt.Fprintf(&sb, "  of keys that stay: %s\n", pds)
	fmt.Fprintf(&sb, "Get after: %s\n", pa)
	fmt.Fprintf(&sb, "| node | entries before | stored MiB before | entries after | stored MiB after | tier charged MiB after | peak RSS MiB (VmHWM) | RSS MiB after |\n|---|---|---|---|---|---|---|---|\n")
	for i, n := range nodes {
		var eb, sbef float64
		if i < len(before) {
			eb, sbef = before[i].tiers("kvtier_entries"), before[i].tiers("kvtier_stored_bytes")
		}
		hwm, rss := procMem(n.Pid())
		fmt.Fprintf(&sb, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d |\n", n.ID(), eb, sbef/(1<<20),
			after[i].tiers("kvtier_entries"), after[i].tiers("kvtier_stored_bytes")/(1<<20),
			after[i].tiers("kvtier_bytes")/(1<<20), hwm>>20, rss>>20)
	}
	for i, n := range nodes[:3] {
		final := timeline[len(timeline)-1].moved[i]
		var first, done time.Time
		for _, pt := range timeline {
			if first.IsZero() && pt.moved[i] > 0 {
				first = pt.at
			}
			if done.IsZero() && pt.moved[i] == final {
				done = pt.at
			}
		}
		if final > 0 {
			fmt.Fprintf(&sb, "sender %s: %.1f MiB, first bytes at ring+%v, last at ring+%v; max RSS while rebalancing %d MiB\n", n.ID(), final/(1<<20),
				first.Sub(tRing).Round(100*time.Millisecond), done.Sub(tRing).Round(100*time.Millisecond), int64(peakRSS[n.ID()])>>20)
		}
	}
	fmt.Fprintf(&sb, "receiver r4: max RSS while rebalancing %d MiB\n", int64(peakRSS["r4"])>>20)
	// CPU time is what the load on a shared machine does not change.
	var cpu float64
	var per []string
	for i, n := range nodes {
		d := last[i].get("process_cpu_seconds_total") - atRing[i].get("process_cpu_seconds_total")
		cpu += d
		per = append(per, fmt.Sprintf("%s %.1f", n.ID(), d))
	}
	fmt.Fprintf(&sb, "kvmeshd CPU seconds, ring -> complete: %.1f (%s): %.1f CPU-s per GiB moved\n", cpu, strings.Join(per, ", "), cpu/(moved/(1<<30)))
	fmt.Fprintf(&sb, "stale copies of moved keys on old owners (sampled %d keys): %d\n", checked, stale)
	b.Log(sb.String())
}

// setR1 sets R=1, W=1 through Admin.SetSettings (the nodes run without
// tokens, so an anonymous caller holds the admin scope); any node
// forwards it to the raft leader, and waitRF then sees it applied.
func setR1(ctx context.Context, tb testing.TB, addr string) {
	tb.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	defer cc.Close()
	req := &api.SetSettingsRequest{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecRaw.String()}
	if _, err := api.NewAdminClient(cc).SetSettings(ctx, req); err != nil {
		tb.Fatalf("set R=1 through %s: %v", addr, err)
	}
}

func waitRF(ctx context.Context, tb testing.TB, addr string, rf uint32) {
	tb.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	defer cc.Close()
	testutil.WaitFor(tb, fmt.Sprintf("%s to see R=%d", addr, rf), func() bool {
		info, err := api.NewClientClient(cc).ClusterInfo(ctx, &api.ClusterInfoRequest{})
		return err == nil && info.ReplicationFactor == rf
	})
}

// benchEntry encodes (raw) a chunk of ntok random tokens with random KV
// bytes into dst.
func benchEntry(rng *rand.Rand, spec chunk.ModelSpec, ntok int, dst []byte) (chunk.Key, []byte, error) {
	e := testutil.EntryOf(spec, testutil.Tokens(rng, ntok), chunk.StandaloneContext(), testutil.RandomKV(rng))
	blob, err := chunk.Encode(dst, e, chunk.CodecRaw)
	return e.Key, blob, err
}

func probeBlobSize(tb testing.TB, spec chunk.ModelSpec, ntok int) int {
	_, blob, err := benchEntry(rand.New(rand.NewPCG(0, 0)), spec, ntok, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return len(blob)
}

// reader Gets random keys, one at a time, and records every result.
type reader struct {
	c    *client.Client
	keys []chunk.Key

	mu      sync.Mutex
	samples []sample
}

type sample struct {
	key int       // index in keys
	at  time.Time // when the Get started
	d   time.Duration
	err error
}

func (r *reader) run(ctx context.Context) {
	rng := rand.New(rand.NewPCG(42, 42))
	for ctx.Err() == nil {
		i := rng.IntN(len(r.keys))
		t := time.Now()
		_, err := r.c.Get(ctx, r.keys[i])
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		r.samples = append(r.samples, sample{i, t, time.Since(t), err})
		r.mu.Unlock()
	}
}

// split summarises the samples before from, in [from, to) (also split
// by whether the key moved) and after to.
func (r *reader) split(from, to time.Time, moved func(key int) bool) (before, during, duringMoved, duringStayed, after string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b, d, dm, ds, a []sample
	for _, s := range r.samples {
		switch {
		case s.at.Before(from):
			b = append(b, s)
		case s.at.Before(to):
			d = append(d, s)
			if moved(s.key) {
				dm = append(dm, s)
			} else {
				ds = append(ds, s)
			}
		default:
			a = append(a, s)
		}
	}
	return summarise(b), summarise(d), summarise(dm), summarise(ds), summarise(a)
}

func summarise(ss []sample) string {
	var ds []time.Duration
	errs := map[string]int{}
	for _, s := range ss {
		if s.err != nil {
			code := status.Code(s.err).String()
			if errors.Is(s.err, client.ErrNotFound) {
				code = "NotFound"
			} else if code == codes.Unknown.String() {
				code = s.err.Error()
			}
			errs[code]++
			continue
		}
		ds = append(ds, s.d)
	}
	if len(ds) == 0 {
		return fmt.Sprintf("no successful Gets (%d errors %v)", len(ss), errs)
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v errors=%v", len(ds), q(0.5).Round(10*time.Microsecond),
		q(0.99).Round(10*time.Microsecond), ds[len(ds)-1].Round(10*time.Microsecond), errs)
}

// metricSet is one scrape of a node's /metrics: "name{labels}" -> value.
type metricSet harness.Metrics

func (m metricSet) get(name string) float64 { return m[name] }

// tiers sums a kvtier metric over the DRAM and disk tiers (an entry lives
// in exactly one).
func (m metricSet) tiers(name string) float64 {
	return m[name+`{tier="dram"}`] + m[name+`{tier="disk"}`]
}

func scrapeAll(ctx context.Context, tb testing.TB, nodes []*harness.Proc) []metricSet {
	tb.Helper()
	out := make([]metricSet, len(nodes))
	for i, n := range nodes {
		m, err := scrape(ctx, n.Addr("http"))
		if err != nil {
			tb.Fatalf("scrape %s: %v", n.ID(), err)
		}
		out[i] = m
	}
	return out
}

func scrape(ctx context.Context, addr string) (metricSet, error) {
	m, err := harness.Scrape(ctx, addr)
	return metricSet(m), err
}

// cpuProfile saves a CPU profile of the node at addr (/debug/pprof).
func cpuProfile(ctx context.Context, addr, path string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

func entriesOf(ms []metricSet) []float64 {
	var out []float64
	for _, m := range ms {
		out = append(out, m.tiers("kvtier_entries"))
	}
	return out
}

// procMem reads a process's peak and current resident set (bytes).
func procMem(pid int) (hwm, rss int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			hwm = v << 10
		case "VmRSS:":
			rss = v << 10
		}
	}
	return hwm, rss
}

func machine() string {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	var mem string
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1]
		if kb, err := strconv.ParseInt(mem, 10, 64); err == nil {
			mem = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	return fmt.Sprintf("%s, %d CPUs, %s RAM, loadavg %s", cpu, runtime.NumCPU(), mem, strings.TrimSpace(string(load)))
}

// envBytes reads a size like kvmeshd's flags do (daemon.ParseBytes: "10G",
// "512MiB").
func envBytes(tb testing.TB, name string, def int64) int64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := daemon.ParseBytes(s)
	if err != nil || v < 0 {
		tb.Fatalf("%s=%q: not a size", name, s)
	}
	return v
}

func envDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, s, err)
	}
	return d
}
