// Package ring places chunks on the nodes of a kvmesh cluster.
//
// Placement (Ring) is pure: weighted rendezvous hashing of a chunk's content
// ID over the members of one epoch. Every node that holds the same epoch and
// member list computes the same replica sets, whatever order it got the
// members in, on any CPU architecture (the score function uses only integer
// arithmetic and exactly rounded float operations). Adding or removing a
// member moves only the keys that must move: about weight/total of them, and
// a key's replica set changes only by the member that joined or left.
//
// Which nodes are alive is package gossip's job; turning gossip into ring
// epochs is the metadata layer's (package meta). This package imports
// neither, so a client that only routes requests links no membership code.
package ring

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/chunk"
)

// Member is one node of a ring epoch.
type Member struct {
	// ID names the node; it is unique in a ring and is the gossip node name.
	ID         string `json:"id"`
	GRPCAddr   string `json:"grpc_addr,omitempty"`
	RaftAddr   string `json:"raft_addr,omitempty"`
	GossipAddr string `json:"gossip_addr,omitempty"`
	// Weight scales the share of keys the node owns (e.g. its capacity in
	// GiB, see CapacityWeight). Zero, negative, NaN and infinite weights
	// count as 1, so a ring of members without weights is uniform.
	Weight float64 `json:"weight,omitempty"`
}

// EffectiveWeight is the weight placement uses for m.
func (m Member) EffectiveWeight() float64 {
	if !(m.Weight > 0) || math.IsInf(m.Weight, 1) {
		return 1
	}
	return m.Weight
}

// Ring is the placement of one epoch. It is immutable and safe for
// concurrent use.
type Ring struct {
	epoch   uint64
	members []Member // sorted by ID, unique IDs
	nodes   []node   // parallel to members
	// uniform is set when all weights are equal: the score is then
	// monotonic in the hash alone and the logarithm can be skipped.
	uniform bool
}

// node is what the score function needs of a member, kept dense for the
// scan in Replicas.
type node struct {
	seedLo, seedHi uint64
	weight         float64
}

// Seeds of the per-member hash lanes (ASCII "ring.lo." and "ring.hi.").
const (
	seedMemberLo uint64 = 0x72696e672e6c6f2e
	seedMemberHi uint64 = 0x72696e672e68692e
)

// New returns the ring of epoch over members. The input order does not
// matter and members is not retained. Members with an empty ID are dropped;
// of several members with the same ID the one that sorts first by
// (GRPCAddr, RaftAddr, GossipAddr, Weight) is kept, so the result still does
// not depend on the input order.
func New(epoch uint64, members []Member) *Ring {
	ms := make([]Member, 0, len(members))
	for _, m := range members {
		if m.ID != "" {
			ms = append(ms, m)
		}
	}
	slices.SortFunc(ms, func(a, b Member) int {
		if c := cmp.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		return cmp.Or(
			cmp.Compare(a.GRPCAddr, b.GRPCAddr),
			cmp.Compare(a.RaftAddr, b.RaftAddr),
			cmp.Compare(a.GossipAddr, b.GossipAddr),
			cmp.Compare(a.Weight, b.Weight),
		)
	})
	ms = slices.CompactFunc(ms, func(a, b Member) bool { return a.ID == b.ID })
	ms = slices.Clip(ms)
	r := &Ring{epoch: epoch, members: ms, nodes: make([]node, len(ms)), uniform: true}
	for i, m := range ms {
		r.uniform = r.uniform && m.EffectiveWeight() == ms[0].EffectiveWeight()
		r.nodes[i] = node{
			seedLo: xxhash.Sum64String(m.ID) ^ seedMemberLo,
			seedHi: Mix64(xxhash.Sum64String(m.ID) ^ seedMemberHi),
			weight: m.EffectiveWeight(),
		}
	}
	return r
}

