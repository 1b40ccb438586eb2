package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/replication"
)

// cleanups is a stack of undo functions. Each step of Node.Start pushes
// the undo of what it started as soon as it started it, so that a step
// failing halfway, a later step failing, and Close all take back exactly
// what runs, newest first.
type cleanups struct {
	undos []undo
}

// undo takes back one thing Start started; name says what, in errors.
type undo struct {
	name string
	fn   func() error
}

// push records how to take back what was just started.
func (c *cleanups) push(name string, fn func() error) {
	c.undos = append(c.undos, undo{name: name, fn: fn})
}

// unwind runs every undo, newest first, even after one failed, and
// returns their errors joined (nil if all succeeded). The stack is empty
// afterwards.
func (c *cleanups) unwind() error {
	var errs []error
	for i := len(c.undos) - 1; i >= 0; i-- {
		if err := c.undos[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("node: close %s: %w", c.undos[i].name, err))
		}
	}
	c.undos = nil
	return errors.Join(errs...)
}

// Start binds the listeners, opens the store and the metadata, joins gossip
// and starts serving. It returns once everything listens; the cluster may
// still be electing a leader (see Ready). ctx bounds only the start. If a
// step fails, what the earlier steps started is closed again, newest
// first, before Start returns the step's error (joined with any error of
// that unwinding); Close then has nothing left to do.
func (n *Node) Start(ctx context.Context) error {
	if n.started {
		return errors.New("node: already started")
	}
	n.started = true
	// Each step pushes the undo of whatever it started onto n.undo before
	// it returns, error or not. Close takes them back in the reverse
	// order: the background loops stop first (they call into the
	// replicator and the metadata), then the servers (no new requests),
	// then injection, replication, gossip, the metadata (which forwards
	// writes over the peer connections), the peer connections, the store,
	// and last the listeners.
	steps := []func(context.Context) error{
		n.checkDataDir,
		n.listen,
		n.openStore,
		n.startPeers,
		n.openMeta,
		n.startGossip,
		n.startReplication,
		n.startInjection,
		n.serveHTTP,
		n.serveGRPC,
		n.startBackgroundLoops,
		n.clearRejoin,
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return errors.Join(err, n.undo.unwind())
		}
	}
	n.log.Info("node: started", "grpc", n.GRPCAddr(), "http", n.HTTPAddr(), "gossip", n.GossipAddr(), "raft", n.RaftAddr())
	return nil
}

// Close stops serving and releases everything Start started, in the
// reverse order, and returns the errors of those closes joined (nil when
// every one succeeded; later calls return the same). It does not leave
// the cluster: a node restarted with the same ID and data directory
// rejoins.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.undo.unwind() })
	return n.closeErr
}

