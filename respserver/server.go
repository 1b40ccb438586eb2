package respserver

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves RESP connections over a Backend.
type Server struct {
	cfg    Config
	budget budget
	nextID atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// New returns a server of cfg (zero fields from DefaultConfig).
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, conns: map[net.Conn]struct{}{}}
	s.budget.max = int64(cfg.MaxBufferedBytes)
	return s, nil
}

// Config returns the server's effective configuration.
func (s *Server) Config() Config { return s.cfg }

// Serve accepts connections on ln until ctx ends or ln fails; then it
// closes ln and every connection it accepted and returns once their
// goroutines have. It returns nil when ctx ended it.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.cfg.TLS != nil {
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	stop := context.AfterFunc(ctx, func() { _ = ln.Close(); s.closeConns() })
	defer func() {
		stop()
		_ = ln.Close()
		s.closeConns()
		s.wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if m := s.cfg.Metrics; m != nil {
			m.accepted.Inc()
		}
		if !s.track(c) {
			s.refuse(c)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(c)
			s.serveConn(ctx, c)
		}()
	}
}

// track adds c to the open connections; false when there are MaxClients
// already, or the server is closing.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.conns) >= s.cfg.MaxClients {
		return false
	}
	s.conns[c] = struct{}{}
	if m := s.cfg.Metrics; m != nil {
		m.connections.Inc()
	}
	return true
}

func (s *Server) untrack(c net.Conn) {
	_ = c.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.conns[c]; ok {
		delete(s.conns, c)
		if m := s.cfg.Metrics; m != nil {
			m.connections.Dec()
		}
	}
}

func (s *Server) closeConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
}

// refuse answers a connection over MaxClients and closes it.
func (s *Server) refuse(c net.Conn) {
	s.refused("", "resource_exhausted")
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(c, "-ERR max number of clients reached\r\n")
	_ = c.Close()
}

func (s *Server) refused(command, reason string) {
	if s.cfg.Refused != nil {
		s.cfg.Refused(command, reason)
	}
}

// serveConn reads, runs and answers the commands of one connection, in
// order; replies to pipelined commands go out together once no more input
// is waiting.
func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	cs := &conn{s: s, c: c, id: s.nextID.Add(1)}
	cs.r = newReader(c, &s.cfg, &s.budget)
	cs.out = &replies{w: bufio.NewWriterSize(c, 64<<10), proto: 2}
	defer cs.r.release()
	if ks, err := s.cfg.Backend.Open(ctx, ""); err == nil {
		cs.ks = ks
	} else if !errors.Is(err, ErrAuthRequired) {
		s.cfg.Logger.Warn("respserver: opening the keyspace", "err", err)
		return
	}
	for {
		_ = c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		if _, err := cs.r.br.Peek(1); err != nil {
			cs.flush()
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(s.cfg.CommandTimeout))
		args, err := cs.r.next()
		if err != nil {
			cs.readFailed(err)
			return
		}
		quit := false
		if args != nil {
			quit = cs.run(ctx, args)
		}
		cs.r.release()
		if quit || cs.r.br.Buffered() == 0 {
			if !cs.flush() || quit {
				return
			}
		}
	}
}

// conn is one client connection's state.
type conn struct {
	s   *Server
	c   net.Conn
	id  int64
	r   *reader
	out *replies
	ks  Keyspace // nil until AUTH where a token is required
}

func (cs *conn) flush() bool {
	_ = cs.c.SetWriteDeadline(time.Now().Add(cs.s.cfg.WriteTimeout))
	return cs.out.w.Flush() == nil
}

// readFailed answers a command that could not be read, if it can.
func (cs *conn) readFailed(err error) {
	var pe *ProtocolError
	switch {
	case errors.As(err, &pe):
		cs.s.refused("", "invalid_argument")
		cs.out.err("ERR " + pe.Error())
	case errors.Is(err, errBusy):
		cs.s.refused("", "resource_exhausted")
		cs.out.err("BUSY " + err.Error())
	case errors.Is(err, os.ErrDeadlineExceeded):
		// A command that took longer than CommandTimeout to arrive.
		cs.s.refused("", "resource_exhausted")
		cs.out.err("ERR command not received within " + cs.s.cfg.CommandTimeout.String())
	default:
		return // the connection ended
	}
	if cs.flush() {
		cs.linger()
	}
}

// Lingering bounds how long, and how many bytes, a connection closed for
// a bad command is read and dropped, so that its error reply is not lost
// to a reset while the client still sends.
const (
	lingerTime  = time.Second
	lingerBytes = 1 << 20
)

// linger ends the connection's writing, then drops what the client still
// sends, within the bounds above, before it is closed.
func (cs *conn) linger() {
	cw, ok := cs.c.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	_ = cs.c.SetReadDeadline(time.Now().Add(lingerTime))
	_, _ = io.CopyN(io.Discard, cs.c, lingerBytes)
}
