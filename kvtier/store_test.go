package kvtier

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

func TestPutGetDeleteDRAM(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 1 << 20})
	blob := makeBlob(t, testFP, 1, 40, chunk.StandaloneContext(), 2) // ~5 KiB: two pages
	for _, at := range []int{len(blob) - 1, len(blob) / 2, 300} {
		bad := bytes.Clone(blob)
		bad[at] ^= 1 // the header still parses; a layer checksum fails
		if _, err := s.Put(ctx, bad, PutOptions{}); !errors.Is(err, chunk.ErrCorrupt) {
			t.Fatalf("corrupt blob (byte %d): %v", at, err)
		}
		if st := s.Stats(); s.Contains(keyOf(t, blob)) || st.Tiers[TierDRAM].Bytes != 0 {
			t.Fatalf("corrupt blob stored: %+v", st.Tiers[TierDRAM])
		}
	}
	hd, err := s.Put(ctx, blob, PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, tier, err := s.get(ctx, hd.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Bytes(), blob) || tier != TierDRAM || !h.Held() {
		t.Fatal("get returned other bytes")
	}
	h.Release()
	h.Release() // idempotent
	if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
		t.Fatalf("idempotent put: %v", err)
	}
	if !s.Contains(hd.Key) {
		t.Fatal("contains = false")
	}
	if err := s.Delete(hd.Key); err != nil {
		t.Fatal(err)
	}
	if s.Contains(hd.Key) {
		t.Fatal("contains after delete")
	}
	if _, err := s.Get(ctx, hd.Key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if err := s.Delete(hd.Key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	st := checkBudgets(t, s)
	if st.Tiers[TierDRAM].Bytes != 0 || st.Entries != 0 {
		t.Fatalf("stats after delete: %+v", st.Tiers[TierDRAM])
	}
}

func TestConflict(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 1 << 20})
	a := makeBlob(t, testFP, 1, 16, chunk.StandaloneContext(), 2)
	// Same tokens and context (so the same key), other KV bytes.
	b := makeBlob(t, testFP, 1, 16, chunk.StandaloneContext(), 2)
	e, _ := chunk.Decode(b, chunk.Limits{})
	e.KV[0] ^= 0xff
	b, _ = chunk.Encode(nil, e, chunk.CodecRaw)
	if keyOf(t, a) != keyOf(t, b) {
		t.Fatal("test setup: keys differ")
	}
	if _, err := s.Put(ctx, a, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, b, PutOptions{}); !errors.Is(err, ErrConflict) {
		t.Fatalf("put of other bytes: %v, want ErrConflict", err)
	}
	h, err := s.Get(ctx, keyOf(t, a))
	if err != nil || !bytes.Equal(h.Bytes(), a) {
		t.Fatal("conflicting put overwrote the entry")
	}
	h.Release()
}

func TestBest(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 1 << 20})
	fp2 := chunk.ModelSpec{Family: "qwen2", Layers: 2, KVHeads: 2, HeadDim: 16, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 1e6}.Fingerprint()
	prefix := chunk.PrefixContext(chunk.ID{Lo: 1, Hi: 2})
	otherPrefix := chunk.PrefixContext(chunk.ID{Lo: 3, Hi: 4})
	win8 := chunk.Context{Kind: chunk.ContextWindow, Window: 8, ID: chunk.ID{Lo: 5}}
	win32 := chunk.Context{Kind: chunk.ContextWindow, Window: 32, ID: chunk.ID{Lo: 6}}
	content := keyOf(t, makeBlob(t, testFP, 7, 16, chunk.StandaloneContext(), 2)).Content
	put := func(fp chunk.Fingerprint, c chunk.Context) {
		t.Helper()
		if _, err := s.Put(ctx, makeBlob(t, fp, 7, 16, c, 2), PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name  string
		put   func()
		want  chunk.Context
		match chunk.Match
		got   chunk.Context
	}{
		{"empty", func() {}, prefix, chunk.MatchMiss, chunk.Context{}},
		{"other fingerprint does not shadow", func() { put(fp2, prefix) }, prefix, chunk.MatchMiss, chunk.Context{}},
		{"standalone only", func() { put(testFP, chunk.StandaloneContext()) }, prefix, chunk.MatchApproximate, chunk.StandaloneContext()},
		{"window beats standalone", func() { put(testFP, win8) }, prefix, chunk.MatchApproximate, win8},
		{"wider window", func() { put(testFP, win32) }, prefix, chunk.MatchApproximate, win32},
		{"other prefix beats windows", func() { put(testFP, otherPrefix) }, prefix, chunk.MatchApproximate, otherPrefix},
		{"exact", func() { put(testFP, prefix) }, prefix, chunk.MatchExact, prefix},
		{"exact standalone", func() {}, chunk.StandaloneContext(), chunk.MatchExact, chunk.StandaloneContext()},
	}
	for _, st := range steps {
		st.put()
		k, m, err := s.Best(testFP, content, st.want)
		if err != nil || m != st.match || (m != chunk.MatchMiss && (k.Context != st.got || k.Fingerprint != testFP || k.Content != content)) {
			t.Fatalf("%s: Best = %v %v %v, want %v %v", st.name, k, m, err, st.match, st.got)
		}
	}
}

