package node

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// ErrNoTLS is returned by New when Config names no TLS files and does not
// set Insecure: a node never falls into plaintext by omission.
var ErrNoTLS = errors.New("node: no TLS configured: give CA, certificate and key files (kvmeshd -tls-ca, -tls-cert, -tls-key; node.Config.TLS) " +
	"or turn TLS off explicitly (kvmeshd -insecure; node.Config.Insecure)")

// ErrCertName is returned by New, and by a certificate reload (which then
// keeps the old certificate), when the node certificate does not name the
// node: its common name must be the node ID, the identity a forwarded
// leave is checked against (kvmesh certs -node ID=HOST makes such a
// certificate).
var ErrCertName = errors.New("node: the node certificate's common name is not the node ID")

// ErrCertRole is returned by New, and by a certificate reload (which then
// keeps the old certificate), when the node certificate is not a node
// certificate (OU tlsconf.NodeOU): every peer would refuse it on Raft and
// the peer API, so a node holding one could never join (kvmesh certs -node
// ID=HOST makes a node certificate; -client makes the other kind).
var ErrCertRole = errors.New("node: the certificate is not a node certificate (OU " + tlsconf.NodeOU + ")")

// security is the node's transport security and authorisation: the TLS
// identity (gRPC server, peer dials, raft), the Guard that authenticates
// and authorises every call, and the per-caller stream limiter. The node
// owns it; it does not change after Start.
type security struct {
	tls     *tlsconf.TLS
	guard   *auth.Guard
	limiter *auth.StreamLimiter
	// unary bounds each client's unary calls in flight.
	unary *auth.StreamLimiter
	// caches maps each registered inject.CacheID to its model and the
	// caller that registered it, so Inject and UnregisterCache check the
	// caller against the cache they name, not only at registration.
	caches *sync.Map // uint64 -> cacheOwner
	// keyMu serialises gossip key operations and keyring file rewrites.
	keyMu *sync.Mutex
}

// cacheOwner is who registered a cache, for what model.
type cacheOwner struct {
	fp chunk.Fingerprint
	// principal names the registering caller (cacheCaller).
	principal string
}

// cacheCaller names a caller for the caches it registers: its token and
// its certificate both (auth.Principal.Key is the token alone when there
// is one), so neither another token on the same certificate nor another
// certificate holding the same token reaches the cache.
func cacheCaller(ctx context.Context) string {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return ""
	}
	return p.Key() + "|cert:" + p.CertName
}

// newSecurity loads cfg's TLS files (or turns TLS off, with a warning,
// when cfg.Insecure is set).
func newSecurity(cfg Config) (security, error) {
	tc := cfg.TLS
	tc.Insecure = tc.Insecure || cfg.Insecure
	if tc.Logger == nil {
		tc.Logger = cfg.Logger
	}
	tc.Check = certCheck(cfg.NodeID, tc.Check)
	t, err := tlsconf.New(tc)
	if errors.Is(err, tlsconf.ErrNotConfigured) {
		return security{}, ErrNoTLS
	}
	if err != nil {
		return security{}, fmt.Errorf("node: TLS: %w", err)
	}
	return security{tls: t, caches: new(sync.Map), keyMu: new(sync.Mutex)}, nil
}

// certCheck is the tlsconf.Config.Check of node id, the one rule for the
// certificate at start (prev nil) and at every reload (SIGHUP): its
// common name must be id, since a forwarded leave is accepted only from
// the leaving node's own certificate, and it must be a node certificate,
// without which peers refuse the node's Raft and peer connections (a node
// that started with one would serve clients but never join). next, if
// set, runs after these checks.
func certCheck(id string, next func(prev, cur *x509.Certificate) error) func(prev, cur *x509.Certificate) error {
	return func(prev, cur *x509.Certificate) error {
		if cur.Subject.CommonName != id {
			return fmt.Errorf("%w: certificate %q, node %q (kvmesh certs -node %s=HOST makes one)", ErrCertName, cur.Subject.CommonName, id, id)
		}
		if !tlsconf.IsNodeCert(cur) {
			return fmt.Errorf("%w: certificate %q has OU %q (kvmesh certs -node %s=HOST makes one)", ErrCertRole, cur.Subject.CommonName, cur.Subject.OrganizationalUnit, id)
		}
		if next != nil {
			return next(prev, cur)
		}
		return nil
	}
}

