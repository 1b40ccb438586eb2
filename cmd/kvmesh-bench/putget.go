package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/cputime"
	"github.com/kvmesh/kvmesh/internal/linkpace"
	"github.com/kvmesh/kvmesh/internal/loopback"
	"github.com/kvmesh/kvmesh/internal/resp"
	"github.com/kvmesh/kvmesh/tests/harness"
	"github.com/kvmesh/kvmesh/workload"
)

// putGetFlags configure the Put/Get run against redis-server (-putget).
type putGetFlags struct {
	kvmeshd   string        // kvmeshd binary ("" builds one)
	duration  time.Duration // timed work per point
	clients   int
	poolBytes int // distinct entries of each point, in bytes
	sizes     []int
	codecs    []chunk.Codec
	configs   []rw
	profile   string   // directory for pprof profiles of the nodes ("" none)
	nodeArgs  []string // more kvmeshd flags
	// clientRate paces each kvmesh client's connections to this many
	// bytes/s each way (0: unpaced); Redis's connections are not paced.
	clientRate int64
}

// rw is a replication setting: R copies, W acknowledged before a Put
// returns. Redis gets a primary with R-1 replicas and WAIT W-1.
type rw struct{ r, w int }

func (c rw) String() string { return fmt.Sprintf("R=%d W=%d", c.r, c.w) }

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mul := 1
		switch {
		case strings.HasSuffix(f, "KiB"):
			mul, f = 1<<10, strings.TrimSuffix(f, "KiB")
		case strings.HasSuffix(f, "MiB"):
			mul, f = 1<<20, strings.TrimSuffix(f, "MiB")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("size %q: want e.g. 256KiB or 4MiB", f)
		}
		out = append(out, n*mul)
	}
	return out, nil
}

func parseConfigs(s string) ([]rw, error) {
	var out []rw
	for _, f := range strings.Split(s, ",") {
		var c rw
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d/%d", &c.r, &c.w); err != nil || c.r < 1 || c.w < 1 || c.w > c.r || c.r > 3 {
			return nil, fmt.Errorf("config %q: want R/W with 1 <= W <= R <= 3, e.g. 3/2", f)
		}
		out = append(out, c)
	}
	return out, nil
}

