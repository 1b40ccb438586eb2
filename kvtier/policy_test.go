package kvtier

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// TestPolicyInvariants drives each policy with random adds, hits,
// removals and evictions with random pins, checking its byte and entry
// accounting against a plain set and that a victim is never pinned.
func TestPolicyInvariants(t *testing.T) {
	for _, tc := range []struct {
		p        Policy
		weighted bool
	}{{PolicyS3FIFO, false}, {PolicyS3FIFO, true}, {PolicyLRU, false}} {
		p := tc.p
		name := p.String()
		if tc.weighted {
			name += "-weighted"
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(p)))
			pol := newPolicy(p, 1000, tc.weighted)
			in := map[*pnode]bool{}
			pinned := map[*pnode]bool{}
			nodes := make([]*pnode, 64)
			for i := range nodes {
				nodes[i] = &pnode{key: chunk.Key{Content: chunk.ID{Lo: uint64(i)}}, reuse: Reuse(i % int(NumReuse))}
			}
			for op := 0; op < 20000; op++ {
				n := nodes[rng.IntN(len(nodes))]
				switch c := rng.IntN(10); {
				case c < 3 && !in[n]:
					n.cost = int64(1 + rng.IntN(100))
					pol.add(n)
					in[n] = true
				case c < 6 && in[n]:
					pol.touch(n)
				case c < 7 && in[n]:
					pol.remove(n)
					delete(in, n)
				case c < 8:
					pinned[n] = !pinned[n]
				default:
					v := pol.victim(func(x *pnode) bool { return pinned[x] })
					if v == nil {
						for x := range in {
							if !pinned[x] {
								t.Fatalf("op %d: no victim with %v unpinned", op, x.key)
							}
						}
						continue
					}
					if pinned[v] || !in[v] {
						t.Fatalf("op %d: victim pinned=%v present=%v", op, pinned[v], in[v])
					}
					pol.evict(v)
					delete(in, v)
				}
				var bytes int64
				for x := range in {
					bytes += x.cost
				}
				if pol.len() != len(in) || pol.bytes() != bytes {
					t.Fatalf("op %d: policy holds %d entries / %d bytes, want %d / %d", op, pol.len(), pol.bytes(), len(in), bytes)
				}
			}
			if s, ok := pol.(*s3fifo); ok && (s.ghost.bytes > s.ghost.capacity || int64(len(s.ghost.at)) > s.ghost.capacity) {
				t.Fatalf("ghost holds %d bytes, %d keys", s.ghost.bytes, len(s.ghost.at))
			}
		})
	}
}

// TestS3FIFOKeepsHotEntries: a scan of one-hit entries must not flush
// entries that are read again, which is what LRU does.
func TestS3FIFOKeepsHotEntries(t *testing.T) {
	for _, tc := range []struct {
		p        Policy
		wantKept bool
	}{{PolicyS3FIFO, true}, {PolicyLRU, false}} {
		sim := newSim(tc.p, 100)
		hot := []uint64{1, 2, 3, 4, 5}
		for r := 0; r < 3; r++ {
			for _, k := range hot {
				sim.access(k, 10)
			}
		}
		for k := uint64(100); k < 300; k++ { // a scan, 4x the capacity
			sim.access(k, 10)
		}
		kept := 0
		for _, k := range hot {
			if sim.has(k) {
				kept++
			}
		}
		if (kept == len(hot)) != tc.wantKept {
			t.Errorf("%v kept %d of %d hot entries through a scan", tc.p, kept, len(hot))
		}
	}
}
