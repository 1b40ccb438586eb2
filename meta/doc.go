// Package meta is kvmesh's cluster metadata: a hashicorp/raft state machine
// replicated over the servers of a cluster, holding the model registry,
// the cluster settings (replication factor, write quorum, codec), the ring
// membership with its epoch and the API token records (auth.Record: a
// salted hash, never a secret; *Store is an auth.TokenTable). It holds no
// tensor bytes; a snapshot is a few kilobytes of JSON.
//
// Each node opens a Store (Open) on its data directory. Reads are local.
// Writes (RegisterModel, SetSettings, PutToken, DeleteToken) are applied
// on the leader: on a follower they go through the Forwarder, which node
// implements over gRPC by calling ApplyForwarded on the leader. Commands are one version byte,
// one kind byte and a JSON payload. Each kind is a type of its own
// (cmd_<kind>.go) that validates itself and applies itself to an immutable
// state; commandKinds ties each kind byte to its type. Every command is
// validated when it is decoded and an invalid one is refused with an error,
// never a panic.
//
// A new cluster bootstraps once gossip (Peers) shows BootstrapExpect nodes.
// From then on the leader reconciles gossip with raft and the ring, as
// Consul and Nomad reconcile serf with raft: alive nodes are added as
// voters up to MaxVoters (5) and as non-voters beyond, and put in the ring
// (a new epoch); nodes that left gracefully (NodeMeta.Leaving, or
// gossip.StateLeft through PeerStatus) are removed from both; dead nodes
// leave the ring after DeadGrace and raft after the longer
// RaftRemoveAfter, so a voter back from a reboot is still a voter. A ring
// change is conditional on the
// epoch it was computed from, so a deposed leader cannot undo a newer one.
//
// Reads are lock-free: every change publishes a new immutable state with
// one atomic store. Close snapshots what the node applied, so a restart
// serves it at once and catches up from the leader after.
//
// # Transport
//
// Raft runs over plain TCP, or over mutual TLS when Config.TLS is set
// (a stream layer over tlsconf's node configurations): every raft
// connection then needs a node certificate of the cluster CA at both ends. Gossip membership alone
// does not make a node a server then: before the leader adds a node to
// raft or the ring (or moves it to a new raft address) it dials the node's
// raft address and needs a completed handshake with a node certificate,
// so a node that has the gossip key but not a valid certificate never
// takes a voter slot it could not use (Stats.Refused counts such nodes).
//
// # Log store
//
// The raft log and stable store are hashicorp/raft-wal (DataDir/raft/wal),
// snapshots raft's FileSnapshotStore (DataDir/raft/snapshots). raft-wal is
// already required at v0.4.0 and works with raft v1.8.0; raft-boltdb/v2
// would pull raft back to v1.7.3. raft-wal also fsyncs once per append
// instead of BoltDB's two and truncates the head of the log cheaply after
// a snapshot, which is what a metadata log does all day. Its "experimental"
// label matters less here: the metadata is small and every node holds a
// full copy, so a lost node is rebuilt from the others' snapshots. Two
// sharp edges are handled here: raft-wal's Close leaves its bolt meta store
// (and its file lock) open, so the Store owns and closes it; and raft runs
// heartbeats on transport goroutines that can outlive Raft.Shutdown, so the
// transport is fenced before the log closes (see guardedTransport).
//
// raft-wal checks only the last batch of its log when it opens it, so every
// entry also carries a checksum (checkedLog, in the entry's Extensions) and
// Open reads the whole log, every snapshot and raft-wal's bolt meta store
// before raft starts. Damage anywhere is ErrCorruptState, which names the
// file and the way out (move DataDir/raft aside: the node then receives
// the metadata from the leader); raft never applies a damaged entry. A log
// written before checksums opens as it is: its entries are read unchecked,
// those written from then on are checked.
//
// # Upgrades
//
// Every node of a cluster must run the same kvmesh version: mixed-version
// clusters are not supported, so upgrade by stopping the whole cluster (or
// by replacing it), not node by node. Newer fields ride on the existing
// command kinds without a command version bump (a settings change's
// if_version and if_settings, a leave's and a ring change's at), and a
// replica running an older binary decodes such a command and ignores
// them: it would apply a conditional settings change unconditionally and
// never expire tombstones, so its state would part from the others' at
// the same log index. Gating them on a cluster-wide version would take a
// version handshake the cluster does not have.
package meta
