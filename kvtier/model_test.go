package kvtier

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
)

// variant returns blob with the same key and other KV bytes.
func variant(t testing.TB, blob []byte) []byte {
	e, err := chunk.Decode(blob, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	e.KV[len(e.KV)/2] ^= 0x81
	b, err := chunk.Encode(nil, e, chunk.CodecRaw)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// corpus makes n entries of 1 to 4 pages (4 KiB), some sharing a content
// ID under other contexts, each with a conflicting variant.
func corpus(t testing.TB, n int) (bs, vs [][]byte) {
	for i := 0; i < n; i++ {
		ctx := testStandalone
		if i%3 == 1 {
			ctx = chunk.Context{Kind: chunk.ContextWindow, Window: uint32(8 * i), ID: chunk.ID{Lo: uint64(i)}}
		}
		b := makeBlob(t, testFP, uint64(i/3+1), 12+12*(i%4), ctx, 2)
		bs = append(bs, b)
		vs = append(vs, variant(t, b))
	}
	return bs, vs
}

type refEntry struct {
	blob    []byte
	expires time.Time // zero: never
}

// TestModel drives the store with random operations against a plain map.
// Without pressure the store must equal the map; under pressure it may
// lose entries (it is a cache) but must never serve wrong or deleted
// bytes, nor report a conflict that the map does not have.
func TestModel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		pressure bool
	}{
		{"roomy", Config{DRAMBytes: 1 << 20}, false},
		{"roomy-lru", Config{DRAMBytes: 1 << 20, Policy: PolicyLRU}, false},
		{"dram-only", Config{DRAMBytes: 16 * 4096}, true},
		{"dram+disk", Config{DRAMBytes: 8 * 4096, DiskBytes: 64 * 4096}, true},
		{"all-tiers", Config{DRAMBytes: 8 * 4096, DiskBytes: 32 * 4096, GPU: NewHostDevice(5 * 4096)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 1))
			now := time.Unix(1e6, 0)
			cfg := tc.cfg
			cfg.Now = func() time.Time { return now }
			if cfg.DiskBytes > 0 {
				cfg.DiskDir = t.TempDir()
			}
			s := openTest(t, cfg)
			ctx := t.Context()
			bs, vs := corpus(t, 24)
			ref := map[chunk.Key]refEntry{}
			live := func(k chunk.Key) (refEntry, bool) {
				r, ok := ref[k]
				if ok && !r.expires.IsZero() && !now.Before(r.expires) {
					delete(ref, k)
					return r, false
				}
				return r, ok
			}
			var loans []*Loan
			ops := 600
			if tc.cfg.DiskBytes > 0 {
				ops = 350 // every demotion fsyncs
			}
			for op := 0; op < ops; op++ {
				i := rng.IntN(len(bs))
				blob := bs[i]
				if rng.IntN(4) == 0 {
					blob = vs[i]
				}
				k := keyOf(t, blob)
				r, inRef := live(k)
				switch c := rng.IntN(10); {
				case c < 3: // put
					var ttl time.Duration
					if rng.IntN(4) == 0 {
						ttl = time.Duration(1+rng.IntN(5)) * time.Second
					}
					// Half the puts write the blob into lent pages first, as
					// a node receives a body, and keep up to two loans out.
					body := blob
					if rng.IntN(2) == 0 {
						if l, err := s.Lend(ctx, len(blob)); err == nil {
							copy(l.Bytes(), blob)
							body = l.Bytes()
							loans = append(loans, l)
						} else if !errors.Is(err, ErrNoSpace) {
							t.Fatalf("op %d: lend: %v", op, err)
						}
					}
					_, err := s.Put(ctx, body, PutOptions{TTL: ttl})
					for len(loans) > 2 {
						loans[0].Release()
						loans = loans[1:]
					}
					switch {
					case errors.Is(err, ErrConflict):
						if !inRef || bytes.Equal(r.blob, blob) {
							t.Fatalf("op %d: conflict the map does not have", op)
						}
					case err != nil:
						if !tc.pressure || !errors.Is(err, ErrNoSpace) {
							t.Fatalf("op %d: put: %v", op, err)
						}
					case inRef && !bytes.Equal(r.blob, blob) && !tc.pressure:
						t.Fatalf("op %d: conflicting put accepted", op)
					default:
						exp := time.Time{}
						if ttl > 0 {
							exp = now.Add(ttl)
						}
						if inRef && bytes.Equal(r.blob, blob) {
							// Same bytes: the TTL only grows, and none stays none.
							if r.expires.IsZero() || (!exp.IsZero() && exp.Before(r.expires)) {
								exp = r.expires
							}
							if ttl == 0 {
								exp = time.Time{}
							}
						}
						ref[k] = refEntry{blob: blob, expires: exp}
					}
				case c < 6: // get
					h, err := s.Get(ctx, k)
					switch {
					case err == nil:
						if !inRef || !bytes.Equal(h.Bytes(), r.blob) {
							t.Fatalf("op %d: get served bytes the map does not hold", op)
						}
						h.Release()
					case errors.Is(err, ErrNotFound):
						if inRef && !tc.pressure {
							t.Fatalf("op %d: lost %v", op, k)
						}
						if inRef {
							delete(ref, k) // evicted: forget, so later puts of other bytes are legal
						}
					default:
						t.Fatalf("op %d: get: %v", op, err)
					}
				case c < 7: // delete
					err := s.Delete(k)
					if err == nil && !inRef {
						t.Fatalf("op %d: deleted what the map lacks", op)
					}
					if errors.Is(err, ErrNotFound) && inRef && !tc.pressure {
						t.Fatalf("op %d: delete lost %v", op, k)
					}
					delete(ref, k)
				case c < 8: // best and contains
					_, m, _ := s.Best(k.Fingerprint, k.Content, k.Context)
					has := s.Contains(k)
					if has != (m == chunk.MatchExact) || (has && !inRef) || (!tc.pressure && has != inRef) {
						t.Fatalf("op %d: contains %v, best %v, map %v", op, has, m, inRef)
					}
				case c < 9: // device read
					if tc.cfg.GPU == nil {
						now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
						continue
					}
					h, err := s.GetDevice(ctx, k)
					if err == nil {
						got := make([]byte, h.Size)
						if err := tc.cfg.GPU.Read(h.Ptr, 0, got); err != nil || !inRef || !bytes.Equal(got, r.blob) {
							t.Fatalf("op %d: device holds bytes the map does not (%v)", op, err)
						}
						h.Release()
					} else if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrNoSpace) {
						t.Fatalf("op %d: get device: %v", op, err)
					} else if errors.Is(err, ErrNotFound) {
						delete(ref, k)
					}
				default: // scan against the map
					for k := range ref {
						live(k)
					}
					n := 0
					s.Scan(func(key chunk.Key, sum uint64, size int) bool {
						r, ok := live(key)
						if !ok || size != len(r.blob) {
							t.Fatalf("op %d: scan found %v not in the map", op, key)
						}
						n++
						return true
					})
					st := checkBudgets(t, s)
					if st.Entries != n || (!tc.pressure && n != len(ref)) {
						t.Fatalf("op %d: scan %d entries, stats %d, map %d", op, n, st.Entries, len(ref))
					}
				}
				checkCounts(t, s)
			}
			for _, l := range loans {
				l.Release()
			}
			st := checkBudgets(t, s)
			s.mu.Lock()
			if got := int64(s.arena.nused) * int64(s.arena.pageSize); got != st.Tiers[TierDRAM].Bytes {
				t.Errorf("arena holds %d bytes, DRAM tier charges %d", got, st.Tiers[TierDRAM].Bytes)
			}
			s.mu.Unlock()
			if st.Tiers[TierDRAM].PinnedBytes != 0 || st.Tiers[TierGPU].PinnedBytes != 0 {
				t.Errorf("pins leaked: %+v", st.Tiers)
			}
		})
	}
}

