package kvtier

import (
	"sync/atomic"

	"github.com/kvmesh/kvmesh/chunk"
)

// Policy names an eviction policy.
type Policy int

const (
	// PolicyS3FIFO (the default): a small probationary FIFO of a tenth of
	// the tier's bytes in front of a main FIFO with reinsertion, and a ghost
	// queue of recently evicted keys, all weighted by bytes (Yang et al.,
	// SOSP'23). An entry read at least once while on probation, or
	// re-admitted while its key is still a ghost, goes to main; one-hit
	// wonders leave from the small queue without displacing hot entries.
	PolicyS3FIFO Policy = iota
	// PolicyLRU: plain least-recently-used, the baseline the benchmarks
	// compare against.
	PolicyLRU
)

func (p Policy) String() string {
	switch p {
	case PolicyS3FIFO:
		return "s3fifo"
	case PolicyLRU:
		return "lru"
	}
	return "policy(?)"
}

// pnode is the intrusive list node an entry carries for the one policy
// (tier) it currently sits in.
type pnode struct {
	prev, next *pnode
	q          *queue
	freq       uint32 // atomic in touchShared, plain under the exclusive lock
	cost       int64
	key        chunk.Key
	owner      *entry // nil in tests that drive the policy alone
	reuse      Reuse  // weighs the entry under a weighted S3-FIFO
}

type queue struct {
	head, tail *pnode // evict from head, insert at tail
	bytes      int64
	n          int
}

func (q *queue) push(n *pnode) {
	n.q, n.prev, n.next = q, q.tail, nil
	if q.tail != nil {
		q.tail.next = n
	} else {
		q.head = n
	}
	q.tail = n
	q.bytes += n.cost
	q.n++
}

func (q *queue) unlink(n *pnode) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		q.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		q.tail = n.prev
	}
	n.prev, n.next, n.q = nil, nil, nil
	q.bytes -= n.cost
	q.n--
}

// policy orders the entries of one tier for eviction. It never decides
// when to evict (the tier does, from its byte budget); it only picks whom.
type policy interface {
	// add admits n, costing n.cost bytes.
	add(n *pnode)
	// touch records a hit on n.
	touch(n *pnode)
	// sharedTouch reports whether touchShared may be used, that is whether
	// the policy records hits without changing its queues.
	sharedTouch() bool
	// touchShared records a hit on n while other goroutines may be
	// recording hits too (the Store's read lock is held, not its write
	// lock).
	touchShared(n *pnode)
	// remove takes n out (deleted or moved to another tier).
	remove(n *pnode)
	// victim returns the entry to evict next, skipping (and treating as
	// hot) those skip reports; nil when every entry is skipped. The
	// victim stays in the policy until evict or remove.
	victim(skip func(*pnode) bool) *pnode
	// evict takes out n, a victim, remembering it where the policy keeps
	// history.
	evict(n *pnode)
	bytes() int64
	len() int
}

// newPolicy makes a tier's policy; weighted S3-FIFO credits new entries
// by reuse class (AdmitReuse). LRU ignores weighted.
func newPolicy(p Policy, capacity int64, weighted bool) policy {
	if p == PolicyLRU {
		return &lru{}
	}
	s := newS3FIFO(capacity)
	s.weighted = weighted
	return s
}

// lru is the baseline.
type lru struct{ q queue }

func (l *lru) add(n *pnode)   { l.q.push(n) }
func (l *lru) touch(n *pnode) { l.q.unlink(n); l.q.push(n) }

// An LRU hit moves the entry: it needs the exclusive lock.
func (l *lru) sharedTouch() bool    { return false }
func (l *lru) touchShared(n *pnode) { panic("kvtier: LRU hits need the exclusive lock") }
func (l *lru) remove(n *pnode)      { l.q.unlink(n) }
func (l *lru) evict(n *pnode)       { l.q.unlink(n) }
func (l *lru) bytes() int64         { return l.q.bytes }
func (l *lru) len() int             { return l.q.n }
func (l *lru) victim(skip func(*pnode) bool) *pnode {
	for n := l.q.head; n != nil; n = n.next {
		if skip == nil || !skip(n) {
			return n
		}
	}
	return nil
}

