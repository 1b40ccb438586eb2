package kvtier

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// lendCopy lends len(blob) bytes and writes blob into them, as a body
// received off the network.
func lendCopy(t testing.TB, s *Store, blob []byte) *Loan {
	t.Helper()
	l, err := s.Lend(t.Context(), len(blob))
	if err != nil {
		t.Fatal(err)
	}
	copy(l.Bytes(), blob)
	return l
}

// dramState is what the DRAM tier charges and pins, and how many puts
// adopted lent pages.
type dramState struct {
	bytes, pinned, lent int64
	adopted             uint64
}

func dramOf(t testing.TB, s *Store) dramState {
	t.Helper()
	d := checkBudgets(t, s).Tiers[TierDRAM]
	s.mu.Lock()
	nused := s.arena.nused
	s.mu.Unlock()
	if got := int64(nused) * int64(s.arena.pageSize); got != d.Bytes {
		t.Fatalf("arena holds %d bytes, DRAM tier charges %d", got, d.Bytes)
	}
	return dramState{bytes: d.Bytes, pinned: d.PinnedBytes, lent: d.LentBytes, adopted: d.AdoptedPuts}
}

// wantEmpty fails unless the DRAM tier holds and pins nothing.
func wantEmpty(t testing.TB, s *Store) {
	t.Helper()
	if d := dramOf(t, s); d.bytes != 0 || d.pinned != 0 || d.lent != 0 {
		t.Fatalf("DRAM tier not empty: %+v", d)
	}
}

func wantGet(t testing.TB, s *Store, blob []byte) []byte {
	t.Helper()
	h, err := s.Get(t.Context(), keyOf(t, blob))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if !bytes.Equal(h.Bytes(), blob) {
		t.Fatal("get served other bytes than were put")
	}
	return h.Bytes()
}

