package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
)

// ServeReplicate handles a blob sent by another node (Peer.Replicate).
// hd is blob's header, parsed once where the blob was received (node's
// receive path with chunk.Verify, the in-memory transport with
// chunk.ParseHeader); the store checks blob again as it stores it.
//
//   - KindWrite and KindHint store it unless a tombstone at least as new as
//     opts.At exists (ErrTombstoned).
//   - KindRepair refuses a tombstoned key, and a store without room
//     (RoomChecker).
//   - KindRebalance stores it within the receiver's budget (inbox.go):
//     it may wait for a slot and for serving calls to finish, and fails
//     with ErrBusy (not a refusal) when the budget stays spent.
//
// Whatever the kind, a blob for a key stored with other bytes is not an
// error: the version that Wins (the smaller checksum) is kept.
//
// It returns the checksum of the version this node keeps.
//
// Refusals wrap ErrRejected (node maps them to a gRPC status the sending
// Transport turns back into ErrRejected); other errors mean "try again".
func (r *Replicator) ServeReplicate(ctx context.Context, blob []byte, hd chunk.Header, opts ReplicateOptions) (kept uint64, err error) {
	if opts.Kind < KindWrite || opts.Kind > KindRebalance {
		return 0, fmt.Errorf("%w: unknown kind %v", ErrRejected, opts.Kind)
	}
	if opts.Kind == KindWrite && opts.At == 0 {
		// A sender that cannot carry the write's time: the receipt time
		// is close to it, and a write must not be refused by an older
		// tombstone.
		opts.At = r.now()
	}
	if opts.Kind == KindRebalance {
		// The receiver's budget (inbox.go): a slot, a gap in serving,
		// the byte rate; ErrBusy tells the sender to come back later.
		r.rebalanceSeen.Store(r.cfg.Now().UnixNano())
		kept, err = r.storeThroughInbox(ctx, blob, hd.Key, opts, true)
	} else {
		kept, err = r.storeLocal(ctx, blob, hd.Key, opts)
	}
	if err == nil {
		r.metrics.served.Add(1)
	}
	return kept, err
}

// ServeFetch lends this node's blob for key (Peer.Fetch with direct
// set), or for a version of an opaque value retired here the newest held
// (versions.go); the caller releases it once sent. Absent keys wrap ErrNotFound,
// and also ErrRecovering while this node refills after a restart (it may
// still receive the key). It counts as serving (incoming rebalance work
// yields to it) until released.
func (r *Replicator) ServeFetch(ctx context.Context, key chunk.Key) (pinned.Bytes, error) {
	r.serving.begin()
	b, got, err := r.getVersion(ctx, key)
	if err == nil {
		if verr := r.checkLocal(b.Bytes(), got, false); verr != nil {
			b.Release()
			err = verr
		}
	}
	if errors.Is(err, chunk.ErrCorrupt) {
		// Answered as absent, so the reader asks another replica; the
		// replica check DropCorrupt queues repairs this node.
		r.DropCorrupt(got, err)
		err = fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		r.serving.end()
		if errors.Is(err, ErrNotFound) && r.cfg.Recovering() {
			err = fmt.Errorf("%w: %w", ErrRecovering, err)
		}
		return pinned.Bytes{}, err
	}
	return b.Then((*endServing)(r.serving)), nil
}

// ServeDelete records a delete of key at time at and removes the local
// copy (Client.Delete with direct set).
func (r *Replicator) ServeDelete(ctx context.Context, key chunk.Key, at int64) error {
	if at <= 0 {
		at = r.now()
	}
	return r.applyDelete(key, at)
}

// Statter is implemented by a Store that can tell a key's checksum and size
// without reading it. Digests of explicit keys use it; without it they
// scan the store.
type Statter interface {
	Stat(key chunk.Key) (checksum uint64, size int, err error)
}

