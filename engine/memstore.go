package engine

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/chunk"
)

// MemStore is an in-memory ChunkStore: a host-DRAM store of ready tensors,
// as InferScale's. Put encodes an entry with the store's codec (so Bytes
// says what the codec saves) and decodes it back once, so what lookups
// return is exactly what the codec preserves; lookups hand out the decoded
// entry itself, shared and read-only. It is safe for concurrent use.
type MemStore struct {
	codec chunk.Codec

	mu      sync.Mutex
	entries map[memKey]map[chunk.Context]memEntry
	bytes   int
}

type memEntry struct {
	blob []byte
	ent  *chunk.Entry
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
	return &MemStore{codec: codec, entries: map[memKey]map[chunk.Context]memEntry{}}
}

// Put encodes and stores e, replacing an entry with the same key.
func (m *MemStore) Put(_ context.Context, e *chunk.Entry) error {
	blob, err := chunk.Encode(nil, e, m.codec)
	if err != nil {
		return fmt.Errorf("engine: memstore put: %w", err)
	}
	dec, err := chunk.Decode(blob, chunk.Limits{})
	if err != nil {
		return fmt.Errorf("engine: memstore put: %w", err)
	}
	k := memKey{e.Key.Fingerprint, e.Key.Content}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[k] == nil {
		m.entries[k] = map[chunk.Context]memEntry{}
	}
	m.bytes += len(blob) - len(m.entries[k][e.Key.Context].blob)
	m.entries[k][e.Key.Context] = memEntry{blob: blob, ent: dec}
	return nil
}

// Bytes is the size of the stored blobs.
func (m *MemStore) Bytes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytes
}

// Lookup implements ChunkSource: the exact context if held, else the best
// other encoding as chunk.Better ranks them (as the node's store does),
// checked against the request's tokens. The entries are
// shared: callers must not modify them (the engine does not).
func (m *MemStore) Lookup(ctx context.Context, reqs []LookupRequest) ([]*chunk.Entry, error) {
	out := make([]*chunk.Entry, len(reqs))
	for i, r := range reqs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m.mu.Lock()
		var ent *chunk.Entry
		var bestCx chunk.Context
		want := chunk.Canonical(r.Key.Fingerprint, r.Key.Context)
		for cx, me := range m.entries[memKey{r.Key.Fingerprint, r.Key.Content}] {
			if !cx.Kind.Valid() {
				continue // not a valid context kind: never served
			}
			if ent == nil || chunk.Better(want, cx, bestCx) {
				ent, bestCx = me.ent, cx
			}
		}
		m.mu.Unlock()
		if ent == nil {
			continue
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
