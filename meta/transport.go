package meta

import (
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/tlsconf"
)

// Raft transport settings: a connection pool of 3 per peer and a 10 s
// bound on each RPC's I/O, hashicorp/raft's TCP transport defaults.
const (
	raftMaxPool = 3
	raftTimeout = 10 * time.Second
)

// newTransport binds raft's network transport: over cfg.TLS's mutual-TLS
// stream layer when it is set, plain TCP otherwise. Both are a
// *raft.NetworkTransport, so guardedTransport fences either.
func newTransport(cfg Config, advertise net.Addr, logger hclog.Logger) (*raft.NetworkTransport, error) {
	if cfg.TLS == nil {
		return raft.NewTCPTransportWithConfig(cfg.RaftBind, advertise, &raft.NetworkTransportConfig{
			MaxPool: raftMaxPool,
			Timeout: raftTimeout,
			Logger:  logger,
		})
	}
	sl, err := tlsconf.NewStreamLayer(cfg.RaftBind, advertise, cfg.TLS)
	if err != nil {
		return nil, err
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  sl,
		MaxPool: raftMaxPool,
		Timeout: raftTimeout,
		Logger:  logger,
	}), nil
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

func (g *guardedTransport) fence() {
	g.mu.Lock()
	g.fenced = true
	g.mu.Unlock()
}
