package gossip

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Leave announces that this node is leaving (the others see EventLeave,
// not EventFail) and waits, until ctx is done (at most 10 s without a
// deadline), for the announcement to spread. Call Shutdown afterwards.
func (g *Gossip) Leave(ctx context.Context) error {
	if g.isClosed() {
		return ErrShutdown
	}
	g.metaMu.Lock()
	m := g.meta
	g.metaMu.Unlock()
	m.Leaving = true
	if err := g.setMeta(m); err != nil {
		return err
	}
	// memberlist's leave is a dead message its receivers cannot tell from
	// a failure. Tell them first, twice: the flag in our metadata, and a
	// direct notice to each member over TCP, which arrives well before the
	// dead message's next gossip round (the metadata broadcast may not).
	if err := g.broadcastMeta(ctx); err != nil {
		g.log.Warn("broadcasting leave intent", "err", err)
	}
	g.sendLeaveNotices()
	if err := g.ml.Leave(timeoutOf(ctx, 10*time.Second)); err != nil {
		return fmt.Errorf("gossip: leave: %w", err)
	}
	return nil
}

const msgLeaving byte = 1

// sendLeaveNotices sends msgLeaving to every other member that is alive
// or held failed, and waits for the sends (each bounded by
// Timing.TCPTimeout). Failed members are included because "failed" may
// only mean that this node lost touch with them (a partition that healed,
// a long pause), while they are alive and may lead the cluster's metadata.
func (g *Gossip) sendLeaveNotices() {
	msg := append([]byte{msgLeaving}, g.cfg.NodeID...)
	// The addresses come from members (copies made by drain), not from
	// ml.Members(): those are pointers into memberlist's own state, which
	// its packet handler rewrites under a lock we cannot take (a data race
	// -race reported while a metadata update was being gossiped).
	to := make(map[string]memberlist.Node)
	g.mu.Lock()
	for id, st := range g.members {
		if st.State != StateAlive && st.State != StateFailed {
			continue
		}
		host, port, err := net.SplitHostPort(st.Meta.GossipAddr)
		p, perr := strconv.ParseUint(port, 10, 16)
		if ip := net.ParseIP(host); err == nil && perr == nil && ip != nil {
			to[id] = memberlist.Node{Name: id, Addr: ip, Port: uint16(p)}
		}
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, to := range to {
		if to.Name == g.cfg.NodeID {
			continue
		}
		wg.Go(func() {
			if err := g.ml.SendReliable(&to, msg); err != nil {
				g.log.Debug("leave notice not delivered", "member", to.Name, "err", err)
			}
		})
	}
	wg.Wait()
}
