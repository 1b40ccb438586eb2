package gossip

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// blackhole accepts TCP connections and never answers, as a member that
// is unreachable after the handshake (a paused process, a half-open
// path): a memberlist push/pull to it waits the whole TCPTimeout.
type blackhole struct {
	ln       net.Listener
	accepted chan struct{} // signalled (without blocking) on each accept
	mu       sync.Mutex
	conns    []net.Conn
	done     chan struct{}
}

func newBlackhole(t *testing.T, accepted chan struct{}) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, accepted: accepted, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			select {
			case b.accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) close() {
	_ = b.ln.Close()
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.conns = nil
}

// TestGossipShutdownDuringReconnect: Shutdown while the reconnect loop is
// stuck on members that never answer returns without waiting for them.
// Before, memberlist's Join went on through every failed member, each
// costing a full TCPTimeout, and Shutdown waited for the loop: k dead
// members, k TCPTimeouts. The bound asserted is one TCPTimeout in all
// (generous: Shutdown cancels the exchanges, so it takes milliseconds),
// against the k*TCPTimeout the old code needed.
func TestGossipShutdownDuringReconnect(t *testing.T) {
	const dead = 4
	cfg := testConfig("n0")
	cfg.Timing.TCPTimeout = 5 * time.Second
	cfg.ReconnectInterval = 50 * time.Millisecond
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var holes []*blackhole
	accepted := make(chan struct{}, 1)
	for i := range dead {
		b := newBlackhole(t, accepted)
		holes = append(holes, b)
		// Feed memberlist's own event path: a member that failed, whose
		// gossip address is the black hole.
		id := fmt.Sprintf("d%d", i+1)
		meta, err := NodeMeta{ID: id, GRPCAddr: "127.0.0.1:1", RaftAddr: "127.0.0.1:2"}.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		addr := b.ln.Addr().(*net.TCPAddr)
		g.queue.NotifyLeave(&memberlist.Node{Name: id, Addr: addr.IP, Port: uint16(addr.Port), Meta: meta})
	}
	testutil.WaitFor(t, "the dead members held failed", func() bool { return len(g.failedAddrs()) == dead })
	// Wait until the loop is inside an exchange with a black hole.
	select {
	case <-accepted:
	case <-time.After(waitLimit):
		t.Fatal("the reconnect loop never dialed a failed member")
	}

	done := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		_ = g.Shutdown()
		done <- time.Since(start)
	}()
	bound := cfg.Timing.TCPTimeout
	select {
	case took := <-done:
		t.Logf("Shutdown took %v with %d unreachable members (TCPTimeout %v)", took, dead, bound)
	case <-time.After(bound):
		took := <-done // let it finish, so that nothing outlives the test
		t.Fatalf("Shutdown took %v with %d unreachable members; want well under one TCPTimeout (%v) in all, not one per member",
			took, dead, bound)
	}
	if _, err := g.Join(t.Context(), []string{holes[1].ln.Addr().String()}); err != ErrShutdown {
		t.Fatalf("Join after Shutdown: %v, want %v", err, ErrShutdown)
	}
}
