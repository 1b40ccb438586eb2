// Package node is a kvmesh server process's wiring: it owns the node's
// chunk store (kvtier), its gossip membership (ring), its Raft metadata
// (meta), and serves the Client and Peer gRPC services on one listener and
// HTTP (/metrics, /healthz, /readyz, /debug/pprof) on another.
//
// Routing. Every content ID has a replica set (ring.Replicas over the
// current epoch, R from the cluster settings). A Put that reaches any node
// is written to the replica set: locally when this node is a replica, and
// to the others through a Replicator (the seam the replication package
// fills; the default writes to every replica directly and best-effort). A
// Get is served from the local store, else fetched from a replica. A
// Lookup asks every replica of each content ID (one batched call per node)
// and answers with the best encoding any of them holds.
//
// Tensor bytes move with api.Codec: a stored blob is handed to the
// transport as a pinned zero-copy view and unpinned when gRPC has written
// the last frame.
package node
