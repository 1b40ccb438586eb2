package replication

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/chunk"
)

// WriteResult says where a write went.
type WriteResult struct {
	Key      chunk.Key
	Checksum uint64
	// StoredOn are the replicas that acknowledged before Write returned
	// (at least W on success), in the order they did.
	StoredOn []string
	// Kept is the checksum of the version of Key those replicas keep: the
	// one that Wins among their answers. It is Checksum unless a replica
	// already held another version of the key that Wins over this one
	// (AlreadyStored); replicas converge on the winner.
	Kept uint64
	// Hinted are replicas that could not be reached by then and got a
	// hint; replicas still in flight may still add to them.
	Hinted []string
}

// AlreadyStored reports whether the replicas keep another version of the
// key than the one written: an earlier write's bytes that Win over these.
func (w WriteResult) AlreadyStored() bool { return w.Kept != w.Checksum }

// Write stores blob, an encoded chunk entry, on the R replicas of its
// content ID and returns once W of them stored it. Replica writes still in
// flight then go on in the background (bounded by CallTimeout), so blob
// must not be modified after the call. A replica that cannot be reached
// gets a hint on this node. With fewer than W acknowledgements the error
// wraps ErrQuorum (the replicas that did store the chunk keep it).
func (r *Replicator) Write(ctx context.Context, blob []byte) (WriteResult, error) {
	return r.WriteOwned(ctx, blob, nil)
}

// WriteOwned is Write for a caller that recycles blob: release (unless
// nil) is called once no replica write uses blob any more, when every one
// of them succeeded. After a failure it is not called: a transport may
// still read a failed stream's bytes, so blob is left to the collector.
func (r *Replicator) WriteOwned(ctx context.Context, blob []byte, release func()) (WriteResult, error) {
	r.serving.begin()
	defer r.serving.end()
	hd, err := chunk.ParseHeader(blob, r.cfg.Limits)
	if err != nil {
		return WriteResult{}, fmt.Errorf("replication: write: %w", err)
	}
	res := WriteResult{Key: hd.Key, Checksum: hd.Checksum}
	n, w := r.quorum()
	reps := r.ring().Replicas(hd.Key.Content, n)
	if len(reps) == 0 {
		return res, ErrNoReplicas
	}
	w = min(w, len(reps))
	opts := ReplicateOptions{Kind: KindWrite, At: r.now()}

	type ack struct {
		node   string
		kept   uint64
		err    error
		hinted bool
	}
	acks := make(chan ack, len(reps))
	if !r.track(len(reps)) {
		return res, ErrClosed
	}
	var left atomic.Int32
	var failed atomic.Bool
	left.Store(int32(len(reps)))
	for _, m := range reps {
		go func() {
			defer r.wg.Done()
			var a ack
			defer func() {
				if a.err != nil {
					failed.Store(true)
				}
				if left.Add(-1) == 0 && release != nil && !failed.Load() {
					release()
				}
			}()
			ctx, cancel := r.background()
			defer cancel()
			a = ack{node: m.ID}
			if m.ID == r.cfg.NodeID {
				a.kept, a.err = r.storeLocal(ctx, blob, hd.Key, opts)
			} else {
				a.kept, a.err = r.cfg.Transport.Replicate(ctx, m.ID, blob, opts)
				if a.err != nil && !errors.Is(a.err, ErrRejected) {
					a.hinted = r.addHint(m.ID, hd.Key, blob, opts.At)
				}
			}
			if a.err == nil {
				r.metrics.replicaWrites.Add(1)
			} else {
				r.metrics.replicaWriteErrors.Add(1)
			}
			acks <- a
		}()
	}
	var errs []error
	for range reps {
		select {
		case a := <-acks:
			switch {
			case a.err == nil:
				if len(res.StoredOn) == 0 || Wins(a.kept, res.Kept) {
					res.Kept = a.kept
				}
				res.StoredOn = append(res.StoredOn, a.node)
				if len(res.StoredOn) >= w {
					r.metrics.writes.Add(1)
					return res, nil
				}
			case a.hinted:
				res.Hinted = append(res.Hinted, a.node)
				errs = append(errs, fmt.Errorf("%s: %w", a.node, a.err))
			default:
				errs = append(errs, fmt.Errorf("%s: %w", a.node, a.err))
			}
		case <-ctx.Done():
			r.metrics.writeFailures.Add(1)
			return res, fmt.Errorf("replication: write %v: %w", hd.Key, ctx.Err())
		}
	}
	r.metrics.writeFailures.Add(1)
	return res, fmt.Errorf("%w: %d of %d stored %v (need %d): %w", ErrQuorum, len(res.StoredOn), len(reps), hd.Key, w, errors.Join(errs...))
}

// Wins reports whether an entry with checksum a is kept over another
// version of the same key with checksum b. Two honest producers of a chunk
// can encode slightly different bytes (GPU kernels are not bit
// deterministic); every replica keeps the smallest checksum it has seen,
// so replicas that took different first writes converge on one version
// through read repair and anti-entropy, whatever the order of arrival.
func Wins(a, b uint64) bool { return a < b }

