package api

import "strings"

// The states of StateHeader.
const (
	// StateReady: in the ring and recovered; serving.
	StateReady = "ready"
	// StateRecovering: in the ring, but its metadata is catching up with
	// the leader's or its startup pull runs.
	StateRecovering = "recovering"
	// StateJoining: it knows no leader, or it is not in the ring.
	StateJoining = "joining"
	// StateLeft: a drain took it out of the cluster.
	StateLeft = "left"
)

// SplitState splits a StateHeader value into the state and why (empty for
// StateReady).
func SplitState(v string) (state, why string) {
	state, why, _ = strings.Cut(v, ": ")
	return state, why
}
