package meta

import (
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Raft transport settings: a connection pool of 3 per peer and a 10 s
// bound on each RPC's I/O, hashicorp/raft's TCP transport defaults.
const (
	raftMaxPool = 3
	raftTimeout = 10 * time.Second
)

// newTransport binds raft's network transport: over cfg.TLS's mutual-TLS
// stream layer when it is set, plain TCP otherwise. Both are a
// *raft.NetworkTransport, so guardedTransport fences either. The stream
// layer is returned too when it checks certificates (TLS not insecure),
// for admission checks; nil otherwise.
func newTransport(cfg Config, advertise net.Addr, logger hclog.Logger) (*raft.NetworkTransport, *streamLayer, error) {
	if cfg.TLS == nil {
		tr, err := raft.NewTCPTransportWithConfig(cfg.RaftBind, advertise, &raft.NetworkTransportConfig{
			MaxPool: raftMaxPool,
			Timeout: raftTimeout,
			Logger:  logger,
		})
		return tr, nil, err
	}
	sl, err := newStreamLayer(cfg.RaftBind, advertise, cfg.TLS)
	if err != nil {
		return nil, nil, err
	}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  sl,
		MaxPool: raftMaxPool,
		Timeout: raftTimeout,
		Logger:  logger,
	})
	if cfg.TLS.Insecure() {
		sl = nil
	}
	return tr, sl, nil
}

// admitTimeout bounds the handshake of an admission check.
const admitTimeout = 2 * time.Second

// admissible reports whether the node at raftAddr may be added to raft:
// with TLS on, it must complete a handshake as a node of the cluster CA,
// so a node that holds the gossip key but no valid node certificate never
// takes a voter slot it could not use. Without TLS every node is.
func (s *Store) admissible(raftAddr string) error {
	if s.tlsLayer == nil {
		return nil
	}
	c, err := s.tlsLayer.Dial(raft.ServerAddress(raftAddr), admitTimeout)
	if err != nil {
		return err
	}
	return c.Close()
}

// guardedTransport is raft's network transport with a fence around the
// heartbeat fast path. raft runs heartbeats in the transport's connection
// goroutines, not its own, so one can still be writing the current term
// after Raft.Shutdown returned; with the log store closed by then, raft
// panics ("failed to save current term"). Close calls fence, which waits
// for a heartbeat in flight and refuses later ones, before closing the log.
type guardedTransport struct {
	*raft.NetworkTransport
	mu     sync.RWMutex
	fenced bool
}

func (g *guardedTransport) SetHeartbeatHandler(cb func(rpc raft.RPC)) {
	if cb == nil {
		g.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	g.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		g.mu.RLock()
		defer g.mu.RUnlock()
		if g.fenced {
			rpc.Respond(nil, raft.ErrRaftShutdown)
			return
		}
		cb(rpc)
	})
}

// Close closes the pooled outgoing connections and then the transport.
// NetworkTransport.Close alone leaves the pool open, so each peer's
// reader of one of them (raft's handleConn) would run until that peer's
// process exits. raft's Shutdown calls this Close last, after its
// replication goroutines have returned their connections to the pool.
func (g *guardedTransport) Close() error {
	g.NetworkTransport.CloseStreams()
	return g.NetworkTransport.Close()
}

func (g *guardedTransport) fence() {
	g.mu.Lock()
	g.fenced = true
	g.mu.Unlock()
}
