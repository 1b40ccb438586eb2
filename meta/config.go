package meta

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// Peers is the membership source the leader reconciles raft and the ring
// with. *gossip.Gossip implements it.
type Peers interface {
	// Members returns the nodes gossip considers alive, this one included.
	Members() []gossip.NodeMeta
}

// PeerStatus may also be implemented by Peers (*gossip.Gossip does it): a
// member it reports in gossip.StateLeft left gracefully and is removed at
// once instead of after DeadGrace.
type PeerStatus interface {
	Status() []gossip.MemberStatus
}

// Forwarder carries a write from a follower to the leader. node implements
// it over gRPC: the leader's handler calls ApplyForwarded with cmd. Errors
// that mean "that node is not (or no longer) the leader" should wrap
// ErrNotLeader, and refusals of the command ErrInvalidCommand or
// ErrStaleEpoch, so that the follower retries the first and not the others.
type Forwarder interface {
	Apply(ctx context.Context, leaderGRPCAddr string, cmd []byte) error
}

// Config configures Open. Zero durations and counts take the documented
// defaults; the raft timings default to hashicorp/raft's (tuned for a LAN)
// and tests shrink them.
type Config struct {
	// NodeID is this node's raft server ID and ring member ID (required);
	// it must equal its gossip NodeMeta.ID and stay the same across
	// restarts.
	NodeID string
	// RaftBind is the host:port raft listens on; port 0 picks a free one
	// (see RaftAddr). Default "127.0.0.1:0".
	RaftBind string
	// RaftAdvertise is the address other nodes dial; default the bound
	// address, which must then not be unspecified (0.0.0.0).
	RaftAdvertise string
	// TLS, if set, carries raft over mutual TLS (newStreamLayer):
	// both ends must hold a node certificate of the cluster CA, so a peer
	// with another CA's certificate, a client certificate or none cannot
	// exchange a single raft RPC with this node. A TLS in insecure mode is
	// plain TCP, as is nil (the default).
	TLS *tlsconf.TLS
	// DataDir holds the raft log (DataDir/raft/wal) and snapshots
	// (DataDir/raft/snapshots) (required).
	DataDir string
	// BootstrapExpect is the number of servers that bootstrap a new
	// cluster: once Peers reports that many nodes, the ones with the
	// smallest IDs bootstrap together. 1 bootstraps alone at once; 0 never
	// bootstraps (the node waits for a leader to add it).
	BootstrapExpect int
	// BootstrapWait is how long the chosen bootstrap set must stay the same
	// before this node bootstraps. It gives the leader of an existing
	// cluster time to add a node started with BootstrapExpect whose ID
	// sorts first, before it would bootstrap a second, divergent cluster.
	// Default 2*ReconcileInterval + 2*HeartbeatTimeout.
	BootstrapWait time.Duration
	// Peers is the gossip membership; nil means this node alone (useful
	// with BootstrapExpect 1). SetPeers sets it after Open when gossip is
	// started later, since gossip needs RaftAddr first.
	Peers Peers
	// Forward sends writes made on a follower to the leader; nil makes such
	// writes fail with ErrNotLeader.
	Forward Forwarder
	// GRPCAddr and Weight describe this node when Peers does not list it
	// (no gossip yet, or none at all); gossip's metadata wins otherwise.
	GRPCAddr string
	Weight   float64
	// Incarnation is this run of the node, as its gossip NodeMeta
	// announces it (node sets both from one value per process start).
	// Leave tombstones the node with it: the leader keeps that incarnation
	// out of raft and the ring, and admits the node again only with
	// another one. 0 is a valid, if undistinguished, incarnation.
	Incarnation uint64
	// DeadGrace is how long the leader waits after a node stops being
	// alive in gossip before it removes the node from the ring (from raft:
	// RaftRemoveAfter). A node that leaves gracefully (NodeMeta.Leaving)
	// is removed from both at once. Default 30s.
	DeadGrace time.Duration
	// RaftRemoveAfter is how long a node may be missing from gossip before
	// the leader removes it from raft, never less than DeadGrace (the
	// larger applies). It is longer than DeadGrace on purpose: the ring
	// should route around a dead node within seconds, but a raft voter
	// that is gone for a reboot or a network blip should come back as the
	// same voter rather than shrink and regrow the quorum. Until then the
	// node still counts as a voter: with 3 voters, one dead, the cluster
	// tolerates no further failure. A graceful leave removes the node at
	// once. Default 15m.
	RaftRemoveAfter time.Duration
	// MaxVoters bounds raft voters; further nodes join as non-voters and
	// are promoted when a voter goes. Default 5.
	MaxVoters int
	// ReconcileInterval is how often the leader reconciles gossip with
	// raft and the ring (besides Reconcile calls). Default 1s.
	ReconcileInterval time.Duration
	// ApplyTimeout bounds a write whose context has no deadline. Default 10s.
	ApplyTimeout time.Duration

	// Raft timings: defaults 1s, 1s, 500ms, 50ms (hashicorp/raft's).
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotInterval and SnapshotThreshold: raft snapshots when at least
	// SnapshotThreshold entries accumulated, checked every
	// SnapshotInterval. Defaults 30s and 1024; TrailingLogs (default 1024)
	// entries stay behind a snapshot for slow followers.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64
	// SnapshotRetain is how many snapshots stay on disk. Default 2.
	SnapshotRetain int
	// WALSegmentSize is the size of raft-wal segment files. Default 4 MiB:
	// metadata entries are small, and the default 64 MiB would be mostly
	// empty.
	WALSegmentSize int

	// Logger receives raft's and this package's logs; default
	// slog.Default(). Records carry no node ID of their own: the caller's
	// logger names the node (node.New's does).
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultRaftBind          = "127.0.0.1:0"
	DefaultDeadGrace         = 30 * time.Second
	DefaultRaftRemoveAfter   = 15 * time.Minute
	DefaultMaxVoters         = 5
	DefaultReconcileInterval = time.Second
	DefaultApplyTimeout      = 10 * time.Second
	DefaultSnapshotInterval  = 30 * time.Second
	DefaultSnapshotThreshold = 1024
	DefaultTrailingLogs      = 1024
	DefaultSnapshotRetain    = 2
	DefaultWALSegmentSize    = 4 << 20
)

