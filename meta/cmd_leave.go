package meta

import (
	"fmt"
	"maps"

	"github.com/kvmesh/kvmesh/ring"
)

// leave is a node's explicit departure: the node leaves the ring (a new
// epoch when it was a member) and is tombstoned with its incarnation, so
// that the leader does not add it back while gossip still shows that run
// of it alive (it serves reads until it stops, and gossip may never tell
// the leader that it left). It comes back only with another incarnation
// (a new process). The leader also removes it from raft before it
// acknowledges the command (Store.Leave).
//
// At is the proposer's clock (Unix nanoseconds): the tombstone expires
// DepartedTTL after it, unless a later leave of the same incarnation (the
// leader's refresh) moves it on. Zero in leaves written before it existed.
type leave struct {
	ID          string `json:"id"`
	Incarnation uint64 `json:"incarnation"`
	At          int64  `json:"at,omitempty"`
}

func (leave) kind() cmdKind { return kindLeave }

func (lv leave) validate() error {
	if err := validateMemberID(lv.ID); err != nil {
		return err
	}
	if lv.At < 0 {
		return fmt.Errorf("%w: leave at %d", ErrInvalidCommand, lv.At)
	}
	return nil
}

func (lv leave) apply(cur *fsmState, _ uint64) (*fsmState, error) {
	left, expired := expireDepartures(cur.left, lv.At)
	d, tomb := left[lv.ID]
	_, member := cur.members[lv.ID]
	next := *cur
	if tomb && d.Incarnation == lv.Incarnation && !member && lv.At <= d.At {
		// A retried leave (or an older refresh): only expiry may
		// have changed.
		if !expired {
			return cur, nil
		}
		next.left = left
		return &next, nil
	}
	if !tomb && len(left) >= maxMembers {
		return cur, fmt.Errorf("%w: %d departed nodes remembered, the most allowed", ErrInvalidCommand, maxMembers)
	}
	if !expired {
		left = maps.Clone(left)
	}
	// A leave without a time (an old log) is stamped by the next
	// command that carries one.
	left[lv.ID] = departure{ID: lv.ID, Incarnation: lv.Incarnation, At: lv.At}
	next.left = left
	if member {
		next.members = maps.Clone(cur.members)
		delete(next.members, lv.ID)
		next.epoch++
		next.ring = ring.New(next.epoch, sortedMembers(next.members))
	}
	return &next, nil
}

// LeaveOf returns the node a raft command removes from the cluster: the ID
// of a well-formed leave command, and ok false for any other command or
// bytes that do not decode (ApplyForwarded refuses those). The node's
// handler of forwarded commands uses it to check that a leave comes from
// the node that leaves.
func LeaveOf(cmd []byte) (id string, ok bool) {
	c, err := decodeCommand(cmd)
	lv, ok := c.(leave)
	if err != nil || !ok {
		return "", false
	}
	return lv.ID, true
}
