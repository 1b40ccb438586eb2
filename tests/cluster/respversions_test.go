package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tests/framework"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// TestRESPReplaceStoppedReplica: three kvmeshd (R=3 W=2, disk tiers), SET
// k v1 through redis-cli, stop one replica (SIGTERM: it keeps v1 on disk),
// SET k v2, start it again: GET k through every node is v2 at once, and
// still after two anti-entropy rounds on every node. The two values are
// ones that the old one-version-per-key rule (the smaller checksum wins)
// would have settled on v1.
func TestRESPReplaceStoppedReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts processes")
	}
	cli := redisTool(t, "redis-cli")
	hosts := []string{"127.0.0.62", "127.0.0.63", "127.0.0.64"}
	checkBindable(t, hosts...)
	bin := buildKvmeshd(t)
	var procs []*harness.Proc
	for i, h := range hosts {
		args := []string{"-bootstrap-expect", "3", "-local-timing", "-dead-grace", "1h", "-dram", "64M", "-disk", "64M",
			"-anti-entropy", "200ms", "-rpc-timeout", "3s", "-resp", h + ":0"}
		if i > 0 {
			args = append(args, "-join", procs[0].Addr("gossip"))
		}
		procs = append(procs, start(t, bin, fmt.Sprintf("n%d", i+1), h, t.TempDir(), args...))
	}
	redis := func(p *harness.Proc, args ...string) string {
		host, port, _ := strings.Cut(p.Addr("resp"), ":")
		return strings.TrimRight(string(runTool(t, "", cli, append([]string{"-h", host, "-p", port, "--raw"}, args...)...)), "\n")
	}
	v1, v2 := framework.StaleWinningValues(t, "k")
	testutil.WaitForWithin(t, 2*time.Minute, "the first SET", func() bool { return redis(procs[0], "SET", "k", v1) == "OK" })
	for _, p := range procs {
		testutil.WaitForWithin(t, time.Minute, p.ID()+" to read v1", func() bool { return redis(p, "GET", "k") == v1 })
	}
	if err := procs[2].Terminate(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := redis(procs[0], "SET", "k", v2); got != "OK" {
		t.Fatalf("SET with a replica down: %q", got)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := procs[2].Start(ctx); err != nil {
		t.Fatal(err)
	}
	rounds := func() []float64 {
		out := make([]float64, len(procs))
		for i, p := range procs {
			m, err := harness.Scrape(ctx, p.Addr("http"))
			if err != nil {
				t.Fatal(err)
			}
			out[i] = m["kvmesh_replication_antientropy_rounds_total"]
		}
		return out
	}
	for pass := range 2 {
		for _, p := range procs {
			if got := redis(p, "GET", "k"); got != v2 {
				t.Fatalf("pass %d: GET k through %s: %q, want %q (the acknowledged SET)", pass, p.ID(), got, v2)
			}
		}
		from := rounds()
		testutil.WaitForWithin(t, time.Minute, "two anti-entropy rounds on every node", func() bool {
			for i, n := range rounds() {
				if n < from[i]+2 {
					return false
				}
			}
			return true
		})
	}
	for _, p := range procs {
		if got := redis(p, "GET", "k"); got != v2 {
			t.Fatalf("after anti-entropy: GET k through %s: %q, want %q", p.ID(), got, v2)
		}
	}
}
