package node

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
)

// The cache socket is how an engine hands this node the shared memory of
// its KV cache (api.SendCacheFile): a descriptor over a unix socket, so
// the node maps only a file its caller holds open, never one it names. A
// file handed over waits under a random handle for the RegisterCache that
// names it (single use, cacheFileTTL at most); the registration itself is
// authenticated and bound to its caller like every other call.

// Bounds of the files waiting for their registration.
const (
	cacheFileTTL        = 30 * time.Second
	maxPendingFiles     = 64
	maxPendingPerUser   = 8
	cacheConnDeadline   = 5 * time.Second
	maxCacheSocketConns = 16
)

// peerCred is who is on the other end of a unix connection
// (SO_PEERCRED).
type peerCred struct {
	pid      int32
	uid, gid uint32
}

// pendingFile is a handed-over file waiting for its registration.
type pendingFile struct {
	f   *os.File
	uid uint32
	exp time.Time
}

// cacheSocket receives the files. Its goroutines stop at close.
type cacheSocket struct {
	ln    *net.UnixListener
	log   *slog.Logger
	now   func() time.Time
	files *prometheus.CounterVec // hand-overs, by outcome: taken, refused

	mu      sync.Mutex
	closed  bool
	pending map[[api.CacheHandleBytes]byte]pendingFile
	users   map[uint32]int // pending files per uid
	conns   map[*net.UnixConn]struct{}
	wg      sync.WaitGroup
}

// listenCacheSocket listens on a fresh abstract unix socket: its name is
// random and bound by this node, so no other process holds it first, and
// it leaves no file behind. Injector.CacheSocket tells engines the name.
func listenCacheSocket(log *slog.Logger) (*cacheSocket, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("@kvmesh-cache-%x", b), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("node: cache socket: %w", err)
	}
	s := &cacheSocket{ln: ln, log: log, now: time.Now,
		files: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_inject_cache_files_total",
			Help: "Shared-memory files engines handed over on the cache socket, by outcome (taken: waiting for or used by a registration; refused: not a file the node maps, or too many waiting; the log says why).",
		}, []string{"outcome"}),
		pending: map[[api.CacheHandleBytes]byte]pendingFile{}, users: map[uint32]int{}, conns: map[*net.UnixConn]struct{}{}}
	s.files.WithLabelValues("taken")
	s.files.WithLabelValues("refused")
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// address is the socket's name ("@..." for the abstract namespace).
func (s *cacheSocket) address() string { return s.ln.Addr().String() }

func (s *cacheSocket) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("node: cache socket accept", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.closed || len(s.conns) >= maxCacheSocketConns {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serve(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			_ = c.Close()
		}()
	}
}

// serve takes one hand-over from c and answers it. A refusal says only
// that: the reason goes to the log.
func (s *cacheSocket) serve(c *net.UnixConn) {
	outcome := "refused"
	defer func() { s.files.WithLabelValues(outcome).Inc() }()
	_ = c.SetDeadline(time.Now().Add(cacheConnDeadline))
	cred, err := unixPeer(c)
	if err != nil {
		s.log.Warn("node: cache socket: no peer credentials", "err", err)
		_ = api.AnswerCacheFile(c, nil)
		return
	}
	f, err := api.RecvCacheFile(c)
	if err != nil {
		s.log.Warn("node: cache socket: hand-over refused", "pid", cred.pid, "uid", cred.uid, "err", err)
		_ = api.AnswerCacheFile(c, nil)
		return
	}
	handle, why := s.keep(f, cred)
	if handle == nil {
		_ = f.Close()
		s.log.Warn("node: cache socket: file refused", "pid", cred.pid, "uid", cred.uid, "why", why)
		_ = api.AnswerCacheFile(c, nil)
		return
	}
	if err := api.AnswerCacheFile(c, handle); err != nil {
		// The engine will not learn the handle: drop the file now.
		if f, err := s.take(handle); err == nil {
			_ = f.Close()
		}
		return
	}
	outcome = "taken"
}

// keep checks f and stores it under a new handle; nil and why on refusal.
// A file this process holds or maps (the DRAM tier's memory, another
// engine's registered cache) is refused when it comes from another
// process: a caller that got hold of one could otherwise have the node
// write into it. An engine inside this process shares its memory anyway.
func (s *cacheSocket) keep(f *os.File, cred peerCred) ([]byte, string) {
	if int(cred.pid) != os.Getpid() {
		if held, err := heldByThisProcess(f); err != nil || held {
			if err != nil {
				return nil, err.Error()
			}
			return nil, "a file this node holds or maps"
		}
	}
	var h [api.CacheHandleBytes]byte
	if _, err := rand.Read(h[:]); err != nil {
		return nil, err.Error()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	switch {
	case s.closed:
		return nil, "closed"
	case len(s.pending) >= maxPendingFiles:
		return nil, "too many files waiting for their registration"
	case s.users[cred.uid] >= maxPendingPerUser:
		return nil, "too many files of this user waiting for their registration"
	}
	s.pending[h] = pendingFile{f: f, uid: cred.uid, exp: s.now().Add(cacheFileTTL)}
	s.users[cred.uid]++
	return h[:], ""
}

// take removes and returns the file under handle; the caller closes it.
// An unknown, used or expired handle wraps api.ErrCacheRefused.
func (s *cacheSocket) take(handle []byte) (*os.File, error) {
	if len(handle) != api.CacheHandleBytes {
		return nil, api.ErrCacheRefused
	}
	h := [api.CacheHandleBytes]byte(handle)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	p, ok := s.pending[h]
	if !ok {
		return nil, api.ErrCacheRefused
	}
	s.drop(h, p)
	return p.f, nil
}

// expire closes the files whose registration never came. mu held.
func (s *cacheSocket) expire() {
	now := s.now()
	for h, p := range s.pending {
		if !now.Before(p.exp) {
			s.drop(h, p)
			_ = p.f.Close()
		}
	}
}

// drop forgets pending file h. mu held.
func (s *cacheSocket) drop(h [api.CacheHandleBytes]byte, p pendingFile) {
	delete(s.pending, h)
	if s.users[p.uid]--; s.users[p.uid] <= 0 {
		delete(s.users, p.uid)
	}
}

// close stops the socket, waits for its goroutines and closes the files
// still waiting.
func (s *cacheSocket) close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, p := range s.pending {
		s.drop(h, p)
		_ = p.f.Close()
	}
	return err
}