// s3fifo: see PolicyS3FIFO.
type s3fifo struct {
	capacity    int64
	small, main queue
	ghost       ghost
	// weighted starts an entry with its reuse class's credit
	// (Reuse.weight) instead of no hits: an entry usable at any position
	// leaves probation for main at once and outlasts two rounds of main
	// without a hit, a prefix-chained one gets no such credit.
	weighted bool
}

const maxFreq = 3

func newS3FIFO(capacity int64) *s3fifo {
	return &s3fifo{capacity: capacity, ghost: ghost{capacity: capacity, at: make(map[chunk.Key]*gnode)}}
}

func (s *s3fifo) add(n *pnode) {
	n.freq = 0
	if s.weighted {
		n.freq = min(n.reuse.weight(), maxFreq)
	}
	if s.ghost.take(n.key) {
		s.main.push(n)
		return
	}
	s.small.push(n)
}

func (s *s3fifo) touch(n *pnode) {
	if n.freq < maxFreq {
		n.freq++
	}
}

// An S3-FIFO hit only bumps a saturating counter, so hits can be recorded
// concurrently, with a compare-and-swap.
func (s *s3fifo) sharedTouch() bool { return true }

func (s *s3fifo) touchShared(n *pnode) {
	for {
		f := atomic.LoadUint32(&n.freq)
		if f >= maxFreq || atomic.CompareAndSwapUint32(&n.freq, f, f+1) {
			return
		}
	}
}

func (s *s3fifo) remove(n *pnode) { n.q.unlink(n) }

func (s *s3fifo) evict(n *pnode) {
	if n.q == &s.small {
		s.ghost.add(n.key, n.cost)
	}
	n.q.unlink(n)
}

func (s *s3fifo) bytes() int64 { return s.small.bytes + s.main.bytes }
func (s *s3fifo) len() int     { return s.small.n + s.main.n }

func (s *s3fifo) victim(skip func(*pnode) bool) *pnode {
	// Every step either returns or moves one entry (or lowers its
	// frequency, at most maxFreq times), so this bound is never reached
	// unless everything is skipped.
	mainSkips := 0
	for steps := (maxFreq + 3) * (s.small.n + s.main.n); steps >= 0; steps-- {
		// Take from small when it is over its share, when main is empty,
		// or when a whole round of main was pinned.
		if s.small.n > 0 && (s.small.bytes*10 >= s.capacity || s.main.n == 0 || mainSkips >= s.main.n) {
			n := s.small.head
			if n.freq > 0 || (skip != nil && skip(n)) {
				s.small.unlink(n)
				n.freq = 0
				if s.weighted {
					n.freq = min(n.reuse.weight(), maxFreq)
				}
				s.main.push(n)
				continue
			}
			return n
		}
		n := s.main.head
		if n == nil {
			return nil
		}
		if skip != nil && skip(n) {
			s.main.unlink(n)
			s.main.push(n)
			mainSkips++
			continue
		}
		mainSkips = 0
		if n.freq > 0 {
			n.freq--
			s.main.unlink(n)
			s.main.push(n)
			continue
		}
		return n
	}
	return nil
}

// ghost remembers keys evicted from the small queue, up to capacity bytes
// of the entries they named, in FIFO order.
type ghost struct {
	capacity int64
	bytes    int64
	head     *gnode
	tail     *gnode
	at       map[chunk.Key]*gnode
}

type gnode struct {
	key  chunk.Key
	cost int64
	next *gnode
	gone bool
}

func (g *ghost) add(k chunk.Key, cost int64) {
	if old := g.at[k]; old != nil {
		old.gone = true
		g.bytes -= old.cost
	}
	n := &gnode{key: k, cost: cost}
	g.at[k] = n
	if g.tail != nil {
		g.tail.next = n
	} else {
		g.head = n
	}
	g.tail = n
	g.bytes += cost
	for g.head != nil && (g.head.gone || g.bytes > g.capacity) {
		h := g.head
		g.head = h.next
		if g.head == nil {
			g.tail = nil
		}
		if !h.gone {
			g.bytes -= h.cost
			delete(g.at, h.key)
		}
	}
}

// take reports whether k is a ghost, forgetting it.
func (g *ghost) take(k chunk.Key) bool {
	n := g.at[k]
	if n == nil {
		return false
	}
	n.gone = true
	g.bytes -= n.cost
	delete(g.at, k)
	return true
}
