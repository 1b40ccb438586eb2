package meta

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ring"
)

// memberOf is the ring member for a node gossip announced, weighted by its
// total capacity (weight 1 when it announced none).
func memberOf(m gossip.NodeMeta) ring.Member {
	mb := ring.Member{ID: m.ID, GRPCAddr: m.GRPCAddr, RaftAddr: m.RaftAddr, GossipAddr: m.GossipAddr}
	if t := m.Capacity.Total(); t > 0 {
		mb.Weight = ring.CapacityWeight(t)
	}
	return mb
}

// tryBootstrap bootstraps a new cluster once gossip shows BootstrapExpect
// nodes. Every node that sees the same alive set picks the same servers
// (the BootstrapExpect smallest IDs), so they all bootstrap one identical
// configuration; nodes outside it wait to be added by the leader. A node
// that has already joined a cluster (it has log entries or knows a leader)
// never bootstraps, and one that waits BootstrapWait first gives an
// existing leader the time to add it instead.
func (s *Store) tryBootstrap() {
	if s.raft.LastIndex() > 0 {
		s.needBootstrap = false
		return
	}
	if _, leader := s.raft.LeaderWithID(); leader != "" {
		s.needBootstrap = false
		return
	}
	expect := s.cfg.BootstrapExpect
	if expect == 0 {
		return
	}
	alive, _ := s.alive()
	if len(alive) < expect {
		s.log.Debug("meta: waiting for peers to bootstrap", "alive", len(alive), "expect", expect)
		s.bootTooFew.Add(1)
		return
	}
	ids := slices.Sorted(maps.Keys(alive))[:expect]
	if !slices.Contains(ids, s.cfg.NodeID) {
		return
	}
	// Alone in gossip (or without gossip) nobody could add this node, so
	// waiting would gain nothing.
	if len(alive) > 1 && !s.bootSettled(ids) {
		return
	}
	var conf raft.Configuration
	for i, id := range ids {
		addr := alive[id].RaftAddr
		if id == s.cfg.NodeID {
			addr = s.raftAddr
		}
		if addr == "" {
			s.log.Debug("meta: waiting for peer raft address to bootstrap", "peer", id)
			return
		}
		suffrage := raft.Voter
		if i >= s.cfg.MaxVoters {
			suffrage = raft.Nonvoter
		}
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: suffrage, ID: raft.ServerID(id), Address: raft.ServerAddress(addr)})
	}
	// With TLS a bootstrap server must show a node certificate, as the
	// leader requires of later nodes (see admissible); the choice of the
	// set is not changed, so that every node keeps choosing the same one:
	// an impostor in it holds the bootstrap up until it is gone.
	for _, sv := range conf.Servers {
		if string(sv.ID) == s.cfg.NodeID {
			continue
		}
		if err := s.admissible(string(sv.Address)); err != nil {
			if who := string(sv.ID) + "@" + string(sv.Address); who != s.bootRefused {
				s.bootRefused = who
				s.log.Warn("meta: not bootstrapping: a server of the bootstrap set fails the raft TLS handshake",
					"server", sv.ID, "raft_addr", sv.Address, "err", err)
			}
			return
		}
	}
	err := s.raft.BootstrapCluster(conf).Error()
	switch {
	case err == nil:
		s.bootstrapped.Store(true)
		s.log.Info("meta: bootstrapped cluster", "servers", ids)
	case errors.Is(err, raft.ErrCantBootstrap):
	default:
		s.log.Warn("meta: bootstrap", "err", err)
		return
	}
	s.needBootstrap = false
}

// bootSettled reports whether the bootstrap set ids has been chosen,
// unchanged, for BootstrapWait.
func (s *Store) bootSettled(ids []string) bool {
	now := time.Now()
	if !slices.Equal(ids, s.bootSet) {
		s.bootSet, s.bootSince = ids, now
		return false
	}
	return now.Sub(s.bootSince) >= s.cfg.BootstrapWait
}

