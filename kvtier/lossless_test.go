package kvtier

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// smoothBlob is a raw entry of the test model whose bf16 values look
// like activations (testutil.SmoothKV), which the lossless codec
// compresses.
func smoothBlob(t testing.TB, seed uint64, tokens int) []byte {
	rng := rand.New(rand.NewPCG(seed, 5))
	e := testutil.EntryOf(testSpec, testutil.Tokens(rng, tokens), testStandalone, testutil.SmoothKV(rng))
	return testutil.Encode(t, e, chunk.CodecRaw)
}

// TestDiskLossless: raw entries are stored on disk with the lossless codec
// when it shrinks them, and come back as the very bytes that were put,
// before and after a restart.
func TestDiskLossless(t *testing.T) {
	probe := smoothBlob(t, 1, 64)
	e, _ := chunk.Decode(probe, chunk.Limits{})
	enc, err := chunk.Encode(nil, e, chunk.CodecLossless)
	if err != nil || len(enc) >= len(probe) {
		t.Skipf("this build's lossless codec does not shrink the test entry (%v)", err)
	}
	ctx := t.Context()
	dir := t.TempDir()
	cfg := Config{DRAMBytes: 4096 * 4, DiskDir: dir, DiskBytes: 1 << 20, PageSize: 4096, Logger: slog.New(slog.DiscardHandler)}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var bs [][]byte
	for i := 0; i < 8; i++ {
		b := smoothBlob(t, uint64(i+1), 64) // 8 KiB + header: 3 pages
		bs = append(bs, b)
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Tiers[TierDisk].Entries == 0 || st.Tiers[TierDisk].Bytes >= st.Tiers[TierDisk].StoredBytes {
		t.Fatalf("disk holds %d entries in %d bytes for %d stored", st.Tiers[TierDisk].Entries, st.Tiers[TierDisk].Bytes, st.Tiers[TierDisk].StoredBytes)
	}
	t.Logf("disk: %d bytes for %d put (%.2fx)", st.Tiers[TierDisk].Bytes, st.Tiers[TierDisk].StoredBytes,
		float64(st.Tiers[TierDisk].StoredBytes)/float64(st.Tiers[TierDisk].Bytes))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, cfg)
	if got := s2.Stats().Tiers[TierDisk].Entries; got != st.Tiers[TierDisk].Entries {
		t.Fatalf("recovered %d of %d re-encoded entries", got, st.Tiers[TierDisk].Entries)
	}
	found := 0
	for _, b := range bs {
		h, err := s2.Get(ctx, keyOf(t, b))
		if err != nil {
			continue
		}
		if !bytes.Equal(h.Bytes(), b) {
			t.Fatal("re-encoded entry came back different")
		}
		h.Release()
		found++
	}
	if found != st.Tiers[TierDisk].Entries {
		t.Fatalf("read back %d of %d", found, st.Tiers[TierDisk].Entries)
	}
}
