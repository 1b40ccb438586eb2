package kvtier

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
)

var benchSizes = []struct {
	name   string
	tokens int // of the 128 KiB-per-token model
}{{"256KiB", 2}, {"1MiB", 8}, {"4MiB", 32}, {"32MiB", 256}}

// runWorkers runs fn b.N times over g goroutines.
func runWorkers(b *testing.B, g int, fn func(w, i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				fn(w, int(i))
			}
		}(w)
	}
	wg.Wait()
}

// BenchmarkPut puts distinct entries into a full DRAM tier (each put
// verifies the blob's checksums, evicts, copies it into the arena).
// BenchmarkPut/verify=false skips the checksum pass.
func BenchmarkPut(b *testing.B) {
	for _, sz := range benchSizes {
		for _, g := range []int{1, 2} {
			b.Run(fmt.Sprintf("size=%s/g=%d", sz.name, g), func(b *testing.B) {
				s := openTest(b, Config{DRAMBytes: 256 << 20, PageSize: 64 << 10})
				bufs := make([][]byte, g)
				for w := range bufs {
					bufs[w] = bigBlob(b, sz.tokens)
				}
				b.SetBytes(int64(len(bufs[0])))
				ctx := b.Context()
				// Fill the tier first: a node runs full, putting into
				// pages that evictions free (already faulted in).
				base := uint64(1 << 40)
				for filled := 0; filled < 256<<20; filled += len(bufs[0]) {
					base++
					rekey(b, bufs[0], base)
					if _, err := s.Put(ctx, bufs[0], PutOptions{}); err != nil {
						b.Fatal(err)
					}
				}
				runWorkers(b, g, func(w, i int) {
					// One buffer per worker: rekeying it is cheap (header only).
					rekey(b, bufs[w], uint64(i+1))
					if _, err := s.Put(ctx, bufs[w], PutOptions{}); err != nil {
						b.Error(err)
					}
				})
			})
		}
	}
}

// mutexWait is the total time goroutines have spent blocked on sync
// mutexes, in nanoseconds.
func mutexWait() float64 {
	s := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return s[0].Value.Float64() * 1e9
}

// BenchmarkGet reads resident entries: a zero-copy pin and release
// (Get), and the same with the bytes copied out, as a send that cannot
// hand the view through would (GetCopy). It reports the time goroutines
// spent blocked on the Store's lock per operation (mutex-wait-ns/op): on
// a loaded machine that, not ns/op, shows whether Gets serialize.
func BenchmarkGet(b *testing.B) {
	for _, mode := range []string{"Get", "GetCopy"} {
		for _, sz := range benchSizes {
			for _, g := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/size=%s/g=%d", mode, sz.name, g), func(b *testing.B) {
					s := openTest(b, Config{DRAMBytes: 256 << 20, PageSize: 64 << 10})
					blob := bigBlob(b, sz.tokens)
					n := min(64, int((200<<20)/len(blob)))
					keys := make([]any, n)
					ctx := b.Context()
					for i := range keys {
						k := rekey(b, blob, uint64(i+1))
						keys[i] = k
						if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
							b.Fatal(err)
						}
					}
					outs := make([][]byte, g)
					for w := range outs {
						outs[w] = make([]byte, len(blob))
					}
					b.SetBytes(int64(len(blob)))
					waited := mutexWait()
					runWorkers(b, g, func(w, i int) {
						h, err := s.Get(ctx, keysAt(keys, i))
						if err != nil {
							b.Error(err)
							return
						}
						if mode == "GetCopy" {
							copy(outs[w], h.Bytes())
						}
						h.Release()
					})
					b.ReportMetric((mutexWait()-waited)/float64(b.N), "mutex-wait-ns/op")
				})
			}
		}
	}
}

// BenchmarkPolicy measures the cost of one cache access in the policy
// alone (the store's own per-operation overhead on top of it).
func BenchmarkPolicy(b *testing.B) {
	for _, p := range []Policy{PolicyS3FIFO, PolicyLRU} {
		b.Run(p.String(), func(b *testing.B) {
			tr := zipfTrace(20000, 1.0, 1<<20, 1)
			sim := newSim(p, tr.capacity)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := tr.reqs[i%len(tr.reqs)]
				sim.access(r, tr.cost[r])
			}
		})
	}
}

type trace struct {
	reqs     []uint64
	cost     []int64
	capacity int64
}

// zipfTrace draws n requests over objects ranked by a Zipf(alpha) law,
// with sizes independent of rank: chunks of 16 to 2048 tokens (log-uniform)
// of the 128 KiB-per-token model, charged in whole 64 KiB pages. The
// capacity is a quarter of the corpus.
func zipfTrace(objects int, alpha float64, n int, seed uint64) trace {
	rng := rand.New(rand.NewPCG(seed, 42))
	cdf := make([]float64, objects)
	sum := 0.0
	for i := range cdf {
		sum += 1 / math.Pow(float64(i+1), alpha)
		cdf[i] = sum
	}
	tr := trace{reqs: make([]uint64, n), cost: make([]int64, objects)}
	var total int64
	for i := range tr.cost {
		tokens := int(math.Round(16 * math.Pow(128, rng.Float64())))
		bytes := int64(tokens)*128<<10 + 2048 // header of 32 layers and the tokens, roughly
		tr.cost[i] = (bytes + 64<<10 - 1) / (64 << 10) * (64 << 10)
		total += tr.cost[i]
	}
	perm := rng.Perm(objects) // rank -> object
	for i := range tr.reqs {
		r := sort.SearchFloat64s(cdf, rng.Float64()*sum)
		tr.reqs[i] = uint64(perm[min(r, objects-1)])
	}
	tr.capacity = total / 4
	return tr
}

