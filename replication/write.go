package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
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
// nil) is called once no replica write uses blob any more, whatever the
// outcome: the transport drops its references to the bytes it sent, and
// a write that fails before any replica write began releases blob at
// once.
func (r *Replicator) WriteOwned(ctx context.Context, blob []byte, release func()) (WriteResult, error) {
	hd, err := chunk.ParseHeader(blob, r.cfg.Limits)
	if err != nil {
		releaseNow(release)
		return WriteResult{}, fmt.Errorf("replication: write: %w", err)
	}
	sw, err := r.BeginWrite(hd.Key, len(blob))
	if err != nil {
		releaseNow(release)
		return WriteResult{Key: hd.Key, Checksum: hd.Checksum}, err
	}
	return sw.Finish(ctx, blob, hd.Checksum, release)
}

// Piece is part of an entry in transit whose owner recycles its bytes:
// they stay valid and unchanged until every reference is dropped. Ref
// takes a reference and Free drops one. A transport sends a piece of a
// kind it knows (node's are the gRPC frames it received) as it is, and
// any other by its Parts.
type Piece interface {
	// Parts appends the piece's bytes, in order, to dst.
	Parts(dst [][]byte) [][]byte
	Len() int
	Ref()
	Free()
}

// ReplicaStream carries one entry to one replica while the entry is
// still arriving.
type ReplicaStream interface {
	// Send sends the next bytes of the entry. The stream takes its own
	// references to p and drops them once it no longer reads p; the
	// caller keeps its reference.
	Send(p Piece) error
	// Close ends the entry and returns the checksum of the version the
	// replica keeps (as Transport.Replicate).
	Close() (kept uint64, err error)
	// Abort ends the stream: the replica stores nothing.
	Abort()
}

// ErrNoStreamNow is a Transport's answer to OpenReplicate when it cannot open a
// stream without waiting (the connection to the replica is not up).
var ErrNoStreamNow = errors.New("replication: no stream to the replica now")

// StreamWrite is a write of an entry that is still arriving: BeginWrite
// opens it once the key and size are known, Send passes each piece to
// the remote replicas, and Finish (once the entry is whole and checked)
// or Abort ends it. One goroutine uses it; every StreamWrite is ended.
type StreamWrite struct {
	r       *Replicator
	key     chunk.Key
	size    int
	w       int
	opts    ReplicateOptions
	reps    []ring.Member
	streams []*replicaStream // one per remote replica of reps, in order
	sent    int
	ended   bool
}

// replicaStream is a StreamWrite's stream to one remote replica. st is
// nil where none could be opened at once (ErrNoStreamNow) or after a
// failure (err).
type replicaStream struct {
	node   string
	st     ReplicaStream
	cancel context.CancelFunc
	err    error
}

// BeginWrite opens a write of an entry of size bytes under key on the R
// replicas of its content ID: streams to the remote ones. It does not wait for a replica: the
// streams outlive the caller's call (CallTimeout bounds them), and one
// that cannot be opened at once is opened at Finish. A replica whose
// stream fails gets a hint at Finish, as a failed write does.
func (r *Replicator) BeginWrite(key chunk.Key, size int) (*StreamWrite, error) {
	n, w := r.quorum()
	reps := r.ring().Replicas(key.Content, n)
	if len(reps) == 0 {
		return nil, ErrNoReplicas
	}
	r.serving.begin()
	sw := &StreamWrite{r: r, key: key, size: size, w: min(w, len(reps)), reps: reps,
		opts: ReplicateOptions{Kind: KindWrite, At: r.now()}}
	for _, m := range reps {
		if m.ID == r.cfg.NodeID {
			continue
		}
		rs := &replicaStream{node: m.ID}
		sw.streams = append(sw.streams, rs)
		sctx, cancel := r.background()
		rs.st, rs.err = r.cfg.Transport.OpenReplicate(sctx, m.ID, key, size, sw.opts, false)
		if rs.err != nil {
			if errors.Is(rs.err, ErrNoStreamNow) {
				rs.err = nil // opened at Finish, sent whole
			}
			rs.st = nil
			cancel()
			continue
		}
		rs.cancel = cancel
	}
	return sw, nil
}

