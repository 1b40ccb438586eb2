package node

import (
	"context"

	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/api"
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
// lent DRAM pages (lendBody). Otherwise, or when the store cannot
// lend, the body is a recycled heap buffer that grows as data arrives.
// each (unless nil) sees every frame as it arrives (api.RecvBodyEach).
func (n *Node) recvBody(ctx context.Context, st api.MsgReceiver, size int, lend bool, each func(mem.BufferSlice, []byte)) ([]byte, func(), error) {
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
	// putUpfrontBytes): a header alone must not reserve MaxBlobBytes.
	blob, err := n.bodies.RecvBodyEach(st, size, putUpfrontBytes, each)
	if err != nil {
		return nil, nil, err
	}
	return blob, func() { n.bodies.Put(blob) }, nil
}

// lendBody says whether a Put stream's body may be received into lent
// DRAM pages: an entry's write or hint, which the store makes room for
// anyway. A repair must not evict for room (it is refused instead) and a
// rebalance is admitted only after its body arrived: theirs go to the
// heap. A client's entry may be lent because replication.WriteOwned and
// StreamWrite.Finish release it on every path with a StreamTransport,
// which the node's transport is (asserted below), failed replica writes
// included: lent pages never released would stay out of the store. A
// client's entry that this node only forwards (not one of its replicas)
// is not lent: no entry here would take the pages.
func (n *Node) lendBody(direct bool, hdr *api.PutHeader, key chunk.Key) bool {
	if k := replication.Kind(hdr.Kind); k != 0 && k != replication.KindWrite && k != replication.KindHint {
		return false
	}
	if direct || hdr.Direct {
		return true
	}
	r := n.meta.Ring()
	return r.Len() == 0 || r.IsReplica(key.Content, n.cfg.NodeID, n.meta.Settings().ReplicationFactor)
}

var _ replication.StreamTransport = transport{}
