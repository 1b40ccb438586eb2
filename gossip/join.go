package gossip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"
)

// Join contacts seeds (host:port) and returns how many answered; an error
// when none did.
func (g *Gossip) Join(ctx context.Context, seeds []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if g.isClosed() {
		return 0, ErrShutdown
	}
	return g.join(seeds)
}

func (g *Gossip) join(seeds []string) (int, error) {
	n, err := g.ml.Join(seeds)
	if n > 0 {
		if err != nil {
			g.log.Debug("some seeds did not answer", "joined", n, "err", err)
		}
		return n, nil
	}
	if err == nil {
		err = errors.New("no seed answered")
	}
	return 0, fmt.Errorf("gossip: join %v: %w", seeds, err)
}

// otherSeeds drops this node's own address from seeds: joining oneself
// "succeeds", and nodes started together with the same seed list would
// each join only themselves and never meet.
func (g *Gossip) otherSeeds(seeds []string) []string {
	self := g.ml.LocalNode()
	port := strconv.Itoa(int(self.Port))
	anyAddr := net.ParseIP(g.cfg.BindAddr).IsUnspecified()
	var out []string
	for _, s := range seeds {
		host, p, err := net.SplitHostPort(s)
		if err == nil && p == port {
			ip := net.ParseIP(host)
			if ip != nil && (ip.Equal(self.Addr) || (ip.IsLoopback() && anyAddr)) {
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

func (g *Gossip) retryJoin(seeds []string) {
	defer g.wg.Done()
	wait := 250 * time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		if g.ml.NumMembers() > 1 {
			return // someone joined us meanwhile
		}
		n, err := g.join(seeds)
		if err == nil {
			g.log.Info("joined cluster", "seeds_answered", n)
			return
		}
		g.log.Warn("join failed; will retry", "err", err, "in", wait)
		wait = min(2*wait, g.cfg.JoinRetryMax)
		t.Reset(wait)
	}
}

// reconnectLoop tries, every ReconnectInterval, to reach the members held
// failed: a push/pull with one that is in fact alive tells it that we
// hold it dead, so it refutes, and its refutation spreads to everyone who
// holds it dead. Members that left are not tried.
func (g *Gossip) reconnectLoop() {
	defer g.wg.Done()
	t := time.NewTicker(g.cfg.ReconnectInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		addrs := g.failedAddrs()
		if len(addrs) == 0 {
			continue
		}
		// memberlist's Join is a push/pull per address, one after
		// another, each bounded by Timing.TCPTimeout; it blocks only this
		// loop, and Shutdown cuts it short (stoppableTransport).
		if n, err := g.ml.Join(addrs); n > 0 {
			g.log.Info("reconnected to members held failed", "tried", len(addrs), "answered", n)
		} else if err != nil {
			g.log.Debug("reconnect to failed members", "tried", addrs, "err", err)
		}
	}
}

// failedAddrs returns the gossip addresses of the members held failed.
func (g *Gossip) failedAddrs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	var out []string
	for id, st := range g.members {
		if st.State == StateFailed && id != g.cfg.NodeID && st.Meta.GossipAddr != "" {
			out = append(out, st.Meta.GossipAddr)
		}
	}
	slices.Sort(out)
	return out
}
