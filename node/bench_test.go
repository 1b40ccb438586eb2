package node_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/meta"
)

// benchEntries makes n distinct entries of about size bytes each.
func benchEntries(b *testing.B, spec chunk.ModelSpec, n, size int) ([]chunk.Key, [][]byte) {
	rng := rand.New(rand.NewPCG(3, uint64(size)))
	tokens := max(1, size/spec.KVBytesPerToken())
	keys := make([]chunk.Key, n)
	blobs := make([][]byte, n)
	for i := range n {
		keys[i], blobs[i] = testutil.Blob(b, rng, spec, testutil.Tokens(rng, tokens), chunk.StandaloneContext())
	}
	return keys, blobs
}

// BenchmarkClusterPutGet measures a client's Put and Get throughput and
// latency against a 3-node loopback cluster with 8 concurrent requests, at
// R=3 (W=2) and at R=1 (what a single redis-server does; see
// BenchmarkRedisReference), and batched lookups of 64 IDs.
func BenchmarkClusterPutGet(b *testing.B) {
	nodes := startClusterDRAM(b, 3, 512<<20)
	c := newClient(b, nodes[0])
	ctx := b.Context()
	spec := chunk.ModelSpec{Family: "llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 500000, TokenizerID: "bench"}
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		b.Fatal(err)
	}
	const conc = 8
	for _, rf := range []int{3, 1} {
		set := meta.Settings{ReplicationFactor: rf, WriteQuorum: min(2, rf), Codec: chunk.CodecRaw}
		if err := nodes[0].Meta().SetSettings(ctx, set, meta.AnyVersion()); err != nil {
			b.Fatal(err)
		}
		testutil.WaitFor(b, fmt.Sprintf("the client to see R=%d", rf), func() bool {
			if _, err := c.ClusterInfo(ctx); err != nil {
				b.Fatal(err)
			}
			return c.ReplicationFactor() == rf
		})
		for _, size := range []int{1 << 20, 16 << 20} {
			count := 16
			if size > 4<<20 {
				count = 4
			}
			keys, blobs := benchEntries(b, spec, count, size)
			run := func(b *testing.B, op func(i int) error) {
				b.SetBytes(int64(len(blobs[0])))
				var next atomic.Int64
				var mu sync.Mutex
				var lat []time.Duration
				b.ResetTimer()
				var wg sync.WaitGroup
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var mine []time.Duration
						for {
							i := int(next.Add(1)) - 1
							if i >= b.N {
								break
							}
							t0 := time.Now()
							if err := op(i % count); err != nil {
								b.Error(err)
								return
							}
							mine = append(mine, time.Since(t0))
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					}()
				}
				wg.Wait()
				b.StopTimer()
				slices.Sort(lat)
				if len(lat) > 0 {
					b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1e3, "p50-ms")
					b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1e3, "p99-ms")
				}
			}
			b.Run(fmt.Sprintf("r%d/put/%dMiB", rf, size>>20), func(b *testing.B) {
				run(b, func(i int) error { _, err := c.Put(ctx, blobs[i]); return err })
			})
			b.Run(fmt.Sprintf("r%d/get/%dMiB", rf, size>>20), func(b *testing.B) {
				for _, blob := range blobs {
					if _, err := c.Put(ctx, blob); err != nil {
						b.Fatal(err)
					}
				}
				run(b, func(i int) error { _, err := c.Get(ctx, keys[i]); return err })
			})
		}
	}
	b.Run("lookup64", func(b *testing.B) {
		fp := spec.Fingerprint()
		items := make([]client.LookupItem, 64)
		for i := range items {
			items[i] = client.LookupItem{Content: chunk.ID{Lo: uint64(i), Hi: 7}, Want: chunk.StandaloneContext()}
		}
		b.ResetTimer()
		for range b.N {
			if _, err := c.Lookup(ctx, fp, items); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
	})
}

// BenchmarkStorePut measures a client's Put into a single node (R=1,
// W=1, raw entries in the raw cluster codec, so each is stored as it
// arrives) with 8 concurrent requests, each one a new entry: the key is
// deleted from the node's store after its put, so the next put of it
// stores it again. It shows the node's receive-and-store path (the body
// lent from the DRAM tier and adopted, or a heap buffer copied into it)
// apart from replication. cpu-ns/op is the whole process's CPU time per
// put, the client's included (run it alone).
func BenchmarkStorePut(b *testing.B) { benchPuts(b, 1) }

// BenchmarkReplicaPut is BenchmarkStorePut over two nodes at R=2, W=2:
// each put is also a replica write (Peer.Replicate) that the other node
// receives, checks and stores, and the key is deleted from both stores
// after it. cpu-ns/op is the CPU of the client, the coordinator and the
// replica together.
func BenchmarkReplicaPut(b *testing.B) { benchPuts(b, 2) }

// benchPuts runs BenchmarkStorePut over nodes nodes, each holding every
// entry (R = W = nodes).
func benchPuts(b *testing.B, nodes int) {
	ns := startClusterDRAM(b, nodes, 512<<20)
	n := ns[0]
	c := newClient(b, n)
	ctx := b.Context()
	spec := chunk.ModelSpec{Family: "llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 500000, TokenizerID: "bench"}
	if _, err := c.RegisterModel(ctx, spec); err != nil {
		b.Fatal(err)
	}
	set := meta.Settings{ReplicationFactor: nodes, WriteQuorum: nodes, Codec: chunk.CodecRaw}
	if err := n.Meta().SetSettings(ctx, set, meta.AnyVersion()); err != nil {
		b.Fatal(err)
	}
	testutil.WaitFor(b, fmt.Sprintf("the client to see R=%d", nodes), func() bool {
		if _, err := c.ClusterInfo(ctx); err != nil {
			b.Fatal(err)
		}
		return c.ReplicationFactor() == nodes
	})
	const conc, count = 8, 32
	for _, size := range []int{1 << 20, 4 << 20} {
		keys := make([]chunk.Key, count)
		blobs := make([][]byte, count)
		tokens := size / spec.KVBytesPerToken()
		for i := range count {
			toks := make([]uint32, tokens)
			for j := range toks {
				toks[j] = uint32(i*tokens + j)
			}
			e := testutil.EntryOf(spec, toks, chunk.StandaloneContext(), testutil.PatternKV)
			keys[i], blobs[i] = e.Key, testutil.Encode(b, e, chunk.CodecRaw)
		}
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			b.SetBytes(int64(len(blobs[0])))
			var next atomic.Int64
			var mu [count]sync.Mutex // one put of an entry at a time
			a0 := n.Store().Stats().Tiers[kvtier.TierDRAM].AdoptedPuts
			c0 := cpuTime(b)
			b.ResetTimer()
			var wg sync.WaitGroup
			for range conc {
				wg.Go(func() {
					for {
						i := int(next.Add(1)) - 1
						if i >= b.N {
							return
						}
						k := i % count
						mu[k].Lock()
						_, err := c.Put(ctx, blobs[k])
						for _, nd := range ns {
							if err == nil {
								err = nd.Store().Delete(keys[k])
							}
						}
						mu[k].Unlock()
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime(b)-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(n.Store().Stats().Tiers[kvtier.TierDRAM].AdoptedPuts-a0)/float64(b.N), "adopted/op")
		})
	}
}

// cpuTime is the process's user plus system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
