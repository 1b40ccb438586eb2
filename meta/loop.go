package meta

import (
	"math"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ring"
)

// observe drains raft's observations: a leader change is a state change for
// watchers and a reason to reconcile.
func (s *Store) observe() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.obsCh:
			s.notify()
			s.Reconcile()
		}
	}
}

// loop bootstraps when it should and, on the leader, reconciles gossip with
// raft and the ring, every ReconcileInterval and on Reconcile.
func (s *Store) loop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		if s.needBootstrap {
			s.tryBootstrap()
		}
		if s.IsLeader() {
			if err := s.reconcile(); err != nil && s.ctx.Err() == nil {
				s.log.Warn("meta: reconcile", "err", err)
			}
		} else if len(s.missingSince) > 0 {
			// Absences seen in an earlier term say nothing about the
			// next one: a node may have come back meanwhile.
			clear(s.missingSince)
		}
		if !s.IsLeader() && len(s.refused) > 0 {
			clear(s.refused)
			s.refusedN.Store(0)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
		}
	}
}

// alive returns the ring members gossip reports alive and not leaving,
// this node included (from Config when gossip does not list it yet), and
// the IDs that announced a graceful leave, have left, or are tombstoned
// (Leave) and not back with another incarnation.
func (s *Store) alive() (alive map[string]ring.Member, leaving map[string]bool) {
	alive = make(map[string]ring.Member)
	leaving = make(map[string]bool)
	departed := s.fsm.departedAll()
	if p := s.peers.Load().p; p != nil {
		for _, nm := range p.Members() {
			if nm.ID == "" {
				continue
			}
			if d, ok := departed[nm.ID]; nm.Leaving || ok && d.Incarnation == nm.Incarnation {
				leaving[nm.ID] = true
				continue
			}
			m := memberOf(nm)
			if !(m.Weight >= 0) || math.IsInf(m.Weight, 0) {
				m.Weight = 0 // JSON cannot carry it; ring reads 0 as 1
			}
			alive[nm.ID] = m
		}
		if ps, ok := p.(PeerStatus); ok {
			for _, st := range ps.Status() {
				if _, up := alive[st.Meta.ID]; !up && st.State == gossip.StateLeft {
					leaving[st.Meta.ID] = true
				}
			}
		}
	}
	d, selfLeft := departed[s.cfg.NodeID]
	selfLeft = selfLeft && d.Incarnation == s.cfg.Incarnation
	if self, ok := alive[s.cfg.NodeID]; !ok && !leaving[s.cfg.NodeID] && !selfLeft {
		self = ring.Member{ID: s.cfg.NodeID, GRPCAddr: s.cfg.GRPCAddr, RaftAddr: s.raftAddr, Weight: s.cfg.Weight}
		if !(self.Weight >= 0) || math.IsInf(self.Weight, 0) {
			self.Weight = 0
		}
		alive[s.cfg.NodeID] = self
	}
	// A tombstoned node that gossip does not show alive (it stopped, or
	// gossip holds it failed) is gone for good: no DeadGrace.
	for id := range departed {
		if _, ok := alive[id]; !ok {
			leaving[id] = true
		}
	}
	return alive, leaving
}
