package kvtier

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
)

// TestConcurrentHits races the read-locked hit path (Get, Release,
// Contains, Best, Stats) against a writer that evicts, deletes and re-puts
// the same keys, for both policies (S3-FIFO hits take the shared lock, LRU
// hits the exclusive one). Every read must return the bytes that were put,
// and at the end no pin, page or count may be left over.
func TestConcurrentHits(t *testing.T) {
	for _, p := range []Policy{PolicyS3FIFO, PolicyLRU} {
		t.Run(p.String(), func(t *testing.T) {
			s := openTest(t, Config{DRAMBytes: 10 * 4096, Policy: p})
			bs, _ := corpus(t, 16)
			want := map[chunk.Key][]byte{}
			for _, b := range bs {
				want[keyOf(t, b)] = b
			}
			ctx := t.Context()
			ops := 2000
			if raceEnabled {
				ops = 600
			}
			errc := make(chan error, 8)
			fail := func(err error) {
				select {
				case errc <- err:
				default:
				}
			}
			for _, b := range bs[:4] {
				if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			var gets atomic.Uint64
			var wg sync.WaitGroup
			for g := 0; g < 3; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 5))
					var held []pinned.Bytes
					for op := 0; op < ops; op++ {
						b := bs[rng.IntN(4)] // a hot set the writer keeps disturbing
						k := keyOf(t, b)
						switch rng.IntN(8) {
						case 0:
							_ = s.Contains(k)
							if _, m, err := s.Best(k.Fingerprint, k.Content, k.Context); err != nil || m == chunk.MatchApproximate {
								fail(fmt.Errorf("best: %v, %v", m, err))
							}
						case 1:
							st := s.Stats()
							if st.Tiers[TierDRAM].Bytes > st.Tiers[TierDRAM].Budget {
								fail(errors.New("DRAM over budget"))
							}
						default:
							h, err := s.Get(ctx, k)
							gets.Add(1)
							if errors.Is(err, ErrNotFound) {
								continue
							}
							if err != nil {
								fail(err)
								continue
							}
							if !bytes.Equal(h.Bytes(), want[k]) {
								fail(errors.New("wrong bytes"))
							}
							held = append(held, h)
							if len(held) > 1 {
								held[0].Release()
								held[0].Release() // a second Release does nothing
								held = held[1:]
							}
						}
					}
					for _, h := range held {
						h.Release()
					}
				}(g)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(9, 9))
				for op := 0; op < ops/2; op++ {
					b := bs[rng.IntN(len(bs))]
					if rng.IntN(3) == 0 {
						if err := s.Delete(keyOf(t, b)); err != nil && !errors.Is(err, ErrNotFound) {
							fail(err)
						}
						continue
					}
					if _, err := s.Put(ctx, b, PutOptions{}); err != nil && !errors.Is(err, ErrNoSpace) {
						fail(err)
					}
				}
			}()
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			st := checkBudgets(t, s)
			if st.Tiers[TierDRAM].PinnedBytes != 0 {
				t.Fatalf("%d bytes still pinned", st.Tiers[TierDRAM].PinnedBytes)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if got := int64(s.arena.nused) * int64(s.arena.pageSize); got != st.Tiers[TierDRAM].Bytes {
				t.Fatalf("arena holds %d bytes, DRAM tier charges %d", got, st.Tiers[TierDRAM].Bytes)
			}
			// Without GPU and disk tiers a Get is a DRAM hit or a DRAM miss.
			if d := st.Tiers[TierDRAM]; d.Hits+d.Misses != gets.Load() {
				t.Fatalf("%d hits and %d misses counted for %d gets", d.Hits, d.Misses, gets.Load())
			}
		})
	}
}
