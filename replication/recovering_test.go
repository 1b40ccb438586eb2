package replication

import (
	"errors"
	"sync/atomic"
	"testing"
)

// recoveringCluster is a three-node cluster whose nodes say they are
// recovering while their flag is set.
func recoveringCluster(t *testing.T) (*cluster, map[string]*atomic.Bool) {
	flags := map[string]*atomic.Bool{"a": {}, "b": {}, "c": {}}
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
		cfg.Recovering = flags[id].Load
	})
	return c, flags
}

// A replica refilling after a restart is not a copy: its miss is
// ErrRecovering (not an answer), and a read that reaches no replica that
// could answer is ErrUnavailable, never ErrNotFound; once a replica with
// the key answers, the read finds it.
func TestRecoveringReplicaIsNotACopy(t *testing.T) {
	c, flags := recoveringCluster(t)
	keys, _ := writeAll(t, c, "a", 1, 2) // on all three when it returns
	key := keys[0]
	// b restarts without its chunks and is recovering.
	c.stop("b")
	c.stores["b"].Wipe()
	c.net.SetDown("b", false)
	flags["b"].Store(true)
	c.start("b")

	_, err := c.reps["b"].ServeFetch(t.Context(), key)
	if !errors.Is(err, ErrRecovering) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("recovering node's fetch of a key it lacks: %v, want ErrRecovering and ErrNotFound", err)
	}
	// The replicas that hold the key are away: the recovering node's own
	// miss is no answer.
	c.net.SetDown("a", true)
	c.net.SetDown("c", true)
	_, err = c.reps["b"].Read(t.Context(), key)
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotFound) {
		t.Fatalf("read on the recovering node with its peers away: %v, want ErrUnavailable", err)
	}
	// Another coordinator whose only reachable replica is the recovering
	// one gets no answer either.
	c.net.SetDown("c", false)
	c.stores["c"].Wipe()
	flags["c"].Store(false)
	c.net.SetDown("a", true)
	if _, err := c.reps["c"].Read(t.Context(), key); !errors.Is(err, ErrNotFound) {
		// c is a replica that is not recovering and lacks the key: its
		// own miss is an answer (the key is absent as far as it knows).
		t.Fatalf("read on a non-recovering replica that lacks the key: %v, want ErrNotFound", err)
	}
	// With the holder back, the read on the recovering node finds it and
	// repairs the node.
	c.net.SetDown("a", false)
	rr, err := c.reps["b"].Read(t.Context(), key)
	if err != nil {
		t.Fatalf("read with a holder up: %v", err)
	}
	rr.Blob.Release()
	c.waitRepairs()
	if !c.stores["b"].Has(key) {
		t.Fatal("the recovering node was not repaired by the read")
	}
	// A key no node has is absent once a replica that is not recovering
	// says so.
	_, absent := makeBlob(t, 2, 0)
	if _, err := c.reps["b"].Read(t.Context(), absent); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of an absent key: %v, want ErrNotFound", err)
	}
}

// Anti-entropy counts the keys below W and below R copies: each key once
// (by its first holder in ring order), peers that cannot answer hold
// nothing, and keys a round pushes count as copied.
func TestUnderReplicatedCount(t *testing.T) {
	c, _ := recoveringCluster(t)
	const n = 30
	keys, _ := writeAll(t, c, "a", 0, n)
	round := func(ids ...string) (underW, underR int) {
		t.Helper()
		for _, id := range ids {
			st, _ := c.reps[id].AntiEntropy(t.Context())
			underW += st.UnderW
			underR += st.UnderR
			if m := c.reps[id].Metrics(); m.KeysUnderReplicated != int64(st.UnderW) || m.KeysBelowReplicas != int64(st.UnderR) {
				t.Fatalf("%s: metrics %d/%d, round %d/%d", id, m.KeysUnderReplicated, m.KeysBelowReplicas, st.UnderW, st.UnderR)
			}
		}
		return underW, underR
	}
	if w, r := round("a", "b", "c"); w != 0 || r != 0 {
		t.Fatalf("fully replicated: %d keys below W, %d below R", w, r)
	}
	// c is away: every key has two copies, counted once over a and b.
	c.net.SetDown("c", true)
	if w, r := round("a", "b"); w != 0 || r != n {
		t.Fatalf("c away: %d below W, %d below R; want 0 and %d", w, r, n)
	}
	// b is away too: a holds the only copy it can see of each key.
	c.net.SetDown("b", true)
	if w, r := round("a"); w != n || r != n {
		t.Fatalf("b and c away: %d below W, %d below R; want %d and %d", w, r, n, n)
	}
	// c comes back empty: a's round pushes its keys to c, which then
	// holds them; b is still away, so two copies each.
	c.net.SetDown("b", false)
	c.stop("b")
	c.stop("c")
	c.stores["c"].Wipe()
	c.net.SetDown("c", false)
	c.start("c")
	c.net.SetDown("b", true)
	if w, r := round("a", "c"); w != 0 || r != n {
		t.Fatalf("c refilled by a's round, b away: %d below W, %d below R; want 0 and %d", w, r, n)
	}
	for _, k := range keys {
		if !c.stores["c"].Has(k) {
			t.Fatalf("c lacks %v after a's round", k)
		}
	}
}
