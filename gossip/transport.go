package gossip

import (
	"context"
	"fmt"
	"log"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// stoppableTransport is memberlist's NetTransport whose outgoing TCP
// exchanges end when it shuts down. memberlist bounds each exchange
// (push/pull, reliable message, fallback probe) by TCPTimeout but cannot
// cancel one, and its Join goes through its addresses one after another:
// without this, a Shutdown while the reconnect loop (or a join retry)
// was trying k unreachable members waited up to k TCPTimeouts. Shutdown
// cancels the dials in progress and closes the connections that are
// open, so every exchange fails at once and the loops notice the stop.
type stoppableTransport struct {
	*memberlist.NetTransport

	ctx    context.Context // cancelled by Shutdown; every dial uses it
	cancel context.CancelFunc

	mu    sync.Mutex
	conns map[*trackedConn]struct{} // open outgoing connections; nil once shut down
}

var _ memberlist.NodeAwareTransport = (*stoppableTransport)(nil)

// newStoppableTransport binds addr:port as memberlist.Create would (with
// a few retries when port is 0, since the TCP and UDP listeners are bound
// one after the other and another process may take the UDP port between).
func newStoppableTransport(addr string, port int, logger *log.Logger) (*stoppableTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{addr}, BindPort: port, Logger: logger}
	tries := 1
	if port == 0 {
		tries = 10
	}
	var nt *memberlist.NetTransport
	var err error
	for range tries {
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			break
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("gossip: gossip transport: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &stoppableTransport{NetTransport: nt, ctx: ctx, cancel: cancel, conns: make(map[*trackedConn]struct{})}, nil
}

// DialTimeout implements memberlist.Transport.
func (t *stoppableTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (t *stoppableTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(t.ctx, "tcp", a.Addr)
	if err != nil {
		if t.ctx.Err() != nil {
			return nil, ErrShutdown
		}
		return nil, err
	}
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conns == nil {
		_ = c.Close()
		return nil, ErrShutdown
	}
	t.conns[tc] = struct{}{}
	return tc, nil
}

// Shutdown implements memberlist.Transport: it ends the outgoing
// exchanges, then closes the listeners.
func (t *stoppableTransport) Shutdown() error {
	t.cancel()
	t.mu.Lock()
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
	return t.NetTransport.Shutdown()
}

// trackedConn forgets itself in its transport when closed.
type trackedConn struct {
	net.Conn
	t *stoppableTransport
}

func (c *trackedConn) Close() error {
	c.t.mu.Lock()
	delete(c.t.conns, c) // a no-op on the nil map after Shutdown
	c.t.mu.Unlock()
	return c.Conn.Close()
}
