package node_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/resp"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/tests/framework"
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
		conns[i] = dialRESP(t, nodetest.ServeRESP(t, nd))
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

// TestRESPReplaceStaleReplica: a SET that replaced a value while one
// replica was down stays the value of the key on every node after that
// replica comes back and anti-entropy and repair have run.
func TestRESPReplaceStaleReplica(t *testing.T) {
	c, conns := respCluster(t, 3)
	if r, w := c.Nodes[0].Quorum(); r != 3 || w != 2 {
		t.Fatalf("R=%d W=%d, want 3 and 2", r, w)
	}
	v1, v2 := framework.StaleWinningValues(t, "k")
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
	conns[2] = dialRESP(t, nodetest.ServeRESP(t, nd))
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

// TestRESPFailedSetKeepsOld: a SET that reaches no quorum (the other two
// replicas down) is an error, and the key keeps its old value: through
// the node that took the SET while the others are down, and on every
// node once they are back and anti-entropy has run.
func TestRESPFailedSetKeepsOld(t *testing.T) {
	c, conns := respCluster(t, 3)
	do(t, conns[0], "OK", "SET", "k", "old")
	for i, cn := range conns {
		testutil.WaitFor(t, fmt.Sprintf("node %d to hold the old value", i), func() bool {
			got, err := cn.Do(nil, "GET", "k")
			return err == nil && string(got) == "old"
		})
	}
	settle(t, c.Nodes...)
	for _, i := range []int{1, 2} {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	do(t, conns[0], "-ERR replication: write quorum not reached*", "SET", "k", "new")
	do(t, conns[0], "old", "GET", "k")
	for _, i := range []int{1, 2} {
		conns[i] = dialRESP(t, nodetest.ServeRESP(t, c.Restart(i)))
	}
	c.WaitRing(3, c.Nodes...)
	settle(t, c.Nodes...)
	for _, cn := range conns {
		do(t, cn, "old", "GET", "k")
	}
	// The key still takes a SET.
	do(t, conns[1], "OK", "SET", "k", "newer")
	for _, cn := range conns {
		do(t, cn, "newer", "GET", "k")
	}
}

// TestRESPReplaceNeverNil: while one client SETs a key again and again
// through two nodes, GETs through every node never find it missing, and
// never read a value older than the last SET acknowledged before the GET
// began.
func TestRESPReplaceNeverNil(t *testing.T) {
	c, conns := respCluster(t, 3)
	do(t, conns[0], "OK", "SET", "k", "v000000")
	var acked atomic.Int64 // the last SET acknowledged
	const sets = 200
	writers := []*resp.Conn{dialRESP(t, nodetest.ServeRESP(t, c.Nodes[0])), dialRESP(t, nodetest.ServeRESP(t, c.Nodes[1]))}
	done := make(chan error, 1)
	go func() {
		for i := 1; i <= sets; i++ {
			if _, err := writers[i%2].Do(nil, "SET", "k", fmt.Sprintf("v%06d", i)); err != nil {
				done <- fmt.Errorf("SET %d: %w", i, err)
				return
			}
			acked.Store(int64(i))
		}
		done <- nil
	}()
	var writeErr error
	reads := 0
	for finished := false; !finished; {
		select {
		case writeErr = <-done:
			finished = true
		default:
		}
		for i, cn := range conns {
			before := acked.Load()
			got, err := cn.Do(nil, "GET", "k")
			if err != nil {
				t.Fatalf("GET through node %d after SET %d: %v", i, before, err)
			}
			var n int64
			if _, err := fmt.Sscanf(string(got), "v%06d", &n); err != nil || n < before {
				t.Fatalf("GET through node %d after SET %d acknowledged: %q", i, before, got)
			}
			reads++
		}
	}
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	for i, cn := range conns {
		testutil.WaitFor(t, fmt.Sprintf("node %d to read the last SET", i), func() bool {
			got, err := cn.Do(nil, "GET", "k")
			return err == nil && string(got) == fmt.Sprintf("v%06d", sets)
		})
	}
	t.Logf("%d GETs during %d SETs", reads, sets)
}

// TestRESPUnversionedValue: a value stored before versions (version zero,
// chunk.OpaqueKey) reads through every node, a SET replaces it, and it
// does not come back.
func TestRESPUnversionedValue(t *testing.T) {
	c, conns := respCluster(t, 3)
	fp := chunk.OpaqueSpec("resp:").Fingerprint()
	// The opaque model is registered by a node's first SET.
	do(t, conns[0], "OK", "SET", "other", "x")
	blob, err := chunk.EncodeOpaque(nil, fp, []byte("k"), []byte("written before versions"), chunk.ID{}, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := c.Nodes[0].Replicator().Write(ctx, blob)
	if err != nil || res.Key != chunk.OpaqueKey(fp, []byte("k")) {
		t.Fatalf("writing the unversioned entry: %v %v", res.Key, err)
	}
	for i, cn := range conns {
		testutil.WaitFor(t, fmt.Sprintf("node %d to read the unversioned value", i), func() bool {
			got, err := cn.Do(nil, "GET", "k")
			return err == nil && string(got) == "written before versions"
		})
	}
	do(t, conns[1], "23", "STRLEN", "k")
	do(t, conns[1], "OK", "SET", "k", "versioned")
	settle(t, c.Nodes...)
	for i, cn := range conns {
		do(t, cn, "versioned", "GET", "k")
		if c.Nodes[i].Store().Contains(chunk.OpaqueKey(fp, []byte("k"))) {
			t.Fatalf("node %d still holds the unversioned entry", i)
		}
	}
	// A late copy of the old entry (a hint, a repair) is refused.
	if _, err := c.Nodes[2].Replicator().Write(ctx, blob); !errors.Is(err, replication.ErrTombstoned) {
		t.Fatalf("writing the replaced entry again: %v, want ErrTombstoned", err)
	}
	for _, cn := range conns {
		do(t, cn, "versioned", "GET", "k")
	}
}

// TestRESPGetDuringRingChange: at R=1, a value whose key a new member now
// owns reads through every node before any rebalance has moved it (the
// previous owner is asked, as a Read asks it).
func TestRESPGetDuringRingChange(t *testing.T) {
	noRebalance := func(cfg *node.Config) {
		cfg.DRAMBytes, cfg.RPCTimeout = 64<<20, 5*time.Second
		cfg.Replication.RingCheckInterval = -1 // nothing moves
	}
	c := nodetest.Start(t, 2, nodetest.Config{Node: func(_ int, cfg *node.Config) { noRebalance(cfg) }})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	set := meta.Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecLossless}
	if err := c.Nodes[0].Meta().SetSettings(ctx, set, meta.AnyVersion()); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.Nodes {
		testutil.WaitFor(t, "R=1", func() bool { r, w := nd.Quorum(); return r == 1 && w == 1 })
	}
	conn := dialRESP(t, nodetest.ServeRESP(t, c.Nodes[0]))
	var keys []string
	for i := range 24 {
		keys = append(keys, fmt.Sprintf("key-%d", i))
		do(t, conn, "OK", "SET", keys[i], "value of "+keys[i])
	}
	cfg := nodetest.NodeConfig(t, "n3", []string{c.Nodes[0].GossipAddr()})
	cfg.Insecure = true
	noRebalance(&cfg)
	n3 := nodetest.StartNode(t, cfg)
	nodes := append(c.Nodes, n3)
	nodetest.WaitRing(t, 3, nodes...)
	fp := chunk.OpaqueSpec("resp:").Fingerprint()
	var moved []string
	for _, k := range keys {
		if n3.Meta().Ring().Replicas(chunk.OpaqueID(fp, []byte(k)), 1)[0].ID == "n3" {
			if holdsValue(t, n3, k) {
				t.Fatalf("%s moved to n3", k)
			}
			moved = append(moved, k)
		}
	}
	// (A read through a node that fetched it from the previous owner may
	// repair n3 with it.)
	for _, nd := range nodes {
		cn := dialRESP(t, nodetest.ServeRESP(t, nd))
		for _, k := range moved {
			do(t, cn, "value of "+k, "GET", k)
		}
	}
	if len(moved) == 0 {
		t.Fatal("no key is n3's: the test proves nothing")
	}
}