// reconcile runs on the leader: it makes raft's configuration and the ring
// follow gossip. Alive nodes missing from raft are added (voters while
// there are fewer than MaxVoters, non-voters beyond, non-voters promoted
// when a voter goes); nodes whose address changed are updated; nodes that
// announced a graceful leave are removed from both; nodes gone from
// gossip are removed from the ring after DeadGrace and from raft after
// RaftRemoveAfter. The ring changes in one command per round, so a round
// bumps the epoch at most once.
func (s *Store) reconcile() error {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ApplyTimeout)
	defer cancel()
	now := time.Now()
	alive, leaving := s.alive()
	for id := range alive {
		delete(s.missingSince, id)
	}
	// goneFor reports whether id should be removed: it left gracefully,
	// or it has been missing from gossip for grace (DeadGrace for the
	// ring, RaftRemoveAfter for raft).
	goneFor := func(id string, grace time.Duration) bool {
		if id == s.cfg.NodeID {
			return false
		}
		if leaving[id] {
			return true
		}
		if _, ok := alive[id]; ok {
			return false
		}
		since, ok := s.missingSince[id]
		if !ok {
			s.missingSince[id] = now
			return false
		}
		return now.Sub(since) >= grace
	}
	dead := func(id string) bool { return goneFor(id, s.cfg.DeadGrace) }

	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("raft configuration: %w", err)
	}
	servers := f.Configuration().Servers
	inRaft := make(map[string]raft.Server, len(servers))
	voters := 0
	for _, sv := range servers {
		inRaft[string(sv.ID)] = sv
		if sv.Suffrage == raft.Voter {
			voters++
		}
	}
	refused := s.checkAdmission(alive, inRaft)
	var errs []error
	// membership waits for a configuration change and reports whether it
	// took effect; a failed one is retried next round.
	membership := func(what, id string, fut raft.IndexFuture) bool {
		if err := fut.Error(); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", what, id, err))
			return false
		}
		s.log.Info("meta: raft membership", "change", what, "server", id)
		return true
	}
	// Removals first, so that a dead voter's slot can go to a live node.
	for _, sv := range servers {
		id := string(sv.ID)
		if !goneFor(id, s.cfg.RaftRemoveAfter) {
			continue
		}
		if !membership("remove", id, s.raft.RemoveServer(sv.ID, 0, s.cfg.ApplyTimeout)) {
			continue
		}
		if sv.Suffrage == raft.Voter {
			voters--
		}
		delete(inRaft, id)
	}
	for _, id := range slices.Sorted(maps.Keys(alive)) {
		m := alive[id]
		if m.RaftAddr == "" || id == s.cfg.NodeID || refused[id] {
			continue
		}
		sid, addr := raft.ServerID(id), raft.ServerAddress(m.RaftAddr)
		sv, ok := inRaft[id]
		switch {
		case !ok && voters < s.cfg.MaxVoters:
			if membership("add voter", id, s.raft.AddVoter(sid, addr, 0, s.cfg.ApplyTimeout)) {
				voters++
			}
		case !ok:
			membership("add nonvoter", id, s.raft.AddNonvoter(sid, addr, 0, s.cfg.ApplyTimeout))
		case sv.Suffrage == raft.Voter && sv.Address != addr:
			membership("readdress voter", id, s.raft.AddVoter(sid, addr, 0, s.cfg.ApplyTimeout))
		case sv.Suffrage != raft.Voter && voters < s.cfg.MaxVoters:
			if membership("promote", id, s.raft.AddVoter(sid, addr, 0, s.cfg.ApplyTimeout)) {
				voters++
			}
		case sv.Suffrage != raft.Voter && sv.Address != addr:
			membership("readdress nonvoter", id, s.raft.AddNonvoter(sid, addr, 0, s.cfg.ApplyTimeout))
		}
	}

	// Refresh tombstones before the ring change: that change carries
	// now, and a tombstone exactly DepartedTTL old would expire on it
	// before this pass refreshed it, letting the departed incarnation
	// back in on the next pass.
	if err := s.refreshDepartures(ctx, now); err != nil {
		errs = append(errs, err)
	}

	cur := s.fsm.currentRing()
	change := ringChange{Epoch: cur.Epoch(), At: now.UnixNano()}
	for _, id := range slices.Sorted(maps.Keys(alive)) {
		if refused[id] {
			continue
		}
		if old, ok := cur.Member(id); !ok || old != alive[id] {
			change.Upsert = append(change.Upsert, alive[id])
		}
	}
	for _, m := range cur.Members() {
		if dead(m.ID) {
			change.Remove = append(change.Remove, m.ID)
		}
	}
	if len(change.Upsert)+len(change.Remove) > 0 {
		slices.SortFunc(change.Upsert, func(a, b ring.Member) int { return cmp.Compare(a.ID, b.ID) })
		cmd, err := encodeCommand(change)
		if err == nil {
			err = s.applyLocal(ctx, cmd)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("ring change at epoch %d: %w", change.Epoch, err))
		} else {
			s.log.Info("meta: ring change", "epoch", change.Epoch+1, "upsert", len(change.Upsert), "remove", change.Remove)
		}
	}

	// Forget nodes that are in neither raft nor the ring any more.
	for id := range s.missingSince {
		if _, ok := inRaft[id]; ok {
			continue
		}
		if s.fsm.currentRing().Contains(id) {
			continue
		}
		delete(s.missingSince, id)
	}
	return errors.Join(errs...)
}

