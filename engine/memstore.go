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

// rank orders the encodings of a content for a chunk wanted in context
// want, as the node's store does (kvtier.Store.Best): want itself (EXACT),
// else an encoding after another prefix, then a window encoding, widest
// window first, then standalone. A prefix encoding comes first because it
// was computed from the start of a prompt: its context holds the tokens
// every prompt starts with (the attention sink, usually a shared system
// prompt) and real text before the chunk, while the first token of a
// standalone chunk or of a bare window stood at position 0 and took the
// sink's role, which it does not have in the prompt. With a system prompt
// a prefix encoding is about ten times closer to full prefill than a
// standalone one, and a bare window is no better than standalone
// (workload.BenchmarkApproxKinds). Ties go to the smaller context ID in
// Lookup, so the choice is stable.
func rank(want, have chunk.Context) int {
	switch {
	case have == want:
		return 1 << 40
	case have.Kind == chunk.ContextPrefix:
		return 1 << 33
	case have.Kind == chunk.ContextWindow:
		return 1<<32 + int(have.Window)
	case have.Kind == chunk.ContextStandalone:
		return 1
	}
	return 0
}

// Lookup implements ChunkSource: the exact context if held, else the best
// other encoding, checked against the request's tokens. The entries are
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
		bestRank := 0
		for cx, me := range m.entries[memKey{r.Key.Fingerprint, r.Key.Content}] {
			// Ties go to the smaller context ID, so the choice is stable.
			rk := rank(r.Key.Context, cx)
			if rk == 0 {
				continue // not a valid context kind: never served
			}
			if rk > bestRank || (rk == bestRank && cx.ID.Less(bestCx.ID)) {
				ent, bestRank, bestCx = me.ent, rk, cx
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