// Send passes p, the next bytes of the entry, to every remote replica's
// stream. A replica whose stream fails is dropped from the write (it gets
// a hint at Finish); Send itself does not fail.
func (sw *StreamWrite) Send(p Piece) {
	sw.sent += p.Len()
	for _, rs := range sw.streams {
		if rs.st == nil {
			continue
		}
		if err := rs.st.Send(p); err != nil {
			rs.fail(err)
		}
	}
}

func (rs *replicaStream) fail(err error) {
	rs.st.Abort()
	rs.cancel()
	rs.st, rs.err = nil, err
}

// Abort ends the write without storing anything: the entry turned out
// invalid or its sender went away.
func (sw *StreamWrite) Abort() {
	if sw.ended {
		return
	}
	sw.ended = true
	for _, rs := range sw.streams {
		if rs.st != nil {
			rs.fail(errAborted)
		}
	}
	sw.r.serving.end()
}

var errAborted = errors.New("replication: write aborted")

// releaseNow runs release (unless nil) for a write that ends before any
// replica write read its blob.
func releaseNow(release func()) {
	if release != nil {
		release()
	}
}

// heldBlob is the Piece of a whole blob that Finish lends to the replica
// streams; release runs when the last reference is dropped.
type heldBlob struct {
	data    []byte
	refs    atomic.Int32
	release func()
}

func (b *heldBlob) Parts(dst [][]byte) [][]byte { return append(dst, b.data) }
func (b *heldBlob) Len() int                    { return len(b.data) }
func (b *heldBlob) Ref()                        { b.refs.Add(1) }
func (b *heldBlob) Free() {
	if b.refs.Add(-1) == 0 && b.release != nil {
		b.release()
	}
}

// tailPiece is the part of a heldBlob from an offset on.
type tailPiece struct {
	*heldBlob
	off int
}

func (t tailPiece) Parts(dst [][]byte) [][]byte { return append(dst, t.data[t.off:]) }
func (t tailPiece) Len() int                    { return len(t.data) - t.off }

