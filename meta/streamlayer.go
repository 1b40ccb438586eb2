package meta

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/tlsconf"
)

// streamLayer is a raft.StreamLayer over mutual TLS: both ends present
// node certificates from the cluster CA (tlsconf's NodeServerConfig and
// NodeClientConfig), and a peer without one (no certificate, another CA,
// a client certificate, expired) fails the handshake. In insecure mode it
// is plain TCP. It lives in meta, raft's only user, rather than in tlsconf,
// so that the client, which imports tlsconf, does not link hashicorp/raft.
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	dialCfg   *tls.Config
}

// raftHandshakeTimeout bounds the TLS handshake of an accepted raft
// connection, so a peer that connects and says nothing does not hold a
// raft connection goroutine forever.
const raftHandshakeTimeout = 10 * time.Second

var _ raft.StreamLayer = (*streamLayer)(nil)

// newStreamLayer listens on bind (host:port; port 0 picks one). advertise
// is the address other nodes dial; nil means the bound address, which must
// then not be unspecified (0.0.0.0), as raft.NewTCPTransport requires.
func newStreamLayer(bind string, advertise net.Addr, t *tlsconf.TLS) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("meta: raft listen %s: %w", bind, err)
	}
	s := &streamLayer{ln: ln, advertise: advertise}
	if s.advertise == nil {
		s.advertise = ln.Addr()
	}
	if a, ok := s.advertise.(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("meta: raft advertise address %v is not a dialable IP address", s.advertise)
	}
	if !t.Insecure() {
		s.ln = tls.NewListener(ln, t.NodeServerConfig())
		s.dialCfg = t.NodeClientConfig()
	}
	return s, nil
}

// Accept waits for the next connection. Its TLS handshake runs on first
// read or write, in raft's connection goroutine and within
// raftHandshakeTimeout, so a slow peer does not stall the accept loop; a failed
// handshake ends that connection only.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*tls.Conn); ok {
		return &handshakeConn{Conn: tc}, nil
	}
	return c, nil
}

// handshakeConn is a server-side tls.Conn whose handshake is bounded.
type handshakeConn struct {
	*tls.Conn
	once sync.Once
	err  error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), raftHandshakeTimeout)
		defer cancel()
		c.err = c.Conn.HandshakeContext(ctx)
	})
	return c.err
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// Close stops listening.
func (s *streamLayer) Close() error { return s.ln.Close() }

// Addr is the advertised address.
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// Dial connects to a peer and completes the TLS handshake within timeout.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	nd := &net.Dialer{}
	if s.dialCfg == nil {
		return nd.DialContext(ctx, "tcp", string(address))
	}
	cfg := s.dialCfg.Clone()
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(string(address))
		if err != nil {
			return nil, fmt.Errorf("meta: raft address %q: %w", address, err)
		}
		cfg.ServerName = host
	}
	d := &tls.Dialer{NetDialer: nd, Config: cfg}
	c, err := d.DialContext(ctx, "tcp", string(address))
	if err != nil {
		return nil, fmt.Errorf("meta: raft dial %s: %w", address, err)
	}
	return c, nil
}
