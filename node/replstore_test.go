package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/ring"
)

// The adapter keeps both packages' sentinels in the chain, lends kvtier's
// pinned view, and answers presence and room from the store.
func TestReplStoreAdapter(t *testing.T) {
	ctx := t.Context()
	s, err := kvtier.Open(kvtier.Config{DRAMBytes: 1 << 20, PageSize: 64 << 10,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	st := replStore{s}
	rng := rand.New(rand.NewPCG(1, 2))
	key, blob := testutil.Blob(t, rng, testutil.Spec(), testutil.Tokens(rng, 8), chunk.StandaloneContext())

	if _, err := st.Get(ctx, key); !errors.Is(err, replication.ErrNotFound) || !errors.Is(err, kvtier.ErrNotFound) {
		t.Fatalf("get of an absent key: %v", err)
	}
	if st.Contains(key) {
		t.Fatal("contains an absent key")
	}
	if hd, err := st.Put(ctx, blob); err != nil || hd.Key != key {
		t.Fatalf("put: %v, %v", hd.Key, err)
	}
	got, err := st.Get(ctx, key)
	if err != nil || !bytes.Equal(got.Bytes(), blob) || !got.Held() {
		t.Fatalf("get: %v (pinned %v, same bytes %v)", err, got.Held(), bytes.Equal(got.Bytes(), blob))
	}
	got.Release()
	if !st.Contains(key) {
		t.Fatal("does not contain a stored key")
	}
	// Other bytes under the same key: a conflict in both vocabularies.
	hd, err := chunk.ParseHeader(blob, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, otherBytes(t, blob)); !errors.Is(err, replication.ErrConflict) || !errors.Is(err, kvtier.ErrConflict) {
		t.Fatalf("put of other bytes: %v", err)
	}
	if err := st.DeleteIf(key, hd.Checksum+1); !errors.Is(err, replication.ErrConflict) {
		t.Fatalf("delete-if with another checksum: %v", err)
	}
	if !st.HasRoom(len(blob)) || st.HasRoom(4<<20) {
		t.Fatalf("room for %d bytes: %v; for 4 MiB: %v", len(blob), st.HasRoom(len(blob)), st.HasRoom(4<<20))
	}
	n := 0
	st.Scan(func(k chunk.Key, sum uint64, size int) bool {
		n++
		if k != key || sum != hd.Checksum || size != len(blob) {
			t.Errorf("scan: %v %x %d", k, sum, size)
		}
		return true
	})
	if n != 1 {
		t.Fatalf("scan saw %d entries", n)
	}
	if err := st.DeleteIf(key, hd.Checksum); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(key); !errors.Is(err, replication.ErrNotFound) {
		t.Fatalf("delete of an absent key: %v", err)
	}
}

// A Replicator over the adapter: a write lands in kvtier, a read lends its
// pinned bytes, a second version of the key keeps the one that Wins, and a
// delete makes the key absent.
func TestReplicatorOverKVTier(t *testing.T) {
	ctx := t.Context()
	s, err := kvtier.Open(kvtier.Config{DRAMBytes: 4 << 20, PageSize: 64 << 10,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rg := ring.New(1, []ring.Member{{ID: "a"}})
	r, err := replication.New(replication.Config{
		NodeID: "a", Store: replStore{s}, Transport: noPeers{}, Placement: replication.PlacementFunc(func() *ring.Ring { return rg }),
		DataDir: t.TempDir(), HintInterval: -1, RingCheckInterval: -1, AntiEntropyInterval: -1, ReadRepairChance: -1,
		CallTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Quorum: func() (int, int) { return 1, 1 },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		s.Close()
	})
	rng := rand.New(rand.NewPCG(5, 6))
	key, blob := testutil.Blob(t, rng, testutil.Spec(), testutil.Tokens(rng, 8), chunk.StandaloneContext())
	if res, err := r.Write(ctx, blob); err != nil || len(res.StoredOn) != 1 {
		t.Fatalf("write: %+v, %v", res, err)
	}
	if !s.Contains(key) {
		t.Fatal("write did not reach kvtier")
	}
	rr, err := r.Read(ctx, key)
	if err != nil || rr.From != "a" || !bytes.Equal(rr.Blob.Bytes(), blob) {
		t.Fatalf("read: from %q, %v", rr.From, err)
	}
	rr.Blob.Release()

	// A second version of the key is not an error: the one that Wins
	// stays in kvtier.
	other := otherBytes(t, blob)
	h1, _ := chunk.ParseHeader(blob, chunk.Limits{})
	h2, _ := chunk.ParseHeader(other, chunk.Limits{})
	if _, err := r.ServeReplicate(ctx, other, h2, replication.ReplicateOptions{Kind: replication.KindWrite}); err != nil {
		t.Fatalf("second version of a key: %v", err)
	}
	want := h1.Checksum
	if replication.Wins(h2.Checksum, h1.Checksum) {
		want = h2.Checksum
	}
	got, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if hd, _ := chunk.ParseHeader(got.Bytes(), chunk.Limits{}); hd.Checksum != want {
		t.Fatalf("kvtier keeps %016x, want the winner %016x", hd.Checksum, want)
	}
	got.Release()
	if _, err := r.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(context.WithoutCancel(ctx), key); !errors.Is(err, replication.ErrNotFound) {
		t.Fatalf("read after delete: %v", err)
	}
}

// otherBytes is blob's entry with other KV bytes under the same key.
func otherBytes(t *testing.T, blob []byte) []byte {
	t.Helper()
	e, err := chunk.Decode(blob, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	e.KV[0] ^= 1
	out, err := chunk.Encode(nil, e, chunk.CodecRaw)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noPeers is the Transport of a node alone in its ring: it is never
// called (a call would panic on the nil interface).
type noPeers struct{ replication.Transport }
