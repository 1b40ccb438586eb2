package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// Config configures a Node. Zero fields take the documented defaults.
type Config struct {
	// NodeID names the node in gossip, raft and the ring (required); it
	// must stay the same across restarts.
	NodeID string
	// DataDir holds the raft log and snapshots (DataDir/raft) and the disk
	// tier (DataDir/tier) (required).
	DataDir string
	// GRPCAddr is where the Client and Peer services listen. Default
	// "127.0.0.1:0" (any free port; see Node.GRPCAddr).
	GRPCAddr string
	// HTTPAddr serves /metrics, /healthz, /readyz and /debug/pprof.
	// Default: the gRPC host with port 0. "off" disables HTTP.
	HTTPAddr string
	// GossipAddr and RaftAddr are the gossip (UDP and TCP) and raft bind
	// addresses. Default: the gRPC host with port 0.
	GossipAddr string
	RaftAddr   string
	// Seeds are gossip host:port addresses of existing members.
	Seeds []string
	// BootstrapExpect is how many servers bootstrap a new cluster together
	// (meta.Config.BootstrapExpect). Default 1 when there are no seeds,
	// else 0 (join an existing cluster).
	BootstrapExpect int
	// DRAMBytes is the DRAM tier budget. Default 1 GiB.
	DRAMBytes int64
	// GPUBytes is the GPU tier's budget, a slab reserved on device
	// GPUDevice at start (kvtier.OpenGPU); 0 means no GPU tier. A build
	// without the cuda tag refuses a positive budget.
	GPUBytes  int64
	GPUDevice int
	// GPU runs injection on device GPUDevice and opens engine caches
	// registered by CUDA IPC (inject.Config.GPU): cudakern/gpu.Driver,
	// which kvmeshd built with the cuda tag sets. Nil: the CPU Injector,
	// and CUDA IPC registrations are refused as unsupported.
	GPU cudakern.GPU
	// DRAMReleaseBytes is how many bytes of freed DRAM pages stay resident
	// before they go back to the OS (kvtier.Config.ReleaseBytes). Default
	// (0) kvtier's, min(DRAMBytes/8, 64 MiB); negative: never.
	DRAMReleaseBytes int64
	// Admission is the store's admission policy (kvtier.Config.Admission).
	// Default kvtier.AdmitAll, every put kept until evicted;
	// kvtier.AdmitReuse keeps what is predicted to be read again and weighs
	// eviction by how an entry can be reused, for engines that write back
	// every prompt they serve (docs/ARCHITECTURE.md, "Write-back").
	Admission kvtier.Admission
	// DiskBytes enables the disk tier under DataDir/tier with that budget;
	// 0 means no disk tier.
	DiskBytes int64
	// Limits bound the entries the node accepts. Zero means
	// chunk.DefaultLimits.
	Limits chunk.Limits
	// FrameBytes is the data frame size of tensor streams. Default
	// api.DefaultFrameBytes (1 MiB).
	FrameBytes int
	// RPCTimeout bounds every outgoing call that has no earlier deadline.
	// Default 10 s.
	RPCTimeout time.Duration
	// PeerLinkBytesPerSec, when positive, paces the connections this node
	// dials to other nodes to that many bytes per second in each
	// direction, emulating a slower network (internal/linkpace). Default 0: off.
	PeerLinkBytesPerSec int64
	// DeadGrace is how long a node may be dead before the leader removes it
	// from the ring (meta.Config.DeadGrace). Default 30 s.
	DeadGrace time.Duration
	// RaftRemoveAfter is how long a node may be dead before the leader
	// removes it from raft (meta.Config.RaftRemoveAfter): never less than
	// DeadGrace. Default 15 min.
	RaftRemoveAfter time.Duration
	// LocalTiming tunes gossip and raft for nodes on one machine (tests,
	// `kvmesh local-cluster`): failures are noticed in about a second.
	LocalTiming bool
	// Rejoin lets a node whose data directory records that it left the
	// cluster (Leave, a drain) start and join again; without it Start
	// fails with ErrLeftCluster.
	Rejoin bool
	// NoStartupPull turns off the pull pass a node runs once it is back in
	// the ring after a start (replication.StartupPull): a DRAM-only node
	// comes back empty, and without it waits for the others' anti-entropy
	// rounds (Replication.AntiEntropyInterval, default 5 min) and read
	// repair to refill it.
	NoStartupPull bool
	// ShutdownHandoff bounds what Close does for the chunks only this
	// node's DRAM holds when it has no disk tier (DiskBytes 0): one
	// anti-entropy round that pushes every key it holds to the other
	// owners that lack it, before the replicator stops, so that a key
	// this node held is not down to fewer copies while it is away. 0 (the
	// default) skips it; kvmeshd sets 30 s.
	ShutdownHandoff time.Duration
	// Replication tunes the replication package (hints, repair,
	// rebalancing, anti-entropy); NodeID, Store, Transport, Placement,
	// Quorum, DataDir (DataDir/replication), Limits and Logger are set by
	// the node. Zero fields take replication's defaults.
	Replication replication.Config
	// TLS names the node's CA, certificate and key files: gRPC (clients
	// and peers) and raft then run over mutual TLS (docs/SECURITY.md).
	// Required unless Insecure is set; New fails with ErrNoTLS otherwise.
	TLS tlsconf.Config
	// Insecure runs the node without TLS: plaintext, and any caller may
	// use the peer API. New logs a warning. Single machine and tests only.
	Insecure bool
	// Tokens requires API tokens (auth package) from clients; without
	// them a client certificate of the CA is the authorisation.
	Tokens bool
	// MaxStreamsPerClient bounds one caller's concurrent streams. Default
	// auth.DefaultMaxStreams; negative means no limit.
	MaxStreamsPerClient int
	// MaxUnaryPerClient bounds one client's unary calls in flight (a
	// cluster member's are not bounded). Default auth.DefaultMaxUnary;
	// negative means no limit.
	MaxUnaryPerClient int
	// MaxChunksPerRequest bounds the chunks one Lookup or Inject names
	// (ResourceExhausted beyond). Default MaxLookupBatch.
	MaxChunksPerRequest int
	// GossipKeyring encrypts gossip (gossipkey.LoadFile); nil means
	// unencrypted gossip.
	GossipKeyring *memberlist.Keyring
	// GossipKeyringFile is where GossipKeyring came from: the node
	// rewrites it after each live key rotation step (Admin.GossipKeys), so
	// a restart comes back with the cluster's keys. Empty: not rewritten.
	GossipKeyringFile string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// AuditLogger receives one record ("audit") per call of a method that
	// needs the admin scope, refused calls included: who, what, the
	// arguments that matter, the result. Nil: no audit log.
	AuditLogger *slog.Logger
}

