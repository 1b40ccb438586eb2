package replication

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestPullRefillsRestartedNode: a node restarts with an empty store (the
// default DRAM-only tier). A plain anti-entropy round on it copies nothing
// (each side pushes only what it holds, and it holds nothing); a Pull
// round takes back every key it replicates, and tombstones, in one round
// whose cost follows the keys it lacks; a second round moves nothing.
func TestPullRefillsRestartedNode(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c", "d"}, nil)
	keys, _ := writeAll(t, c, "a", 0, 120)
	if _, err := c.reps["a"].Delete(t.Context(), keys[0]); err != nil {
		t.Fatal(err)
	}
	var mine []chunk.Key
	for _, k := range keys[1:] {
		if c.ring().IsReplica(k.Content, "b", c.r) {
			mine = append(mine, k)
		}
	}
	if len(mine) == 0 {
		t.Fatal("b replicates nothing")
	}
	// b restarts empty: store wiped, tombstones kept on disk.
	c.stop("b")
	c.stores["b"].Wipe()
	c.net.SetDown("b", false)
	c.start("b")

	st, err := c.reps["b"].AntiEntropy(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pushed != 0 || c.stores["b"].Len() != 0 {
		t.Fatalf("a push round on the empty node moved something: %+v, holds %d", st, c.stores["b"].Len())
	}
	fetches := c.net.Stats().Fetches
	st, err = c.reps["b"].StartupPull(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pulled != len(mine) || c.net.Stats().Fetches-fetches != int64(len(mine)) {
		t.Fatalf("pulled %d keys with %d fetches, want %d: %+v", st.Pulled, c.net.Stats().Fetches-fetches, len(mine), st)
	}
	for _, k := range mine {
		if !c.stores["b"].Has(k) {
			t.Fatalf("b lacks %v after the pull", k)
		}
	}
	if c.stores["b"].Has(keys[0]) {
		t.Fatal("a deleted key came back")
	}
	if m := c.reps["b"].Metrics(); m.PullKeys != int64(len(mine)) || m.PullRounds != 1 || m.PullRunning != 0 || m.PullBytes <= 0 {
		t.Fatalf("pull metrics %+v", m)
	}
	st, err = c.reps["b"].Pull(t.Context())
	if err != nil || st.Pulled != 0 || st.BucketsDiffer != 0 {
		t.Fatalf("second pull: %+v, %v", st, err)
	}
}

// TestStartupPullRetriesUnreachablePeer: a peer that cannot answer the
// first round is pulled from in a later one.
func TestStartupPullRetriesUnreachablePeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, nil)
		keys, _ := writeAll(t, c, "a", 0, 40)
		c.stop("b")
		c.stores["b"].Wipe()
		c.net.SetDown("b", false)
		c.start("b")
		// Every key is on all three nodes (R=3): cut b from a and c for the
		// first round only.
		c.net.Partition([]string{"b"}, []string{"a", "c"}, true)
		go func() {
			time.Sleep(200 * time.Millisecond)
			c.net.Partition([]string{"b"}, []string{"a", "c"}, false)
		}()
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		st, err := c.reps["b"].StartupPull(ctx)
		if err != nil {
			t.Fatalf("startup pull: %v (%+v)", err, st)
		}
		if got := c.holders(keys[0]); !slices.Contains(got, "b") || st.Pulled != len(keys) {
			t.Fatalf("pulled %d of %d; key 0 on %v", st.Pulled, len(keys), got)
		}
	})
}

// TestNodeUpFlushesHints: hints for a node whose deliveries failed wait
// out a backoff; NodeUp delivers them at once.
func TestNodeUpFlushesHints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
			cfg.HintInterval = 10 * time.Millisecond
			cfg.MaxHintBackoff = time.Hour
		})
		c.net.SetDown("c", true)
		blob, key := makeBlob(t, 1, 0)
		if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
			t.Fatal(err)
		}
		// The hint is stored by the write's straggler, after the ack.
		testutil.WaitForWithin(t, 10*time.Second, "one hint held", func() bool {
			n, _ := c.reps["a"].HintsPending()
			return n == 1
		})
		// Fail deliveries until the backoff is long (about 20 s).
		for range 12 {
			_, _ = c.reps["a"].deliverHints(t.Context(), true)
		}
		c.net.SetDown("c", false)
		time.Sleep(50 * time.Millisecond) // several hint loop ticks: all inside the backoff
		if c.stores["c"].Has(key) {
			t.Fatal("hint delivered inside its backoff")
		}
		c.reps["a"].NodeUp("c")
		testutil.WaitForWithin(t, 10*time.Second, "the hint delivered after NodeUp", func() bool { return c.stores["c"].Has(key) })
	})
}