// ServeDigest answers a DigestRequest (Peer.Digest).
func (r *Replicator) ServeDigest(ctx context.Context, req DigestRequest) (DigestResponse, error) {
	if len(req.Keys) > 0 {
		return DigestResponse{Epoch: r.ring().Epoch(), Items: r.keyItems(req.Keys)}, nil
	}
	rg := r.ring()
	if rg.Epoch() != req.Epoch {
		return DigestResponse{Epoch: rg.Epoch()}, fmt.Errorf("%w: asked for %d, at %d", ErrEpochMismatch, req.Epoch, rg.Epoch())
	}
	if req.Replicas <= 0 || req.From == "" || !rg.Contains(req.From) {
		return DigestResponse{}, fmt.Errorf("%w: bad digest request from %q", ErrRejected, req.From)
	}
	pairs := newPairSet(rg, r.cfg.NodeID, []string{req.From}, req.Replicas)
	switch {
	case len(req.Split) > 0:
		if len(req.Split) > maxSplit {
			return DigestResponse{}, fmt.Errorf("%w: %d buckets to split, at most %d", ErrRejected, len(req.Split), maxSplit)
		}
		return DigestResponse{Epoch: rg.Epoch(), Table: pairs.subTables(r.localItems, 0, req.Split)}, nil
	case len(req.Ranges) > 0:
		if len(req.Ranges) > maxRanges {
			return DigestResponse{}, fmt.Errorf("%w: %d ranges, at most %d", ErrRejected, len(req.Ranges), maxRanges)
		}
		want := make(map[uint32]bool, len(req.Ranges))
		for _, b := range req.Ranges {
			want[b] = true
		}
		return DigestResponse{Epoch: rg.Epoch(), Items: pairs.items(r.localItems, 0, want)}, nil
	}
	return DigestResponse{Epoch: rg.Epoch(), Table: pairs.tables(r.localItems)[0]}, nil
}

// Container is implemented by a Store that can tell cheaply whether it
// holds a key. Digests of many explicit keys (a rebalance asking a new
// owner what it lacks) use it when the Store is no Statter, answering with
// Checksum 0 (unknown).
type Container interface {
	Contains(key chunk.Key) bool
}

// keyItems returns the items of keys held here (live or tombstones),
// sorted by key. Checksum is 0 where the Store could only say it holds
// the key.
func (r *Replicator) keyItems(keys []chunk.Key) []DigestItem {
	var out []DigestItem
	st, hasStat := r.cfg.Store.(Statter)
	ct, hasContains := r.cfg.Store.(Container)
	if !hasStat && !hasContains && len(keys) > 4 {
		// One scan instead of a read per key.
		want := make(map[chunk.Key]bool, len(keys))
		for _, k := range keys {
			want[k] = true
		}
		r.localItems(func(it DigestItem) bool {
			if want[it.Key] {
				out = append(out, it)
			}
			return true
		})
	} else {
		for _, k := range keys {
			if t, ok := r.tombs.get(k); ok && t.deleted {
				out = append(out, DigestItem{Key: k, Deleted: true, At: t.at})
				continue
			}
			it := DigestItem{Key: k, At: r.liveAt(k)}
			switch {
			case hasStat:
				sum, size, err := st.Stat(k)
				if err != nil {
					continue
				}
				it.Checksum, it.Size = sum, size
			case len(keys) <= 4:
				// Few keys (a read-repair check): read the header.
				b, err := r.cfg.Store.Get(context.Background(), k)
				if err != nil {
					continue
				}
				hd, err := chunk.ParseHeader(b.Bytes(), r.cfg.Limits)
				it.Checksum, it.Size = hd.Checksum, b.Len()
				b.Release()
				if err != nil {
					continue
				}
			default:
				if !ct.Contains(k) {
					continue
				}
			}
			out = append(out, it)
		}
	}
	slices.SortFunc(out, func(a, b DigestItem) int { return chunk.CompareKeys(a.Key, b.Key) })
	return out
}

// localItems calls fn for every key held here: live entries of the store
// (with the time of a recorded write-after-delete) and tombstones.
func (r *Replicator) localItems(fn func(DigestItem) bool) {
	recs := r.tombs.list()
	byKey := make(map[chunk.Key]tomb, len(recs))
	for _, t := range recs {
		byKey[t.key] = t.tomb
	}
	stopped := false
	r.cfg.Store.Scan(func(k chunk.Key, sum uint64, size int) bool {
		it := DigestItem{Key: k, Checksum: sum, Size: size}
		if t, ok := byKey[k]; ok {
			if t.deleted {
				return true // a delete in flight; the tombstone stands for it
			}
			it.At = t.at
		}
		if !fn(it) {
			stopped = true
			return false
		}
		return true
	})
	if stopped {
		return
	}
	for _, t := range recs {
		if t.deleted && !fn(DigestItem{Key: t.key, Deleted: true, At: t.at}) {
			return
		}
	}
}

// isRejected reports whether err is a definite refusal.
func isRejected(err error) bool { return errors.Is(err, ErrRejected) }
