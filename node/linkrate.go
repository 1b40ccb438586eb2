package node

import (
	"context"
	"net"

	"golang.org/x/time/rate"
)

// Emulated links. A node with Config.PeerLinkBytesPerSec set paces every
// connection it dials to another node, in both directions, to that rate:
// what it sends waits for the limiter before the write, and what it reads
// waits after the read, so the peer's sends back up in TCP. Each node
// paces only the connections it dials (one per peer), so every direction
// of every node pair crosses exactly one pacer. Benchmarks use it to see
// what a codec buys on a 1, 10 or 25 Gbit/s network on one machine.

// linkBurst is the most bytes a paced connection moves at once: small
// against a second's worth at any emulated rate, large against a frame
// header.
const linkBurst = 64 << 10

// pacedConn paces a connection's reads and writes, each direction on its
// own limiter (a full-duplex link).
type pacedConn struct {
	net.Conn
	rd, wr *rate.Limiter
}

func newPacedConn(c net.Conn, bytesPerSec int64) net.Conn {
	if bytesPerSec <= 0 {
		return c
	}
	return &pacedConn{Conn: c,
		rd: rate.NewLimiter(rate.Limit(bytesPerSec), linkBurst),
		wr: rate.NewLimiter(rate.Limit(bytesPerSec), linkBurst)}
}

func (c *pacedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p[:min(len(p), linkBurst)])
	if n > 0 {
		// The wait is at most linkBurst at the link rate; closing the
		// connection does not need to cut it short.
		_ = c.rd.WaitN(context.Background(), n)
	}
	return n, err
}

func (c *pacedConn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		part := p[written:min(len(p), written+linkBurst)]
		_ = c.wr.WaitN(context.Background(), len(part))
		n, err := c.Conn.Write(part)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// pacedDialer dials TCP and paces the connection (no pacing at rate 0).
func pacedDialer(bytesPerSec int64) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return newPacedConn(c, bytesPerSec), nil
	}
}