// TestConcurrentBudgets runs puts, gets, device reads, deletes and scans
// from several goroutines over small budgets and checks, while they run
// and after, that no budget is exceeded and no read returns wrong bytes.
func TestConcurrentBudgets(t *testing.T) {
	for _, m := range deviceMakers() {
		t.Run(m.name, func(t *testing.T) { testConcurrentBudgets(t, m.open(t, 6*4096)) })
	}
}

func testConcurrentBudgets(t *testing.T, dev testDevice) {
	s := openTest(t, Config{DRAMBytes: 12 * 4096, DiskDir: t.TempDir(), DiskBytes: 40 * 4096, GPU: dev})
	bs, _ := corpus(t, 30)
	want := map[chunk.Key][]byte{}
	for _, b := range bs {
		want[keyOf(t, b)] = b
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	// The monitor: budgets hold at every instant it looks.
	monitorDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		for ctx.Err() == nil {
			st := s.Stats()
			for _, ts := range st.Tiers {
				if ts.Bytes > ts.Budget {
					fail(errors.New("budget exceeded: " + ts.Tier.String()))
				}
			}
			if dev.Used() > dev.Capacity() {
				fail(errors.New("device over capacity"))
			}
			// The O(1) counts agree with the index at every instant.
			s.mu.Lock()
			entries, stored := s.walkStats()
			for tier := range s.tiers {
				if s.tiers[tier].entries != entries[tier] || s.tiers[tier].stored != stored[tier] {
					fail(errors.New("entry counts drifted in tier " + Tier(tier).String()))
				}
			}
			s.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 99))
			var held []pinned.Bytes
			for op := 0; op < 250; op++ {
				b := bs[rng.IntN(len(bs))]
				k := keyOf(t, b)
				switch c := rng.IntN(10); {
				case c < 4:
					if _, err := s.Put(ctx, b, PutOptions{}); err != nil && !errors.Is(err, ErrNoSpace) {
						fail(err)
					}
				case c < 7:
					h, err := s.Get(ctx, k)
					if err == nil {
						if !bytes.Equal(h.Bytes(), want[k]) {
							fail(errors.New("wrong bytes"))
						}
						held = append(held, h)
					} else if !errors.Is(err, ErrNotFound) {
						fail(err)
					}
				case c < 8:
					h, err := s.GetDevice(ctx, k)
					if err == nil {
						got := make([]byte, h.Size)
						if dev.Read(h.Ptr, 0, got) != nil || !bytes.Equal(got, want[k]) {
							fail(errors.New("wrong device bytes"))
						}
						h.Release()
					} else if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrNoSpace) {
						fail(err)
					}
				case c < 9:
					if err := s.Delete(k); err != nil && !errors.Is(err, ErrNotFound) {
						fail(err)
					}
				default:
					s.Scan(func(chunk.Key, uint64, int) bool { return rng.IntN(4) != 0 })
				}
				// Hold up to two pins at a time, so pressure meets pins.
				for len(held) > 2 {
					held[0].Release()
					held = held[1:]
				}
			}
			for _, h := range held {
				h.Release()
			}
		}(g)
	}
	wg.Wait()
	cancel()
	<-monitorDone
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := checkBudgets(t, s)
	if st.Tiers[TierDRAM].PinnedBytes != 0 || st.Tiers[TierGPU].PinnedBytes != 0 {
		t.Fatalf("pins leaked: %+v", st.Tiers)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if got := int64(s.arena.nused) * int64(s.arena.pageSize); got != st.Tiers[TierDRAM].Bytes {
		t.Fatalf("arena holds %d bytes, DRAM tier charges %d", got, st.Tiers[TierDRAM].Bytes)
	}
	// A slab device rounds allocations up; the tier charges entry sizes.
	if used, charged := dev.Used(), st.Tiers[TierGPU].Bytes; used < charged || used > charged+int64(st.Tiers[TierGPU].Entries)*255 {
		t.Fatalf("device holds %d bytes, GPU tier charges %d for %d entries", used, charged, st.Tiers[TierGPU].Entries)
	}
	for _, e := range s.index {
		if e.busy || e.loading || e.pol == nil {
			t.Fatalf("entry %v left busy=%v loading=%v policy=%v", e.key, e.busy, e.loading, e.pol != nil)
		}
	}
}
