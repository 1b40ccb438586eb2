package meta

// Gauge is one metric of a Store, read when asked so nothing has to keep it
// in step. The names are Prometheus names; node registers each as a
// GaugeFunc (or one collector) on its /metrics registry. The package does
// not import client_golang itself, so it carries no metrics dependency.
type Gauge struct {
	Name  string
	Help  string
	Value float64
}

// Metrics returns the store's gauges now: kvmesh_meta_is_leader, _term,
// _ring_epoch, _last_index, _commit_index, _applied_index, _ring_members,
// _models, _tokens, _raft_refused, _raft_voters and _raft_nonvoters (the last two only when the
// raft configuration could be read).
func (s *Store) Metrics() []Gauge {
	st := s.Stats()
	leader := 0.0
	if st.State == "Leader" {
		leader = 1
	}
	out := []Gauge{
		{"kvmesh_meta_is_leader", "1 if this node is the raft leader.", leader},
		{"kvmesh_meta_term", "Current raft term.", float64(st.Term)},
		{"kvmesh_meta_ring_epoch", "Epoch of the ring this node has applied.", float64(st.Epoch)},
		{"kvmesh_meta_last_index", "Last raft log index on this node.", float64(st.LastIndex)},
		{"kvmesh_meta_commit_index", "Raft commit index known to this node.", float64(st.CommitIndex)},
		{"kvmesh_meta_applied_index", "Last raft index applied to the metadata state.", float64(st.AppliedIndex)},
		{"kvmesh_meta_ring_members", "Members of the current ring.", float64(st.Members)},
		{"kvmesh_meta_models", "Registered model specs.", float64(st.Models)},
		{"kvmesh_meta_tokens", "API token records.", float64(st.Tokens)},
		{"kvmesh_meta_raft_refused", "Gossip members the leader keeps out of raft and the ring: their raft TLS handshake fails.", float64(st.Refused)},
	}
	if servers, err := s.Servers(); err == nil {
		var v, nv float64
		for _, sv := range servers {
			if sv.Voter {
				v++
			} else {
				nv++
			}
		}
		out = append(out,
			Gauge{"kvmesh_meta_raft_voters", "Voters in the raft configuration.", v},
			Gauge{"kvmesh_meta_raft_nonvoters", "Non-voters in the raft configuration.", nv})
	}
	return out
}
