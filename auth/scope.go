package auth

import (
	"fmt"
	"strings"
)

// Scope is a set of permissions. Scopes are independent: admin does not
// imply read or write, so an operator token is "read,write,admin".
type Scope uint8

// Scopes.
const (
	// ScopeRead: look up and fetch chunks, list models, stats.
	ScopeRead Scope = 1 << iota
	// ScopeWrite: store and delete chunks.
	ScopeWrite
	// ScopeAdmin: register models, change settings, drain nodes, manage
	// tokens.
	ScopeAdmin
	// ScopePeer: the node-to-node API. Only a node certificate grants it;
	// no token can hold it.
	ScopePeer
	// ScopeCluster: state that belongs to the whole cluster rather than to
	// a namespace (settings, gossip keys, drain). No token names it: an
	// admin token without a namespace holds it (Verifier.Verify adds it),
	// as does a node certificate, and every caller when tokens are off. An
	// admin token with a namespace does not, so it manages its own models
	// and tokens and nothing else.
	ScopeCluster

	// TokenScopes are the scopes a token may hold.
	TokenScopes = ScopeRead | ScopeWrite | ScopeAdmin
	// AllScopes is what a node certificate grants.
	AllScopes = TokenScopes | ScopePeer | ScopeCluster
)

var scopeNames = [...]struct {
	s    Scope
	name string
}{{ScopeRead, "read"}, {ScopeWrite, "write"}, {ScopeAdmin, "admin"}, {ScopePeer, "peer"}, {ScopeCluster, "cluster"}}

// Has reports whether s holds every scope in need.
func (s Scope) Has(need Scope) bool { return s&need == need }

// String lists the scopes comma-separated ("read,write"); "" for none.
func (s Scope) String() string {
	var b strings.Builder
	for _, n := range scopeNames {
		if s&n.s != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(n.name)
		}
	}
	if rest := s &^ AllScopes; rest != 0 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "0x%x", uint8(rest))
	}
	return b.String()
}

// ParseScopes parses a comma-separated list of token scopes ("read",
// "read,write", "read,write,admin"). "peer" and "cluster" are not
// accepted: no token names them.
func ParseScopes(s string) (Scope, error) {
	var out Scope
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		var found Scope
		for _, n := range scopeNames {
			if strings.EqualFold(part, n.name) {
				found = n.s
			}
		}
		if found == 0 || found&^TokenScopes != 0 {
			return 0, fmt.Errorf("%w: unknown token scope %q (want read, write, admin)", ErrInvalidToken, part)
		}
		out |= found
	}
	return out, nil
}

// MarshalText writes String.
func (s Scope) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText wrote ("" is no scope).
func (s *Scope) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*s = 0
		return nil
	}
	v, err := ParseScopes(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}