// DefaultConfig is the configuration of every field Open defaults: the
// values a zero field takes (BootstrapWait follows ReconcileInterval and
// HeartbeatTimeout). The caller sets NodeID and DataDir (and the cluster's
// bootstrap or seeds) before Open.
func DefaultConfig() Config {
	c := Config{
		RaftBind:           DefaultRaftBind,
		DeadGrace:          DefaultDeadGrace,
		RaftRemoveAfter:    DefaultRaftRemoveAfter,
		MaxVoters:          DefaultMaxVoters,
		ReconcileInterval:  DefaultReconcileInterval,
		ApplyTimeout:       DefaultApplyTimeout,
		HeartbeatTimeout:   time.Second,
		ElectionTimeout:    time.Second,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		SnapshotInterval:   DefaultSnapshotInterval,
		SnapshotThreshold:  DefaultSnapshotThreshold,
		TrailingLogs:       DefaultTrailingLogs,
		SnapshotRetain:     DefaultSnapshotRetain,
		WALSegmentSize:     DefaultWALSegmentSize,
	}
	c.BootstrapWait = 2*c.ReconcileInterval + 2*c.HeartbeatTimeout
	return c
}

// Validate reports what Open would refuse before touching the data
// directory.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c Config) withDefaults() (Config, error) {
	if c.NodeID == "" {
		return c, errors.New("meta: Config.NodeID is required")
	}
	if c.DataDir == "" {
		return c, errors.New("meta: Config.DataDir is required")
	}
	if c.BootstrapExpect < 0 {
		return c, errors.New("meta: Config.BootstrapExpect must be >= 0")
	}
	if c.RaftBind == "" {
		c.RaftBind = DefaultRaftBind
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	d := DefaultConfig()
	def(&c.DeadGrace, d.DeadGrace)
	def(&c.RaftRemoveAfter, d.RaftRemoveAfter)
	c.RaftRemoveAfter = max(c.RaftRemoveAfter, c.DeadGrace)
	def(&c.ReconcileInterval, d.ReconcileInterval)
	def(&c.ApplyTimeout, d.ApplyTimeout)
	def(&c.HeartbeatTimeout, d.HeartbeatTimeout)
	def(&c.ElectionTimeout, d.ElectionTimeout)
	def(&c.LeaderLeaseTimeout, d.LeaderLeaseTimeout)
	def(&c.CommitTimeout, d.CommitTimeout)
	def(&c.SnapshotInterval, d.SnapshotInterval)
	def(&c.BootstrapWait, 2*c.ReconcileInterval+2*c.HeartbeatTimeout)
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		c.LeaderLeaseTimeout = c.HeartbeatTimeout
	}
	if c.MaxVoters <= 0 {
		c.MaxVoters = d.MaxVoters
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = d.TrailingLogs
	}
	if c.SnapshotRetain <= 0 {
		c.SnapshotRetain = d.SnapshotRetain
	}
	if c.WALSegmentSize <= 0 {
		c.WALSegmentSize = d.WALSegmentSize
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}
