package chunk

// Match says how a stored encoding of a chunk's content fits the context the
// chunk is wanted in. The order of the values is their quality:
// MatchMiss < MatchApproximate < MatchExact.
type Match uint8

const (
	// MatchMiss: no usable encoding is stored; the engine prefills the chunk.
	MatchMiss Match = iota
	// MatchApproximate: another encoding of the same tokens (another prefix,
	// a window, standalone); usable, and repaired by recomputation if asked.
	MatchApproximate
	// MatchExact: the encoding after the wanted context itself; identical to
	// prefill.
	MatchExact
)

func (m Match) String() string {
	switch m {
	case MatchExact:
		return "exact"
	case MatchApproximate:
		return "approximate"
	}
	return "miss"
}

// MatchOf says how an encoding stored in context have fits a chunk wanted in
// context want (never MatchMiss: have is stored).
func MatchOf(want, have Context) Match {
	if have == want {
		return MatchExact
	}
	return MatchApproximate
}

// Better reports whether an encoding of a chunk's content stored in context a
// serves the chunk wanted in context want better than one stored in context
// b. It is the one ranking of stored encodings: every store, the merge of
// replicas' answers and the injection's fetcher choose by it.
//
// Of two opaque contexts, the newer version is better whatever the want
// (OpaqueNewer): an opaque lookup asks for the newest (OpaqueNewest).
//
// The order: want itself; then an encoding after another prefix; then a
// window encoding, widest window first; then standalone; then contexts of an
// unknown kind. Ties go to the lower context ID, so every store and replica
// chooses alike. A prefix encoding comes first because it was computed from
// the start of a prompt: its context holds the tokens every prompt starts
// with (the attention sink, usually a shared system prompt) and real text
// before the chunk, while the first token of a standalone chunk or of a bare
// window stood at position 0 and took the sink's role, which it does not have
// in the prompt. With a system prompt a prefix encoding is about ten times
// closer to full prefill than a standalone one, and a bare window is no
// better than standalone (go test -bench ApproxKinds ./workload).
func Better(want, a, b Context) bool {
	if a == b {
		return false
	}
	if a.Kind == ContextOpaque && b.Kind == ContextOpaque {
		return OpaqueNewer(a, b)
	}
	if a == want || b == want {
		return a == want
	}
	ra, rb := approxRank(a), approxRank(b)
	if ra != rb {
		return ra > rb
	}
	if a.Kind == ContextWindow && a.Window != b.Window {
		return a.Window > b.Window
	}
	if a.ID != b.ID {
		return a.ID.Less(b.ID)
	}
	// Left: unknown kinds, or a Window set where the kind has none. Any
	// fixed order will do; it keeps Better a strict total order.
	if a.Kind != b.Kind {
		return a.Kind < b.Kind
	}
	return a.Window > b.Window
}

// approxRank orders the context kinds of approximate encodings.
func approxRank(c Context) int {
	switch c.Kind {
	case ContextPrefix:
		return 3
	case ContextWindow:
		return 2
	case ContextStandalone:
		return 1
	}
	return 0
}
