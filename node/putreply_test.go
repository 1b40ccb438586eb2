package node_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestPutSaysWhichVersionIsKept: a second Put of a key with other bytes is
// not an error, and its reply says which version the cluster keeps: the
// one with the smaller checksum, whichever came first. A Get then returns
// that version.
func TestPutSaysWhichVersionIsKept(t *testing.T) {
	nodes := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := newClient(t, nodes...)
	spec := testutil.Spec()
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(16, 1))
	// versions returns two encodings of one key with other KV bytes (two
	// honest producers), the one whose checksum Wins first.
	versions := func() (small, big []byte, smallSum, bigSum uint64) {
		tokens := testutil.Tokens(rng, 5)
		_, a := testutil.Blob(t, rng, spec, tokens, chunk.StandaloneContext())
		_, b := testutil.Blob(t, rng, spec, tokens, chunk.StandaloneContext())
		ha, err := chunk.ParseHeader(a, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		hb, err := chunk.ParseHeader(b, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if hb.Checksum < ha.Checksum {
			return b, a, hb.Checksum, ha.Checksum
		}
		return a, b, ha.Checksum, hb.Checksum
	}
	get := func(blob []byte) []byte {
		t.Helper()
		hd, err := chunk.ParseHeader(blob, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Get(ctx, hd.Key)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	t.Run("the first version wins", func(t *testing.T) {
		small, big, smallSum, bigSum := versions()
		res, err := c.Put(ctx, small)
		if err != nil || res.AlreadyStored || res.Kept != smallSum || res.Checksum != smallSum {
			t.Fatalf("first put: %+v, %v; want stored, kept %016x", res, err, smallSum)
		}
		res, err = c.Put(ctx, big)
		if err != nil {
			t.Fatalf("second put of other bytes: %v, want no error", err)
		}
		if !res.AlreadyStored || res.Kept != smallSum || res.Checksum != bigSum {
			t.Fatalf("second put: %+v; want already stored, kept %016x (this one %016x)", res, smallSum, bigSum)
		}
		if !bytes.Equal(get(big), small) {
			t.Fatal("get returns the version that lost")
		}
	})
	t.Run("the second version wins", func(t *testing.T) {
		small, big, smallSum, bigSum := versions()
		if res, err := c.Put(ctx, big); err != nil || res.AlreadyStored || res.Kept != bigSum {
			t.Fatalf("first put: %+v, %v; want stored, kept %016x", res, err, bigSum)
		}
		res, err := c.Put(ctx, small)
		if err != nil || res.AlreadyStored || res.Kept != smallSum {
			t.Fatalf("second put: %+v, %v; want stored (it wins), kept %016x", res, err, smallSum)
		}
		testutil.WaitFor(t, "every replica to keep the smaller checksum", func() bool {
			return bytes.Equal(get(small), small)
		})
	})
}