func parseCodecs(s string) ([]chunk.Codec, error) {
	var out []chunk.Codec
	for _, f := range strings.Split(s, ",") {
		c, err := chunk.ParseCodec(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// benchSpec is a Llama-3-8B-shaped model: 128 KiB of bf16 KV per token.
var benchSpec = chunk.ModelSpec{Family: "llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: chunk.BF16,
	RopeStyle: chunk.RopeNeoX, RopeTheta: 500000, TokenizerID: "kvmesh-bench-putget"}

// pointResult is one timed point: a Put or Get phase of one system.
type pointResult struct {
	ops      int
	bytes    int64
	wall     time.Duration
	cpu      time.Duration // server processes' CPU time during the timed work
	client   time.Duration // this process's CPU time (the clients) during it
	lat      []time.Duration
	blobSize int
}

func (p pointResult) mbps() float64 { return float64(p.bytes) / 1e6 / p.wall.Seconds() }

func (p pointResult) pct(q float64) time.Duration { return workload.Quantile(p.lat, q) }

// cpuPerGB is the servers' CPU seconds per GB moved.
func (p pointResult) cpuPerGB() float64 { return p.cpu.Seconds() / (float64(p.bytes) / 1e9) }

// clientPerGB is the clients' CPU seconds per GB moved.
func (p pointResult) clientPerGB() float64 { return p.client.Seconds() / (float64(p.bytes) / 1e9) }

func ms(d time.Duration) string {
	v := float64(d.Microseconds()) / 1e3
	if v >= 10 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func (p pointResult) cell() string {
	return fmt.Sprintf("%.0f (%s/%s)", p.mbps(), ms(p.pct(0.5)), ms(p.pct(0.99)))
}

// ratio is kvmesh against Redis: throughput (higher is better), p50 and p99
// latency (lower is better).
func ratio(k, r pointResult) string {
	f := func(a, b float64) string {
		if b == 0 {
			return "-"
		}
		return strconv.FormatFloat(a/b, 'f', 2, 64)
	}
	return fmt.Sprintf("%sx / %s / %s", f(k.mbps(), r.mbps()), f(float64(k.pct(0.5)), float64(r.pct(0.5))), f(float64(k.pct(0.99)), float64(r.pct(0.99))))
}

type row struct {
	cfg                            rw
	codec                          chunk.Codec
	size, stored                   int
	kPut, kGet, redisSet, redisGet pointResult
}

// runPutGet starts 3 kvmeshd processes and redis-server, and times Put and
// Get of the same blobs on both, point by point, in the same run.
func runPutGet(ctx context.Context, f putGetFlags, progress func(string)) error {
	redisBin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redis-server is not installed (make bench-redis installs it from Debian): %w", err)
	}
	dir, err := os.MkdirTemp("", "kvmesh-putget-")
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
	nodes, err := startNodesArgs(ctx, f.kvmeshd, dir, 3, "1G", f.nodeArgs)
	defer func() {
		var wg sync.WaitGroup
		for _, p := range nodes {
			wg.Go(func() { _ = p.Terminate(15 * time.Second) })
		}
		wg.Wait()
	}()
	if err != nil {
		return err
	}
	var seeds []string
	for _, p := range nodes {
		seeds = append(seeds, p.Addr("grpc"))
	}
	clients := make([]*client.Client, f.clients)
	for i := range clients {
		cfg := client.Config{Seeds: seeds}
		if f.clientRate > 0 {
			cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(linkpace.Dialer(f.clientRate))}
		}
		if clients[i], err = client.New(ctx, cfg); err != nil {
			return err
		}
		defer clients[i].Close()
	}
	dialOpts, err := client.DialOptions(client.Config{})
	if err != nil {
		return err
	}
	adminConn, err := grpc.NewClient(seeds[0], dialOpts...)
	if err != nil {
		return err
	}
	defer adminConn.Close()
	admin := api.NewAdminClient(adminConn)
	if _, err := retry(ctx, func() (chunk.Fingerprint, error) { return clients[0].RegisterModel(ctx, benchSpec) }); err != nil {
		return fmt.Errorf("register model: %w", err)
	}
	progress(fmt.Sprintf("3 kvmeshd up (%s), %d clients", strings.Join(seeds, " "), f.clients))

	var rows []row
	for _, cfg := range f.configs {
		rs, err := startRedis(ctx, redisBin, dir, cfg.r)
		if err != nil {
			return err
		}
		err = func() error {
			defer rs.stop()
			conns := make([]*resp.Conn, f.clients)
			for i := range conns {
				if conns[i], err = resp.Dial(rs.addr); err != nil {
					return err
				}
				defer conns[i].Close()
			}
			for _, codec := range f.codecs {
				if err := setSettings(ctx, admin, clients, cfg, codec); err != nil {
					return err
				}
				for _, size := range f.sizes {
					name := fmt.Sprintf("r%d-%s-%dKiB", cfg.r, codec, size>>10)
					progress(fmt.Sprintf("%s %s, %d KiB entries: encoding", cfg, codec, size>>10))
					keys, blobs, err := benchPool(size, f.poolBytes, codec)
					if err != nil {
						return err
					}
					r := row{cfg: cfg, codec: codec, size: size, stored: len(blobs[0])}
					var prof *profiler
					if f.profile != "" {
						prof = &profiler{dir: f.profile, duration: f.duration, nodes: nodes}
					}
					if r.kPut, r.kGet, err = kvmeshPoint(ctx, f, name, clients, nodes, keys, blobs, prof); err != nil {
						return fmt.Errorf("kvmesh %s: %w", name, err)
					}
					if r.redisSet, r.redisGet, err = redisPoint(ctx, f, conns, rs, cfg, blobs); err != nil {
						return fmt.Errorf("redis %s: %w", name, err)
					}
					progress(fmt.Sprintf("  put %s vs SET %s; get %s vs GET %s", r.kPut.cell(), r.redisSet.cell(), r.kGet.cell(), r.redisGet.cell()))
					rows = append(rows, r)
				}
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	fmt.Print(putGetMarkdown(f, rows, loadStart, loadAvg()))
	return nil
}

func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := f()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return v, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startNodes starts n kvmeshd processes that form one cluster, as
// `kvmesh local-cluster` does.
func startNodes(ctx context.Context, bin, dir string, n int) ([]*harness.Proc, error) {
	return startNodesArgs(ctx, bin, dir, n, "1G", nil)
}

// startNodesArgs is startNodes with a DRAM budget and more flags.
func startNodesArgs(ctx context.Context, bin, dir string, n int, dram string, extra []string) ([]*harness.Proc, error) {
	var nodes []*harness.Proc
	for i, host := range loopback.Hosts(n) {
		id := fmt.Sprintf("n%d", i+1)
		a := append([]string{"-bootstrap-expect", strconv.Itoa(n), "-local-timing", "-dram", dram, "-disk", "0", "-log-level", "warn"}, extra...)
		if i > 0 {
			a = append(a, "-join", nodes[0].Addr("gossip"))
		}
		p := harness.NewProc(harness.ProcConfig{Bin: bin, ID: id, Host: host, DataDir: filepath.Join(dir, id),
			LogPath: filepath.Join(dir, id+".log"), Args: a, ReadyTimeout: time.Minute})
		if err := p.Start(ctx); err != nil {
			return nodes, err
		}
		nodes = append(nodes, p)
	}
	return nodes, nil
}

// setSettings sets R, W and the codec, and waits until every client sees
// them and every node is in the ring.
func setSettings(ctx context.Context, admin api.AdminClient, clients []*client.Client, cfg rw, codec chunk.Codec) error {
	req := &api.SetSettingsRequest{ReplicationFactor: uint32(cfg.r), WriteQuorum: uint32(cfg.w), Codec: codec.String()}
	if _, err := retry(ctx, func() (*api.SetSettingsResponse, error) { return admin.SetSettings(ctx, req) }); err != nil {
		return fmt.Errorf("set settings: %w", err)
	}
	_, err := retry(ctx, func() (bool, error) {
		for _, c := range clients {
			if err := c.Refresh(ctx); err != nil {
				return false, err
			}
			if c.ReplicationFactor() != cfg.r || c.Codec() != codec || c.Ring().Len() != 3 {
				return false, fmt.Errorf("clients see R=%d codec %v and %d nodes", c.ReplicationFactor(), c.Codec(), c.Ring().Len())
			}
		}
		return true, nil
	})
	return err
}

// benchPool makes entries of about size raw bytes each (KV values drawn
// like a model's: normal, in bf16), poolBytes of them, encoded in codec.
func benchPool(size, poolBytes int, codec chunk.Codec) ([]chunk.Key, [][]byte, error) {
	rng := rand.New(rand.NewPCG(uint64(size), 7))
	n := max(16, poolBytes/size)
	ntok := max(1, size/benchSpec.KVBytesPerToken())
	fp := benchSpec.Fingerprint()
	kv := make([]byte, ntok*benchSpec.KVBytesPerToken())
	for j := 0; j < len(kv); j += 2 {
		h := chunk.F32ToBF16(float32(rng.NormFloat64()))
		kv[j], kv[j+1] = byte(h), byte(h>>8)
	}
	// The entries differ in their tokens (so in their keys), not in their
	// KV bytes: neither system deduplicates values.
	keys := make([]chunk.Key, n)
	blobs := make([][]byte, n)
	for i := range n {
		tokens := make([]uint32, ntok)
		for j := range tokens {
			tokens[j] = rng.Uint32N(128000)
		}
		e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, tokens), Context: chunk.StandaloneContext()},
			DType: benchSpec.DType, Layers: benchSpec.Layers, KVHeads: benchSpec.KVHeads, HeadDim: benchSpec.HeadDim,
			Tokens: tokens, KV: kv}
		blob, err := chunk.Encode(nil, e, codec)
		if err != nil {
			return nil, nil, err
		}
		keys[i], blobs[i] = e.Key, blob
	}
	return keys, blobs, nil
}

// timed runs op over items [0, n) with the given number of workers, worker
// w using its own connection, and returns the latencies and wall time.
func timed(ctx context.Context, workers, n int, op func(ctx context.Context, w, i int) error) ([]time.Duration, time.Duration, error) {
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var first error
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					break
				}
				t0 := time.Now()
				err := op(ctx, w, i)
				mine = append(mine, time.Since(t0))
				if err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return lat, time.Since(start), first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// phase is a timed phase of a point: rounds of work, each followed by an
// untimed reset, until the duration is spent (at least one round).
func phase(ctx context.Context, f putGetFlags, blobSize int, pids []int, rounds func(round int) (int, int64), round func(ctx context.Context, w, i int) error, reset func() error) (pointResult, error) {
	res := pointResult{blobSize: blobSize}
	for r := 0; r == 0 || res.wall < f.duration; r++ {
		n, bytes := rounds(r)
		cpu0, self0 := cpuOf(pids), cputime.Process()
		lat, wall, err := timed(ctx, f.clients, n, round)
		res.cpu += cpuOf(pids) - cpu0
		res.client += cputime.Process() - self0
		if err != nil {
			return res, err
		}
		res.ops += n
		res.bytes += bytes
		res.wall += wall
		res.lat = append(res.lat, lat...)
		if reset != nil {
			if err := reset(); err != nil {
				return res, err
			}
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
	slices.Sort(res.lat)
	return res, nil
}

func cpuOf(pids []int) time.Duration {
	var t time.Duration
	for _, p := range pids {
		d, _ := cputime.Of(p)
		t += d
	}
	return t
}

func poolBytes(blobs [][]byte) int64 {
	var n int64
	for _, b := range blobs {
		n += int64(len(b))
	}
	return n
}

// kvmeshPoint puts every entry of the pool once per round (deleting them
// between rounds, so every Put stores a new entry), then gets random ones.
func kvmeshPoint(ctx context.Context, f putGetFlags, name string, clients []*client.Client, nodes []*harness.Proc, keys []chunk.Key, blobs [][]byte, prof *profiler) (put, get pointResult, err error) {
	var pids []int
	for _, p := range nodes {
		pids = append(pids, p.Pid())
	}
	total := poolBytes(blobs)
	del := func() error {
		_, _, err := timed(ctx, f.clients, len(keys), func(ctx context.Context, w, i int) error {
			_, err := clients[w].Delete(ctx, keys[i])
			return err
		})
		return err
	}
	putOp := func(ctx context.Context, w, i int) error {
		_, err := clients[w].Put(ctx, blobs[i])
		return err
	}
	stopProf := prof.start(ctx, name+"-put")
	put, err = phase(ctx, f, len(blobs[0]), pids, func(int) (int, int64) { return len(blobs), total }, putOp, del)
	stopProf()
	if err != nil {
		return put, get, err
	}
	if _, _, err := timed(ctx, f.clients, len(blobs), putOp); err != nil {
		return put, get, err
	}
	perRound := 2 * len(keys)
	order := rand.Perm(len(keys))
	// Each client reads into its own buffer, as each Redis connection does.
	bufs := make([][]byte, len(clients))
	stopProf = prof.start(ctx, name+"-get")
	get, err = phase(ctx, f, len(blobs[0]), pids, func(int) (int, int64) { return perRound, 2 * total },
		func(ctx context.Context, w, i int) error {
			k := order[i%len(keys)]
			b, err := clients[w].GetInto(ctx, keys[k], bufs[w])
			bufs[w] = b
			if err == nil && len(b) != len(blobs[k]) {
				err = fmt.Errorf("get %v: %d bytes, put %d", keys[k], len(b), len(blobs[k]))
			}
			return err
		}, nil)
	stopProf()
	if err != nil {
		return put, get, err
	}
	return put, get, del()
}

// redisPoint does what kvmeshPoint does with SET (and WAIT for R > 1),
// GET and DEL.
func redisPoint(ctx context.Context, f putGetFlags, conns []*resp.Conn, rs *redisSet, cfg rw, blobs [][]byte) (set, get pointResult, err error) {
	keys := make([][]byte, len(blobs))
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "e%d-%d", len(blobs[0]), i)
	}
	total := poolBytes(blobs)
	bufs := make([][]byte, len(conns))
	wait := []byte(strconv.Itoa(cfg.w - 1))
	setOp := func(ctx context.Context, w, i int) error {
		c := conns[w]
		if err := c.Command([]byte("SET"), keys[i], blobs[i]); err != nil {
			return err
		}
		if cfg.w > 1 {
			if err := c.Command([]byte("WAIT"), wait, []byte("10000")); err != nil {
				return err
			}
		}
		if _, err := c.Reply(nil); err != nil {
			return err
		}
		if cfg.w > 1 {
			got, err := c.Reply(nil)
			if err != nil {
				return err
			}
			if n, _ := strconv.Atoi(string(got)); n < cfg.w-1 {
				return fmt.Errorf("WAIT %d: %s replicas acknowledged", cfg.w-1, got)
			}
		}
		return nil
	}
	del := func() error {
		args := append([][]byte{[]byte("DEL")}, keys...)
		if err := conns[0].Command(args...); err != nil {
			return err
		}
		_, err := conns[0].Reply(nil)
		return err
	}
	set, err = phase(ctx, f, len(blobs[0]), rs.pids(), func(int) (int, int64) { return len(blobs), total }, setOp, del)
	if err != nil {
		return set, get, err
	}
	if _, _, err := timed(ctx, f.clients, len(blobs), setOp); err != nil {
		return set, get, err
	}
	order := rand.Perm(len(keys))
	get, err = phase(ctx, f, len(blobs[0]), rs.pids(), func(int) (int, int64) { return 2 * len(keys), 2 * total },
		func(ctx context.Context, w, i int) error {
			k := order[i%len(keys)]
			if err := conns[w].Command([]byte("GET"), keys[k]); err != nil {
				return err
			}
			b, err := conns[w].Reply(bufs[w])
			bufs[w] = b
			if err == nil && len(b) != len(blobs[k]) {
				err = fmt.Errorf("GET %s: %d bytes, SET %d", keys[k], len(b), len(blobs[k]))
			}
			return err
		}, nil)
	if err != nil {
		return set, get, err
	}
	return set, get, del()
}

// redisSet is a redis-server primary and its replicas.
type redisSet struct {
	addr  string
	procs []*exec.Cmd
}

func (r *redisSet) pids() []int {
	var out []int
	for _, p := range r.procs {
		out = append(out, p.Process.Pid)
	}
	return out
}

func (r *redisSet) stop() {
	for _, p := range r.procs {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

// startRedis starts a redis-server primary with n-1 replicas (no
// persistence) and waits until the replicas are in sync.
func startRedis(ctx context.Context, bin, dir string, n int) (*redisSet, error) {
	rs := &redisSet{}
	var primary string
	for i := range n {
		port, err := freePort()
		if err != nil {
			rs.stop()
			return nil, err
		}
		d := filepath.Join(dir, fmt.Sprintf("redis-%d-%d", n, i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			rs.stop()
			return nil, err
		}
		args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d,
			"--logfile", filepath.Join(d, "redis.log"), "--proto-max-bulk-len", "64mb",
			"--client-output-buffer-limit", "replica 0 0 0"}
		if i == 0 {
			primary = "127.0.0.1:" + port
		} else {
			args = append(args, "--replicaof", "127.0.0.1", strings.TrimPrefix(primary, "127.0.0.1:"))
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		if err := cmd.Start(); err != nil {
			rs.stop()
			return nil, err
		}
		rs.procs = append(rs.procs, cmd)
	}
	rs.addr = primary
	_, err := retry(ctx, func() (bool, error) {
		c, err := resp.Dial(primary)
		if err != nil {
			return false, err
		}
		defer c.Close()
		info, err := c.Do(nil, "INFO", "replication")
		if err != nil {
			return false, err
		}
		if want := fmt.Sprintf("connected_slaves:%d", n-1); !strings.Contains(string(info), want) {
			return false, fmt.Errorf("redis primary: no %q in %q", want, info)
		}
		return true, nil
	})
	if err != nil {
		rs.stop()
		return nil, err
	}
	return rs, nil
}

// profiler fetches CPU profiles of every node over a phase, then its
// allocation profile.
type profiler struct {
	dir      string
	duration time.Duration
	nodes    []*harness.Proc
}

func (p *profiler) start(ctx context.Context, name string) (stop func()) {
	if p == nil {
		return func() {}
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		return func() {}
	}
	// A phase lasts at least the duration: the profile covers its timed
	// work (and a little of its untimed deletes).
	secs := max(1, int(p.duration.Seconds()))
	// This process (the clients) too, over the same phase.
	self, err := os.Create(filepath.Join(p.dir, name+"-client.cpu.pprof"))
	if err == nil {
		if err := pprof.StartCPUProfile(self); err != nil {
			self.Close()
			self = nil
		}
	} else {
		self = nil
	}
	var wg sync.WaitGroup
	for _, n := range p.nodes {
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", n.Addr("http"), secs)
		wg.Go(func() { fetch(ctx, url, filepath.Join(p.dir, fmt.Sprintf("%s-%s.cpu.pprof", name, n.ID()))) })
	}
	return func() {
		wg.Wait()
		if self != nil {
			pprof.StopCPUProfile()
			self.Close()
		}
		for _, n := range p.nodes {
			fetch(ctx, "http://"+n.Addr("http")+"/debug/pprof/allocs",
				filepath.Join(p.dir, fmt.Sprintf("%s-%s.allocs.pprof", name, n.ID())))
		}
	}
}

func fetch(ctx context.Context, url, path string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		return
	}
	defer resp.Body.Close()
	out, err := os.Create(path)
	if err != nil {
		return
	}
	defer out.Close()
	_, _ = io.Copy(out, resp.Body)
}

func putGetMarkdown(f putGetFlags, rows []row, loadStart, loadEnd string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "3 kvmeshd processes on loopback and redis-server (%s) on the same machine, %d clients each, %v of timed work per point;\n",
		redisVersion(), f.clients, f.duration)
	fmt.Fprintf(&b, "every Put stores a new entry (deleted between rounds); cells are MB/s of entry bytes (p50/p99 ms). %d CPUs (%s), load %s -> %s.\n\n",
		runtime.NumCPU(), cpuModel(), loadStart, loadEnd)
	b.WriteString("| R W | codec | entry bytes | kvmesh Put | Redis SET | Put/SET MB/s, p50, p99 | kvmesh Get | Redis GET | Get/GET MB/s, p50, p99 |\n")
	b.WriteString("|---|---|---:|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.cfg.r, r.cfg.w, r.codec, sizeCell(r.size, r.stored),
			r.kPut.cell(), r.redisSet.cell(), ratio(r.kPut, r.redisSet), r.kGet.cell(), r.redisGet.cell(), ratio(r.kGet, r.redisGet))
	}
	b.WriteString("\nCPU seconds per GB moved, servers (all kvmeshd processes; all redis-server processes) + clients (this process's 8 clients):\n\n")
	b.WriteString("| R W | codec | entry bytes | kvmesh Put | Redis SET | kvmesh Get | Redis GET |\n|---|---|---:|---:|---:|---:|---:|\n")
	cell := func(p pointResult) string { return fmt.Sprintf("%.2f + %.2f", p.cpuPerGB(), p.clientPerGB()) }
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d %d | %s | %s | %s | %s | %s | %s |\n", r.cfg.r, r.cfg.w, r.codec, sizeCell(r.size, r.stored),
			cell(r.kPut), cell(r.redisSet), cell(r.kGet), cell(r.redisGet))
	}
	return b.String()
}

func sizeCell(raw, stored int) string {
	if math.Abs(float64(stored-raw)) < float64(raw)/50 {
		return fmt.Sprintf("%d KiB", raw>>10)
	}
	return fmt.Sprintf("%d KiB as %d KiB", raw>>10, stored>>10)
}

func redisVersion() string {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return "redis-server"
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return "Redis " + v
		}
	}
	return strings.TrimSpace(string(out))
}