// registerTLSMetrics exports the outcomes of certificate reloads, so a
// refused renewal (the node still serving its old certificate, which
// will expire) can be alerted on.
func (s *security) registerTLSMetrics(reg prometheus.Registerer) error {
	count := func(failed bool) func() float64 {
		return func() float64 {
			ok, bad := s.tls.ReloadCounts()
			if failed {
				return float64(bad)
			}
			return float64(ok)
		}
	}
	return errors.Join(
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kvmesh_tls_reloads_total", Help: "Certificate reloads (SIGHUP) that took effect.",
		}, count(false))),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kvmesh_tls_reload_failures_total",
			Help: "Certificate reloads (SIGHUP) refused or failed (unreadable, another CA, common name not the node ID, not a node certificate); the old certificate kept serving.",
		}, count(true))),
	)
}

// rememberCache records the model and the registering caller of a cache.
func (s *security) rememberCache(ctx context.Context, id uint64, fp chunk.Fingerprint) {
	s.caches.Store(id, cacheOwner{fp: fp, principal: cacheCaller(ctx)})
}

// forgetCache drops an unregistered cache.
func (s *security) forgetCache(id uint64) { s.caches.Delete(id) }

// checkCache answers a caller other than the one that registered cache
// id (another token, certificate or address), or one whose namespace does
// not cover the cache's model, exactly as an unknown ID is answered
// (NotFound): a cache is its registrant's, and nobody else learns that it
// exists. An unknown ID passes: the injector answers it the same way.
func (s *security) checkCache(ctx context.Context, id uint64) error {
	v, ok := s.caches.Load(id)
	if !ok {
		return nil
	}
	o := v.(cacheOwner)
	if _, ok := auth.FromContext(ctx); ok && cacheCaller(ctx) == o.principal && checkFingerprint(ctx, o.fp) == nil {
		return nil
	}
	return toStatus(fmt.Errorf("%w: %d", inject.ErrUnknownCache, id))
}

