package kvtier

import (
	"fmt"
	"testing"
)

// BenchmarkReceivePut is a node's put from the body's arrival on: the
// body is copied out of the received frames (here one wire buffer) into
// a buffer, and put into a full DRAM tier. mode=heap receives into a
// reused heap buffer, which Put checks and copies into the arena;
// mode=lend receives into pages Lend lends, which Put checks in place
// and adopts, one copy fewer. cpu-ns/op is the whole process's CPU time
// per put (run it alone).
func BenchmarkReceivePut(b *testing.B) {
	for _, mode := range []string{"heap", "lend"} {
		for _, sz := range benchSizes[:3] {
			for _, g := range []int{1, 2} {
				b.Run(fmt.Sprintf("mode=%s/size=%s/g=%d", mode, sz.name, g), func(b *testing.B) {
					s := openTest(b, Config{DRAMBytes: 256 << 20, PageSize: 64 << 10})
					wire := make([][]byte, g)
					heap := make([][]byte, g)
					for w := range wire {
						wire[w] = bigBlob(b, sz.tokens)
						heap[w] = make([]byte, len(wire[w]))
					}
					b.SetBytes(int64(len(wire[0])))
					ctx := b.Context()
					base := uint64(1 << 40)
					for filled := 0; filled < 256<<20; filled += len(wire[0]) {
						base++
						rekey(b, wire[0], base)
						if _, err := s.Put(ctx, wire[0], PutOptions{}); err != nil {
							b.Fatal(err)
						}
					}
					c0 := cpuTime(b)
					runWorkers(b, g, func(w, i int) {
						rekey(b, wire[w], uint64(i+1))
						if mode == "heap" {
							copy(heap[w], wire[w])
							if _, err := s.Put(ctx, heap[w], PutOptions{}); err != nil {
								b.Error(err)
							}
							return
						}
						l, err := s.Lend(ctx, len(wire[w]))
						if err != nil {
							b.Error(err)
							return
						}
						copy(l.Bytes(), wire[w])
						if _, err := s.Put(ctx, l.Bytes(), PutOptions{}); err != nil {
							b.Error(err)
						}
						l.Release()
					})
					b.StopTimer()
					b.ReportMetric(float64((cpuTime(b)-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
					if mode == "lend" && s.Stats().Tiers[TierDRAM].AdoptedPuts < uint64(b.N) {
						b.Fatal("puts copied lent pages")
					}
				})
			}
		}
	}
}
