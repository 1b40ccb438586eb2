package node_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/resp"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/replication"
)

// respCluster starts n in-process nodes (R=3, W=2) with their doors.
func respCluster(t *testing.T, n int) (*nodetest.Cluster, []*resp.Conn) {
	t.Helper()
	c := nodetest.Start(t, n, nodetest.Config{Node: func(_ int, cfg *node.Config) {
		// A disk tier, so that a restarted node still holds what it held.
		cfg.DRAMBytes, cfg.DiskBytes, cfg.RPCTimeout = 64<<20, 64<<20, 5*time.Second
	}})
	conns := make([]*resp.Conn, n)
	for i, nd := range c.Nodes {
		conns[i] = dialRESP(t, serveRESP(t, nd))
	}
	return c, conns
}

// settle runs anti-entropy rounds on nodes, in order, until a whole pass
// over them copies and deletes nothing and no repair is pending.
func settle(t *testing.T, nodes ...*node.Node) {
	t.Helper()
	testutil.WaitForWithin(t, 60*time.Second, "anti-entropy to settle", func() bool {
		quiet := true
		for _, nd := range nodes {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			st, err := nd.Replicator().AntiEntropy(ctx)
			cancel()
			if err != nil || st.Pushed+st.Fetched+st.Deletes+st.Pulled > 0 || nd.Replicator().RepairsPending() > 0 {
				quiet = false
			}
		}
		return quiet
	})
}

// holdsValue reports whether nd's store holds an entry of key.
func holdsValue(t *testing.T, nd *node.Node, key string) bool {
	t.Helper()
	fp := chunk.OpaqueSpec("resp:").Fingerprint()
	_, m, err := nd.Store().Best(fp, chunk.OpaqueID(fp, []byte(key)), chunk.OpaqueContext())
	if err != nil {
		t.Fatal(err)
	}
	return m != chunk.MatchMiss
}

// oldRuleKeeps picks two values of key that the one-version-per-key rule
// (replication.Wins over the unversioned entries' checksums) would settle
// on the first of: the pair with which a replica that missed the
// replacement brings the old value back under that rule.
func oldRuleKeeps(t *testing.T, key string) (v1, v2 string) {
	t.Helper()
	fp := chunk.OpaqueSpec("resp:").Fingerprint()
	sum := func(v string) uint64 {
		blob, err := chunk.EncodeOpaque(nil, fp, []byte(key), []byte(v), chunk.ID{}, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		hd, err := chunk.ParseHeader(blob, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return hd.Checksum
	}
	for i := range 64 {
		v1, v2 = fmt.Sprintf("old value %d", i), fmt.Sprintf("new value %d", i)
		if replication.Wins(sum(v1), sum(v2)) {
			return v1, v2
		}
	}
	t.Fatal("no pair of values whose old one wins by checksum")
	return "", ""
}

// TestRESPReplaceStaleReplica: a SET that replaced a value while one
// replica was down stays the value of the key on every node after that
// replica comes back and anti-entropy and repair have run.
func TestRESPReplaceStaleReplica(t *testing.T) {
	c, conns := respCluster(t, 3)
	if r, w := c.Nodes[0].Quorum(); r != 3 || w != 2 {
		t.Fatalf("R=%d W=%d, want 3 and 2", r, w)
	}
	v1, v2 := oldRuleKeeps(t, "k")
	do(t, conns[0], "OK", "SET", "k", v1)
	for i, cn := range conns {
		testutil.WaitFor(t, fmt.Sprintf("node %d to hold %q", i, v1), func() bool {
			got, err := cn.Do(nil, "GET", "k")
			return err == nil && string(got) == v1
		})
	}
	settle(t, c.Nodes...)
	if err := c.Stop(2); err != nil {
		t.Fatal(err)
	}
	do(t, conns[0], "OK", "SET", "k", v2)
	nd := c.Restart(2)
	c.WaitRing(3, c.Nodes...)
	conns[2] = dialRESP(t, serveRESP(t, nd))
	if !holdsValue(t, nd, "k") {
		t.Fatal("the restarted replica holds no value of k: the test would prove nothing")
	}
	// The replica that missed the replacement runs first, so that its old
	// value is what it offers the others.
	settle(t, nd, c.Nodes[0], c.Nodes[1])
	for round := range 2 {
		for i, cn := range conns {
			got, err := cn.Do(nil, "GET", "k")
			if err != nil || string(got) != v2 {
				t.Fatalf("round %d: GET k through node %d: %q, %v; want %q (the acknowledged SET)", round, i, got, err, v2)
			}
		}
		settle(t, nd, c.Nodes[0], c.Nodes[1])
	}
}

// TestRESPFailedSetKeepsOld: a SET that reaches no quorum leaves the key
// holding a value: the old one where no replica took the new one.
var _ = errors.Is