// Defaults of Config.
const (
	DefaultGRPCAddr   = "127.0.0.1:0"
	DefaultDRAMBytes  = 1 << 30
	DefaultRPCTimeout = 10 * time.Second
)

// DefaultConfig is the configuration of every field New defaults that has
// a fixed value: the values a zero field takes. The listeners other than
// gRPC default to its host with any free port, and BootstrapExpect to 1
// without Seeds; the packages the node builds (meta, gossip, replication)
// have their own DefaultConfig. The caller sets NodeID and DataDir before
// New.
func DefaultConfig() Config {
	c := Config{
		GRPCAddr:   DefaultGRPCAddr,
		DRAMBytes:  DefaultDRAMBytes,
		FrameBytes: api.DefaultFrameBytes,
		RPCTimeout: DefaultRPCTimeout,
		Limits:     chunk.DefaultLimits,
	}
	c.securityDefaults()
	return c
}

// Validate reports what New would refuse before starting anything.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c Config) withDefaults() (Config, error) {
	if c.NodeID == "" {
		return c, errors.New("node: Config.NodeID is required")
	}
	if c.DataDir == "" {
		return c, errors.New("node: Config.DataDir is required")
	}
	d := DefaultConfig()
	if c.GRPCAddr == "" {
		c.GRPCAddr = d.GRPCAddr
	}
	host, _, err := net.SplitHostPort(c.GRPCAddr)
	if err != nil {
		return c, fmt.Errorf("node: gRPC address %q: %w", c.GRPCAddr, err)
	}
	anyPort := net.JoinHostPort(host, "0")
	if c.HTTPAddr == "" {
		c.HTTPAddr = anyPort
	}
	if c.GossipAddr == "" {
		c.GossipAddr = anyPort
	}
	if c.RaftAddr == "" {
		c.RaftAddr = anyPort
	}
	if c.BootstrapExpect == 0 && len(c.Seeds) == 0 {
		c.BootstrapExpect = 1
	}
	if c.DRAMBytes <= 0 {
		c.DRAMBytes = d.DRAMBytes
	}
	if c.FrameBytes <= 0 {
		c.FrameBytes = d.FrameBytes
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = d.RPCTimeout
	}
	if c.Limits == (chunk.Limits{}) {
		c.Limits = d.Limits
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.securityDefaults()
	return c, nil
}

