package node

import (
	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/replication"
)

// Seams for the tests in package node_test. Those tests start their nodes
// with node/nodetest, which imports node, so only a test outside the
// package can use it; what they check inside a node they reach through
// these, which exist only while the package's tests are compiled.

// Store is the node's chunk store.
func (n *Node) Store() *kvtier.Store { return n.store }

// Replicator is the node's replicator.
func (n *Node) Replicator() *replication.Replicator { return n.repl }

// Gossip is the node's gossip membership.
func (n *Node) Gossip() *gossip.Gossip { return n.gossip }

// Quorum is the replication factor and write quorum the node uses now.
func (n *Node) Quorum() (replicas, writeQuorum int) { return n.quorum() }

// Injector is the node's Injector service.
func (n *Node) Injector() api.InjectorServer { return n.inj }

// PeerClient is the node's pooled Peer client of addr.
func (n *Node) PeerClient(addr string) (api.PeerClient, error) { return n.peers.peer(addr) }

// Panics is how many handler panics the node's interceptors recovered.
func (n *Node) Panics() float64 { return readCounter(n.metrics.panics) }

// BytesOut is the node's kvmesh_bytes_out_total of op.
func BytesOut(n *Node, op string) float64 { return readCounter(n.metrics.bytesOut.WithLabelValues(op)) }

// Interceptors are the node's gRPC server interceptors.
func (n *Node) Interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return n.unaryInterceptor, n.streamInterceptor
}

// ReplicaRemote is the injection fetcher's view of a node's replicas.
type ReplicaRemote = replicaRemote

// RemoteOf is n's ReplicaRemote.
func RemoteOf(n *Node) ReplicaRemote { return replicaRemote{n: n, reads: n.inj.reads} }

// Others are the replicas of content other than the node itself.
func (r replicaRemote) Others(content chunk.ID) []string { return r.others(content) }

// LeftMarkerName is the file that marks a data directory whose node left.
const LeftMarkerName = leftMarkerName

// NodeIDFileName is the file in a data directory that names its node.
const NodeIDFileName = nodeIDFileName

// InjectReads reports the injection path's FetchMany streams and the
// entries read in them (opened by the injection, shared with another).
func InjectReads(n *Node) (streams, fetched, shared float64) {
	r := n.inj.reads
	return readCounter(r.streams), readCounter(r.entries.WithLabelValues("fetched")), readCounter(r.entries.WithLabelValues("shared"))
}

// HandOver hands f over on the cache socket of the node behind ic and
// returns the handle to register it with.
var HandOver = handOver
