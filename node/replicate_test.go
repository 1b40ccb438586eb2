package node_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/tests/framework"
)

// replTiming is replication's background work tuned for tests: hints
// retried within a second, rebalance retried fast, no transfer rate limit.
var replTiming = replication.Config{
	HintInterval: 100 * time.Millisecond, MaxHintBackoff: 500 * time.Millisecond,
	RingCheckInterval: 200 * time.Millisecond, RebalanceRetry: 300 * time.Millisecond,
	RebalanceBytesPerSec: -1, CallTimeout: 3 * time.Second,
}

// replConfig is nodetest.NodeConfig of node id, insecure, with 32 MiB of
// DRAM and replTiming, expecting expect members to bootstrap.
func replConfig(t testing.TB, id string, seeds []string, expect int) node.Config {
	cfg := nodetest.NodeConfig(t, id, seeds)
	cfg.BootstrapExpect, cfg.DRAMBytes, cfg.Insecure, cfg.Replication = expect, 32<<20, true, replTiming
	return cfg
}

// startReplCluster starts n nodes (nodetest.Start) of replConfig's
// settings and returns them with their configurations, whose addresses
// are pinned to the bound ones so that a node restarted from its config
// comes back where it was.
func startReplCluster(t testing.TB, n int) ([]*node.Node, []node.Config) {
	t.Helper()
	c := nodetest.Start(t, n, nodetest.Config{Node: func(_ int, cfg *node.Config) {
		cfg.DRAMBytes, cfg.Replication = 32<<20, replTiming
	}})
	return c.Nodes, c.Configs
}

// holders returns the IDs of the nodes whose local store holds key.
func holders(nodes []*node.Node, key chunk.Key) []string {
	var out []string
	for _, nd := range nodes {
		if nd.Store().Contains(key) {
			out = append(out, nd.ID())
		}
	}
	slices.Sort(out)
	return out
}

// owners returns the IDs of key's replicas on nd's ring.
func owners(nd *node.Node, key chunk.Key) []string {
	rf, _ := nd.Quorum()
	var out []string
	for _, m := range nd.Meta().Ring().Replicas(key.Content, rf) {
		out = append(out, m.ID)
	}
	slices.Sort(out)
	return out
}

type testChunk struct {
	key  chunk.Key
	blob []byte
}

// registerAndPut registers testutil.Spec through c and puts makeChunks'
// n chunks of seed, failing t on any error.
func registerAndPut(t *testing.T, ctx context.Context, c *client.Client, seed uint64, n int) []testChunk {
	t.Helper()
	chunks := makeChunks(t, seed, n)
	framework.RegisterAndPutBlobs(t, ctx, c, testutil.Spec(), blobsOf(chunks))
	return chunks
}

// blobsOf returns the chunks' blobs, in order.
func blobsOf(chunks []testChunk) [][]byte {
	blobs := make([][]byte, len(chunks))
	for i, ch := range chunks {
		blobs[i] = ch.blob
	}
	return blobs
}

func makeChunks(t *testing.T, seed uint64, n int) []testChunk {
	rng := rand.New(rand.NewPCG(seed, seed))
	out := make([]testChunk, n)
	for i := range out {
		out[i].key, out[i].blob = testutil.Blob(t, rng, testutil.Spec(), testutil.Tokens(rng, 8+i%7), chunk.StandaloneContext())
	}
	return out
}

// checkReadable reads every chunk through nodes[0]'s replication (local,
// then the replicas) and compares the bytes.
func checkReadable(t *testing.T, ctx context.Context, nd *node.Node, chunks []testChunk) {
	t.Helper()
	for i, c := range chunks {
		rr, err := nd.Replicator().Read(ctx, c.key)
		if err != nil {
			t.Fatalf("chunk %d (%v) lost: %v", i, c.key, err)
		}
		same := bytes.Equal(rr.Blob.Bytes(), c.blob)
		rr.Blob.Release()
		if !same {
			t.Fatalf("chunk %d (%v): bytes differ", i, c.key)
		}
	}
}

