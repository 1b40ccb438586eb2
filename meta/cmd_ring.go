package meta

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/kvmesh/kvmesh/ring"
)

// ringChange moves the ring from Epoch to Epoch+1: members in Upsert are
// added or replaced (same ID), IDs in Remove leave. The epoch makes the
// change conditional, so a change computed by a deposed leader against an
// older ring fails with ErrStaleEpoch instead of undoing a newer one.
type ringChange struct {
	Epoch  uint64        `json:"epoch"`
	Upsert []ring.Member `json:"upsert,omitempty"`
	Remove []string      `json:"remove,omitempty"`
	// At is the leader's clock when it proposed the change (Unix
	// nanoseconds); the FSM expires tombstones by it (DepartedTTL). Zero
	// in changes written before it existed: no expiry.
	At int64 `json:"at,omitempty"`
}

func (ringChange) kind() cmdKind { return kindRingChange }

func (rc ringChange) validate() error {
	if rc.At < 0 {
		return fmt.Errorf("%w: ring change at %d", ErrInvalidCommand, rc.At)
	}
	if len(rc.Upsert)+len(rc.Remove) == 0 {
		return fmt.Errorf("%w: empty ring change", ErrInvalidCommand)
	}
	if len(rc.Upsert) > maxMembers || len(rc.Remove) > maxMembers {
		return fmt.Errorf("%w: ring change of %d+%d members", ErrInvalidCommand, len(rc.Upsert), len(rc.Remove))
	}
	seen := make(map[string]bool, len(rc.Upsert)+len(rc.Remove))
	for _, m := range rc.Upsert {
		if err := validateMember(m); err != nil {
			return err
		}
		if seen[m.ID] {
			return fmt.Errorf("%w: member %q twice in one change", ErrInvalidCommand, m.ID)
		}
		seen[m.ID] = true
	}
	for _, id := range rc.Remove {
		if id == "" || seen[id] {
			return fmt.Errorf("%w: removed member %q empty or repeated", ErrInvalidCommand, id)
		}
		seen[id] = true
	}
	return nil
}

// apply moves the ring to a new epoch when a member is added, changed or
// removed, or a tombstone of a member that comes back is cleared; a change
// that moves nothing keeps the epoch (an epoch always means a different
// ring) and only expires tombstones by At.
func (rc ringChange) apply(cur *fsmState, _ uint64) (*fsmState, error) {
	if rc.Epoch != cur.epoch {
		return cur, fmt.Errorf("%w: change for epoch %d, ring is at %d", ErrStaleEpoch, rc.Epoch, cur.epoch)
	}
	if len(cur.members)+len(rc.Upsert) > maxMembers {
		return cur, fmt.Errorf("%w: ring would exceed %d members", ErrInvalidCommand, maxMembers)
	}
	next := *cur
	var expired bool
	next.left, expired = expireDepartures(cur.left, rc.At)
	back := slices.ContainsFunc(rc.Upsert, func(m ring.Member) bool {
		_, ok := next.left[m.ID]
		return ok
	})
	if back && !expired {
		// expireDepartures returned cur.left itself: copy it once
		// before the deletions below.
		next.left = maps.Clone(next.left)
	}
	next.members = maps.Clone(cur.members)
	diff := false
	for _, m := range rc.Upsert {
		if old, ok := next.members[m.ID]; !ok || old != m {
			diff = true
		}
		next.members[m.ID] = m
		if _, ok := next.left[m.ID]; ok {
			// Back with another incarnation: the leader saw to that.
			delete(next.left, m.ID)
			diff = true
		}
	}
	for _, id := range rc.Remove {
		if _, ok := next.members[id]; ok {
			diff = true
			delete(next.members, id)
		}
	}
	if !diff {
		if !expired {
			return cur, nil
		}
		next.members = cur.members
		return &next, nil
	}
	next.epoch++
	next.ring = ring.New(next.epoch, sortedMembers(next.members))
	return &next, nil
}

// maxMembers bounds one ring; more is a bug, not a cluster.
const maxMembers = 4096

func validateMemberID(id string) error {
	if id == "" || len(id) > 256 {
		return fmt.Errorf("%w: member id %q", ErrInvalidCommand, id)
	}
	return nil
}

func validateMember(m ring.Member) error {
	if err := validateMemberID(m.ID); err != nil {
		return err
	}
	switch {
	case math.IsNaN(m.Weight) || math.IsInf(m.Weight, 0) || m.Weight < 0:
		return fmt.Errorf("%w: member %q weight %v", ErrInvalidCommand, m.ID, m.Weight)
	}
	return nil
}
