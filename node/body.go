package node

import (
	"context"
	"sync"

	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/replication"
)

// newBody returns a buffer of size bytes to receive an entry into, and its
// release, to call exactly once when nothing reads buf any more; after it
// nothing may use buf. The buffer is DRAM pages the store lends (a Put of
// exactly buf then adopts them: the entry is not copied again), or nil
// when the store cannot lend them (an entry over putUpfrontBytes, which
// must not be reserved on a header's word; the lending cap reached; no
// room in DRAM): the caller then receives into a heap buffer (n.bodies).
func (n *Node) newBody(ctx context.Context, size int) (buf []byte, release func()) {
	if size <= 0 || size > putUpfrontBytes {
		return nil, nil
	}
	l, err := n.store.Lend(ctx, size)
	if err != nil {
		return nil, nil
	}
	return l.Bytes(), l.Release
}

// recvBody receives the body of a Put stream, size bytes, and returns it
// with its release (as newBody's). lend says whether the body may be
// lent DRAM pages (lendBody, and the caller's credit). Otherwise, or when
// the store cannot lend, the body is a recycled heap buffer of upfront
// bytes that grows as data arrives. each (unless nil) sees every frame
// as it arrives (api.RecvBodyEach).
func (n *Node) recvBody(ctx context.Context, st api.MsgReceiver, size int, lend bool, upfront int, each func(mem.BufferSlice, []byte)) ([]byte, func(), error) {
	if lend {
		if buf, release := n.newBody(ctx, size); buf != nil {
			if err := api.RecvBodyEach(st, buf, each); err != nil {
				release()
				return nil, nil, err
			}
			return buf, release, nil
		}
	}
	// Room for the announced size only as data arrives (beyond
	// upfront): a header alone must not reserve MaxBlobBytes.
	blob, err := n.bodies.RecvBodyEach(st, size, upfront, each)
	if err != nil {
		return nil, nil, err
	}
	return blob, func() { n.bodies.Put(blob) }, nil
}

// Credit of Put bodies (lendCredit).
const (
	// lendCreditBytes caps a caller's credit: the DRAM its Put headers may
	// take before their bodies arrive.
	lendCreditBytes = 4 * putUpfrontBytes
	// uncreditedUpfrontBytes is the heap a Put of a caller without credit
	// gets before its data arrives.
	uncreditedUpfrontBytes = 1 << 20
	// creditCallers bounds the callers lendCredit remembers.
	creditCallers = 4096
)

// lendCredit says whose Put headers are taken at their word. Lent DRAM
// pages are taken, evicting other entries, when a Put's header arrives;
// a header alone must not evict anything. So a client's Put is lent
// pages (and forwarded to the other replicas as it arrives, where they
// are lent too) only while the client has credit: bytes of its earlier
// Put bodies that arrived whole, up to lendCreditBytes. A lend spends the
// announced size, the body's arrival earns it back; a stalled Put keeps
// what it spent. A caller without credit (a new one, or one whose Puts
// stall) is received into a heap buffer that grows as its bytes arrive
// and is stored, evicting what it must, only once whole. Cluster members
// forward what their own callers' credit let through: they need none.
type lendCredit struct {
	mu    sync.Mutex
	bytes map[string]int
}

// spend takes size from key's credit, and reports whether it had as much.
func (c *lendCredit) spend(key string, size int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bytes[key] < size {
		return false
	}
	c.bytes[key] -= size
	return true
}

// earn adds the size of a body that arrived whole to key's credit.
func (c *lendCredit) earn(key string, size int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bytes == nil {
		c.bytes = make(map[string]int)
	}
	if _, ok := c.bytes[key]; !ok && len(c.bytes) >= creditCallers {
		for k := range c.bytes { // forget one caller: it starts again from nothing
			delete(c.bytes, k)
			break
		}
	}
	c.bytes[key] = min(lendCreditBytes, c.bytes[key]+size)
}

// putCredit decides, at a Put's header, whether the caller's announced
// size is taken at its word (credited: lent pages, cut-through), and
// returns the function to call once the body arrived whole.
func (n *Node) putCredit(ctx context.Context, size int) (credited bool, arrived func()) {
	if n.sec.member(ctx) {
		return true, func() {}
	}
	key := "unknown"
	if p, ok := auth.FromContext(ctx); ok {
		key = p.Key()
	}
	return n.credit.spend(key, size), func() { n.credit.earn(key, size) }
}

// lendReplicaBody says whether a replica write's body may be received
// into lent DRAM pages: an entry's write or hint, which the store makes
// room for anyway. A repair must not evict for room (it is refused
// instead) and a rebalance is admitted only after its body arrived:
// theirs go to the heap.
func lendReplicaBody(kind replication.Kind) bool {
	return kind == replication.KindWrite || kind == replication.KindHint
}

// lendClientBody says whether a client's Put body may be received into
// lent DRAM pages. It may because StreamWrite.Finish releases it on every
// path, failed replica writes included (the transport drops its
// references to the bytes it sent), and receivePut releases it
// where no write began: lent pages never released would stay out of the
// store. An entry that this node only forwards (not one of its replicas)
// is not lent: no entry here would take the pages.
func (n *Node) lendClientBody(key chunk.Key) bool {
	r := n.meta.Ring()
	return r.Len() == 0 || r.IsReplica(key.Content, n.cfg.NodeID, n.meta.Settings().ReplicationFactor)
}

var _ replication.Transport = transport{}
