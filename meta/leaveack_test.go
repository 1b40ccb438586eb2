package meta

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// ackLost forwards every command, then loses the answer to a leave: the
// leader committed it and removed the leaver from raft, but the leaver
// hears a failure (a forward that timed out on a loaded leader).
type ackLost struct{ inner Forwarder }

func (f ackLost) Apply(ctx context.Context, addr string, cmd []byte) error {
	err := f.inner.Apply(ctx, addr, cmd)
	if _, ok := LeaveOf(cmd); ok && err == nil {
		return errors.New("forward: answer lost")
	}
	return err
}

// TestLeaveAckLost: a leave whose acknowledgement is lost still returns
// nil once this node's own state shows it committed. Before, the leaver,
// out of raft, knew no leader to retry with and failed when its context
// ended (drains failed that way under load).
func TestLeaveAckLost(t *testing.T) {
	c := newCluster(t, 3)
	c.tweak = func(cfg *Config) {
		cfg.Incarnation = 77
		cfg.Forward = ackLost{inner: cfg.Forward}
	}
	for _, id := range ids(4) {
		c.start(id)
	}
	c.waitAgree(ids(4))
	leaver := c.follower()
	id := leaver.NodeID()
	if err := leaver.Leave(ctxT(t)); err != nil {
		if leaver.IsLeader() {
			t.Skipf("%s led by the time it left (leadership moved): the ack path under test was not taken", id)
		}
		t.Fatalf("leave with a lost acknowledgement: %v", err)
	}
	if inc, ok := leaver.Departed(id); !ok || inc != 77 {
		t.Fatalf("leaver's own tombstone: %d %v", inc, ok)
	}
	rest := slices.DeleteFunc(ids(4), func(s string) bool { return s == id })
	c.peers.remove(id)
	c.waitAgree(rest)
	testutil.WaitFor(t, id+" out of raft", func() bool { return !slices.Contains(serverIDs(t, c.leader()), id) })
}
