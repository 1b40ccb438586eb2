// Package replication keeps every acknowledged chunk of a kvmesh cluster
// through node failures and ring changes.
//
// A Replicator runs on every node, next to the node's store. It is a library
// over three small interfaces it declares: Store (the node's local tiers,
// which package node adapts its kvtier store to), Transport (calls to
// other nodes, which package node implements with the Peer gRPC service)
// and Placement (the current ring, which *meta.Store provides). It imports
// neither the store nor gRPC: bytes it reads are lent as pinned.Bytes, and
// every outcome a caller branches on is a sentinel error.
//
//   - Writes (Write) go to the R replicas of the chunk's content ID in
//     parallel and return once W of them stored it, naming them. A replica
//     that cannot be reached gets a hint: the blob, kept on this node in a
//     bounded directory that survives a restart, delivered with backoff when
//     the replica answers again. A key already stored with other bytes (two
//     producers' encodings differ in the last bits) is not an error: every
//     store of it, whatever its kind, keeps the version that Wins (the
//     smaller entry checksum), and repair and anti-entropy push that version,
//     so replicas converge on one whatever order the writes came in.
//     Opaque values (the Redis door's) are versioned instead: each version
//     is a key of its own, and a replica keeps the newest and refuses
//     older ones (versions.go).
//     A write whose entry is still arriving (BeginWrite, a StreamWrite)
//     opens its replica streams at once and passes each piece on as it
//     comes (Transport.OpenReplicate; cut-through), so the replicas hold the
//     entry by the time its last byte arrives here.
//   - Reads (Read) try this node first, then the replicas in ring order, then
//     the previous ring's replicas (a rebalance may still be moving the
//     chunk); a node that never saw the previous ring (it joined with the
//     ring already including it) asks the members ranked right after the
//     replicas instead, for RebalanceSettle after a rebalance sign, since
//     with rendezvous placement that is where the previous owners rank.
//     Replicas found lacking the entry, or holding other bytes, are
//     repaired in the background through a bounded queue (a copy this node
//     lacks is stored from the bytes the read fetched).
//   - On every ring epoch change the Replicator streams the chunks it holds
//     to new owners that lack them, rate-limited per sender, and deletes a
//     chunk it no longer owns only after every new owner holds it
//     (Rebalance). The receiver keeps its own budget (inbox.go): a few
//     rebalance stores at once, each waiting for a gap in the serving calls
//     in flight (ServingYield), the rest waiting or pushed back with
//     ErrBusy, which the sender answers by sending again later. Drain does
//     the same for a ring without this node, before it leaves. A change of
//     the replication factor R is a change of placement like a ring change:
//     raising it streams every chunk to its new replicas, lowering it hands
//     the copies beyond R off under the same acknowledgement rule. On
//     either change the tombstones held here go to the keys' new owners,
//     and hints kept for a node that no longer replicates their key go to
//     the key's current replicas instead.
//   - Anti-entropy compares, with each other replica, a table of bucket
//     hashes over (key, checksum) of the keys both should hold, splits the
//     differing buckets into sub-ranges, lists only the differing ranges and
//     copies only the differing keys: the cost of a round is a fixed table
//     plus what differs, not the data.
//   - Deletes (Delete) leave tombstones for TombstoneTTL, so neither a late
//     hint nor anti-entropy brings a deleted chunk back; writes carry their
//     time, so a chunk written again after a delete is not removed by an
//     older tombstone. Eviction is not a delete: an evicted replica is just
//     missing, refetched on demand by Read and refilled by repair only when
//     its store reports room (RoomChecker), so repair never evicts.
//
// # Wiring in a node
//
// The node builds one Replicator with Store: its kvtier store (adapted),
// Placement: the meta store, Quorum: from meta's Settings, and a Transport
// over its peer connections, and calls Kick when meta's Watch fires. The
// Transport methods and the Serve* methods meet on the Peer service:
//
//	Transport.Replicate -> Peer.Replicate (PutHeader kind, at)         -> ServeReplicate
//	Transport.Fetch     -> Peer.Fetch (FORMAT_ENTRY, direct)            -> ServeFetch
//	Transport.Digest    -> Peer.Digest (from, epoch, replicas, split,
//	                       ranges, keys)                                -> ServeDigest
//	Transport.Delete    -> Client.Delete (direct, at)                   -> ServeDelete
//
// The node maps this package's sentinels to gRPC statuses and back (each
// refusal carries its reason as a status detail), so that refusals
// (ErrRejected, ErrTombstoned, ErrNoRoom), a busy receiver's ErrBusy,
// ErrNotFound and ErrEpochMismatch survive the wire for errors.Is, and
// every other failure counts as "unreachable".
// Client puts go through Write (or BeginWrite, which streams an entry to
// the other replicas as it arrives), client reads through Read, client
// deletes through Delete; Drain serves `kvmesh drain`; Collector goes to
// the node's Prometheus registry.
package replication
