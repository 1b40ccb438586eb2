// Package node is a kvmesh server process's wiring: it owns the node's
// chunk store (kvtier), its gossip membership (gossip), its Raft metadata
// (meta), and serves the Client and Peer gRPC services on one listener and
// HTTP (/metrics, /healthz, /readyz, /debug/pprof) on another.
//
// Routing and replication. Every content ID has a replica set
// (ring.Replicas over the current epoch; R and W from the cluster
// settings, clamped to the ring's size). The node runs one
// replication.Replicator over its store, with a Transport over the Peer
// service: a Put that reaches any node is written to the replica set and
// acknowledged once W replicas stored it (StoredOn names them; unreachable
// replicas get hints, delivered when they answer again); a Get is served
// from the local store, else from the replicas in ring order, repairing
// those found lacking; a Delete leaves tombstones. Meta's Watch kicks the
// Replicator, which rebalances on every ring epoch change; anti-entropy
// runs in the background. A Lookup asks every replica of each content ID
// (one batched call per node) and answers with the best encoding any of
// them holds.
//
// Lifecycle. New checks the Config; Start runs ordered steps (data
// directory, listeners, store, peer connections, metadata, gossip,
// replication, injection, HTTP and gRPC servers, background loops), each
// pushing the undo of what it started onto one stack. A failing step
// unwinds that stack, newest first; Close unwinds it too and returns the
// errors of every close joined.
//
// Leaving. Drain (Client.Drain, `kvmesh drain NODE`) copies every chunk
// the node holds to its owners on the ring without it, then leaves (raft
// leadership handed off, gossip leave) and sweeps once more for writes
// that reached it meanwhile. Close alone does not leave: a node restarted
// with the same ID and data directory rejoins.
//
// Files. Each gRPC service's handlers have one file: client_service.go,
// peer_service.go, admin_service.go, injector_service.go. What two
// services share has its own file: putget.go (Put/Replicate and
// Get/Fetch bodies), lookup.go (the cross-replica lookup, also used by
// the injection fetcher), gossipkey.go (key rotation on this node and
// fanned out).
//
// Tensor bytes move with api.Codec: a stored blob is handed to the
// transport as a pinned zero-copy view and unpinned when gRPC has written
// the last frame.
package node
