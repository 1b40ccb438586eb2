package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/framework"
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

// restartCluster is three kvmeshd processes that bootstrap together, a
// client over them, and the entries written through it.
type restartCluster struct {
	procs []*harness.Proc
	c     *client.Client
	framework.Entries
}

// startRestartCluster starts three nodes on hosts with the flags both
// restart tests share plus extra, waits until all are ready, and writes n
// entries of 64 KiB drawn from seed.
func startRestartCluster(t *testing.T, ctx context.Context, hosts []string, n int, seed uint64, extra ...string) *restartCluster {
	t.Helper()
	dirs := make([]string, len(hosts))
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	return startRestartClusterOn(t, ctx, hosts, dirs, n, seed, extra...)
}

// startRestartClusterOn is startRestartCluster with node i's data in
// dirs[i].
func startRestartClusterOn(t *testing.T, ctx context.Context, hosts, dirs []string, n int, seed uint64, extra ...string) *restartCluster {
	t.Helper()
	checkBindable(t, hosts...)
	bin := buildKvmeshd(t)
	common := append([]string{"-bootstrap-expect", "3", "-local-timing", "-dead-grace", "1h", "-dram", "64M", "-rpc-timeout", "3s"}, extra...)
	rc := &restartCluster{procs: make([]*harness.Proc, len(hosts))}
	for i, h := range hosts {
		args := common
		if i > 0 {
			args = append(slices.Clone(common), "-join", rc.procs[0].Addr("gossip"))
		}
		rc.procs[i] = start(t, bin, fmt.Sprintf("n%d", i+1), h, dirs[i], args...)
	}
	for _, p := range rc.procs {
		waitReady(t, ctx, p)
	}
	seeds := make([]string, len(rc.procs))
	for i, p := range rc.procs {
		seeds[i] = p.Addr("grpc")
	}
	c, err := client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc.c = c
	rc.Entries = framework.RegisterAndPut(t, ctx, c, n, 128, seed)
	return rc
}

// waitReady waits until p's /readyz answers 200 and returns the first
// other answer it saw ("" when the first was 200).
func waitReady(t *testing.T, ctx context.Context, p *harness.Proc) string {
	t.Helper()
	var first string
	testutil.WaitFor(t, p.ID()+" ready", func() bool {
		code, body, err := readyz(ctx, p.Addr("http"))
		if err == nil && code == http.StatusOK {
			return true
		}
		if err == nil && first == "" {
			first = body
		}
		return false
	})
	return first
}

// checkEntries reads every entry back and compares its bytes.
func (rc *restartCluster) checkEntries(t *testing.T, ctx context.Context, after string) {
	t.Helper()
	rc.Check(t, ctx, rc.c, after)
}

// TestRollingRestartGatedOnReadyz restarts each of three DRAM-only nodes
// in turn with SIGTERM, starting the next one as soon as the restarted
// one's /readyz says 200 and nothing else. With R=3 each node holds every
// entry, so a node that says ready with fewer entries than were written
// would let the next restart take the last copies away: /readyz must stay
// 503 (recovering) until the startup pull has refilled it, and every
// acknowledged entry must be readable afterwards. The data set is small
// (60 entries, 3.75 MiB); it shows the readiness rule, not recovery time
// at volume.
func TestRollingRestartGatedOnReadyz(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()
	const n = 60
	rc := startRestartCluster(t, ctx, []string{"127.0.0.31", "127.0.0.32", "127.0.0.33"}, n, 1, "-disk", "0")
	// Writes reach the third replica asynchronously: wait until every node
	// holds every entry before the first restart.
	for _, p := range rc.procs {
		testutil.WaitFor(t, fmt.Sprintf("%s holding %d entries", p.ID(), n), func() bool {
			st, err := rc.c.Stats(ctx, p.Addr("grpc"))
			return err == nil && st.Entries >= n
		})
	}
	for _, p := range rc.procs {
		if err := p.Terminate(30 * time.Second); err != nil {
			t.Fatalf("%s after SIGTERM: %v", p.ID(), err)
		}
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		first := waitReady(t, ctx, p)
		st, state, err := rc.c.StatsAndState(ctx, p.Addr("grpc"))
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
	rc.checkEntries(t, ctx, "after the rolling restart")
}

// TestFullRestartKeepsChunksOnDisk stops all three nodes cleanly and
// starts them again: each wrote its DRAM to its disk tier before it left
// and reads it back on start, so every entry survives although no node was
// left to pull from. One body, run in process and on kvmeshd processes.
func TestFullRestartKeepsChunksOnDisk(t *testing.T) {
	testutil.SkipIfShort(t, "three-node clusters stopped and started")
	runners := []framework.Runner{framework.InProcess{},
		framework.Processes{Bin: buildKvmeshd, Hosts: []string{"127.0.0.34", "127.0.0.35", "127.0.0.36"}}}
	framework.Run(t, 3, framework.Options{DiskBytes: 64 << 20}, runners, func(t *testing.T, fc framework.Cluster) {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
		defer cancel()
		e := framework.RegisterAndPut(t, ctx, fc.Client(), 40, 128, 2)
		for i := range fc.Len() {
			if err := fc.Stop(i); err != nil {
				t.Fatalf("n%d stopped: %v", i+1, err)
			}
		}
		for i := range fc.Len() {
			if err := fc.Restart(ctx, i); err != nil {
				t.Fatal(err)
			}
		}
		for i := range fc.Len() {
			fc.WaitReady(i)
		}
		e.Check(t, ctx, fc.Client(), "in the full restart")
	})
}
