package meta

import (
	"sync"

	"github.com/hashicorp/raft"
)

// guardedTransport is raft's TCP transport with a fence around the
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