// Node is one kvmesh server. New configures it, Start brings it up, Close
// takes it down.
type Node struct {
	cfg Config
	log *slog.Logger
	// respClock stamps the versions of the values the Redis-protocol
	// doors write (resp.go).
	respClock versionClock
	// incarnation tells this run of the node from its other runs (gossip
	// metadata and meta.Config.Incarnation): a node that left explicitly
	// is admitted back only with another one.
	incarnation uint64

	store  *kvtier.Store
	meta   *meta.Store
	gossip *gossip.Gossip
	peers  *peerPool
	repl   *replication.Replicator
	// dropsTo is repl once it runs: the store, opened before it, tells it
	// of the copies it drops for want of room (kvtier.Config.OnDropped).
	dropsTo atomic.Pointer[replication.Replicator]
	// bodies recycles the buffers Put and Replicate receive entries into.
	bodies api.BodyPool
	// credit is the callers' Put credit (lendCredit).
	credit lendCredit
	bg     *background // meta watch, gossip events; started last, stopped first
	drain  drainState
	rec    recovery  // set by the background recovery (recovery.go)
	inj    *injector // node-side KV injection (inject.go)
	sec    security  // TLS, token guard, stream limits (security.go)

	grpcLis  net.Listener
	grpcSrv  *grpc.Server
	httpLis  net.Listener
	httpSrv  *http.Server
	registry *registry
	metrics  *metrics

	// undo holds what Start started, newest last; Close (or a failing
	// Start) unwinds it.
	undo cleanups
	// rejoining is the leave recorded in the data directory when
	// Config.Rejoin let the node start anyway; Start's last step clears it.
	rejoining *leftMarker
	closeOnce sync.Once
	closeErr  error
	started   bool
	// left is closed once a drain that took the node out of the cluster
	// has finished (Left).
	left     chan struct{}
	leftOnce sync.Once
}

// New checks cfg and returns a Node that Start brings up.
func New(cfg Config) (*Node, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeID), incarnation: uint64(time.Now().UnixNano()), left: make(chan struct{})}
	if n.sec, err = newSecurity(cfg); err != nil {
		return nil, err
	}
	n.registry = &registry{Registry: prometheus.NewRegistry()}
	n.metrics = newMetrics(n.registry)
	return n, nil
}

func splitHostPort(hp string) (string, int, error) {
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	return h, port, nil
}

// ID is the node's ID.
func (n *Node) ID() string { return n.cfg.NodeID }

// GRPCAddr is the bound gRPC address (host:port).
func (n *Node) GRPCAddr() string {
	if n.grpcLis == nil {
		return ""
	}
	return n.grpcLis.Addr().String()
}

// HTTPAddr is the bound HTTP address, or "" when HTTP is off.
func (n *Node) HTTPAddr() string {
	if n.httpLis == nil {
		return ""
	}
	return n.httpLis.Addr().String()
}

// GossipAddr is the bound gossip address.
func (n *Node) GossipAddr() string {
	if n.gossip == nil {
		return ""
	}
	return n.gossip.Addr()
}

// RaftAddr is the bound raft address.
func (n *Node) RaftAddr() string {
	if n.meta == nil {
		return ""
	}
	return n.meta.RaftAddr()
}

// Ready reports why the node cannot serve data yet, or nil: it needs a
// known leader and a ring that contains it (inRing), and then must have
// recovered: caught its metadata up with the leader's and finished its
// startup pull (an error wrapping ErrRecovering until then). A node that
// restarted without its chunks is thus not ready while it lacks them, and
// an operator who restarts the next node only once this one is ready
// never takes the last copy of a key away.
func (n *Node) Ready() error {
	if err := n.inRing(); err != nil {
		return err
	}
	return n.recovering()
}

// Meta is the node's metadata store (for tests and tools in process).
func (n *Node) Meta() *meta.Store { return n.meta }

// Leave takes this node out of the cluster for good: through raft
// (meta.Leave: a leader first hands over leadership, then the leader
// removes the node from the ring and the raft configuration and
// tombstones this incarnation) and then through gossip, which only tells
// the others sooner. It fails, and the node stays a member, when the
// removal is not committed before ctx ends. It moves no data: Drain does.
// Once committed, the leave is recorded in the data directory: a later
// Start on it fails with ErrLeftCluster unless Config.Rejoin.
func (n *Node) Leave(ctx context.Context) error {
	if n.meta == nil || n.gossip == nil {
		return nil
	}
	if err := n.meta.Leave(ctx); err != nil {
		return fmt.Errorf("node: leave: %w", err)
	}
	if err := writeLeftMarker(n.cfg.DataDir, leftMarker{NodeID: n.cfg.NodeID, Incarnation: n.incarnation, At: time.Now()}); err != nil {
		n.log.Warn("node: left the cluster, but a restart on this data directory will not know it", "err", err)
	}
	gctx, cancel := context.WithTimeout(ctx, gossipLeaveTimeout)
	defer cancel()
	if err := n.gossip.Leave(gctx); err != nil {
		// Committed already: gossip is only the fast path.
		n.log.Warn("node: gossip leave", "err", err)
	}
	return nil
}

// gossipLeaveTimeout bounds the gossip leave after the committed one.
const gossipLeaveTimeout = 5 * time.Second