// checkDataDir creates the data directory and refuses one first started
// under another node ID (ErrNodeIDMismatch), or whose node left the
// cluster, unless Config.Rejoin (ErrLeftCluster).
func (n *Node) checkDataDir(context.Context) error {
	// Only the node's user may read its entries, tokens' records and
	// raft log: 0700, as the systemd unit's StateDirectoryMode.
	if err := os.MkdirAll(n.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	if fi, err := os.Stat(n.cfg.DataDir); err == nil && fi.Mode().Perm()&0o077 != 0 {
		n.log.Warn("node: the data directory is open to other users; make it 0700", "dir", n.cfg.DataDir, "mode", fi.Mode().Perm().String())
	}
	if err := checkNodeIDFile(n.cfg.DataDir, n.cfg.NodeID); err != nil {
		return err
	}
	left, err := checkLeftMarker(n.cfg.DataDir, n.cfg.Rejoin)
	if err != nil {
		return err
	}
	if left != nil {
		n.log.Warn("node: rejoining the cluster after a leave (-rejoin)", "left_at", left.At, "left_incarnation", left.Incarnation)
	}
	n.rejoining = left
	return nil
}

// listen binds the gRPC and (unless "off") the HTTP listener first, so
// that their addresses are known to the metadata and to gossip.
func (n *Node) listen(ctx context.Context) error {
	var lc net.ListenConfig
	var err error
	if n.grpcLis, err = lc.Listen(ctx, "tcp", n.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("node: listen gRPC: %w", err)
	}
	n.undo.push("gRPC listener", closeListener(n.grpcLis))
	if n.cfg.HTTPAddr == "off" {
		return nil
	}
	if n.httpLis, err = lc.Listen(ctx, "tcp", n.cfg.HTTPAddr); err != nil {
		return fmt.Errorf("node: listen HTTP: %w", err)
	}
	n.undo.push("HTTP listener", closeListener(n.httpLis))
	return nil
}

// closeListener closes l unless its server closed it already.
func closeListener(l net.Listener) func() error {
	return func() error {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
}

// TierDir is where a node on dataDir keeps its disk tier.
func TierDir(dataDir string) string { return filepath.Join(dataDir, "tier") }

func (n *Node) openStore(context.Context) error {
	cfg := n.cfg
	tcfg := kvtier.Config{DRAMBytes: cfg.DRAMBytes, ReleaseBytes: cfg.DRAMReleaseBytes, Admission: cfg.Admission, Limits: cfg.Limits, SkipVerify: true, Logger: n.log}
	// A copy the disk tier could not take leaves this node short of what
	// the ring says: the replicator takes such copies back when it can.
	tcfg.OnDropped = func(chunk.Key) {
		if r := n.dropsTo.Load(); r != nil {
			r.CopiesDropped()
		}
	}
	if cfg.DiskBytes > 0 {
		tcfg.DiskDir, tcfg.DiskBytes = TierDir(cfg.DataDir), cfg.DiskBytes
	}
	if cfg.GPUBytes > 0 {
		dev, err := kvtier.OpenGPU(kvtier.GPUConfig{Device: cfg.GPUDevice, Bytes: cfg.GPUBytes})
		if err != nil {
			return fmt.Errorf("node: open GPU tier: %w", err)
		}
		// Pushed before the store, so it is freed after the store closes.
		n.undo.push("GPU tier", dev.Close)
		tcfg.GPU, tcfg.GPUBytes = dev, cfg.GPUBytes
	}
	var err error
	if n.store, err = kvtier.Open(tcfg); err != nil {
		return fmt.Errorf("node: open store: %w", err)
	}
	n.undo.push("store", n.store.Close)
	// Unwound just before the store closes, once the servers and the
	// replicator have stopped: DRAM entries go to the disk tier (if any),
	// and the next start on this data directory reads them back.
	n.undo.push("spill DRAM to disk", n.spill)
	if err := n.registry.Register(n.store.Collector()); err != nil {
		return fmt.Errorf("node: register store metrics: %w", err)
	}
	return nil
}

func (n *Node) startPeers(context.Context) error {
	n.peers = newPeerPool(n.log)
	n.peers.creds = n.sec.tls.NodeClientCredentials()
	n.peers.linkRate = n.cfg.PeerLinkBytesPerSec
	n.undo.push("peer connections", func() error { n.peers.close(); return nil })
	return nil
}

func (n *Node) openMeta(ctx context.Context) error {
	cfg := n.cfg
	mcfg := meta.Config{
		NodeID:          cfg.NodeID,
		RaftBind:        cfg.RaftAddr,
		DataDir:         cfg.DataDir,
		BootstrapExpect: cfg.BootstrapExpect,
		Forward:         forwarder{n},
		GRPCAddr:        n.GRPCAddr(),
		Incarnation:     n.incarnation,
		DeadGrace:       cfg.DeadGrace,
		RaftRemoveAfter: cfg.RaftRemoveAfter,
		Logger:          n.log,
		TLS:             n.sec.metaTLS(),
	}
	if cfg.LocalTiming {
		// Raft keeps its default 1 s heartbeat and election timeouts: on a
		// loaded machine (CI runs many test binaries on 2 cores) shorter
		// ones elect leaders over and over. Membership changes reach raft
		// faster, though.
		mcfg.CommitTimeout = 10 * time.Millisecond
		mcfg.ReconcileInterval = 200 * time.Millisecond
	}
	var err error
	if n.meta, err = meta.Open(ctx, mcfg); err != nil {
		return fmt.Errorf("node: open metadata: %w", err)
	}
	n.undo.push("metadata", n.meta.Close)
	n.registerMetaMetrics()
	n.registerRecoveryMetric()
	return nil
}

func (n *Node) startGossip(context.Context) error {
	cfg := n.cfg
	ghost, gport, err := splitHostPort(cfg.GossipAddr)
	if err != nil {
		return fmt.Errorf("node: gossip address: %w", err)
	}
	gcfg := gossip.Config{
		NodeID:   cfg.NodeID,
		BindAddr: ghost,
		BindPort: gport,
		Meta: gossip.NodeMeta{
			ID: cfg.NodeID, GRPCAddr: n.GRPCAddr(), RaftAddr: n.meta.RaftAddr(), HTTPAddr: n.HTTPAddr(),
			Capacity:    gossip.Capacity{DRAMBytes: uint64(cfg.DRAMBytes), DiskBytes: uint64(cfg.DiskBytes)},
			Incarnation: n.incarnation,
		},
		Seeds:   cfg.Seeds,
		Logger:  n.log,
		Keyring: cfg.GossipKeyring,
	}
	if cfg.LocalTiming {
		gcfg.Timing = gossip.LocalTiming()
		gcfg.JoinRetryMax = time.Second
	}
	if n.gossip, err = gossip.Start(gcfg); err != nil {
		return fmt.Errorf("node: start gossip: %w", err)
	}
	n.undo.push("gossip", n.gossip.Shutdown)
	n.meta.SetPeers(n.gossip)
	n.meta.Reconcile()
	return nil
}

func (n *Node) startReplication(context.Context) error {
	cfg := n.cfg
	rcfg := cfg.Replication
	rcfg.NodeID = cfg.NodeID
	rcfg.Store = replStore{n.store}
	rcfg.Transport = transport{n}
	rcfg.Placement = n.meta
	rcfg.Quorum = n.quorum
	rcfg.DataDir = filepath.Join(cfg.DataDir, "replication")
	rcfg.Limits = cfg.Limits
	rcfg.Logger = n.log
	rcfg.Recovering = func() bool { return n.recovering() != nil }
	if rcfg.CallTimeout == 0 {
		rcfg.CallTimeout = cfg.RPCTimeout
	}
	var err error
	if n.repl, err = replication.New(rcfg); err != nil {
		return fmt.Errorf("node: start replication: %w", err)
	}
	n.undo.push("replication", n.repl.Close)
	n.dropsTo.Store(n.repl)
	// Unwound before the replicator closes (the servers have stopped):
	// a node without a disk tier hands its chunks to their other owners.
	n.undo.push("hand chunks to their other owners", n.handoff)
	if err := n.registry.Register(n.repl.Collector()); err != nil {
		return fmt.Errorf("node: register replication metrics: %w", err)
	}
	return nil
}

func (n *Node) startInjection(context.Context) error {
	var err error
	if n.inj, err = n.startInject(); err != nil {
		return err
	}
	n.undo.push("injection", n.inj.close)
	return nil
}

// httpShutdownTimeout bounds how long Close waits for HTTP requests in
// flight.
const httpShutdownTimeout = 2 * time.Second

func (n *Node) serveHTTP(context.Context) error {
	if n.httpLis == nil {
		return nil
	}
	n.httpSrv = &http.Server{Handler: n.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.httpSrv.Serve(n.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("node: HTTP server stopped", "err", err)
		}
	}()
	n.undo.push("HTTP server", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
		defer cancel()
		err := n.httpSrv.Shutdown(ctx)
		if err != nil {
			err = errors.Join(err, n.httpSrv.Close())
		}
		<-done
		return err
	})
	return nil
}

// grpcStopTimeout bounds how long Close lets calls in flight finish
// before it cuts them off.
const grpcStopTimeout = 5 * time.Second

func (n *Node) serveGRPC(context.Context) error {
	n.grpcSrv = grpc.NewServer(append(append(n.serverOptions(), api.ServerOptions()...),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(8<<20),
	)...)
	api.RegisterClientServer(n.grpcSrv, &clientService{n: n})
	api.RegisterPeerServer(n.grpcSrv, &peerService{n: n})
	api.RegisterAdminServer(n.grpcSrv, &adminService{n: n})
	api.RegisterInjectorServer(n.grpcSrv, n.inj)
	// Server reflection (grpcurl), behind the same guard as every call
	// (auth.DefaultMethods gives it the read scope).
	reflection.Register(n.grpcSrv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.grpcSrv.Serve(n.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Error("node: gRPC server stopped", "err", err)
		}
	}()
	n.undo.push("gRPC server", func() error {
		stopped := make(chan struct{})
		go func() { n.grpcSrv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(grpcStopTimeout):
			n.grpcSrv.Stop()
			<-stopped
		}
		<-done
		return nil
	})
	return nil
}

func (n *Node) startBackgroundLoops(context.Context) error {
	n.bg = n.startBackground()
	n.undo.push("background loops", func() error { n.bg.stop(); return nil })
	return nil
}

// clearRejoin removes the leave record of a node that started again with
// Config.Rejoin, once everything else started.
func (n *Node) clearRejoin(context.Context) error {
	if n.rejoining == nil {
		return nil
	}
	return clearLeftMarker(n.cfg.DataDir)
}