// checkPeer refuses, with PermissionDenied, a caller that is not a
// cluster member: the direct (this node only) forms of Put, Delete and
// replication's times and kinds are for nodes, which present a node
// certificate (or, in a cluster without TLS, anyone).
func (s *security) checkPeer(ctx context.Context, what string) error {
	if s.member(ctx) {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s is for cluster members (a node certificate)", what)
}

// member reports whether the caller of ctx is a cluster member: a node
// certificate, or in a cluster without TLS anyone without a certificate.
func (s *security) member(ctx context.Context) bool {
	p, ok := auth.FromContext(ctx)
	return ok && (p.Peer() || (s.tls.Insecure() && p.CertName == ""))
}

// checkForwarded refuses, with PermissionDenied, a forwarded raft leave
// (Peer.MetaApply) for node X that does not come from X: with TLS the
// caller's node certificate must name X (its common name is its node ID,
// which every node checks at New and at each certificate reload). Only a node asks to leave, for itself
// (meta.Store.Leave at the end of its drain); an operator drains another
// node through Drain on that node, which needs the admin scope. Without
// TLS no caller has an identity and every leave passes. Other commands
// pass: the peer scope covers them, and the leader validates them.
func (s *security) checkForwarded(ctx context.Context, cmd []byte) error {
	id, ok := meta.LeaveOf(cmd)
	if !ok {
		return nil
	}
	p, ok := auth.FromContext(ctx)
	switch {
	case !ok:
		return status.Error(codes.PermissionDenied, "no authenticated caller")
	case p.Node && p.CertName == id:
		return nil
	case s.tls.Insecure() && p.CertName == "":
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "leave of node %q forwarded by %s: a node asks to leave only for itself (drain another node with Drain on it)", id, p.Key())
}

// metaTLS is the TLS raft runs over: nil (plain TCP) in insecure mode.
func (s *security) metaTLS() *tlsconf.TLS {
	if s.tls.Insecure() {
		return nil
	}
	return s.tls
}

// startGuard builds the Guard and the limiter once the metadata store
// (the token table) is open.
func (s *security) startGuard(cfg Config, tokens *meta.Store, log *slog.Logger) {
	var v *auth.Verifier
	if cfg.Tokens {
		v = auth.NewVerifier(tokens)
	}
	s.guard = auth.NewGuard(auth.Config{Verifier: v, InsecurePeers: s.tls.Insecure(), Logger: log})
	s.limiter = auth.NewStreamLimiter(auth.LimiterConfig{MaxStreams: cfg.MaxStreamsPerClient})
	s.unary = auth.NewStreamLimiter(auth.LimiterConfig{MaxStreams: cfg.MaxUnaryPerClient, Unary: true})
}

// checkFingerprint refuses a caller whose token's namespace does not
// cover the model fp, as a PermissionDenied status. Handlers call it
// right after parsing a request, before storing or returning anything.
func checkFingerprint(ctx context.Context, fp chunk.Fingerprint) error {
	return auth.CheckFingerprint(ctx, fp)
}

// checkChunks refuses a request naming more than the node's
// MaxChunksPerRequest chunks.
func (n *Node) checkChunks(what string, count int) error {
	if count > n.cfg.MaxChunksPerRequest {
		return status.Errorf(codes.ResourceExhausted, "%s of %d chunks exceeds the limit of %d", what, count, n.cfg.MaxChunksPerRequest)
	}
	return nil
}

// serverOptions are the gRPC server options security adds: credentials,
// the tap handle that authorises each call and takes its caller's slot
// before its message is read (callGate), the codec that caps request lists,
// and the Guard's interceptors (which find callGate's Principal), before the
// node's own (panic recovery, metrics) so those see only authorised calls.
// The call observer (refusals, audit) runs before them all, so it sees
// the handlers' refusals too; callGate reports its own to it, and so do the
// requests gRPC could not decode (undecodable).
func (n *Node) serverOptions() []grpc.ServerOption {
	n.sec.startGuard(n.cfg, n.meta, n.log)
	// Here rather than in New: Start runs once per node, so the
	// collectors register once on the node's registry.
	if err := n.sec.registerTLSMetrics(n.registry); err != nil {
		n.log.Warn("node: register TLS metrics", "err", err)
	}
	obs := newCallObserver(n, n.sec.guard)
	return []grpc.ServerOption{
		grpc.Creds(n.sec.tls.ServerCredentials()),
		grpc.InTapHandle(n.callGate(obs)),
		grpc.ForceServerCodecV2(n.serverCodec()),
		grpc.StatsHandler(undecodable{obs}),
		grpc.ChainUnaryInterceptor(obs.unary, n.sec.guard.UnaryInterceptor(), n.unaryInterceptor),
		grpc.ChainStreamInterceptor(obs.stream, n.sec.guard.StreamInterceptor(), n.streamInterceptor),
	}
}

// securityDefaults fills the security limits of c.
func (c *Config) securityDefaults() {
	if c.MaxChunksPerRequest <= 0 {
		c.MaxChunksPerRequest = MaxLookupBatch
	}
	if c.MaxStreamsPerClient == 0 {
		c.MaxStreamsPerClient = auth.DefaultMaxStreams
	}
	if c.MaxUnaryPerClient == 0 {
		c.MaxUnaryPerClient = auth.DefaultMaxUnary
	}
}

// ReloadTLS reads the node's certificate and key files again (what
// kvmeshd does on SIGHUP). A certificate that fails the node's checks
// (ErrCertName, ErrCertRole) or another CA's is refused and the old one
// keeps serving; either way the outcome is logged and counted in
// kvmesh_tls_reload*_total. Without TLS it does nothing.
func (n *Node) ReloadTLS() error {
	return n.sec.tls.Reload()
}

// ReloadTLSOnSignal calls ReloadTLS whenever the process receives one of
// sigs (default SIGHUP), until ctx is done; it blocks (see
// tlsconf.TLS.ReloadOnSignal). kvmeshd runs it when it serves TLS.
func (n *Node) ReloadTLSOnSignal(ctx context.Context, sigs ...os.Signal) {
	n.sec.tls.ReloadOnSignal(ctx, sigs...)
}
