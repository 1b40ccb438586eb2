package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/pinned"
	"github.com/kvmesh/kvmesh/replication"
)

// replStore is the node's kvtier store as replication sees it: a
// replication.Store, RoomChecker, Container and Encodings. It maps kvtier's sentinel
// errors to replication's (keeping both in the chain) and lends kvtier's
// pinned views without copying.
type replStore struct{ s *kvtier.Store }

var (
	_ replication.Store       = replStore{}
	_ replication.RoomChecker = replStore{}
	_ replication.Container   = replStore{}
	_ replication.Encodings   = replStore{}
)

func mapKVTierErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kvtier.ErrNotFound):
		return fmt.Errorf("%w: %w", replication.ErrNotFound, err)
	case errors.Is(err, kvtier.ErrConflict):
		return fmt.Errorf("%w: %w", replication.ErrConflict, err)
	}
	return err
}

// Put implements Store.
func (k replStore) Put(ctx context.Context, blob []byte) (chunk.Header, error) {
	hd, err := k.s.Put(ctx, blob, kvtier.PutOptions{})
	return hd, mapKVTierErr(err)
}

// Get implements Store; the blob is kvtier's pinned view.
func (k replStore) Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error) {
	b, err := k.s.Get(ctx, key)
	return b, mapKVTierErr(err)
}

// Delete implements Store.
func (k replStore) Delete(key chunk.Key) error { return mapKVTierErr(k.s.Delete(key)) }

// DeleteIf implements Store.
func (k replStore) DeleteIf(key chunk.Key, checksum uint64) error {
	return mapKVTierErr(k.s.DeleteIf(key, checksum))
}

// Contains implements Container.
func (k replStore) Contains(key chunk.Key) bool { return k.s.Contains(key) }

// Encodings implements Encodings.
func (k replStore) Encodings(fp chunk.Fingerprint, content chunk.ID) []chunk.Key {
	return k.s.Encodings(fp, content)
}

// Scan implements Store.
func (k replStore) Scan(fn func(key chunk.Key, checksum uint64, size int) bool) { k.s.Scan(fn) }

// HasRoom implements RoomChecker: some enabled DRAM or disk tier has size
// bytes free without evicting. It walks kvtier's Stats (O(entries)), which
// is acceptable for repairs, not for a hot path.
func (k replStore) HasRoom(size int) bool {
	st := k.s.Stats()
	for _, t := range []kvtier.Tier{kvtier.TierDRAM, kvtier.TierDisk} {
		ts := st.Tiers[t]
		if ts.Enabled && ts.Budget-ts.Bytes >= int64(size) {
			return true
		}
	}
	return false
}
