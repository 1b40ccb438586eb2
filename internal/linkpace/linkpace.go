// Package linkpace emulates a slower network on one machine: a
// connection paced to a byte rate in each direction. Nodes pace the
// connections they dial to peers (kvmeshd -peer-link-rate) and benchmarks
// their clients', to see what a codec or a data path buys on a 1, 10 or
// 25 Gbit/s network.
package linkpace

import (
	"context"
	"net"

	"golang.org/x/time/rate"
)

// Burst is the most bytes a paced connection moves at once: small
// against a second's worth at any emulated rate, large against a frame
// header.
const Burst = 64 << 10

// pacedConn paces a connection's reads and writes, each direction on its
// own limiter (a full-duplex link).
type pacedConn struct {
	net.Conn
	rd, wr *rate.Limiter
}

// Conn returns c paced to bytesPerSec in each direction: what it writes
// waits for the limiter before the write, and what it reads waits after
// the read, so the other end's sends back up in TCP. Rate 0 returns c.
func Conn(c net.Conn, bytesPerSec int64) net.Conn {
	if bytesPerSec <= 0 {
		return c
	}
	return &pacedConn{Conn: c,
		rd: rate.NewLimiter(rate.Limit(bytesPerSec), Burst),
		wr: rate.NewLimiter(rate.Limit(bytesPerSec), Burst)}
}

func (c *pacedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p[:min(len(p), Burst)])
	if n > 0 {
		// The wait is at most Burst at the link rate; closing the
		// connection does not need to cut it short.
		_ = c.rd.WaitN(context.Background(), n)
	}
	return n, err
}

func (c *pacedConn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		part := p[written:min(len(p), written+Burst)]
		_ = c.wr.WaitN(context.Background(), len(part))
		n, err := c.Conn.Write(part)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// Dialer dials TCP and paces the connection (no pacing at rate 0), for
// grpc.WithContextDialer.
func Dialer(bytesPerSec int64) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return Conn(c, bytesPerSec), nil
	}
}
