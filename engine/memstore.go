package engine

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/chunk"
)

// MemStore is an in-memory ChunkStore holding encoded entries, so a lookup
// pays the decode a real store pays. It is safe for concurrent use.
type MemStore struct {
	codec chunk.Codec

	mu      sync.Mutex
	entries map[memKey]map[chunk.Context][]byte
	bytes   int
}

type memKey struct {
	fp      chunk.Fingerprint
	content chunk.ID
}

// NewMemStore returns an empty store encoding with codec (CodecInvalid
// means CodecRaw).
func NewMemStore(codec chunk.Codec) *MemStore {
	if codec == chunk.CodecInvalid {
		codec = chunk.CodecRaw
	}
	return &MemStore{codec: codec, entries: map[memKey]map[chunk.Context][]byte{}}
}

// Put encodes and stores e, replacing an entry with the same key.
func (m *MemStore) Put(_ context.Context, e *chunk.Entry) error {
	blob, err := chunk.Encode(nil, e, m.codec)
	if err != nil {
		return fmt.Errorf("engine: memstore put: %w", err)
	}
	k := memKey{e.Key.Fingerprint, e.Key.Content}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[k] == nil {
		m.entries[k] = map[chunk.Context][]byte{}
	}
	m.bytes += len(blob) - len(m.entries[k][e.Key.Context])
	m.entries[k][e.Key.Context] = blob
	return nil
}

// Bytes is the size of the stored blobs.
func (m *MemStore) Bytes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytes
}

// rank orders the other encodings of a content: a window of the same
// context ID, then larger windows, then standalone, then other prefixes.
func rank(want, have chunk.Context) int {
	switch {
	case have == want:
		return 1 << 40
	case have.Kind == chunk.ContextWindow:
		return 1<<32 + int(have.Window)
	case have.Kind == chunk.ContextStandalone:
		return 2
	}
	return 1
}

// Lookup implements ChunkSource: the exact context if held, else the best
// other encoding, decoded and checked against the request's tokens.
func (m *MemStore) Lookup(ctx context.Context, reqs []LookupRequest) ([]*chunk.Entry, error) {
	out := make([]*chunk.Entry, len(reqs))
	for i, r := range reqs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m.mu.Lock()
		var best []byte
		var bestCx chunk.Context
		bestRank := 0
		for cx, blob := range m.entries[memKey{r.Key.Fingerprint, r.Key.Content}] {
			// Ties go to the smaller context ID, so the choice is stable.
			if rk := rank(r.Key.Context, cx); rk > bestRank || (rk == bestRank && cx.ID.Less(bestCx.ID)) {
				best, bestRank, bestCx = blob, rk, cx
			}
		}
		m.mu.Unlock()
		if best == nil {
			continue
		}
		ent, err := chunk.Decode(best, chunk.Limits{})
		if err != nil {
			return nil, fmt.Errorf("engine: memstore decode: %w", err)
		}
		if !equalTokens(ent.Tokens, r.Tokens) {
			continue // a content ID collision: treat as a miss
		}
		out[i] = ent
	}
	return out, nil
}

func equalTokens(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
