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
	// Admission. An encoding usable at any position (standalone, or at the
	// prefix root, which is the same computation) and a window encoding
	// are kept: an indexer encodes them on purpose, for reuse. So is the
	// first prefix-chained encoding of a content (a chat's history, a
	// document seen for the first time, a passage so far held only
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
	// is kept from its second sighting on. A standalone put while the
	// root encoding of the same content is held is refused as a duplicate;
	// a root put replaces a standalone twin.
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
	// ReusePrefix: after a prefix other than the root; EXACT only for a
	// prompt that starts with the same chunks.
	ReusePrefix Reuse = iota
	// ReuseWindow: after a window of w tokens.
	ReuseWindow
	// ReuseRoot: at the start of a prompt (the prefix root); EXACT for
	// every prompt that starts with the chunk, usable anywhere else.
	ReuseRoot
	// ReuseStandalone: encoded alone; usable at any position.
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
	case ReuseRoot:
		return "prefix_root"
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
	if key.Context.ID == chunk.PrefixRoot(key.Fingerprint) {
		return ReuseRoot
	}
	return ReusePrefix
}

// weight is the reuse credit a new entry of class r starts with under
// AdmitReuse: rounds of S3-FIFO's main queue it survives without a hit.
func (r Reuse) weight() uint32 {
	switch r {
	case ReuseStandalone, ReuseRoot:
		return 2
	case ReuseWindow:
		return 1
	}
	return 0
}

// Refusal reasons.
const (
	refuseDuplicate = iota // an equivalent encoding is held
	refuseUnproven         // a further prefix copy, its key seen once
)

// ReuseStats counts one reuse class.
type ReuseStats struct {
	Reuse Reuse
	// Entries and StoredBytes are what the store holds now (all tiers).
	Entries     int
	StoredBytes int64
	// Admitted counts new entries stored; Refused the puts AdmitReuse
	// turned away, by reason (duplicate: an equivalent encoding is held;
	// unproven: a further prefix-chained copy of a content, its key seen
	// once);
	// Evicted the entries dropped from the store for room. Bytes are the
	// entries' sizes as put.
	Admitted, AdmittedBytes           uint64
	RefusedDuplicate, RefusedUnproven uint64
	RefusedBytes                      uint64
	Evicted                           uint64
}

// admitReuse decides a put of a new key under AdmitReuse: ok false
// refuses it (why says why); replace, when set, is a twin the put
// supersedes. mu held exclusively.
func (s *Store) admitReuse(key chunk.Key, size int) (ok bool, why int, replace *entry) {
	class := ReuseOf(key)
	var chained, twin bool
	for _, e := range s.groups[groupKey{key.Fingerprint, key.Content}] {
		if e.loading || e.dead {
			continue
		}
		switch c := ReuseOf(e.key); {
		case c == ReusePrefix:
			chained = true
		case class == ReuseStandalone && c == ReuseRoot:
			twin = true
		case class == ReuseRoot && c == ReuseStandalone:
			replace = e
		}
	}
	switch {
	case twin:
		return false, refuseDuplicate, nil
	case class != ReusePrefix || !chained:
		return true, 0, replace
	case s.door.take(key):
		return true, 0, nil
	}
	s.door.add(key, int64(size))
	return false, refuseUnproven, nil
}
