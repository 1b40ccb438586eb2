package auth

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
)

// Within reports whether every model ns allows is also allowed by outer:
// each of ns's prefixes extends one of outer's. An empty outer (every
// model) holds any ns; an empty ns (every model) is within only an empty
// outer.
func (ns Namespace) Within(outer Namespace) bool {
	if len(outer) == 0 {
		return true
	}
	if len(ns) == 0 {
		return false
	}
	for _, p := range ns {
		ok := false
		for _, o := range outer {
			if strings.HasPrefix(p, o) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// Grant checks that p may create a token with scopes and namespace ns and
// returns the namespace to give it: a token never gets a scope its
// creator lacks nor models outside its creator's namespace, so an admin
// token cannot mint a broader one. An empty ns inherits p's namespace.
// Refusals are PermissionDenied status errors wrapping
// ErrPermissionDenied; a malformed ns wraps ErrInvalidToken.
func (p *Principal) Grant(scopes Scope, ns Namespace) (Namespace, error) {
	ns, err := ns.normalized()
	if err != nil {
		return nil, err
	}
	if scopes&^TokenScopes != 0 || scopes == 0 {
		return nil, fmt.Errorf("%w: scopes %q", ErrInvalidToken, scopes)
	}
	if !p.Scopes.Has(scopes) {
		return nil, &authError{code: codes.PermissionDenied, err: ErrPermissionDenied,
			msg: fmt.Sprintf("caller %s cannot grant scope %s it lacks", p.name(), scopes&^p.Scopes)}
	}
	if len(ns) == 0 {
		return append(Namespace(nil), p.Namespace...), nil
	}
	if !ns.Within(p.Namespace) {
		return nil, &authError{code: codes.PermissionDenied, err: ErrPermissionDenied,
			msg: fmt.Sprintf("caller %s cannot grant models outside its namespace", p.name())}
	}
	return ns, nil
}

// Manages reports whether p may see and revoke the token rec: its
// namespace must lie within p's (an unrestricted admin manages every
// token).
func (p *Principal) Manages(rec Record) bool { return rec.Namespace.Within(p.Namespace) }

// Peer reports whether p is a cluster member: a node certificate, or a
// caller the Guard let use the peer API (a cluster without TLS).
func (p *Principal) Peer() bool { return p.Node || p.Scopes.Has(ScopePeer) }
