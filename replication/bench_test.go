package replication

import (
	"context"
	"testing"
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
				blobs[i], _ = makeSizedBlob(b, i, 0, 64, 8) // 256 KiB: 64 tokens, 8 layers, f16
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
						c.stores[id].wipe()
						c.start(id)
					}
					b.StartTimer()
				}
				if _, err := c.reps["a"].Write(context.Background(), blobs[i%pool]); err != nil {
					b.Fatal(err)
				}
			}
			for _, r := range c.reps {
				r.Close()
			}
		})
	}
}

// BenchmarkRebalanceJoin: a 4th node joins 3 that hold the data (R=3); it
// reports the bytes moved against the ideal (a quarter of the stored
// bytes: the newcomer's share) and the rebalance throughput.
func BenchmarkRebalanceJoin(b *testing.B) {
	const chunks = 2000
	blobs := make([][]byte, chunks)
	for i := range blobs {
		blobs[i], _ = makeSizedBlob(b, i, 0, 16, 8) // 64 KiB
	}
	var moved, stored int64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		c := newCluster(b, []string{"a", "b", "c"}, nil)
		for _, blob := range blobs {
			for _, id := range []string{"a", "b", "c"} {
				if _, err := c.stores[id].Put(context.Background(), blob); err != nil {
					b.Fatal(err)
				}
			}
		}
		for _, id := range []string{"a", "b", "c"} {
			c.reps[id].Rebalance(context.Background())
			stored += int64(c.stores[id].bytes())
		}
		c.start("d")
		c.setRing("a", "b", "c", "d")
		b.StartTimer()
		for _, id := range []string{"a", "b", "c", "d"} {
			st, err := c.reps[id].Rebalance(context.Background())
			if err != nil || st.Pending != 0 {
				b.Fatalf("%s: %+v %v", id, st, err)
			}
			moved += st.BytesMoved
		}
		b.StopTimer()
		for _, r := range c.reps {
			r.Close()
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(moved)/float64(stored/4), "moved/ideal")
	b.ReportMetric(float64(moved)/float64(b.N)/(1<<20), "MiB_moved/op")
	b.ReportMetric(float64(moved)/(1<<20)/b.Elapsed().Seconds(), "MiB/s")
}
