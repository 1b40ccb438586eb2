package meta

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// skewedLeaver forwards every command, but a leave goes out with the time
// of a leaver whose clock is far behind.
type skewedLeaver struct{ inner Forwarder }

func (f skewedLeaver) Apply(ctx context.Context, addr string, cmd []byte) error {
	if c, err := decodeCommand(cmd); err == nil {
		if lv, ok := c.(leave); ok {
			lv.At = 1
			if cmd, err = encodeCommand(lv); err != nil {
				return err
			}
		}
	}
	return f.inner.Apply(ctx, addr, cmd)
}

// TestLeaveStampedByLeader: the tombstone's time is the leader's, not the
// leaver's (whose clock is behind by decades here), so DepartedTTL counts
// from when a leader handled the leave.
func TestLeaveStampedByLeader(t *testing.T) {
	c := newCluster(t, 3)
	c.tweak = func(cfg *Config) {
		cfg.Incarnation = 5
		cfg.Forward = skewedLeaver{inner: cfg.Forward}
	}
	for _, id := range ids(4) {
		c.start(id)
	}
	c.waitAgree(ids(4))
	leaver := c.follower()
	id := leaver.NodeID()
	before := time.Now().UnixNano()
	if err := leaver.Leave(ctxT(t)); err != nil {
		t.Fatalf("leave: %v", err)
	}
	// Out of raft, the leaver may not hear of a later leader.
	c.stop(id)
	l := c.leader()
	var d departure
	testutil.WaitFor(t, "the leader's tombstone of "+id, func() bool {
		var ok bool
		d, ok = l.fsm.departedAll()[id]
		return ok
	})
	if d.Incarnation != 5 || d.At < before {
		t.Fatalf("tombstone %+v: want incarnation 5 stamped at or after %d (the leader's clock), not the leaver's", d, before)
	}
}