// TestReplicaKilledDuringWrites kills one of 3 replicas while a client
// writes: no chunk acknowledged with a write quorum is lost.
func TestReplicaKilledDuringWrites(t *testing.T) {
	testutil.SkipIfShort(t, "a 3-node cluster under writes")
	nodes, _ := startReplCluster(t, 3)
	c := newClient(t, nodes[0], nodes[1])
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	chunks := makeChunks(t, 7, 60)
	quorate := func(i int, res client.PutResult) {
		if len(res.StoredOn) < 2 {
			t.Fatalf("put %d acknowledged by %v, below the write quorum", i, res.StoredOn)
		}
	}
	const before = 20 // writes before the kill, all acknowledged
	for i, res := range framework.RegisterAndPutBlobs(t, ctx, c, testutil.Spec(), blobsOf(chunks[:before])) {
		quorate(i, res)
	}
	acked := slices.Clone(chunks[:before])
	failed := 0
	// Kill n3 in the middle of the stream, while writes go on.
	var killed sync.WaitGroup
	killed.Go(func() { _ = nodes[2].Close() })
	for i, ch := range chunks[before:] {
		res, err := c.Put(ctx, ch.blob)
		if err != nil {
			failed++
			continue
		}
		quorate(i+before, res)
		acked = append(acked, ch)
	}
	killed.Wait()
	if len(acked) < len(chunks)/2 {
		t.Fatalf("only %d of %d writes acknowledged (%d failed)", len(acked), len(chunks), failed)
	}
	live := nodes[:2]
	for _, nd := range live {
		checkReadable(t, ctx, nd, acked)
	}
	// Every acknowledged chunk ends on both live replicas (write
	// stragglers, repairs): one more failure would still lose nothing.
	testutil.WaitForWithin(t, 30*time.Second, "acknowledged chunks on both live nodes", func() bool {
		for _, ch := range acked {
			if len(holders(live, ch.key)) < 2 {
				_, _ = nodes[0].Replicator().Read(ctx, ch.key) // read repair
				return false
			}
		}
		return true
	})
	t.Logf("%d acknowledged, %d failed", len(acked), failed)
}

// TestHintsDeliveredAfterReturn: a node down during writes receives their
// hints once it is back.
func TestHintsDeliveredAfterReturn(t *testing.T) {
	testutil.SkipIfShort(t, "a 3-node cluster and a restart")
	nodes, cfgs := startReplCluster(t, 3)
	c := newClient(t, nodes[0], nodes[1])
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if _, err := c.RegisterModel(ctx, testutil.Spec()); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWithin(t, 30*time.Second, "the model on n3", func() bool {
		_, ok := nodes[2].Meta().Model(testutil.Spec().Fingerprint())
		return ok
	})
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	chunks := makeChunks(t, 11, 20)
	for i, res := range framework.PutBlobs(t, ctx, c, blobsOf(chunks)) {
		if slices.Contains(res.StoredOn, "n3") {
			t.Fatalf("put %d stored on the closed n3", i)
		}
	}
	// Writes return at their quorum; the failed call to n3 may add its
	// hint a moment later.
	testutil.WaitForWithin(t, 30*time.Second, "a hint per write that missed n3", func() bool {
		pending := 0
		for _, nd := range nodes[:2] {
			p, _ := nd.Replicator().HintsPending()
			pending += p
		}
		return pending >= len(chunks)
	})

	back := nodetest.StartNode(t, cfgs[2])
	all := []*node.Node{nodes[0], nodes[1], back}
	nodetest.WaitRing(t, 3, all...)
	testutil.WaitForWithin(t, 45*time.Second, "hinted chunks on the returned n3", func() bool {
		for _, ch := range chunks {
			if !back.Store().Contains(ch.key) {
				return false
			}
		}
		return true
	})
	testutil.WaitForWithin(t, 30*time.Second, "no hints pending", func() bool {
		for _, nd := range nodes[:2] {
			if p, _ := nd.Replicator().HintsPending(); p > 0 {
				return false
			}
		}
		return true
	})
	delivered := nodes[0].Replicator().Metrics().HintsDelivered + nodes[1].Replicator().Metrics().HintsDelivered
	if delivered < int64(len(chunks)) {
		t.Fatalf("%d hints delivered, want at least %d", delivered, len(chunks))
	}
	for _, ch := range chunks {
		got, err := back.Replicator().ServeFetch(ctx, ch.key)
		if err != nil {
			t.Fatal(err)
		}
		same := bytes.Equal(got.Bytes(), ch.blob)
		got.Release()
		if !same {
			t.Fatalf("%v: hinted bytes differ", ch.key)
		}
	}
}

// TestJoinRebalances: a 4th node joins and ends with its share; the old
// owners drop what they no longer own.
func TestJoinRebalances(t *testing.T) {
	testutil.SkipIfShort(t, "a cluster that grows")
	nodes, _ := startReplCluster(t, 3)
	c := newClient(t, nodes...)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	chunks := registerAndPut(t, ctx, c, 13, 60)
	n4 := nodetest.StartNode(t, replConfig(t, "n4", []string{nodes[0].GossipAddr()}, 0))
	all := append(slices.Clone(nodes), n4)
	nodetest.WaitRing(t, 4, all...)
	placed := func() bool {
		for _, ch := range chunks {
			if !slices.Equal(holders(all, ch.key), owners(nodes[0], ch.key)) {
				return false
			}
		}
		return true
	}
	testutil.WaitForWithin(t, 60*time.Second, "every chunk on exactly its owners in the 4-node ring", placed)
	share := 0
	for _, ch := range chunks {
		if n4.Store().Contains(ch.key) {
			share++
		}
	}
	// R=3 of 4 nodes: n4 owns about 3/4 of the chunks.
	if share < len(chunks)/2 || share == len(chunks) {
		t.Fatalf("n4 holds %d of %d chunks, want about 3/4", share, len(chunks))
	}
	// Each chunk n4 took was dropped by the one old owner that left its
	// replica set. The counter moves just after the delete that placed
	// saw, so wait for it too.
	testutil.WaitForWithin(t, 30*time.Second, fmt.Sprintf("the old owners to drop the %d chunks n4 took", share), func() bool {
		var dropped int64
		for _, nd := range nodes {
			dropped += nd.Replicator().Metrics().RebalanceDropped
		}
		return dropped >= int64(share)
	})
	checkReadable(t, ctx, n4, chunks)
}

