package kvtier

import (
	"fmt"

	"github.com/kvmesh/kvmesh/chunk"
)

// Admission says which puts a Store keeps.
type Admission int

const (
	// AdmitAll keeps every put until eviction: whatever a serving engine
	// writes back competes for the budget on equal terms.
	AdmitAll Admission = iota
	// AdmitReuse keeps what is predicted to be read again and weighs
	// eviction by how an entry can be reused (see Reuse).
	//
	// Admission. An encoding usable at any position (standalone, which is
	// also the one key of a chunk at the start of a prompt) and a window
	// encoding are kept: an indexer encodes them on purpose, for reuse. So
	// is the first prefix-chained encoding of a content (a chat's history,
	// a document seen for the first time, a passage so far held only
	// standalone): any prompt can use it, EXACT after the same prefix and
	// otherwise as the best approximation chunk.Better knows, since it saw
	// the system prompt and real text before it. Another prefix-chained
	// encoding of a content that has one is a second copy that only an
	// identical prefix uses better: it is kept only on the second put of
	// that very key. The first put is refused and its key remembered by a
	// doorkeeper (a FIFO of refused keys, bounded by the bytes of the
	// entries they name, Config.DoorkeeperBytes). A RAG prompt that puts
	// its passages in a novel order therefore writes nothing new, while a
	// prefix that recurs (a popular first passage after the system prompt)
	// is kept from its second sighting on. Equivalent encodings need no
	// rule here: one computation has one key (chunk.Canonical), so a
	// second put of it is a put of the same key.
	//
	// Eviction. Within S3-FIFO, an entry gets its class's reuse credit
	// (Reuse.weight) in place of hits when it is put and when it enters
	// the main queue: an encoding usable anywhere skips probation and
	// outlasts two rounds of the main queue without a hit, a window one
	// one round; a prefix-chained one gets no credit, so one that is never
	// read leaves from probation as S3-FIFO's one-hit wonders do.
	AdmitReuse
)

func (a Admission) String() string {
	switch a {
	case AdmitAll:
		return "all"
	case AdmitReuse:
		return "reuse"
	}
	return fmt.Sprintf("admission(%d)", int(a))
}

// ParseAdmission reads "all" or "reuse".
func ParseAdmission(s string) (Admission, error) {
	switch s {
	case "all":
		return AdmitAll, nil
	case "reuse":
		return AdmitReuse, nil
	}
	return 0, fmt.Errorf("kvtier: admission %q: want all or reuse", s)
}

// Reuse classes an entry by how it can be reused, from its context.
type Reuse uint8

const (
	// ReusePrefix: after a prefix; EXACT only for a prompt that starts
	// with the same chunks.
	ReusePrefix Reuse = iota
	// ReuseWindow: after a window of w tokens.
	ReuseWindow
	// ReuseStandalone: encoded alone; usable at any position, and EXACT
	// at the start of a prompt.
	ReuseStandalone
	// NumReuse is the number of classes.
	NumReuse
)

func (r Reuse) String() string {
	switch r {
	case ReusePrefix:
		return "prefix"
	case ReuseWindow:
		return "window"
	case ReuseStandalone:
		return "standalone"
	}
	return fmt.Sprintf("reuse(%d)", uint8(r))
}

// ReuseOf classes key.
func ReuseOf(key chunk.Key) Reuse {
	switch key.Context.Kind {
	case chunk.ContextStandalone:
		return ReuseStandalone
	case chunk.ContextWindow:
		return ReuseWindow
	}
	return ReusePrefix
}

// weight is the reuse credit a new entry of class r starts with under
// AdmitReuse: rounds of S3-FIFO's main queue it survives without a hit.
func (r Reuse) weight() uint32 {
	switch r {
	case ReuseStandalone:
		return 2
	case ReuseWindow:
		return 1
	}
	return 0
}

// ReuseStats counts one reuse class.
type ReuseStats struct {
	Reuse Reuse
	// Entries and StoredBytes are what the store holds now (all tiers).
	Entries     int
	StoredBytes int64
	// Admitted counts new entries stored; Refused the puts AdmitReuse
	// turned away (a further prefix-chained copy of a content, its key
	// seen once); Evicted the entries dropped from the store for room.
	// Bytes are the entries' sizes as put.
	Admitted, AdmittedBytes uint64
	Refused, RefusedBytes   uint64
	Evicted                 uint64
}

// admitReuse decides a put of a new key under AdmitReuse. mu held
// exclusively.
func (s *Store) admitReuse(key chunk.Key, size int) bool {
	if ReuseOf(key) != ReusePrefix {
		return true
	}
	chained := false
	for _, e := range s.groups[groupKey{key.Fingerprint, key.Content}] {
		if !e.loading && !e.dead && ReuseOf(e.key) == ReusePrefix {
			chained = true
			break
		}
	}
	if !chained || s.door.take(key) {
		return true
	}
	s.door.add(key, int64(size))
	return false
}
