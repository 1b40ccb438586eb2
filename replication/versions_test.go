package replication

import (
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func opaqueBlob(t *testing.T, value string, v chunk.ID) ([]byte, chunk.Key) {
	t.Helper()
	fp := chunk.OpaqueSpec("test").Fingerprint()
	blob, err := chunk.EncodeOpaque(nil, fp, []byte("k"), []byte(value), v, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return blob, chunk.OpaqueKeyAt(fp, []byte("k"), v)
}

// settle runs anti-entropy rounds on ids, in order, until a pass changes
// nothing.
func (c *cluster) settle(ids ...string) {
	c.t.Helper()
	testutil.WaitFor(c.t, "anti-entropy to settle", func() bool {
		quiet := true
		for _, id := range ids {
			st, err := c.reps[id].AntiEntropy(c.t.Context())
			if err != nil || st.Pushed+st.Fetched+st.Deletes > 0 {
				quiet = false
			}
		}
		return quiet
	})
}

// Versions of an opaque value: a replica that missed the newer one gets it
// and drops the older; the older is refused everywhere after (as a repair,
// a hint, a write), also after a delete of the newest and a restart.
func TestOpaqueVersions(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	ctx := t.Context()
	b1, k1 := opaqueBlob(t, "one", chunk.ID{Hi: 10, Lo: 1})
	b2, k2 := opaqueBlob(t, "two", chunk.ID{Hi: 20, Lo: 1})
	between, _ := opaqueBlob(t, "between", chunk.ID{Hi: 15, Lo: 9})
	if _, err := c.reps["a"].Write(ctx, b1); err != nil {
		t.Fatal(err)
	}
	c.settle("a", "b", "c")
	c.net.SetDown("c", true)
	if _, err := c.reps["a"].Write(ctx, b2); err != nil {
		t.Fatal(err)
	}
	// c stays down until the write's call to it has given up (a hint),
	// so that c keeps the old version. The coordinator retires its older
	// version once the write is acknowledged, b as it stores the newer.
	testutil.WaitFor(t, "the write to c hinted", func() bool {
		n, _ := c.reps["a"].HintsPending()
		return n == 1
	})
	c.net.SetDown("c", false)
	testutil.WaitFor(t, "the old version on c alone", func() bool {
		got := c.holders(k1)
		return len(got) == 1 && got[0] == "c"
	})
	if _, err := serveReceived(ctx, c.reps["a"], b1, ReplicateOptions{Kind: KindRepair}); !errors.Is(err, ErrTombstoned) {
		t.Fatalf("repair of the old version: %v, want ErrTombstoned", err)
	}
	c.settle("c", "a", "b")
	if got := c.holders(k1); len(got) != 0 {
		t.Fatalf("the old version still on %v", got)
	}
	if got := c.holders(k2); len(got) != 3 {
		t.Fatalf("the new version on %v, want all three", got)
	}
	for _, kind := range []Kind{KindWrite, KindHint, KindRepair, KindRebalance} {
		if _, err := serveReceived(ctx, c.reps["c"], between, ReplicateOptions{Kind: kind}); !errors.Is(err, ErrTombstoned) {
			t.Fatalf("%v of a version older than the one held: %v, want ErrTombstoned", kind, err)
		}
	}
	// A delete of the newest version leaves no version anywhere, and one
	// older than it stays refused after a restart.
	if _, err := c.reps["b"].Delete(ctx, k2); err != nil {
		t.Fatal(err)
	}
	c.settle("a", "b", "c")
	if got := append(c.holders(k1), c.holders(k2)...); len(got) != 0 {
		t.Fatalf("versions left after the delete on %v", got)
	}
	c.stop("b")
	c.net.SetDown("b", false)
	r := c.start("b")
	if _, err := serveReceived(ctx, r, between, ReplicateOptions{Kind: KindHint}); !errors.Is(err, ErrTombstoned) {
		t.Fatalf("hint of a version older than a deleted one, after a restart: %v, want ErrTombstoned", err)
	}
	// A newer version is a value again.
	b3, k3 := opaqueBlob(t, "three", chunk.ID{Hi: 30, Lo: 1})
	if _, err := c.reps["c"].Write(ctx, b3); err != nil {
		t.Fatal(err)
	}
	c.settle("a", "b", "c")
	if got := c.holders(k3); len(got) != 3 {
		t.Fatalf("the newest version on %v, want all three", got)
	}
	// A read of a retired version is served by the newer one, here and
	// from a peer.
	b, err := c.reps["c"].ServeFetch(ctx, k1)
	if err != nil {
		t.Fatal(err)
	}
	if hd, err := chunk.ParseHeader(b.Bytes(), chunk.Limits{}); err != nil || hd.Key != k3 {
		t.Fatalf("fetch of a retired version: %v, %v; want %v", hd.Key, err, k3)
	}
	b.Release()
	if err := c.stores["b"].Delete(k3); err != nil {
		t.Fatal(err)
	}
	rr, err := c.reps["b"].Read(ctx, k2)
	if err != nil {
		t.Fatal(err)
	}
	if hd, err := chunk.ParseHeader(rr.Blob.Bytes(), chunk.Limits{}); err != nil || hd.Key != k3 || rr.From == "b" {
		t.Fatalf("read of a retired version: %v from %s, %v; want %v from a peer", hd.Key, rr.From, err, k3)
	}
	rr.Blob.Release()
}

// A write of a version that fails its quorum is withdrawn on the
// coordinator: the older version stays there, and no hint carries the
// failed one.
func TestOpaqueFailedWriteWithdrawn(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	ctx := t.Context()
	b1, k1 := opaqueBlob(t, "one", chunk.ID{Hi: 10, Lo: 1})
	b2, k2 := opaqueBlob(t, "two", chunk.ID{Hi: 20, Lo: 1})
	if _, err := c.reps["a"].Write(ctx, b1); err != nil {
		t.Fatal(err)
	}
	c.settle("a", "b", "c")
	c.net.SetDown("b", true)
	c.net.SetDown("c", true)
	if _, err := c.reps["a"].Write(ctx, b2); !errors.Is(err, ErrQuorum) {
		t.Fatalf("write with two replicas down: %v, want ErrQuorum", err)
	}
	if got := c.holders(k2); len(got) != 0 {
		t.Fatalf("the failed version on %v", got)
	}
	if n, _ := c.reps["a"].HintsPending(); n != 0 {
		t.Fatalf("%d hints of the failed write", n)
	}
	c.net.SetDown("b", false)
	c.net.SetDown("c", false)
	c.settle("a", "b", "c")
	if got := c.holders(k1); len(got) != 3 {
		t.Fatalf("the old version on %v, want all three", got)
	}
}

// A value SET again and again holds one tombstone per replica (the newest
// retired version's, which stands for the older ones), also after a
// restart, and every older version stays refused.
func TestOpaqueOneTombstonePerValue(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	ctx := t.Context()
	const versions = 50
	var key chunk.Key
	for i := 1; i <= versions; i++ {
		var blob []byte
		blob, key = opaqueBlob(t, "value", chunk.ID{Hi: uint64(i)})
		if _, err := c.reps["a"].Write(ctx, blob); err != nil {
			t.Fatal(err)
		}
	}
	c.settle("a", "b", "c")
	count := func(r *Replicator) int {
		n := 0
		for _, it := range r.tombs.list() {
			if it.key.Content == key.Content {
				n++
			}
		}
		return n
	}
	for id, r := range c.reps {
		if n := count(r); n != 1 {
			t.Fatalf("%s holds %d tombstones of the value, want 1", id, n)
		}
	}
	c.stop("a")
	c.net.SetDown("a", false)
	r := c.start("a")
	if n := count(r); n != 1 {
		t.Fatalf("after a restart a holds %d tombstones of the value, want 1", n)
	}
	old, _ := opaqueBlob(t, "old", chunk.ID{Hi: 3})
	if _, err := serveReceived(ctx, r, old, ReplicateOptions{Kind: KindRepair}); !errors.Is(err, ErrTombstoned) {
		t.Fatalf("repair of an old version after a restart: %v, want ErrTombstoned", err)
	}
	if got := c.holders(key); len(got) != 3 {
		t.Fatalf("the newest version on %v, want all three", got)
	}
}