// Digest is a 64-bit hash of the epoch and the members (every field), for
// nodes and clients to check cheaply that they hold the same ring.
func (r *Ring) Digest() uint64 {
	var d xxhash.Digest
	d.Reset()
	var buf [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		_, _ = d.Write(buf[:])
	}
	str := func(s string) {
		put(uint64(len(s)))
		_, _ = d.WriteString(s)
	}
	put(r.epoch)
	put(uint64(len(r.members)))
	for _, m := range r.members {
		str(m.ID)
		str(m.GRPCAddr)
		str(m.RaftAddr)
		str(m.GossipAddr)
		put(math.Float64bits(m.Weight))
	}
	return d.Sum64()
}

// Epoch is the ring's epoch, as the metadata layer numbered it.
func (r *Ring) Epoch() uint64 { return r.epoch }

// Len is the number of members.
func (r *Ring) Len() int { return len(r.members) }

// Members returns a copy of the members, sorted by ID.
func (r *Ring) Members() []Member { return slices.Clone(r.members) }

// Member returns the member with the given ID.
func (r *Ring) Member(id string) (Member, bool) {
	i, ok := r.index(id)
	if !ok {
		return Member{}, false
	}
	return r.members[i], true
}

// Contains reports whether id is a member.
func (r *Ring) Contains(id string) bool {
	_, ok := r.index(id)
	return ok
}

func (r *Ring) index(id string) (int, bool) {
	return slices.BinarySearchFunc(r.members, id, func(m Member, id string) int { return cmp.Compare(m.ID, id) })
}

// Replicas returns the replica set of content: the n members with the
// highest scores, best first. The first is the owner. It returns all members
// when n exceeds their number, and nil when n <= 0 or the ring is empty.
func (r *Ring) Replicas(content chunk.ID, n int) []Member {
	n = min(n, len(r.members))
	if n <= 0 {
		return nil
	}
	return r.AppendReplicas(make([]Member, 0, n), content, n)
}

// AppendReplicas appends the replica set of content (as Replicas returns it)
// to dst. It does not allocate when dst has room and n <= 8.
func (r *Ring) AppendReplicas(dst []Member, content chunk.ID, n int) []Member {
	var buf [8]candidate
	for _, c := range r.top(buf[:0], content, n) {
		dst = append(dst, r.members[c.idx])
	}
	return dst
}

// Owner returns the first replica of content; false when the ring is empty.
func (r *Ring) Owner(content chunk.ID) (Member, bool) {
	var buf [1]candidate
	top := r.top(buf[:0], content, 1)
	if len(top) == 0 {
		return Member{}, false
	}
	return r.members[top[0].idx], true
}

// IsReplica reports whether the member nodeID is among the n replicas of
// content.
func (r *Ring) IsReplica(content chunk.ID, nodeID string, n int) bool {
	return r.ReplicaRank(content, nodeID, n) >= 0
}

// ReplicaRank returns the position of nodeID in the replica set of content
// of size n (0 for the owner), or -1 when it is not in it.
func (r *Ring) ReplicaRank(content chunk.ID, nodeID string, n int) int {
	i, ok := r.index(nodeID)
	if !ok || n <= 0 {
		return -1
	}
	// A member is among the top n exactly when fewer than n members beat
	// it, which a single pass counts without sorting.
	mine := candidate{score: r.score(content, i), idx: int32(i)}
	rank := 0
	for j := range r.nodes {
		if j != i && (candidate{score: r.score(content, j), idx: int32(j)}).beats(mine) {
			rank++
			if rank >= n {
				return -1
			}
		}
	}
	return rank
}

// candidate is a member index with its score for one key.
type candidate struct {
	score float64
	idx   int32
}

// beats orders candidates: higher score first, then lower index (lower ID),
// so ties, however unlikely, resolve the same way everywhere.
func (c candidate) beats(o candidate) bool {
	return c.score > o.score || (c.score == o.score && c.idx < o.idx)
}

// top appends the n best candidates for content to dst (which it reuses
// when its capacity suffices), best first.
func (r *Ring) top(dst []candidate, content chunk.ID, n int) []candidate {
	n = min(n, len(r.nodes))
	if n <= 0 {
		return dst[:0]
	}
	dst = dst[:0]
	if cap(dst) < n {
		dst = make([]candidate, 0, n)
	}
	for i := range r.nodes {
		c := candidate{score: r.score(content, i), idx: int32(i)}
		if len(dst) == n {
			if !c.beats(dst[n-1]) {
				continue
			}
			dst = dst[:n-1]
		}
		// Insertion into the short sorted list.
		j := len(dst)
		dst = append(dst, c)
		for j > 0 && c.beats(dst[j-1]) {
			dst[j] = dst[j-1]
			j--
		}
		dst[j] = c
	}
	return dst
}