// checkAdmission returns the alive nodes that must not join raft or the
// ring (nor move there to a new raft address) because they fail the
// admission handshake (see admissible). Nodes already in raft at their
// address are not checked again. Each refusal is logged once per address.
func (s *Store) checkAdmission(alive map[string]ring.Member, inRaft map[string]raft.Server) map[string]bool {
	out := make(map[string]bool)
	if s.tlsLayer == nil {
		return out
	}
	for _, id := range slices.Sorted(maps.Keys(alive)) {
		m := alive[id]
		if id == s.cfg.NodeID || m.RaftAddr == "" {
			continue
		}
		if sv, ok := inRaft[id]; ok && string(sv.Address) == m.RaftAddr {
			continue
		}
		err := s.admissible(m.RaftAddr)
		if err == nil {
			if _, was := s.refused[id]; was {
				s.log.Info("meta: node now passes the raft TLS handshake", "server", id, "raft_addr", m.RaftAddr)
			}
			continue
		}
		out[id] = true
		if s.refused[id] != m.RaftAddr {
			s.log.Warn("meta: not adding node to raft or the ring: its raft TLS handshake fails", "server", id, "raft_addr", m.RaftAddr, "err", err)
			s.refused[id] = m.RaftAddr
		}
	}
	for id := range s.refused {
		if !out[id] {
			delete(s.refused, id)
		}
	}
	s.refusedN.Store(int64(len(s.refused)))
	return out
}

// refreshDepartures re-commits the leave of every departed incarnation
// that gossip still shows alive once its tombstone is half expired
// (DepartedTTL), so that a tombstone expires only after its incarnation
// has been out of sight for at least DepartedTTL/2.
func (s *Store) refreshDepartures(ctx context.Context, now time.Time) error {
	departed := s.fsm.departedAll()
	if len(departed) == 0 {
		return nil
	}
	p := s.peers.Load().p
	if p == nil {
		return nil
	}
	var errs []error
	for _, nm := range p.Members() {
		d, ok := departed[nm.ID]
		if !ok || d.Incarnation != nm.Incarnation || d.At != 0 && now.UnixNano()-d.At < int64(DepartedTTL/2) {
			continue
		}
		cmd, err := encodeCommand(leave{ID: d.ID, Incarnation: d.Incarnation, At: now.UnixNano()})
		if err == nil {
			err = s.applyLocal(ctx, cmd)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("refresh the tombstone of %s: %w", d.ID, err))
			continue
		}
		s.log.Info("meta: departed node still in gossip; tombstone refreshed", "member", d.ID, "incarnation", d.Incarnation)
	}
	return errors.Join(errs...)
}
