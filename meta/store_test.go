package meta

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestSingleNodeRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := fastConfig("solo", dir)
	cfg.BootstrapExpect = 1
	s, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	fp, err := s.RegisterModel(ctxT(t), testSpec(1))
	if err != nil {
		t.Fatal(err)
	}
	if fp != testSpec(1).Fingerprint() {
		t.Fatalf("fingerprint %v, want %v", fp, testSpec(1).Fingerprint())
	}
	bad := testSpec(2)
	bad.Layers = 0
	if _, err := s.RegisterModel(ctxT(t), bad); !errors.Is(err, ErrInvalidCommand) || !errors.Is(err, chunk.ErrInvalidSpec) {
		t.Fatalf("invalid spec: err %v", err)
	}
	want := Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: chunk.CodecRaw}
	if err := s.SetSettings(ctxT(t), want, AnyVersion()); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "self in ring", func() bool { return len(ringIDs(s)) == 1 })
	epoch := s.Ring().Epoch()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The snapshot taken by Close is restored by Open, before any election.
	if _, ok := s.Model(fp); !ok || s.Settings() != want {
		t.Fatalf("state not restored by Open: models %v, settings %+v", s.Models(), s.Settings())
	}
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "state replayed", func() bool {
		_, ok := s.Model(fp)
		return ok && s.Settings() == want && s.Ring().Epoch() >= epoch
	})
}

func TestOpenConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no id", Config{DataDir: t.TempDir()}},
		{"no dir", Config{NodeID: "a"}},
		{"negative expect", Config{NodeID: "a", DataDir: t.TempDir(), BootstrapExpect: -1}},
		{"unspecified bind", Config{NodeID: "a", DataDir: t.TempDir(), RaftBind: "0.0.0.0:0"}},
		{"bad bind", Config{NodeID: "a", DataDir: t.TempDir(), RaftBind: "nope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = testLogger()
			if s, err := Open(ctxT(t), tc.cfg); err == nil {
				s.Close()
				t.Fatal("Open accepted the config")
			}
		})
	}
}

func TestDataDirLocked(t *testing.T) {
	cfg := fastConfig("a", t.TempDir())
	s, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s2, err := Open(ctxT(t), cfg); !errors.Is(err, ErrDataDirLocked) {
		if s2 != nil {
			s2.Close()
		}
		t.Fatalf("second Open of one dir: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	s, err = Open(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("reopen after Close: %v", err)
	}
	s.Close()
}

// TestWatchAndMetrics checks that Watch fires on state and leader changes
// and closes on Close, and that the gauges follow the state.
func TestWatchAndMetrics(t *testing.T) {
	cfg := fastConfig("w", t.TempDir())
	cfg.BootstrapExpect = 1
	s, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := s.Watch()
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch: // the election at least
	case <-ctxT(t).Done():
		t.Fatal("no watch event for the election")
	}
	for len(ch) > 0 {
		<-ch
	}
	if _, err := s.RegisterModel(ctxT(t), testSpec(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-ctxT(t).Done():
		t.Fatal("no watch event for a registration")
	}
	cancel()
	cancel()
	if _, ok := <-ch; ok {
		t.Fatal("channel open after cancel")
	}
	testutil.WaitFor(t, "ring of one", func() bool { return s.Ring().Len() == 1 })

	got := map[string]float64{}
	for _, g := range s.Metrics() {
		if g.Help == "" {
			t.Fatalf("%s has no help", g.Name)
		}
		got[g.Name] = g.Value
	}
	st := s.Stats()
	for name, want := range map[string]float64{
		"kvmesh_meta_is_leader": 1, "kvmesh_meta_models": 1, "kvmesh_meta_ring_members": 1,
		"kvmesh_meta_ring_epoch": float64(s.Ring().Epoch()), "kvmesh_meta_raft_voters": 1, "kvmesh_meta_raft_nonvoters": 0,
		"kvmesh_meta_tokens": 0, "kvmesh_meta_raft_refused": 0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Fatalf("%s = %v, want %v", name, got[name], want)
		}
	}
	if got["kvmesh_meta_term"] < 1 || got["kvmesh_meta_last_index"] < 3 || got["kvmesh_meta_applied_index"] > float64(st.LastIndex) {
		t.Fatalf("raft gauges %v", got)
	}

	ch2, cancel2 := s.Watch()
	defer cancel2()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range ch2 {
	}
	if ch3, _ := s.Watch(); ch3 != nil {
		if _, ok := <-ch3; ok {
			t.Fatal("Watch after Close returned an open channel")
		}
	}
	if _, err := s.RegisterModel(ctxT(t), testSpec(2)); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}
}

// TestFollowerWithoutForwarder: a follower with no Forwarder refuses
// writes with ErrNotLeader instead of hanging.
func TestFollowerWithoutForwarder(t *testing.T) {
	c := newCluster(t, 2)
	c.start(nodeID(0))
	c.start(nodeID(1))
	c.leader()
	// Joining an established cluster, n02 stays a follower.
	c.tweak = func(cfg *Config) { cfg.Forward = nil }
	f := c.start(nodeID(2))
	c.waitAgree(ids(3))
	term := f.Stats().Term
	if f.IsLeader() {
		t.Skip("an election under load made the forwarder-less node leader")
	}
	_, err := f.RegisterModel(ctxT(t), testSpec(1))
	if err == nil && f.Stats().Term != term {
		t.Skip("an election under load during the write may have made the forwarder-less node leader")
	}
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("write without forwarder: %v", err)
	}
}

// TestLeaderLeave: a leader that leaves hands leadership to another node
// first, and is then removed from raft and the ring like any node.
func TestLeaderLeave(t *testing.T) {
	c := newCluster(t, 3)
	for _, id := range ids(4) {
		c.start(id)
	}
	c.waitAgree(ids(4))
	l := c.leader()
	if err := l.Leave(ctxT(t)); err != nil {
		t.Fatalf("leader leave: %v", err)
	}
	old := l.NodeID()
	if l.IsLeader() {
		t.Fatal("a node that left still leads")
	}
	c.peers.remove(old)
	rest := slices.DeleteFunc(ids(4), func(id string) bool { return id == old })
	c.stop(old)
	c.waitAgree(rest)
	if nl := c.leader(); nl.NodeID() == old {
		t.Fatal("stopped node leads")
	}
}

// TestLastVoterCannotLeave: the only server refuses to leave instead of
// leaving a cluster with no voter.
func TestLastVoterCannotLeave(t *testing.T) {
	c := newCluster(t, 1)
	s := c.start(nodeID(0))
	c.waitAgree(ids(1))
	err := s.Leave(ctxT(t))
	if !errors.Is(err, ErrLastVoter) || !errors.Is(err, ErrInvalidCommand) {
		t.Fatalf("leave of the only voter: %v, want ErrLastVoter", err)
	}
	if !s.Ring().Contains(nodeID(0)) {
		t.Fatal("a refused leave changed the ring")
	}
}