// TestDrainMovesEverything drains a node through the admin RPC: its
// chunks reach their owners among the others, it leaves the ring, and
// nothing is lost once it is gone.
func TestDrainMovesEverything(t *testing.T) {
	testutil.SkipIfShort(t, "a 3-node cluster and a drain")
	nodes, _ := startReplCluster(t, 4)
	c := newClient(t, nodes[:3]...)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	chunks := registerAndPut(t, ctx, c, 17, 40)
	n4 := nodes[3]
	held := 0
	for _, ch := range chunks {
		if n4.Store().Contains(ch.key) {
			held++
		}
	}
	if held == 0 {
		t.Fatal("n4 holds nothing to drain")
	}
	var phases []string
	last, err := c.Drain(ctx, n4.GRPCAddr(), false, func(p *api.DrainProgress) {
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !last.Left || last.Phase != "done" || last.NodeId != "n4" || last.Keys < uint64(held) {
		t.Fatalf("last progress %v, want done and left with at least %d keys", last, held)
	}
	if !slices.Equal(phases, []string{"draining", "leaving", "done"}) {
		t.Fatalf("phases %v", phases)
	}
	rest := nodes[:3]
	nodetest.WaitRing(t, 3, rest...)
	if err := n4.Close(); err != nil {
		t.Fatal(err)
	}
	// R=3 of the 3 left: every chunk on every remaining node, without
	// any read having to repair it.
	for _, ch := range chunks {
		if h := holders(rest, ch.key); len(h) != 3 {
			t.Fatalf("%v on %v after the drain, want all three", ch.key, h)
		}
	}
	checkReadable(t, ctx, nodes[0], chunks)
}

// TestSingleNodeQuorumAndDrain: R and W from the settings (3 and 2) clamp
// to a 1-node ring, so writes succeed on the one node; draining the only
// node is refused.
func TestSingleNodeQuorumAndDrain(t *testing.T) {
	nodes, _ := startReplCluster(t, 1)
	nd := nodes[0]
	if r, w := nd.Quorum(); r != 1 || w != 1 {
		t.Fatalf("quorum on a 1-node ring: R=%d W=%d, want 1 and 1", r, w)
	}
	c := newClient(t, nd)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ch := makeChunks(t, 19, 1)[0]
	res := framework.RegisterAndPutBlobs(t, ctx, c, testutil.Spec(), [][]byte{ch.blob})[0]
	if !slices.Equal(res.StoredOn, []string{"n1"}) {
		t.Fatalf("stored on %v, want [n1]", res.StoredOn)
	}
	_, err := c.Drain(ctx, nd.GRPCAddr(), true, nil)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("drain of the only node: %v, want FailedPrecondition", err)
	}
	if !nd.Store().Contains(ch.key) {
		t.Fatal("a refused drain removed the chunk")
	}
}

// BenchmarkDrain measures one drain (without leaving) of a node of a
// 4-node cluster holding 96 entries of 256 KiB (24 MiB, fitting every node's 32 MiB DRAM after the drain) at R=3, transfers
// unlimited; run with -benchtime=1x. MB/s counts the bytes copied.
func BenchmarkDrain(b *testing.B) {
	nodes, _ := startReplCluster(b, 4)
	c := newClient(b, nodes[:3]...)
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(23, 23))
	for i := range 96 {
		_, blob := testutil.Blob(b, rng, spec, testutil.Tokens(rng, 512), chunk.StandaloneContext())
		if _, err := c.Put(ctx, blob); err != nil {
			b.Fatalf("put %d: %v", i, err)
		}
	}
	var moved int64
	var keys int
	b.ResetTimer()
	for range b.N {
		st, err := nodes[3].Drain(ctx, true, nil)
		if err != nil {
			b.Fatal(err)
		}
		moved += st.BytesMoved
		keys += st.KeysMoved
	}
	b.StopTimer()
	secs := b.Elapsed().Seconds()
	b.ReportMetric(float64(moved)/1e6/secs, "MB/s")
	b.ReportMetric(float64(keys)/float64(b.N), "keys/drain")
}
