package kvtier

import "github.com/kvmesh/kvmesh/chunk"

// sim is a cache of byte-weighted keys run by a policy exactly as a tier
// runs it (admit on miss, evict until the new entry fits), without bytes.
type sim struct {
	pol      policy
	capacity int64
	used     int64
	nodes    map[uint64]*pnode
	hits     int
	misses   int
	hitBytes int64
	allBytes int64
}

func newSim(p Policy, capacity int64) *sim {
	return &sim{pol: newPolicy(p, capacity, false), capacity: capacity, nodes: make(map[uint64]*pnode)}
}

func (s *sim) has(k uint64) bool { return s.nodes[k] != nil }

func (s *sim) access(k uint64, cost int64) {
	s.allBytes += cost
	if n := s.nodes[k]; n != nil {
		s.hits++
		s.hitBytes += cost
		s.pol.touch(n)
		return
	}
	s.misses++
	if cost > s.capacity {
		return
	}
	for s.used+cost > s.capacity {
		v := s.pol.victim(nil)
		s.pol.evict(v)
		s.used -= v.cost
		delete(s.nodes, v.key.Content.Lo)
	}
	n := &pnode{cost: cost, key: chunk.Key{Content: chunk.ID{Lo: k}}}
	s.pol.add(n)
	s.nodes[k] = n
	s.used += cost
}
