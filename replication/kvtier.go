package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/pinned"
)

// KVTierStore adapts a *kvtier.Store to Store, RoomChecker and Container: it maps
// kvtier's sentinel errors to this package's (keeping both in the chain)
// and hands out kvtier's pinned views without copying.
type KVTierStore struct {
	S *kvtier.Store
	// Put options for chunks stored through replication (e.g. a TTL).
	PutOptions kvtier.PutOptions
}

// NewKVTierStore wraps s.
func NewKVTierStore(s *kvtier.Store) *KVTierStore { return &KVTierStore{S: s} }

func mapKVTierErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kvtier.ErrNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, kvtier.ErrConflict):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

// Put implements Store.
func (k *KVTierStore) Put(ctx context.Context, blob []byte) (chunk.Header, error) {
	hd, err := k.S.Put(ctx, blob, k.PutOptions)
	return hd, mapKVTierErr(err)
}

// Get implements Store; the blob is kvtier's pinned view.
func (k *KVTierStore) Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error) {
	b, err := k.S.Get(ctx, key)
	return b, mapKVTierErr(err)
}

// Delete implements Store.
func (k *KVTierStore) Delete(key chunk.Key) error { return mapKVTierErr(k.S.Delete(key)) }

// DeleteIf implements Store.
func (k *KVTierStore) DeleteIf(key chunk.Key, checksum uint64) error {
	return mapKVTierErr(k.S.DeleteIf(key, checksum))
}

// Contains implements Container.
func (k *KVTierStore) Contains(key chunk.Key) bool { return k.S.Contains(key) }

// Scan implements Store.
func (k *KVTierStore) Scan(fn func(key chunk.Key, checksum uint64, size int) bool) { k.S.Scan(fn) }

// HasRoom implements RoomChecker: some enabled DRAM or disk tier has size
// bytes free without evicting. It walks kvtier's Stats (O(entries)), which
// is acceptable for repairs, not for a hot path.
func (k *KVTierStore) HasRoom(size int) bool {
	st := k.S.Stats()
	for _, t := range []kvtier.Tier{kvtier.TierDRAM, kvtier.TierDisk} {
		ts := st.Tiers[t]
		if ts.Enabled && ts.Budget-ts.Bytes >= int64(size) {
			return true
		}
	}
	return false
}
