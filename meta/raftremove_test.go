package meta

import (
	"slices"
	"testing"
	"time"
)

// TestDeadNodeStaysVoter: a node missing from gossip for DeadGrace leaves
// the ring but stays a raft voter until RaftRemoveAfter, so that when it
// comes back (a reboot) it rejoins the ring as the voter it was, without
// a raft membership change.
func TestDeadNodeStaysVoter(t *testing.T) {
	c := newCluster(t, 3)
	c.tweak = func(cfg *Config) { cfg.RaftRemoveAfter = time.Hour }
	all := ids(3)
	for _, id := range all {
		c.start(id)
	}
	c.waitAgree(all)
	l := c.leader()
	var victim string
	for _, id := range all {
		if id != l.NodeID() {
			victim = id
			break
		}
	}
	c.stop(victim)
	rest := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return id == victim })
	c.waitAgree(rest)
	v, nv := voters(t, c.leader())
	if !slices.Equal(v, all) || len(nv) != 0 {
		t.Fatalf("after DeadGrace: voters %v, non-voters %v; want %s still a voter", v, nv, victim)
	}

	c.start(victim)
	c.waitAgree(all)
	if v, nv := voters(t, c.leader()); !slices.Equal(v, all) || len(nv) != 0 {
		t.Fatalf("after the restart: voters %v, non-voters %v", v, nv)
	}
}

// TestRaftRemoveAfterDefaults: RaftRemoveAfter defaults to its own,
// longer value, and is never shorter than DeadGrace.
func TestRaftRemoveAfterDefaults(t *testing.T) {
	for _, tc := range []struct {
		grace, remove, want time.Duration
	}{
		{0, 0, DefaultRaftRemoveAfter},
		{time.Second, 0, DefaultRaftRemoveAfter},
		{time.Hour, 0, time.Hour},
		{time.Second, time.Minute, time.Minute},
		{time.Minute, time.Second, time.Minute},
	} {
		cfg, err := Config{NodeID: "n", DataDir: t.TempDir(), DeadGrace: tc.grace, RaftRemoveAfter: tc.remove}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.RaftRemoveAfter != tc.want {
			t.Errorf("DeadGrace %v, RaftRemoveAfter %v: effective %v, want %v", tc.grace, tc.remove, cfg.RaftRemoveAfter, tc.want)
		}
	}
}