type ratios struct{ hit, byteHit float64 }

func replay(p Policy, tr trace) ratios {
	sim := newSim(p, tr.capacity)
	warm := len(tr.reqs) / 5 // count after the cache has filled
	for i, r := range tr.reqs {
		if i == warm {
			sim.hits, sim.misses, sim.hitBytes, sim.allBytes = 0, 0, 0, 0
		}
		sim.access(r, tr.cost[r])
	}
	return ratios{float64(sim.hits) / float64(sim.hits+sim.misses), float64(sim.hitBytes) / float64(sim.allBytes)}
}

// TestHitRatio replays Zipf traces over a corpus four times the budget
// through S3-FIFO and plain LRU, the policies exactly as the tiers run
// them, and requires S3-FIFO to beat LRU on every one.
func TestHitRatio(t *testing.T) {
	requests := 1 << 20
	if testing.Short() || raceEnabled {
		requests = 1 << 17
	}
	t.Logf("%-6s %-14s %-14s %-14s %-14s", "alpha", "s3fifo hit", "lru hit", "s3fifo bytes", "lru bytes")
	for _, alpha := range []float64{0.9, 1.0, 1.1, 1.2} {
		tr := zipfTrace(20000, alpha, requests, uint64(alpha*10))
		s3 := replay(PolicyS3FIFO, tr)
		lr := replay(PolicyLRU, tr)
		t.Logf("%-6.1f %-14.4f %-14.4f %-14.4f %-14.4f", alpha, s3.hit, lr.hit, s3.byteHit, lr.byteHit)
		if s3.hit <= lr.hit {
			t.Errorf("alpha %.1f: S3-FIFO hit ratio %.4f does not beat LRU's %.4f", alpha, s3.hit, lr.hit)
		}
	}
}

// TestWaste measures DRAM page waste (allocated minus stored, over
// allocated) on chunks of 16 to 2048 tokens of the 128 KiB-per-token model,
// from the exact blob sizes chunk.Encode produces.
func TestWaste(t *testing.T) {
	headerBytes := func(tokens int) int { return 88 + 24*32 + 4*tokens + 8 }
	for _, ps := range []int{16 << 10, 32 << 10, 64 << 10, 128 << 10} {
		var alloc, used, worst float64
		for tokens := 16; tokens <= 2048; tokens++ {
			size := tokens*128<<10 + headerBytes(tokens)
			a := float64((size + ps - 1) / ps * ps)
			alloc += a
			used += float64(size)
			worst = max(worst, (a-float64(size))/a)
		}
		waste := (alloc - used) / alloc
		t.Logf("page %3d KiB: waste %.4f%% over the 16..2048-token mix, worst single entry %.2f%%", ps>>10, 100*waste, 100*worst)
		if ps == 64<<10 && (waste >= 0.04 || worst >= 0.04) {
			t.Errorf("64 KiB pages waste %.2f%% (worst %.2f%%), want < 4%%", 100*waste, 100*worst)
		}
	}
	// The same arithmetic as the arena charges, checked on a real store.
	s := openTest(t, Config{DRAMBytes: 64 << 20, PageSize: 64 << 10})
	ctx := t.Context()
	var alloc, used int64
	for i, tokens := range []int{16, 17, 33, 20} {
		blob := bigBlob(t, tokens)
		rekey(t, blob, uint64(i+1))
		if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
			t.Fatal(err)
		}
		alloc += int64((len(blob) + 64<<10 - 1) / (64 << 10) * (64 << 10))
		used += int64(len(blob))
	}
	st := s.Stats()
	if st.Tiers[TierDRAM].Bytes != alloc || st.Tiers[TierDRAM].StoredBytes != used {
		t.Fatalf("store charges %d for %d stored, want %d for %d", st.Tiers[TierDRAM].Bytes, st.Tiers[TierDRAM].StoredBytes, alloc, used)
	}
	t.Logf("store: waste %.2f%% on entries of 16, 17, 33 and 20 tokens", 100*st.Waste())
}

// TestHeapIndependentOfStoredBytes: storing 192 MiB in DRAM grows the Go
// heap by the index only (32 MiB under the race detector).
func TestHeapIndependentOfStoredBytes(t *testing.T) {
	s := openTest(t, Config{DRAMBytes: 256 << 20, PageSize: 64 << 10})
	blob := bigBlob(t, 8) // 1 MiB
	n := 192
	if raceEnabled {
		n = 32 // the detector's shadow of every copied byte makes this slow
	}
	ctx := t.Context()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i++ {
		rekey(t, blob, uint64(i+1))
		if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew %d bytes for %d MiB stored (%d bytes per entry)", grew, n, grew/int64(n))
	if st := s.Stats(); st.Tiers[TierDRAM].Entries != n {
		t.Fatalf("%d entries", st.Tiers[TierDRAM].Entries)
	}
	if grew > 2<<20 {
		t.Fatalf("heap grew %d bytes storing %d MiB off-heap", grew, n)
	}
}