// Finish completes the write of blob, the whole entry (checksum sum),
// whose first bytes went through Send: it sends the rest, stores blob
// here if this node is a replica, and returns once W replicas stored it.
// Replica writes still in flight then go on in the background (bounded
// by CallTimeout), so blob must not be modified after the call; release
// is called as WriteOwned says. A replica that cannot be reached gets a
// hint on this node. With fewer than W acknowledgements the error wraps
// ErrQuorum (the replicas that did store the chunk keep it; a version of
// an opaque value is withdrawn here, versions.go).
func (sw *StreamWrite) Finish(ctx context.Context, blob []byte, sum uint64, release func()) (WriteResult, error) {
	r := sw.r
	if sw.ended {
		releaseNow(release)
		return WriteResult{}, errAborted
	}
	sw.ended = true
	defer r.serving.end()
	res := WriteResult{Key: sw.key, Checksum: sum}
	if len(blob) != sw.size || sw.sent > len(blob) {
		for _, rs := range sw.streams {
			if rs.st != nil {
				rs.fail(errAborted)
			}
		}
		releaseNow(release)
		return res, fmt.Errorf("replication: write %v: %d bytes sent of an entry of %d, finished with %d", sw.key, sw.sent, sw.size, len(blob))
	}
	type ack struct {
		node   string
		kept   uint64
		err    error
		hinted bool
	}
	reps := sw.reps
	acks := make(chan ack, len(reps))
	if !r.track(len(reps)) {
		for _, rs := range sw.streams {
			if rs.st != nil {
				rs.fail(ErrClosed)
			}
		}
		releaseNow(release)
		return res, ErrClosed
	}
	// The streams hold the blob through a Piece: release runs once the
	// last of them and this call drop it.
	held := &heldBlob{data: blob, release: release}
	held.refs.Store(1)
	var left atomic.Int32
	left.Store(int32(len(reps)))
	done := func() {
		if left.Add(-1) == 0 {
			held.Free()
		}
	}
	// A version of an opaque value stored here by its own write retires
	// the older versions only once the write is acknowledged; a write
	// that fails is withdrawn here before Finish returns (versions.go).
	// outcome says which, once: true for acknowledged, or not known (ctx
	// ended first).
	outcome := make(chan bool, 1)
	hint := func(a *ack) {
		if a.err != nil && !errors.Is(a.err, ErrRejected) {
			a.hinted = r.addHint(a.node, sw.key, blob, sw.opts.At)
		}
	}
	i := 0
	for _, m := range reps {
		var rs *replicaStream
		if m.ID != r.cfg.NodeID {
			rs = sw.streams[i]
			i++
		}
		go func() {
			defer r.wg.Done()
			a := ack{node: m.ID}
			defer done()
			switch {
			case rs == nil:
				ctx, cancel := r.background()
				defer cancel()
				a.kept, a.err = r.store(ctx, blob, sw.key, sw.opts, !versioned(sw.key))
				if a.err == nil && versioned(sw.key) {
					defer func() {
						if <-outcome {
							r.settleOwn(sw.key, true)
						}
					}()
				}
			case rs.st != nil:
				a.kept, a.err = rs.finish(held, sw.sent)
				hint(&a)
			case rs.err != nil:
				a.err = rs.err
				hint(&a)
			default: // no stream could be opened at once: one now, sent whole
				a.kept, a.err = sw.openLate(rs, held)
				hint(&a)
			}
			if a.err == nil {
				r.metrics.replicaWrites.Add(1)
			} else {
				r.metrics.replicaWriteErrors.Add(1)
			}
			acks <- a
		}()
	}
	w := sw.w
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
					outcome <- true
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
			outcome <- true // the replicas still writing may take it
			return res, fmt.Errorf("replication: write %v: %w", sw.key, ctx.Err())
		}
	}
	r.metrics.writeFailures.Add(1)
	outcome <- false
	if versioned(sw.key) && slices.Contains(res.StoredOn, r.cfg.NodeID) {
		r.settleOwn(sw.key, false) // before the caller hears of the failure
	}
	return res, fmt.Errorf("%w: %d of %d stored %v (need %d): %w", ErrQuorum, len(res.StoredOn), len(reps), sw.key, w, errors.Join(errs...))
}

// openLate opens rs's stream, waiting for its connection, and sends it
// the whole blob.
func (sw *StreamWrite) openLate(rs *replicaStream, held *heldBlob) (uint64, error) {
	ctx, cancel := sw.r.background()
	st, err := sw.r.cfg.Transport.OpenReplicate(ctx, rs.node, sw.key, sw.size, sw.opts, true)
	if err != nil {
		cancel()
		return 0, err
	}
	rs.st, rs.cancel = st, cancel
	return rs.finish(held, 0)
}

// finish sends blob's bytes from off on and closes the stream.
func (rs *replicaStream) finish(held *heldBlob, off int) (uint64, error) {
	defer rs.cancel()
	if off < len(held.data) {
		if err := rs.st.Send(tailPiece{held, off}); err != nil {
			rs.st.Abort()
			return 0, err
		}
	}
	return rs.st.Close()
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
	return r.store(ctx, blob, key, opts, true)
}

// store is storeLocal; retire says whether a version of an opaque value
// retires the older ones now (versions.go).
func (r *Replicator) store(ctx context.Context, blob []byte, key chunk.Key, opts ReplicateOptions, retire bool) (uint64, error) {
	mu := r.lockKey(key)
	defer mu.Unlock()
	t, hasTomb := r.tombs.get(key)
	if hasTomb && t.deleted && (opts.At == 0 || opts.At <= t.at) {
		return 0, fmt.Errorf("%w: %w: %v", ErrRejected, ErrTombstoned, key)
	}
	if err := r.supersededLocked(key); err != nil {
		return 0, err
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
	if retire {
		r.retireOlderLocked(key, r.now())
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
	r.retireOlderLocked(key, at)
	return nil
}