func TestTTL(t *testing.T) {
	ctx := t.Context()
	now := time.Unix(1000, 0)
	s := openTest(t, Config{DRAMBytes: 1 << 20, Now: func() time.Time { return now }})
	blob := makeBlob(t, testFP, 1, 16, chunk.StandaloneContext(), 2)
	k := keyOf(t, blob)
	if _, err := s.Put(ctx, blob, PutOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(59 * time.Second)
	if !s.Contains(k) {
		t.Fatal("expired early")
	}
	now = now.Add(2 * time.Second)
	if s.Contains(k) {
		t.Fatal("not expired")
	}
	if st := s.Stats(); st.Tiers[TierDRAM].Bytes != 0 {
		t.Fatalf("expired entry still charged: %d", st.Tiers[TierDRAM].Bytes)
	}
}

func TestCloseAndCancel(t *testing.T) {
	s, err := Open(Config{DRAMBytes: 4 * 4096, PageSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	bs := blobs(t, 5, 12)
	for _, b := range bs[:4] {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A full tier and a cancelled context: the put gives up, storing nothing.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Put(cctx, bs[4], PutOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("put with a cancelled context: %v", err)
	}
	if s.Contains(keyOf(t, bs[4])) {
		t.Fatal("cancelled put stored")
	}
	h := mustGet(t, s, bs[0])
	if err := s.Close(); err == nil {
		t.Fatal("close with a pinned handle succeeded")
	}
	if _, err := s.Get(ctx, keyOf(t, bs[1])); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
	if !bytes.Equal(h.Bytes(), bs[0]) {
		t.Fatal("pinned bytes changed at close")
	}
	h.Release()
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if !s.freed {
		t.Fatal("arena kept after the last handle was released and Close called again")
	}
}

// DeleteIf drops the key only while it holds the bytes the caller names:
// other bytes and an absent key are refused and leave the store as it is.
func TestDeleteIf(t *testing.T) {
	ctx := t.Context()
	blob := makeBlob(t, testFP, 1, 16, chunk.StandaloneContext(), 2)
	hd, err := chunk.ParseHeader(blob, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		stored bool
		sum    uint64
		want   error
		kept   bool
	}{
		{"same bytes", true, hd.Checksum, nil, false},
		{"other bytes", true, hd.Checksum ^ 1, ErrConflict, true},
		{"absent", false, hd.Checksum, ErrNotFound, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openTest(t, Config{DRAMBytes: 1 << 20})
			if tc.stored {
				if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.DeleteIf(hd.Key, tc.sum); !errors.Is(err, tc.want) {
				t.Fatalf("DeleteIf: %v, want %v", err, tc.want)
			}
			if got := s.Contains(hd.Key); got != tc.kept {
				t.Fatalf("contains %v after DeleteIf, want %v", got, tc.kept)
			}
			if st := checkBudgets(t, s); !tc.kept && (st.Entries != 0 || st.Tiers[TierDRAM].Bytes != 0) {
				t.Fatalf("stats after DeleteIf: %+v", st.Tiers[TierDRAM])
			}
		})
	}
}
