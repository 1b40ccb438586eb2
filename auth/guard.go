package auth

import (
	"context"
	"crypto/x509"
	"log/slog"
	"maps"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// AuthorizationHeader is the gRPC metadata key carrying "Bearer <token>".
const AuthorizationHeader = "authorization"

// DefaultMethods maps every kvmesh RPC to the scope it needs. Model
// registration and token administration are admin (each handler keeps a
// namespaced admin inside its namespace); the cluster's own state
// (settings, gossip keys, drain) is admin and cluster, which only an admin
// without a namespace holds; storing and deleting chunks is write; the
// rest of the client API is read; the peer API is for nodes only.
func DefaultMethods() map[string]Scope {
	return map[string]Scope{
		api.Client_RegisterModel_FullMethodName: ScopeAdmin,
		api.Client_Models_FullMethodName:        ScopeRead,
		api.Client_Put_FullMethodName:           ScopeWrite,
		api.Client_Get_FullMethodName:           ScopeRead,
		api.Client_Lookup_FullMethodName:        ScopeRead,
		api.Client_Delete_FullMethodName:        ScopeWrite,
		api.Client_Stats_FullMethodName:         ScopeRead,
		api.Client_ClusterInfo_FullMethodName:   ScopeRead,
		api.Client_Drain_FullMethodName:         ScopeAdmin | ScopeCluster,
		// Injection reads chunks into the caller's own cache memory.
		api.Injector_CacheSocket_FullMethodName:     ScopeRead,
		api.Injector_RegisterCache_FullMethodName:   ScopeRead,
		api.Injector_UnregisterCache_FullMethodName: ScopeRead,
		api.Injector_Inject_FullMethodName:          ScopeRead,
		api.Peer_Replicate_FullMethodName:           ScopePeer,
		api.Peer_Fetch_FullMethodName:               ScopePeer,
		api.Peer_Digest_FullMethodName:              ScopePeer,
		api.Peer_MetaApply_FullMethodName:           ScopePeer,
		api.Peer_Delete_FullMethodName:              ScopePeer,
		api.Peer_GossipKey_FullMethodName:           ScopePeer,
		api.Peer_FetchMany_FullMethodName:           ScopePeer,
		api.Admin_CreateToken_FullMethodName:        ScopeAdmin,
		api.Admin_ListTokens_FullMethodName:         ScopeAdmin,
		api.Admin_RevokeToken_FullMethodName:        ScopeAdmin,
		api.Admin_GossipKeys_FullMethodName:         ScopeAdmin | ScopeCluster,
		api.Admin_GetSettings_FullMethodName:        ScopeAdmin | ScopeCluster,
		api.Admin_SetSettings_FullMethodName:        ScopeAdmin | ScopeCluster,
		// gRPC server reflection (grpcurl list/describe) describes the
		// services, as the repository's .proto files do: any valid token
		// may use it, a caller without one may not.
		ReflectionV1Method:      ScopeRead,
		ReflectionV1AlphaMethod: ScopeRead,
	}
}

// The methods of gRPC server reflection, which every node serves (v1 and
// the v1alpha that older tools ask for first). Named here, not imported, so
// that the client does not link the reflection service.
const (
	ReflectionV1Method      = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	ReflectionV1AlphaMethod = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
)

// Config configures a Guard.
type Config struct {
	// Verifier checks tokens. Nil turns tokens off: every caller without a
	// node certificate gets AnonymousScopes (use it with mutual TLS, where
	// holding a client certificate is the authorisation).
	Verifier *Verifier
	// Methods maps full method names ("/kvmesh.v1.Client/Put") to the
	// scope they need; a method missing from it is denied, and a scope of
	// 0 makes a method public (no token needed; health checks). Default
	// DefaultMethods().
	Methods map[string]Scope
	// AnonymousScopes are the scopes of callers when Verifier is nil.
	// Default TokenScopes (read, write, admin).
	AnonymousScopes Scope
	// InsecurePeers lets callers without a node certificate use ScopePeer
	// methods. Set it only when the cluster runs without TLS
	// (tlsconf.Config.Insecure), where no caller has a certificate.
	InsecurePeers bool
	// IsNode tells a node certificate from a client one. Default
	// tlsconf.IsNodeCert.
	IsNode func(*x509.Certificate) bool
	// Logger receives denials at debug level. Default slog.Default().
	Logger *slog.Logger
}

// Guard authenticates and authorises gRPC calls. Install its interceptors
// first in the chain, so everything after them sees the Principal.
type Guard struct {
	verifier      *Verifier
	methods       map[string]Scope
	anon          Scope
	insecurePeers bool
	isNode        func(*x509.Certificate) bool
	log           *slog.Logger
}

// NewGuard returns a Guard for cfg.
func NewGuard(cfg Config) *Guard {
	g := &Guard{
		verifier:      cfg.Verifier,
		methods:       maps.Clone(cfg.Methods),
		anon:          cfg.AnonymousScopes & TokenScopes,
		insecurePeers: cfg.InsecurePeers,
		isNode:        cfg.IsNode,
		log:           cfg.Logger,
	}
	if g.methods == nil {
		g.methods = DefaultMethods()
	}
	if cfg.AnonymousScopes == 0 {
		g.anon = TokenScopes
	}
	if g.anon.Has(ScopeAdmin) {
		// Without tokens there are no namespaces: an admin caller is the
		// cluster's admin.
		g.anon |= ScopeCluster
	}
	if g.isNode == nil {
		g.isNode = tlsconf.IsNodeCert
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.verifier == nil {
		g.log.Warn("auth: API tokens are off; every client gets scopes " + g.anon.String())
	}
	return g
}

// Authorize authenticates the call in ctx for the full method name and
// returns its Principal, or a Unauthenticated / PermissionDenied status
// error.
func (g *Guard) Authorize(ctx context.Context, method string) (*Principal, error) {
	need, known := g.methods[method]
	if !known {
		return nil, g.deny(&authError{code: codes.PermissionDenied, err: ErrPermissionDenied, msg: "method " + method + " is not in the authorisation table"}, method, nil)
	}
	p := g.transportPrincipal(ctx)
	if p.Node || need == 0 {
		return p, nil
	}
	if need&ScopePeer != 0 {
		// A caller with a (non-node) certificate is a client even here.
		if g.insecurePeers && p.CertName == "" {
			p.Scopes = ScopePeer
			return p, nil
		}
		return nil, g.deny(&authError{code: codes.PermissionDenied, err: ErrPermissionDenied, msg: "the peer API needs a node certificate"}, method, p)
	}
	if g.verifier == nil {
		p.Scopes = g.anon
	} else {
		tok, err := bearer(ctx)
		if err != nil {
			return nil, g.deny(err, method, p)
		}
		tp, err := g.verifier.Verify(ctx, tok)
		if err != nil {
			return nil, g.deny(err, method, p)
		}
		tp.CertName, tp.Addr = p.CertName, p.Addr
		p = tp
	}
	if err := p.Allow(need); err != nil {
		return nil, g.deny(err, method, p)
	}
	return p, nil
}

// transportPrincipal names the caller by what the connection proves: its
// remote address and its verified certificate, if any.
func (g *Guard) transportPrincipal(ctx context.Context) *Principal {
	p := &Principal{}
	if pr, ok := peer.FromContext(ctx); ok {
		if pr.Addr != nil {
			p.Addr = pr.Addr.String()
		}
		if ti, ok := pr.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			cp := certPrincipal(ti.State.VerifiedChains[0][0], g.isNode)
			cp.Addr = p.Addr
			p = cp
		}
	}
	return p
}

// Identify says who the call in ctx claims to be, for logs and audit
// records of calls whether or not Authorize let them in: the remote
// address, the verified certificate's name (and whether it is a node's),
// and the ID of a well-formed bearer token. It checks no secret and
// grants no scope: the token ID of a refused call is only what the
// caller presented.
func (g *Guard) Identify(ctx context.Context) *Principal {
	p := g.transportPrincipal(ctx)
	if tok, err := bearer(ctx); err == nil {
		if t, err := ParseToken(tok); err == nil {
			p.TokenID = t.ID
		}
	}
	return p
}

// Scope returns the scope method needs, and false for a method the
// Guard denies because its table lacks it.
func (g *Guard) Scope(method string) (Scope, bool) {
	s, ok := g.methods[method]
	return s, ok
}

func (g *Guard) deny(err error, method string, p *Principal) error {
	if g.log.Enabled(context.Background(), slog.LevelDebug) {
		who := ""
		if p != nil {
			who = p.name()
		}
		g.log.Debug("auth: call refused", "method", method, "caller", who, "err", err)
	}
	return err
}

// bearer returns the token of the call's single "authorization: Bearer"
// header.
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(AuthorizationHeader)
	switch len(vals) {
	case 0:
		return "", unauthenticated("no %s header", AuthorizationHeader)
	case 1:
	default:
		return "", unauthenticated("more than one %s header", AuthorizationHeader)
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", unauthenticated("%s header is not \"Bearer <token>\"", AuthorizationHeader)
	}
	return strings.TrimSpace(tok), nil
}

// UnaryInterceptor authorises unary calls (grpc.ChainUnaryInterceptor).
func (g *Guard) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := FromContext(ctx); ok {
			// Authorised before the message was read (a tap handle).
			return handler(ctx, req)
		}
		p, err := g.Authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(WithPrincipal(ctx, p), req)
	}
}

// StreamInterceptor authorises streaming calls
// (grpc.ChainStreamInterceptor).
func (g *Guard) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if _, ok := FromContext(ss.Context()); ok {
			return handler(srv, ss)
		}
		p, err := g.Authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &ctxStream{ServerStream: ss, ctx: WithPrincipal(ss.Context(), p)})
	}
}

// ctxStream is a ServerStream with a replaced context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// TokenCredentials are a client's per-call credentials presenting token
// (grpc.WithPerRPCCredentials). They refuse to send the token over a
// connection without TLS unless allowInsecure is set.
func TokenCredentials(token string, allowInsecure bool) credentials.PerRPCCredentials {
	return tokenCreds{header: "Bearer " + token, secure: !allowInsecure}
}

type tokenCreds struct {
	header string
	secure bool
}

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{AuthorizationHeader: c.header}, nil
}

func (c tokenCreds) RequireTransportSecurity() bool { return c.secure }
