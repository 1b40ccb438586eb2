package meta

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/ring"
)

var (
	_ Peers      = (*gossip.Gossip)(nil)
	_ PeerStatus = (*gossip.Gossip)(nil)
)

// TestWithGossip wires Stores to real memberlist gossip the way node does:
// raft first (gossip announces its address), then gossip, then SetPeers and
// Reconcile on every gossip event. Three nodes bootstrap; a fourth joins; one
// leaves gracefully and is removed without waiting for DeadGrace.
func TestWithGossip(t *testing.T) {
	type member struct {
		s    *Store
		g    *gossip.Gossip
		stop func()
	}
	var seed string
	start := func(id string) member {
		cfg := fastConfig(id, t.TempDir())
		cfg.BootstrapExpect = 3
		cfg.DeadGrace = time.Hour // only the graceful leave may remove a node
		s, err := Open(ctxT(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Failure detection looser than LocalTiming's: no member fails
		// here, and one starved of CPU (-race on 2 busy cores) held failed
		// for a moment makes every node reconcile again.
		tm := gossip.LocalTiming()
		tm.ProbeInterval, tm.ProbeTimeout, tm.SuspicionMult = 500*time.Millisecond, 300*time.Millisecond, 4
		gc := gossip.Config{
			NodeID: id, BindAddr: "127.0.0.1", Timing: tm, Logger: testLogger(),
			Meta: gossip.NodeMeta{ID: id, GRPCAddr: "grpc-" + id, RaftAddr: s.RaftAddr(), Capacity: gossip.Capacity{DRAMBytes: 4 << 30}},
		}
		if seed != "" {
			gc.Seeds = []string{seed}
		}
		g, err := gossip.Start(gc)
		if err != nil {
			t.Fatal(err)
		}
		if seed == "" {
			seed = g.Addr()
		}
		s.SetPeers(g)
		events, cancel := g.Subscribe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range events {
				s.Reconcile()
			}
		}()
		m := member{s: s, g: g}
		m.stop = func() {
			cancel()
			<-done
			_ = g.Shutdown()
			_ = s.Close()
		}
		t.Cleanup(m.stop)
		return m
	}
	var ms []member
	for i := range 3 {
		ms = append(ms, start(nodeID(i)))
	}
	agree := func(members []member, want []string) uint64 {
		t.Helper()
		var epoch uint64
		testutil.WaitFor(t, fmt.Sprintf("rings agree on %v", want), func() bool {
			epoch = members[0].s.Ring().Epoch()
			for _, m := range members {
				if m.s.Ring().Epoch() != epoch || !slices.Equal(ringIDs(m.s), want) {
					return false
				}
			}
			return true
		})
		return epoch
	}
	e1 := agree(ms, ids(3))
	for _, m := range ms {
		if mb, _ := m.s.Ring().Member(nodeID(0)); mb.Weight != ring.CapacityWeight(4<<30) || mb.GRPCAddr != "grpc-"+nodeID(0) {
			t.Fatalf("ring member %+v lacks gossip metadata", mb)
		}
	}

	ms = append(ms, start(nodeID(3)))
	e2 := agree(ms, ids(4))
	if e2 <= e1 {
		t.Fatalf("join: epoch %d, was %d", e2, e1)
	}

	// A follower leaves gracefully.
	var leaver int
	for i, m := range ms {
		if !m.s.IsLeader() {
			leaver = i
			break
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if err := ms[leaver].g.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	ms[leaver].stop()
	rest := slices.Delete(slices.Clone(ms), leaver, leaver+1)
	want := slices.DeleteFunc(ids(4), func(id string) bool { return id == nodeID(leaver) })
	e3 := agree(rest, want)
	if e3 <= e2 {
		t.Fatalf("leave: epoch %d, was %d", e3, e2)
	}
}

func TestMemberOf(t *testing.T) {
	m := gossip.NodeMeta{ID: "a", GRPCAddr: "g", RaftAddr: "r", GossipAddr: "s"}
	if got := memberOf(m); got != (ring.Member{ID: "a", GRPCAddr: "g", RaftAddr: "r", GossipAddr: "s"}) {
		t.Fatalf("%+v", got)
	}
	m.Capacity = gossip.Capacity{GPUBytes: 16 * ring.GiB, DRAMBytes: 48 * ring.GiB}
	if w := memberOf(m).Weight; w != 64 {
		t.Fatalf("weight %v, want 64", w)
	}
}
