package respserver

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves RESP connections over a Backend.
type Server struct {
	cfg    Config
	budget budget
	nextID atomic.Int64
	// running holds a slot per command running (MaxInFlight).
	running chan struct{}

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
	s := &Server{cfg: cfg, conns: map[net.Conn]struct{}{}, running: make(chan struct{}, cfg.MaxInFlight)}
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

// maxBatch bounds the pipelined commands a connection runs at once.
const maxBatch = 32

// serveConn reads, runs and answers the commands of one connection.
// Pipelined commands that name keys run side by side, in batches of
// commands whose keys are all different (a command on a key already in
// the batch starts the next one, so each key sees its commands in
// order); their replies go out in order, together once no more input is
// waiting. Any other command runs alone.
func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	cs := &conn{s: s, c: c, id: s.nextID.Add(1)}
	cs.r = newReader(c, &s.cfg, &s.budget)
	cs.bw = bufio.NewWriterSize(c, 64<<10)
	cs.out = &replies{w: cs.bw, proto: 2}
	defer cs.r.release()
	defer cs.giveBack()
	if ks, err := s.cfg.Backend.Open(ctx, ""); err == nil {
		cs.ks = ks
	} else if !errors.Is(err, ErrAuthRequired) {
		s.cfg.Logger.Warn("respserver: opening the keyspace", "err", err)
		return
	}
	// pending is a command read and not yet run, the first of the next
	// batch; pendingHeld its budget.
	var pending [][]byte
	pendingHeld := 0
	defer func() { s.budget.give(pendingHeld) }()
	for {
		if pending == nil {
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
			cs.held += cs.r.detach()
			if args == nil {
				continue
			}
			pending = args
		}
		batch := [][][]byte{pending}
		pending = nil
		cs.held += pendingHeld
		pendingHeld = 0
		var readErr error
		if keys := batchKeys(batch[0]); keys != nil {
			seen := make(map[string]bool)
			for _, k := range keys {
				seen[string(k)] = true
			}
			for len(batch) < maxBatch && cs.r.br.Buffered() > 0 {
				args, err := cs.r.next()
				if err != nil {
					readErr = err
					break
				}
				n := cs.r.detach()
				if args == nil {
					s.budget.give(n)
					continue
				}
				keys := batchKeys(args)
				if keys == nil || slices.ContainsFunc(keys, func(k []byte) bool { return seen[string(k)] }) {
					pending, pendingHeld = args, n
					break
				}
				cs.held += n
				for _, k := range keys {
					seen[string(k)] = true
				}
				batch = append(batch, args)
			}
		}
		quit := cs.runBatch(ctx, batch)
		// The commands' arguments are done with; replies not yet written
		// stay held until the flush.
		s.budget.give(cs.held)
		cs.held = 0
		if readErr != nil {
			cs.readFailed(readErr)
			return
		}
		if quit || (pending == nil && cs.r.br.Buffered() == 0) {
			ok := cs.flush()
			cs.giveBack()
			if !ok || quit {
				return
			}
		}
	}
}

// batchKeys returns the keys of a command that may run beside others, nil
// for one that runs alone.
func batchKeys(args [][]byte) [][]byte {
	c, ok := commands[strings.ToUpper(string(args[0]))]
	if !ok || c.keys == nil || (c.arity > 0 && len(args) != c.arity) || (c.arity < 0 && len(args) < -c.arity) {
		return nil
	}
	return c.keys(args)
}

// runBatch runs commands, side by side when there are several, and
// writes their replies in order; it reports whether the connection ends
// (QUIT).
func (cs *conn) runBatch(ctx context.Context, batch [][][]byte) (quit bool) {
	if len(batch) == 1 {
		return cs.run(ctx, cs.out, batch[0])
	}
	segs := make([]segments, len(batch))
	var wg sync.WaitGroup
	for i, args := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs.run(ctx, &replies{w: &segs[i], proto: cs.out.proto}, args)
		}()
	}
	wg.Wait()
	for i := range segs {
		segs[i].writeTo(cs.bw)
	}
	return false
}

// holdReply takes n bytes of the budget for a reply that waits to be
// written; giveBack returns them once the replies went out.
func (cs *conn) holdReply(n int) error {
	if !cs.s.budget.take(n) {
		return errBusy
	}
	cs.replyHeld.Add(int64(n))
	return nil
}

// giveBack returns the budget of the commands run and the replies written.
func (cs *conn) giveBack() {
	cs.s.budget.give(cs.held + int(cs.replyHeld.Swap(0)))
	cs.held = 0
}

// conn is one client connection's state.
type conn struct {
	s   *Server
	c   net.Conn
	id  int64
	r   *reader
	out *replies
	bw  *bufio.Writer // the connection's, under out
	ks  Keyspace      // nil until AUTH where a token is required
	// held is the budget of the commands read and not yet done;
	// replyHeld that of replies not yet written.
	held      int
	replyHeld atomic.Int64
}

func (cs *conn) flush() bool {
	_ = cs.c.SetWriteDeadline(time.Now().Add(cs.s.cfg.WriteTimeout))
	return cs.bw.Flush() == nil
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
