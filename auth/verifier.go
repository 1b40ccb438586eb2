package auth

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/chunk"
)

// TokenTable finds token records by ID. The metadata store implements it;
// LookupToken returns an error wrapping ErrUnknownToken for an ID it lacks.
type TokenTable interface {
	LookupToken(ctx context.Context, id string) (Record, error)
}

// Principal is an authenticated caller. The Guard's interceptors put one
// in every call's context.
type Principal struct {
	// TokenID names the token the call presented; "" for none.
	TokenID string
	// CertName is the common name of the verified client certificate;
	// "" without TLS.
	CertName string
	// Node is set when the certificate is a node certificate.
	Node bool
	// Scopes the caller holds.
	Scopes Scope
	// Namespace limits the models the caller may touch; empty is all.
	Namespace Namespace
	// Addr is the remote address, for logs and for limiting callers that
	// have no other identity.
	Addr string
}

// Key identifies the caller for per-caller limits: the token ID, else the
// certificate name, else the remote address.
func (p *Principal) Key() string {
	switch {
	case p.TokenID != "":
		return "token:" + p.TokenID
	case p.CertName != "":
		return "cert:" + p.CertName
	}
	// The host only: every connection has its own port.
	if host, _, err := net.SplitHostPort(p.Addr); err == nil {
		return "addr:" + host
	}
	return "addr:" + p.Addr
}

// Allow checks the caller holds need.
func (p *Principal) Allow(need Scope) error {
	if !p.Scopes.Has(need) {
		if lack := need &^ p.Scopes; lack == ScopeCluster && len(p.Namespace) > 0 {
			return &authError{code: codes.PermissionDenied, err: ErrPermissionDenied,
				msg: fmt.Sprintf("caller %s has a namespace: cluster-wide state (settings, gossip keys, drain) needs an admin token without one", p.name())}
		}
		return &authError{code: codes.PermissionDenied, err: ErrPermissionDenied,
			msg: fmt.Sprintf("caller %s lacks scope %s", p.name(), need&^p.Scopes)}
	}
	return nil
}

// AllowFingerprint checks fp is in the caller's namespace.
func (p *Principal) AllowFingerprint(fp chunk.Fingerprint) error {
	if !p.Namespace.Allows(fp) {
		return &authError{code: codes.PermissionDenied, err: ErrPermissionDenied,
			msg: fmt.Sprintf("caller %s may not touch model %s", p.name(), fp)}
	}
	return nil
}

func (p *Principal) name() string {
	if p.TokenID != "" {
		return "token " + p.TokenID
	}
	if p.CertName != "" {
		return "cert " + p.CertName
	}
	return p.Addr
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the caller the interceptors authenticated.
func FromContext(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(*Principal)
	return p, ok && p != nil
}

// CheckFingerprint is what a handler calls for each model fingerprint of
// a request once it has parsed it (and before it stores or returns
// anything): nil if the caller may touch that model, else a
// PermissionDenied status error to return as is. It fails closed: a
// context without a Principal (a call that bypassed the Guard) is denied.
func CheckFingerprint(ctx context.Context, fp chunk.Fingerprint) error {
	p, ok := FromContext(ctx)
	if !ok {
		return &authError{code: codes.PermissionDenied, err: ErrPermissionDenied, msg: "no authenticated caller"}
	}
	return p.AllowFingerprint(fp)
}

// authError is a sentinel-wrapping error that is also a gRPC status.
type authError struct {
	code codes.Code
	err  error
	msg  string
}

func (e *authError) Error() string              { return e.err.Error() + ": " + e.msg }
func (e *authError) Unwrap() error              { return e.err }
func (e *authError) GRPCStatus() *status.Status { return status.New(e.code, e.Error()) }

func unauthenticated(format string, args ...any) error {
	return &authError{code: codes.Unauthenticated, err: ErrUnauthenticated, msg: fmt.Sprintf(format, args...)}
}

// Verifier checks presented tokens against a TokenTable.
type Verifier struct {
	table TokenTable
	now   func() time.Time
	dummy Record
}

// NewVerifier returns a Verifier over table.
func NewVerifier(table TokenTable) *Verifier {
	_, dummy, _ := NewToken("", ScopeRead, nil, time.Time{})
	return &Verifier{table: table, now: time.Now, dummy: dummy}
}

// Verify authenticates a presented "<id>.<secret>" and returns its
// principal. A bad token wraps ErrUnauthenticated and the message does not
// say which part was wrong; a failing table lookup is returned wrapped, as
// a gRPC Unavailable status.
func (v *Verifier) Verify(ctx context.Context, presented string) (*Principal, error) {
	tok, err := ParseToken(presented)
	if err != nil {
		return nil, unauthenticated("malformed token")
	}
	rec, err := v.table.LookupToken(ctx, tok.ID)
	switch {
	case errors.Is(err, ErrUnknownToken):
		// Spend the same HMAC an existing ID costs, so response time does
		// not tell which IDs exist.
		_ = v.dummy.Matches(tok)
		return nil, unauthenticated("invalid token")
	case err != nil:
		return nil, &authError{code: codes.Unavailable, err: err, msg: "token lookup failed"}
	}
	if rec.ID != tok.ID || !rec.Matches(tok) {
		return nil, unauthenticated("invalid token")
	}
	if !rec.Expires.IsZero() && !v.now().Before(rec.Expires) {
		// The same answer as a wrong secret: the caller learns neither
		// that the ID exists nor which check failed.
		return nil, unauthenticated("invalid token")
	}
	return &Principal{TokenID: rec.ID, Scopes: TokenPrincipalScopes(rec), Namespace: rec.Namespace}, nil
}

// TokenPrincipalScopes are the scopes a caller presenting rec's token
// holds: rec's token scopes, and ScopeCluster for an admin token without
// a namespace.
func TokenPrincipalScopes(rec Record) Scope {
	s := rec.Scopes & TokenScopes
	if s.Has(ScopeAdmin) && len(rec.Namespace) == 0 {
		s |= ScopeCluster
	}
	return s
}

// Check answers whether the presented token may use scope on model fp: nil
// if allowed, else an error wrapping ErrUnauthenticated or
// ErrPermissionDenied.
func (v *Verifier) Check(ctx context.Context, presented string, need Scope, fp chunk.Fingerprint) error {
	p, err := v.Verify(ctx, presented)
	if err != nil {
		return err
	}
	if err := p.Allow(need); err != nil {
		return err
	}
	return p.AllowFingerprint(fp)
}

// certPrincipal names the caller by its verified client certificate.
func certPrincipal(leaf *x509.Certificate, isNode func(*x509.Certificate) bool) *Principal {
	p := &Principal{CertName: leaf.Subject.CommonName}
	if isNode(leaf) {
		p.Node = true
		p.Scopes = AllScopes
	}
	return p
}
