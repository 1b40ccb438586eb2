package replication

import (
	"testing"
	"time"
)

// BenchmarkWrite measures coordinated write throughput over the in-process
// transport (each replica verifies the blob and keeps a copy, as kvtier
// does), R=1 against R=3/W=2. The timing includes the stragglers: a run
// ends when every replica write has finished.
func BenchmarkWrite(b *testing.B) {
	for _, bc := range []struct {
		name string
		r, w int
	}{{"R1", 1, 1}, {"R3W2", 3, 2}} {
		b.Run(bc.name, func(b *testing.B) {
			const pool = 256
			blobs := make([][]byte, pool)
			for i := range blobs {
				blobs[i], _ = makeSizedBlob(b, i, 0, 512, 8) // 256 KiB: 512 tokens, 8 layers, 2 heads x 8 dims, f16
			}
			c := newCluster(b, []string{"a", "b", "c"}, nil)
			c.r, c.w = bc.r, bc.w
			b.SetBytes(int64(len(blobs[0])))
			b.ResetTimer()
			for i := range b.N {
				if i%pool == 0 && i > 0 {
					b.StopTimer()
					for id, r := range c.reps {
						r.Close()
						c.stores[id].Wipe()
						c.start(id)
					}
					b.StartTimer()
				}
				if _, err := c.reps["a"].Write(b.Context(), blobs[i%pool]); err != nil {
					b.Fatal(err)
				}
			}
			for _, r := range c.reps {
				r.Close()
			}
		})
	}
}

// BenchmarkRebalanceJoin: a 4th node joins 3 that hold the data (R=3,
// 256 KiB chunks, no rate limit); it reports the bytes moved against the
// ideal (a quarter of the stored bytes: the newcomer's share), the
// rebalance throughput and the time of the whole rebalance (all four
// nodes' passes, run one after the other).
func BenchmarkRebalanceJoin(b *testing.B) {
	for _, bc := range []struct {
		name   string
		chunks int
	}{{"data=64MiB", 256}, {"data=256MiB", 1024}} {
		b.Run(bc.name, func(b *testing.B) {
			var moved, stored int64
			var elapsed time.Duration
			for range b.N {
				c := newCluster(b, []string{"a", "b", "c"}, nil)
				for i := range bc.chunks {
					blob, _ := makeSizedBlob(b, i, 0, 512, 8) // 256 KiB
					for _, id := range []string{"a", "b", "c"} {
						if _, err := c.stores[id].Put(b.Context(), blob); err != nil {
							b.Fatal(err)
						}
					}
				}
				for _, id := range []string{"a", "b", "c"} {
					c.reps[id].Rebalance(b.Context())
					stored += int64(c.stores[id].Bytes())
				}
				c.start("d")
				c.setRing("a", "b", "c", "d")
				start := time.Now()
				for _, id := range []string{"a", "b", "c", "d"} {
					st, err := c.reps[id].Rebalance(b.Context())
					if err != nil || st.Pending != 0 {
						b.Fatalf("%s: %+v %v", id, st, err)
					}
					moved += st.BytesMoved
				}
				elapsed += time.Since(start)
				for id, r := range c.reps {
					r.Close()
					c.stores[id].Wipe() // the cleanup keeps c until the end
				}
			}
			b.ReportMetric(float64(moved)/float64(stored/4), "moved/ideal")
			b.ReportMetric(float64(moved)/float64(b.N)/(1<<20), "MiB_moved/op")
			b.ReportMetric(float64(moved)/(1<<20)/elapsed.Seconds(), "MiB/s")
			b.ReportMetric(elapsed.Seconds()/float64(b.N), "s_rebalance/op")
		})
	}
}
