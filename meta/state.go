package meta

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// Departed reports whether id left explicitly (Leave) with incarnation
// and has not been admitted back since, as this node has applied it.
func (s *Store) Departed(id string) (incarnation uint64, ok bool) { return s.fsm.departed(id) }

// NodeID is this node's ID.
func (s *Store) NodeID() string { return s.cfg.NodeID }

// RaftAddr is the address raft listens on (as advertised to the others);
// gossip carries it in NodeMeta.RaftAddr.
func (s *Store) RaftAddr() string { return s.raftAddr }

// SetPeers sets the membership source after Open: gossip needs RaftAddr in
// its metadata before it starts, so it usually comes second.
func (s *Store) SetPeers(p Peers) {
	s.peers.Store(&peersBox{p})
	s.Reconcile()
}

// Reconcile asks the loop to bootstrap or reconcile now instead of at the
// next tick; node calls it on gossip events. It does not block.
func (s *Store) Reconcile() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Model returns the registered spec of fp.
func (s *Store) Model(fp chunk.Fingerprint) (chunk.ModelSpec, bool) { return s.fsm.model(fp) }

// Models returns every registered spec, sorted by fingerprint.
func (s *Store) Models() []chunk.ModelSpec { return s.fsm.modelList() }

// Settings returns the cluster settings (DefaultSettings until set).
func (s *Store) Settings() Settings { return s.fsm.currentSettings() }

// Ring returns the current epoch's ring as this node has applied it.
func (s *Store) Ring() *ring.Ring { return s.fsm.currentRing() }

// IsLeader reports whether this node is the raft leader now.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// Leader returns the leader's ID and gRPC address as this node knows them,
// or empty strings when it knows no leader. The gRPC address comes from the
// ring, or from gossip while the leader is not in the ring yet.
func (s *Store) Leader() (id, grpcAddr string) {
	_, lid := s.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	id = string(lid)
	if m, ok := s.fsm.member(id); ok && m.GRPCAddr != "" {
		return id, m.GRPCAddr
	}
	if id == s.cfg.NodeID && s.cfg.GRPCAddr != "" {
		return id, s.cfg.GRPCAddr
	}
	if p := s.peers.Load().p; p != nil {
		for _, nm := range p.Members() {
			if nm.ID == id {
				return id, nm.GRPCAddr
			}
		}
	}
	return id, ""
}

// Watch returns a channel that receives a value after any change of the
// replicated state or of the leader; changes in a burst coalesce into one.
// The channel is closed by cancel or by Close.
func (s *Store) Watch() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.watchClosed {
		close(ch)
		return ch, func() {}
	}
	id := s.nextWatch
	s.nextWatch++
	s.watchers[id] = ch
	return ch, func() {
		s.watchMu.Lock()
		defer s.watchMu.Unlock()
		if c, ok := s.watchers[id]; ok {
			delete(s.watchers, id)
			close(c)
		}
	}
}

func (s *Store) notify() {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for _, ch := range s.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// waitFor blocks until cond holds or ctx ends; it reports whether cond held.
func (s *Store) waitFor(ctx context.Context, cond func() bool) bool {
	ch, cancel := s.Watch()
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return cond()
		case _, ok := <-ch:
			if !ok {
				return cond()
			}
		}
	}
	return true
}

// WaitLeader blocks until this node knows a leader (with its gRPC address
// when the leader is another node) or ctx ends.
func (s *Store) WaitLeader(ctx context.Context) error {
	if s.waitFor(ctx, func() bool {
		id, addr := s.Leader()
		return id != "" && (addr != "" || id == s.cfg.NodeID)
	}) {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNoLeader, context.Cause(ctx))
}

// WaitModel blocks until fp is registered in this node's state or ctx ends.
// A node that is told about a model registered through another node a
// moment ago uses it before answering "unknown model".
func (s *Store) WaitModel(ctx context.Context, fp chunk.Fingerprint) (chunk.ModelSpec, bool) {
	var spec chunk.ModelSpec
	ok := s.waitFor(ctx, func() bool {
		var found bool
		spec, found = s.fsm.model(fp)
		return found
	})
	return spec, ok
}

// Server is a raft server as the current configuration lists it.
type Server struct {
	ID       string
	RaftAddr string
	Voter    bool
}

// Servers returns the raft configuration this node has (the leader's is
// authoritative).
func (s *Store) Servers() ([]Server, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("meta: raft configuration: %w", err)
	}
	cf := f.Configuration()
	out := make([]Server, 0, len(cf.Servers))
	for _, sv := range cf.Servers {
		out = append(out, Server{ID: string(sv.ID), RaftAddr: string(sv.Address), Voter: sv.Suffrage == raft.Voter})
	}
	return out, nil
}

// Stats is a snapshot of this node's raft and metadata counters.
type Stats struct {
	State        string // "Leader", "Follower", "Candidate", "Shutdown"
	Term         uint64
	LastIndex    uint64
	CommitIndex  uint64
	AppliedIndex uint64
	Epoch        uint64
	Members      int
	Models       int
	Tokens       int // API token records
	// Refused counts gossip members the leader does not add to raft or
	// the ring because their raft TLS handshake fails (0 on followers).
	Refused     int
	LastContact time.Time // zero on the leader
}

// Stats returns this node's counters (for status commands and metrics).
func (s *Store) Stats() Stats {
	models, members, tokens := s.fsm.counts()
	st := Stats{
		State:        s.raft.State().String(),
		Term:         s.raft.CurrentTerm(),
		LastIndex:    s.raft.LastIndex(),
		CommitIndex:  s.raft.CommitIndex(),
		AppliedIndex: s.raft.AppliedIndex(),
		Epoch:        s.fsm.currentRing().Epoch(),
		Members:      members,
		Models:       models,
		Tokens:       tokens,
		Refused:      int(s.refusedN.Load()),
	}
	if st.State != raft.Leader.String() {
		st.LastContact = s.raft.LastContact()
	}
	return st
}