// A put of lent bytes makes the loan's pages the entry: Get serves the very
// pages the body was written into, and releasing the loan leaves the entry.
func TestLendAdopt(t *testing.T) {
	for _, pageSize := range []int{4096, 64 << 10} {
		s := openTest(t, Config{DRAMBytes: 4 << 20, PageSize: pageSize})
		blob := makeBlob(t, testFP, 1, 200, testStandalone, 2)
		l := lendCopy(t, s, blob)
		if d := dramOf(t, s); d.lent != d.bytes || d.pinned != int64(len(blob)) {
			t.Fatalf("lent pages not charged and pinned: %+v", d)
		}
		if _, err := s.Put(t.Context(), l.Bytes(), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if d := dramOf(t, s); d.adopted != 1 || d.bytes != d.lent {
			t.Fatalf("put did not adopt the loan: %+v", d)
		}
		if got := wantGet(t, s, blob); &got[0] != &l.Bytes()[0] {
			t.Fatal("the entry is a copy, not the lent pages")
		}
		// Putting the same bytes again is the usual no-op.
		if _, err := s.Put(t.Context(), l.Bytes(), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		l.Release()
		l.Release() // a second release does nothing
		d := dramOf(t, s)
		if d.adopted != 1 || d.lent != 0 || d.pinned != 0 || d.bytes == 0 {
			t.Fatalf("after release: %+v", d)
		}
		wantGet(t, s, blob)
		if err := s.Delete(keyOf(t, blob)); err != nil {
			t.Fatal(err)
		}
		wantEmpty(t, s)
	}
}

// A body that fails mid-receive, or is never put, gives its pages back.
func TestLendReleaseUnput(t *testing.T) {
	s := openTest(t, Config{DRAMBytes: 1 << 20})
	blob := makeBlob(t, testFP, 1, 64, testStandalone, 2)
	l, err := s.Lend(t.Context(), len(blob))
	if err != nil {
		t.Fatal(err)
	}
	copy(l.Bytes(), blob[:len(blob)/2]) // the stream broke here
	l.Release()
	wantEmpty(t, s)
	if s.Contains(keyOf(t, blob)) {
		t.Fatal("an unput loan became an entry")
	}
}

// Deleting or evicting an entry whose pages are still lent hides it at
// once and frees its pages only when the loan is released; the borrower
// reads its bytes until then.
func TestLendDeleteWhileLent(t *testing.T) {
	for _, how := range []string{"delete", "deleteif", "evict"} {
		t.Run(how, func(t *testing.T) {
			s := openTest(t, Config{DRAMBytes: 16 * 4096})
			blob := makeBlob(t, testFP, 1, 40, testStandalone, 2) // 3 pages
			l := lendCopy(t, s, blob)
			if _, err := s.Put(t.Context(), l.Bytes(), PutOptions{}); err != nil {
				t.Fatal(err)
			}
			k := keyOf(t, blob)
			h, err := s.Get(t.Context(), k) // a reader's pin outlives the loan
			if err != nil {
				t.Fatal(err)
			}
			switch how {
			case "delete":
				err = s.Delete(k)
			case "deleteif":
				hd, _ := chunk.ParseHeader(blob, chunk.Limits{})
				err = s.DeleteIf(k, hd.Checksum)
			case "evict":
				// A lent entry is pinned: filling the tier evicts others.
				for i := uint64(2); i < 12; i++ {
					if _, err := s.Put(t.Context(), makeBlob(t, testFP, i, 40, testStandalone, 2), PutOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				if !s.Contains(k) {
					t.Fatal("a lent entry was evicted")
				}
				err = s.Delete(k)
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Contains(k) {
				t.Fatal("deleted entry still found")
			}
			before := dramOf(t, s)
			if !bytes.Equal(l.Bytes(), blob) || !bytes.Equal(h.Bytes(), blob) {
				t.Fatal("lent bytes changed after delete")
			}
			l.Release()
			if !bytes.Equal(h.Bytes(), blob) {
				t.Fatal("pinned bytes changed after the loan's release")
			}
			if d := dramOf(t, s); d.bytes != before.bytes {
				t.Fatalf("pages freed while a Get still pins them: %+v, before %+v", d, before)
			}
			h.Release()
			if d := dramOf(t, s); d.bytes != before.bytes-3*4096 || d.pinned != 0 {
				t.Fatalf("pages not freed at the last release: %+v, before %+v", d, before)
			}
		})
	}
}

// Puts that store nothing new leave the loan as it was: a conflict, a
// no-op (the bytes already stored by a copy), an admission refusal and a
// corrupt body; the loan's release then frees its pages.
func TestLendPutStoresNothing(t *testing.T) {
	ctx := t.Context()
	blob := makeBlob(t, testFP, 1, 64, testStandalone, 2)
	for _, tc := range []struct {
		name    string
		cfg     Config
		setup   func(*Store)
		body    func([]byte) []byte
		wantErr error
	}{
		{name: "conflict", setup: func(s *Store) {
			if _, err := s.Put(ctx, variant(t, blob), PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}, wantErr: ErrConflict},
		{name: "no-op", setup: func(s *Store) {
			if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "refused", cfg: Config{Admission: AdmitReuse}, setup: func(s *Store) {
			// A content's first prefix-chained encoding is kept; another
			// prefix chain's is refused on its first put.
			b := makeBlob(t, testFP, 7, 64, chunk.PrefixContext(chunk.ID{Lo: 1}), 2)
			if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}, body: func([]byte) []byte {
			return makeBlob(t, testFP, 7, 64, chunk.PrefixContext(chunk.ID{Lo: 2}), 2)
		}},
		{name: "corrupt", body: func(b []byte) []byte {
			c := bytes.Clone(b)
			c[len(c)-1] ^= 1
			return c
		}, wantErr: chunk.ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.DRAMBytes = 1 << 20
			s := openTest(t, cfg)
			if tc.setup != nil {
				tc.setup(s)
			}
			body := blob
			if tc.body != nil {
				body = tc.body(blob)
			}
			before := dramOf(t, s)
			entries := s.Stats().Entries
			l := lendCopy(t, s, body)
			_, err := s.Put(ctx, l.Bytes(), PutOptions{})
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) || tc.wantErr == nil && err != nil {
				t.Fatalf("put: %v, want %v", err, tc.wantErr)
			}
			if d := dramOf(t, s); d.adopted != 0 || s.Stats().Entries != entries {
				t.Fatalf("a put that stores nothing took the loan: %+v", d)
			}
			if !bytes.Equal(l.Bytes(), body) {
				t.Fatal("lent bytes changed")
			}
			l.Release()
			if d := dramOf(t, s); d != before {
				t.Fatalf("after release %+v, before the loan %+v", d, before)
			}
		})
	}
}

// A caller that deletes what it put and puts the same lent bytes again
// (as replication does to keep the winning version of a key) gets the
// pages adopted again, not shared by two entries.
func TestLendPutAgainAfterDelete(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 1 << 20})
	blob := makeBlob(t, testFP, 1, 64, testStandalone, 2)
	hd, _ := chunk.ParseHeader(blob, chunk.Limits{})
	l := lendCopy(t, s, blob)
	for range 3 {
		if _, err := s.Put(ctx, l.Bytes(), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		wantGet(t, s, blob)
		if err := s.DeleteIf(hd.Key, hd.Checksum); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Put(ctx, l.Bytes(), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := dramOf(t, s); d.adopted != 4 || d.bytes != d.lent {
		t.Fatalf("%+v", d)
	}
	l.Release()
	wantGet(t, s, blob)
	if err := s.Delete(hd.Key); err != nil {
		t.Fatal(err)
	}
	wantEmpty(t, s)
}

// A put of a part of a loan, or of a copy of its bytes, copies as usual.
func TestLendOtherSlicesCopy(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 1 << 20})
	blob := makeBlob(t, testFP, 1, 64, testStandalone, 2)
	l, err := s.Lend(ctx, len(blob)+100)
	if err != nil {
		t.Fatal(err)
	}
	copy(l.Bytes(), blob)
	if _, err := s.Put(ctx, l.Bytes()[:len(blob)], PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := dramOf(t, s); d.adopted != 0 {
		t.Fatalf("a part of a loan was adopted: %+v", d)
	}
	l.Release()
	wantGet(t, s, blob)
	if err := s.Delete(keyOf(t, blob)); err != nil {
		t.Fatal(err)
	}
	wantEmpty(t, s)
}

// Lend refuses (ErrNoSpace) beyond the lending cap, beyond the tier, and
// when DRAM holds only pinned pages; the caller then uses its own buffer.
func TestLendRefusals(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 16 * 4096, LendBytes: 8 * 4096})
	if _, err := s.Lend(ctx, 17*4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("lend over the tier: %v", err)
	}
	if _, err := s.Lend(ctx, 0); err == nil {
		t.Fatal("lend of nothing succeeded")
	}
	a, err := s.Lend(ctx, 5*4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lend(ctx, 4*4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("lend over the cap: %v", err)
	}
	b, err := s.Lend(ctx, 3*4096)
	if err != nil {
		t.Fatal(err)
	}
	// Fill the rest of the tier with pinned entries.
	var held []func()
	for i := uint64(1); dramOf(t, s).bytes < 16*4096; i++ {
		k := keyOf(t, makeBlob(t, testFP, i, 12, testStandalone, 2))
		if _, err := s.Put(ctx, makeBlob(t, testFP, i, 12, testStandalone, 2), PutOptions{}); err != nil {
			t.Fatal(err)
		}
		h, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h.Release)
	}
	a.Release()
	for _, r := range held {
		r()
	}
	c, err := s.Lend(ctx, 5*4096)
	if err != nil {
		t.Fatalf("lend that evicts unpinned entries: %v", err)
	}
	b.Release()
	c.Release()
	s2 := openTest(t, Config{DRAMBytes: 16 * 4096, LendBytes: -1})
	if _, err := s2.Lend(ctx, 4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("lend with lending off: %v", err)
	}
	wantEmpty(t, s2)
}

// Loans of a closed store: Lend and Put fail, Release still frees, and
// Close succeeds once the loans are back.
func TestLendClose(t *testing.T) {
	s, err := Open(Config{DRAMBytes: 1 << 20, PageSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	blob := makeBlob(t, testFP, 1, 64, testStandalone, 2)
	l := lendCopy(t, s, blob)
	if err := s.Close(); err == nil {
		t.Fatal("close with a loan out freed its pages")
	}
	if _, err := s.Lend(t.Context(), 4096); !errors.Is(err, ErrClosed) {
		t.Fatalf("lend after close: %v", err)
	}
	if _, err := s.Put(t.Context(), l.Bytes(), PutOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("put after close: %v", err)
	}
	if !bytes.Equal(l.Bytes(), blob) {
		t.Fatal("lent bytes changed at close")
	}
	l.Release()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// Goroutines lend, put (sometimes the same loan twice), get, delete and
// release at random over a small tier; every read is right, and once all
// is released and deleted the tier is empty (run with -race).
func TestLendConcurrent(t *testing.T) {
	s := openTest(t, Config{DRAMBytes: 24 * 4096, LendBytes: 12 * 4096})
	bs, _ := corpus(t, 16)
	keys := make([]chunk.Key, len(bs))
	for i, b := range bs {
		keys[i] = keyOf(t, b)
	}
	ctx := t.Context()
	type loan struct {
		l    *Loan
		want []byte
	}
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var loans []loan
			for range 300 {
				i := rng.IntN(len(bs))
				b, k := bs[i], keys[i]
				switch c := rng.IntN(10); {
				case c < 4:
					l, err := s.Lend(ctx, len(b))
					if errors.Is(err, ErrNoSpace) {
						break
					}
					if err != nil {
						fail(err)
						return
					}
					copy(l.Bytes(), b)
					for range 1 + rng.IntN(2) {
						if _, err := s.Put(ctx, l.Bytes(), PutOptions{}); err != nil && !errors.Is(err, ErrNoSpace) {
							fail(err)
						}
					}
					loans = append(loans, loan{l, b})
				case c < 7:
					h, err := s.Get(ctx, k)
					if err == nil {
						if !bytes.Equal(h.Bytes(), b) {
							fail(errors.New("wrong bytes"))
						}
						h.Release()
					} else if !errors.Is(err, ErrNotFound) {
						fail(err)
					}
				default:
					if err := s.Delete(k); err != nil && !errors.Is(err, ErrNotFound) {
						fail(err)
					}
				}
				for _, l := range loans {
					if !bytes.Equal(l.l.Bytes(), l.want) {
						fail(errors.New("lent bytes changed"))
					}
				}
				for len(loans) > 1 {
					loans[0].l.Release()
					loans = loans[1:]
				}
			}
			for _, l := range loans {
				l.l.Release()
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for _, k := range keys {
		_ = s.Delete(k)
	}
	wantEmpty(t, s)
	if d := dramOf(t, s); d.adopted == 0 {
		t.Fatal("no put adopted a loan")
	}
}