// keepWinner settles a Put of blob (checksum sum) that found key stored
// with other bytes: the version that Wins stays, and its checksum is
// returned. It runs under key's lock.
func (r *Replicator) keepWinner(ctx context.Context, blob []byte, key chunk.Key, sum uint64) (uint64, error) {
	got, err := r.cfg.Store.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		_, err = r.cfg.Store.Put(ctx, blob) // gone since (evicted): store ours
		return sum, err
	}
	if err != nil {
		return 0, err
	}
	ours, err := chunk.ParseHeader(got.Bytes(), r.cfg.Limits)
	got.Release()
	if err != nil {
		return 0, err
	}
	if !Wins(sum, ours.Checksum) {
		return ours.Checksum, nil // ours stays: the write is already stored, as the winner
	}
	if err := r.cfg.Store.DeleteIf(key, ours.Checksum); err != nil && !errors.Is(err, ErrNotFound) {
		return 0, err
	}
	_, err = r.cfg.Store.Put(ctx, blob)
	return sum, err
}

// storeLocal puts blob in the local store as a replica write of kind
// opts.Kind (see ServeReplicate) and returns the checksum of the version
// of key the store keeps. Refusals wrap ErrRejected.
func (r *Replicator) storeLocal(ctx context.Context, blob []byte, key chunk.Key, opts ReplicateOptions) (uint64, error) {
	mu := r.lockKey(key)
	defer mu.Unlock()
	t, hasTomb := r.tombs.get(key)
	if hasTomb && t.deleted && (opts.At == 0 || opts.At <= t.at) {
		return 0, fmt.Errorf("%w: %w: %v", ErrRejected, ErrTombstoned, key)
	}
	if opts.Kind == KindRepair {
		if rc, ok := r.cfg.Store.(RoomChecker); ok && !rc.HasRoom(len(blob)) {
			return 0, fmt.Errorf("%w: %w: %v (%d bytes)", ErrRejected, ErrNoRoom, key, len(blob))
		}
	}
	hd, err := r.cfg.Store.Put(ctx, blob)
	kept := hd.Checksum
	if errors.Is(err, ErrConflict) {
		if hd, err = chunk.ParseHeader(blob, r.cfg.Limits); err == nil {
			kept, err = r.keepWinner(ctx, blob, key, hd.Checksum)
		}
	}
	if err != nil {
		if errors.Is(err, ErrConflict) || errors.Is(err, chunk.ErrCorrupt) || errors.Is(err, chunk.ErrTooLarge) ||
			errors.Is(err, chunk.ErrUnsupported) || errors.Is(err, chunk.ErrInvalidEntry) {
			return 0, fmt.Errorf("%w: %w", ErrRejected, err)
		}
		return 0, err
	}
	if hasTomb && opts.At > t.at {
		// A write newer than the delete: remember it, so that the older
		// tombstone on another replica does not win in anti-entropy.
		if err := r.tombs.set(key, opts.At, false); err != nil {
			r.log.Warn("recording write after delete", "key", key, "err", err)
		}
	}
	return kept, nil
}

// DeleteResult says where a delete went.
type DeleteResult struct {
	// DeletedOn are the replicas that recorded the delete.
	DeletedOn []string
}

// Delete deletes key on its replicas (and here), leaving tombstones so
// that neither hints nor anti-entropy bring it back. It waits for every
// replica (or ctx); a replica that is down learns the delete from the
// others' anti-entropy. The error wraps ErrQuorum when fewer than W
// replicas recorded it.
func (r *Replicator) Delete(ctx context.Context, key chunk.Key) (DeleteResult, error) {
	var res DeleteResult
	n, w := r.quorum()
	reps := r.ring().Replicas(key.Content, n)
	if len(reps) == 0 {
		return res, ErrNoReplicas
	}
	w = min(w, len(reps))
	at := r.now()
	r.hints.dropKey(key, at)
	self := false
	type ack struct {
		node string
		err  error
	}
	acks := make(chan ack, len(reps))
	for _, m := range reps {
		if m.ID == r.cfg.NodeID {
			self = true
			acks <- ack{m.ID, r.applyDelete(key, at)}
			continue
		}
		go func() { acks <- ack{m.ID, r.cfg.Transport.Delete(ctx, m.ID, key, at)} }()
	}
	if !self {
		// A non-replica may still hold a copy (a rebalance in progress).
		if err := r.cfg.Store.Delete(key); err != nil && !errors.Is(err, ErrNotFound) {
			r.log.Warn("deleting local copy", "key", key, "err", err)
		}
	}
	var errs []error
	for range reps {
		a := <-acks // every call returns once ctx ends
		if a.err == nil {
			res.DeletedOn = append(res.DeletedOn, a.node)
		} else {
			errs = append(errs, fmt.Errorf("%s: %w", a.node, a.err))
		}
	}
	r.metrics.deletes.Add(1)
	if len(res.DeletedOn) < w {
		return res, fmt.Errorf("%w: delete %v recorded on %d of %d (need %d): %w", ErrQuorum, key, len(res.DeletedOn), len(reps), w, errors.Join(errs...))
	}
	return res, nil
}

// applyDelete records a tombstone at time at and deletes the local copy.
func (r *Replicator) applyDelete(key chunk.Key, at int64) error {
	mu := r.lockKey(key)
	defer mu.Unlock()
	if t, ok := r.tombs.get(key); ok && t.at >= at {
		if t.deleted {
			return nil
		}
		// A write newer than this delete is recorded: it wins.
		return nil
	}
	if err := r.tombs.set(key, at, true); err != nil {
		return fmt.Errorf("replication: recording tombstone: %w", err)
	}
	if err := r.cfg.Store.Delete(key); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("replication: delete %v: %w", key, err)
	}
	return nil
}