// score is member i's weighted rendezvous score for content: w / -ln(u),
// with u a uniform hash in (0, 1). The member with the highest score wins;
// P(win) = w / sum(w) (the -ln(u)/w are exponentials with rate w). When all
// weights are equal the score is the hash itself (53 bits, exact), which
// orders members the same way (bar ties within an ulp, probability ~1e-15
// per key) at a fraction of the cost.
func (r *Ring) score(content chunk.ID, i int) float64 {
	nd := &r.nodes[i]
	h := Mix64(content.Lo ^ nd.seedLo)
	h = Mix64(h ^ content.Hi ^ nd.seedHi)
	if r.uniform {
		return float64(h >> 11)
	}
	// 52 bits, centred in their interval (exact in a float64), so u is
	// never 0 or 1.
	u := (float64(h>>12) + 0.5) * 0x1p-52
	return nd.weight / -detLog(u)
}

// Mix64 is MurmurHash3's 64-bit finaliser: a bijection with full
// avalanche. Placement scores with it, and anti-entropy digests fold keys
// with it, so it is the one mixer of the module.
func Mix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// detLog is the natural logarithm of x for 0 < x < 1, computed the same
// way on every platform: math.Log has assembly versions on some
// architectures, and the compiler may fuse a*b+c where it has FMA, either
// of which could flip a near tie between two nodes. This is the FreeBSD
// e_log.c algorithm (as in Go's portable math.Log, < 1 ulp error) with
// every product rounded explicitly, which forbids fusion.
func detLog(x float64) float64 {
	const (
		ln2Hi = 6.93147180369123816490e-01 // 3fe62e42 fee00000
		ln2Lo = 1.90821492927058770002e-10 // 3dea39ef 35793c76
		l1    = 6.666666666666735130e-01   // 3FE55555 55555593
		l2    = 3.999999999940941908e-01   // 3FD99999 9997FA04
		l3    = 2.857142874366239149e-01   // 3FD24924 94229359
		l4    = 2.222219843214978396e-01   // 3FCC71C5 1D8E78AF
		l5    = 1.818357216161805012e-01   // 3FC74664 96CB03DE
		l6    = 1.531383769920937332e-01   // 3FC39A09 D078C69F
		l7    = 1.479819860511658591e-01   // 3FC2F112 DF3E5244
	)
	// x = f1 * 2^ki with f1 in [sqrt(2)/2, sqrt(2)); x is normal here
	// (x >= 2^-53), so the exponent field gives the split directly.
	b := math.Float64bits(x)
	ki := int(b>>52&0x7ff) - 1022
	f1 := math.Float64frombits(b&^(0x7ff<<52) | 1022<<52) // in [0.5, 1)
	if f1 < math.Sqrt2/2 {
		f1 = float64(f1 * 2)
		ki--
	}
	f := f1 - 1
	k := float64(ki)

	s := f / (2 + f)
	s2 := float64(s * s)
	s4 := float64(s2 * s2)
	t1 := float64(s2 * (l1 + float64(s4*(l3+float64(s4*(l5+float64(s4*l7)))))))
	t2 := float64(s4 * (l2 + float64(s4*(l4+float64(s4*l6)))))
	rr := t1 + t2
	hfsq := float64(float64(0.5*f) * f)
	return float64(k*ln2Hi) - ((hfsq - (float64(s*(hfsq+rr)) + float64(k*ln2Lo))) - f)
}

// GiB is the unit of CapacityWeight.
const GiB = 1 << 30

// CapacityWeight turns a node's storage capacity in bytes into a ring
// weight: capacity in GiB, at least 1/1024 so that a node with a tiny
// budget still takes a small share rather than the default 1.
func CapacityWeight(bytes uint64) float64 {
	return max(float64(bytes)/GiB, 1.0/1024)
}
