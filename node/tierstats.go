package node

import "github.com/kvmesh/kvmesh/kvtier"

// StoreStats is a snapshot of the node's chunk store: per tier, and per
// reuse class (what the admission policy kept, refused and evicted). The
// same numbers are exported as kvtier_* metrics. Before Start it is zero.
func (n *Node) StoreStats() kvtier.Stats {
	if n.store == nil {
		return kvtier.Stats{}
	}
	return n.store.Stats()
}
