package cluster

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/harness"
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
	procs := make([]*harness.Proc, len(hosts))
	for i, h := range hosts {
		args := common
		if i > 0 {
			args = append(slices.Clone(common), "-join", procs[0].Addr("gossip"))
		}
		procs[i] = start(t, bin, fmt.Sprintf("n%d", i+1), h, t.TempDir(), args...)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()
	waitReady := func(p *harness.Proc) (first string) {
		for {
			code, body, err := readyz(ctx, p.Addr("http"))
			if err == nil && code == http.StatusOK {
				return first
			}
			if err == nil && first == "" {
				first = body
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never ready: %d %q %v", p.ID(), code, body, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, p := range procs {
		waitReady(p)
	}
	c, err := client.New(ctx, client.Config{Seeds: []string{procs[0].Addr("grpc"), procs[1].Addr("grpc")}, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	const n = 60 // 64 KiB each
	rng := rand.New(rand.NewPCG(21, 1))
	keys := make([]chunk.Key, n)
	blobs := make([][]byte, n)
	for i := range n {
		keys[i], blobs[i] = testutil.StandaloneBlob(t, rng, spec, 128)
		if _, err := c.Put(ctx, blobs[i]); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	// Writes reach the third replica asynchronously: wait until every node
	// holds every entry before the first restart.
	for _, p := range procs {
		for {
			st, err := c.Stats(ctx, p.Addr("grpc"))
			if err == nil && st.Entries >= n {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never held %d entries: %v %v", p.ID(), n, st, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i, p := range procs {
		if err := p.Terminate(30 * time.Second); err != nil {
			t.Fatalf("%s after SIGTERM: %v", p.ID(), err)
		}
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		first := waitReady(procs[i])
		st, state, err := c.StatsAndState(ctx, procs[i].Addr("grpc"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Entries < n {
			t.Fatalf("%s said ready holding %d of %d entries (first /readyz answer %q)", p.ID(), st.Entries, n, first)
		}
		if state != "ready" {
			t.Fatalf("%s: /readyz 200 but Stats says %q", p.ID(), state)
		}
		t.Logf("%s ready again with %d entries; first /readyz answer: %q", p.ID(), st.Entries, first)
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
	procs := make([]*harness.Proc, len(hosts))
	for i, h := range hosts {
		args := common
		if i > 0 {
			args = append(slices.Clone(common), "-join", procs[0].Addr("gossip"))
		}
		procs[i] = start(t, bin, fmt.Sprintf("n%d", i+1), h, t.TempDir(), args...)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()
	waitReady := func(p *harness.Proc) {
		for {
			code, body, err := readyz(ctx, p.Addr("http"))
			if err == nil && code == http.StatusOK {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never ready: %d %q %v", p.ID(), code, body, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, p := range procs {
		waitReady(p)
	}
	seeds := []string{procs[0].Addr("grpc"), procs[1].Addr("grpc"), procs[2].Addr("grpc")}
	c, err := client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	const n = 40
	rng := rand.New(rand.NewPCG(21, 2))
	keys := make([]chunk.Key, n)
	blobs := make([][]byte, n)
	for i := range n {
		keys[i], blobs[i] = testutil.StandaloneBlob(t, rng, spec, 128)
		if _, err := c.Put(ctx, blobs[i]); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	for _, p := range procs {
		if err := p.Terminate(30 * time.Second); err != nil {
			t.Fatalf("%s after SIGTERM: %v", p.ID(), err)
		}
	}
	for _, p := range procs {
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
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
