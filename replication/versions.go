package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
)

// Versions of an opaque value (chunk/opaque.go) are keys of their own: one
// content ID, one opaque context per version. A replica never chooses
// between two values of a key by their bytes; it keeps the newest version
// (chunk.OpaqueNewer) and retires the older ones, each with a tombstone,
// so that no hint, repair, rebalance or anti-entropy brings an older
// version back:
//
//   - a version older than one the replica holds, or than one it deleted,
//     is refused as tombstoned (and tombstoned here, so anti-entropy
//     deletes it on the replica that offered it);
//   - storing a version retires the older ones held here, except on the
//     node whose write it is: there they are retired once W replicas
//     acknowledged it, and a write that fails its quorum with every
//     replica answered is withdrawn (this node's copy and hints dropped,
//     without a tombstone), so the value it would replace stays here; a
//     replica that took it keeps it, and it may still become the value;
//   - a delete of a version retires the older ones held here too, so that
//     a key deleted at its newest version has no value left;
//   - a read of a version (Read, ServeFetch) that is retired here is
//     served by the newest version held here, which is newer: a reader
//     that found a version never misses because a SET replaced it.
//
// This needs a Store that lists the versions it holds (Encodings); with
// another Store every version is kept, and readers still pick the newest.

// Encodings is implemented by a Store that can list the keys it holds of
// one content ID of one model, whatever their context.
type Encodings interface {
	Encodings(fp chunk.Fingerprint, content chunk.ID) []chunk.Key
}

// versioned reports whether key is a version of an opaque value.
func versioned(key chunk.Key) bool { return key.Context.Kind == chunk.ContextOpaque }

// supersededLocked reports (as ErrTombstoned) a version of an opaque value
// that is older than one held or deleted here, and tombstones it. It runs
// under key's lock, which every version of the key shares.
func (r *Replicator) supersededLocked(key chunk.Key) error {
	if !versioned(key) {
		return nil
	}
	newer := false
	if v, ok := r.tombs.newestDeleted(key); ok && !chunk.OpaqueNewer(key.Context, chunk.OpaqueContextAt(v)) {
		newer = true
	}
	if es, ok := r.cfg.Store.(Encodings); ok && !newer {
		for _, k := range es.Encodings(key.Fingerprint, key.Content) {
			if versioned(k) && chunk.OpaqueNewer(k.Context, key.Context) {
				newer = true
				break
			}
		}
	}
	if !newer {
		return nil
	}
	if err := r.tombs.set(key, r.now(), true); err != nil {
		r.log.Warn("recording a superseded version", "key", key, "err", err)
	}
	return fmt.Errorf("%w: %w: %v (a newer version of the value is held or deleted here)", ErrRejected, ErrTombstoned, key)
}

// retireOlderLocked deletes, with a tombstone at time at, every version of
// key's value held here that is older than key. It runs under key's lock.
func (r *Replicator) retireOlderLocked(key chunk.Key, at int64) {
	es, ok := r.cfg.Store.(Encodings)
	if !versioned(key) || !ok {
		return
	}
	for _, k := range es.Encodings(key.Fingerprint, key.Content) {
		if !versioned(k) || !chunk.OpaqueNewer(key.Context, k.Context) {
			continue
		}
		if err := r.tombs.set(k, at, true); err != nil {
			r.log.Warn("recording a retired version", "key", k, "err", err)
			continue
		}
		if err := r.cfg.Store.Delete(k); err != nil && !errors.Is(err, ErrNotFound) {
			r.log.Warn("retiring an older version", "key", k, "err", err)
		}
	}
}

// settleOwn ends this node's part in its own write of key, a version of an
// opaque value stored here: acknowledged (or not known) retires the older
// versions held here, failed withdraws it.
func (r *Replicator) settleOwn(key chunk.Key, acknowledged bool) {
	mu := r.lockKey(key)
	defer mu.Unlock()
	if acknowledged {
		r.retireOlderLocked(key, r.now())
		return
	}
	r.hints.dropKey(key, r.now())
	if err := r.cfg.Store.Delete(key); err != nil && !errors.Is(err, ErrNotFound) {
		r.log.Warn("withdrawing a failed write", "key", key, "err", err)
	}
}

// getVersion is Store.Get of key, except that a version of an opaque value
// gone here (retired) is served by the newest version held here, newer
// than it. It returns the key of the copy it lends.
func (r *Replicator) getVersion(ctx context.Context, key chunk.Key) (pinned.Bytes, chunk.Key, error) {
	b, err := r.cfg.Store.Get(ctx, key)
	es, ok := r.cfg.Store.(Encodings)
	if err == nil || !versioned(key) || !ok || !errors.Is(err, ErrNotFound) {
		return b, key, err
	}
	newest := key
	for _, k := range es.Encodings(key.Fingerprint, key.Content) {
		if versioned(k) && chunk.OpaqueNewer(k.Context, newest.Context) {
			newest = k
		}
	}
	if newest == key {
		return b, key, err
	}
	nb, nerr := r.cfg.Store.Get(ctx, newest)
	if nerr != nil {
		return b, key, err // gone too: the miss of key
	}
	return nb, newest, nil
}

// serves reports whether a copy named got serves a read of key: key
// itself, or a newer version of the same opaque value.
func serves(got, key chunk.Key) bool {
	return got == key || versioned(key) && versioned(got) && got.Fingerprint == key.Fingerprint &&
		got.Content == key.Content && chunk.OpaqueNewer(got.Context, key.Context)
}
