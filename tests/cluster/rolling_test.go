package cluster

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
)

// readyz returns the HTTP status of addr's /readyz and its body.
func readyz(ctx context.Context, addr string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestRollingRestartGatedOnReadyz restarts each of three DRAM-only nodes
// in turn with SIGTERM, starting the next one as soon as the restarted
// one's /readyz says 200 and nothing else. With R=3 each node holds every
// entry, so a node that says ready with fewer entries than were written
// would let the next restart take the last copies away: /readyz must stay
// 503 (recovering) until the startup pull has refilled it, and every
// acknowledged entry must be readable afterwards.
func TestRollingRestartGatedOnReadyz(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	hosts := []string{"127.0.0.31", "127.0.0.32", "127.0.0.33"}
	checkBindable(t, hosts...)
	bin := buildKvmeshd(t)
	common := []string{"-bootstrap-expect", "3", "-local-timing", "-dead-grace", "1h", "-dram", "64M", "-disk", "0", "-rpc-timeout", "3s"}
	procs := make([]*proc, len(hosts))
	dirs := make([]string, len(hosts))
	for i, h := range hosts {
		dirs[i] = t.TempDir()
		args := append([]string{"-data-dir", dirs[i], "-grpc", h + ":0", "-http", h + ":0"}, common...)
		if i > 0 {
			args = append(args, "-join", procs[0].addrs["gossip"])
		}
		procs[i] = start(t, bin, fmt.Sprintf("n%d", i+1), args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	waitReady := func(p *proc) (first string) {
		for {
			code, body, err := readyz(ctx, p.addrs["http"])
			if err == nil && code == http.StatusOK {
				return first
			}
			if err == nil && first == "" {
				first = body
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never ready: %d %q %v", p.id, code, body, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, p := range procs {
		waitReady(p)
	}
	c, err := client.New(ctx, client.Config{Seeds: []string{procs[0].addrs["grpc"], procs[1].addrs["grpc"]}, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := testSpec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	const n = 60 // 64 KiB each
	rng := rand.New(rand.NewPCG(21, 1))
	keys := make([]chunk.Key, n)
	blobs := make([][]byte, n)
	for i := range n {
		keys[i], blobs[i] = entry(t, rng, spec, 64)
		if _, err := c.Put(ctx, blobs[i]); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	// Writes reach the third replica asynchronously: wait until every node
	// holds every entry before the first restart.
	for _, p := range procs {
		for {
			st, err := c.Stats(ctx, p.addrs["grpc"])
			if err == nil && st.Entries >= n {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never held %d entries: %v %v", p.id, n, st, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := <-p.done; err != nil {
			t.Fatalf("%s after SIGTERM: %v", p.id, err)
		}
		p.done <- nil
		seed := procs[(i+1)%len(procs)].addrs["gossip"]
		args := append([]string{"-data-dir", dirs[i], "-grpc", p.addrs["grpc"], "-gossip", p.addrs["gossip"],
			"-raft", p.addrs["raft"], "-http", p.addrs["http"], "-join", seed}, common...)
		procs[i] = start(t, bin, p.id, args...)
		first := waitReady(procs[i])
		st, state, err := c.StatsAndState(ctx, procs[i].addrs["grpc"])
		if err != nil {
			t.Fatal(err)
		}
		if st.Entries < n {
			t.Fatalf("%s said ready holding %d of %d entries (first /readyz answer %q)", p.id, st.Entries, n, first)
		}
		if state != "ready" {
			t.Fatalf("%s: /readyz 200 but Stats says %q", p.id, state)
		}
		t.Logf("%s ready again with %d entries; first /readyz answer: %q", p.id, st.Entries, first)
	}
	for i, k := range keys {
		b, err := c.Get(ctx, k)
		if err != nil {
			t.Fatalf("entry %d lost after the rolling restart: %v", i, err)
		}
		if string(b) != string(blobs[i]) {
			t.Fatalf("entry %d: wrong bytes", i)
		}
	}
}

// TestFullRestartKeepsChunksOnDisk stops all three nodes with SIGTERM and
// starts them again: each wrote its DRAM to its disk tier (on by default)
// before it left and reads it back on start, so every entry survives
// although no node was left to pull from.
func TestFullRestartKeepsChunksOnDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	hosts := []string{"127.0.0.34", "127.0.0.35", "127.0.0.36"}
	checkBindable(t, hosts...)
	bin := buildKvmeshd(t)
	common := []string{"-bootstrap-expect", "3", "-local-timing", "-dead-grace", "1h", "-dram", "64M", "-rpc-timeout", "3s"}
	procs := make([]*proc, len(hosts))
	dirs := make([]string, len(hosts))
	for i, h := range hosts {
		dirs[i] = t.TempDir()
		args := append([]string{"-data-dir", dirs[i], "-grpc", h + ":0", "-http", h + ":0"}, common...)
		if i > 0 {
			args = append(args, "-join", procs[0].addrs["gossip"])
		}
		procs[i] = start(t, bin, fmt.Sprintf("n%d", i+1), args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	waitReady := func(p *proc) {
		for {
			code, body, err := readyz(ctx, p.addrs["http"])
			if err == nil && code == http.StatusOK {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never ready: %d %q %v", p.id, code, body, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, p := range procs {
		waitReady(p)
	}
	seeds := []string{procs[0].addrs["grpc"], procs[1].addrs["grpc"], procs[2].addrs["grpc"]}
	c, err := client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := testSpec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	const n = 40
	rng := rand.New(rand.NewPCG(21, 2))
	keys := make([]chunk.Key, n)
	blobs := make([][]byte, n)
	for i := range n {
		keys[i], blobs[i] = entry(t, rng, spec, 64)
		if _, err := c.Put(ctx, blobs[i]); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	for _, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := <-p.done; err != nil {
			t.Fatalf("%s after SIGTERM: %v", p.id, err)
		}
		p.done <- nil
	}
	for i, p := range procs {
		args := append([]string{"-data-dir", dirs[i], "-grpc", p.addrs["grpc"], "-gossip", p.addrs["gossip"],
			"-raft", p.addrs["raft"], "-http", p.addrs["http"]}, common...)
		if i > 0 {
			args = append(args, "-join", procs[0].addrs["gossip"])
		}
		procs[i] = start(t, bin, p.id, args...)
	}
	for _, p := range procs {
		waitReady(p)
	}
	for i, k := range keys {
		b, err := c.Get(ctx, k)
		if err != nil {
			t.Fatalf("entry %d lost in the full restart: %v", i, err)
		}
		if string(b) != string(blobs[i]) {
			t.Fatalf("entry %d: wrong bytes", i)
		}
	}
}
