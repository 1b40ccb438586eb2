package auth

import (
	"errors"
	"slices"
	"testing"
)

func TestNamespaceWithin(t *testing.T) {
	for _, tc := range []struct {
		ns, outer Namespace
		want      bool
	}{
		{nil, nil, true},
		{Namespace{"ab"}, nil, true},
		{nil, Namespace{"ab"}, false},
		{Namespace{"ab"}, Namespace{"ab"}, true},
		{Namespace{"abcd"}, Namespace{"ab"}, true},
		{Namespace{"a"}, Namespace{"ab"}, false},
		{Namespace{"abcd", "ff"}, Namespace{"ab", "f"}, true},
		{Namespace{"abcd", "ee"}, Namespace{"ab", "f"}, false},
	} {
		if got := tc.ns.Within(tc.outer); got != tc.want {
			t.Errorf("%v within %v = %v, want %v", tc.ns, tc.outer, got, tc.want)
		}
	}
}

func TestGrant(t *testing.T) {
	admin := &Principal{TokenID: "0123456789abcdef", Scopes: TokenScopes}
	nsAdmin := &Principal{TokenID: "0123456789abcdef", Scopes: ScopeRead | ScopeAdmin, Namespace: Namespace{"ab"}}
	for _, tc := range []struct {
		name   string
		p      *Principal
		scopes Scope
		ns     Namespace
		want   Namespace
		err    error
	}{
		{"unrestricted, all", admin, TokenScopes, nil, nil, nil},
		{"unrestricted, narrowed", admin, ScopeRead, Namespace{"CD"}, Namespace{"cd"}, nil},
		{"inherits namespace", nsAdmin, ScopeRead, nil, Namespace{"ab"}, nil},
		{"inside namespace", nsAdmin, ScopeRead | ScopeAdmin, Namespace{"ab12"}, Namespace{"ab12"}, nil},
		{"outside namespace", nsAdmin, ScopeRead, Namespace{"cd"}, nil, ErrPermissionDenied},
		{"broader namespace", nsAdmin, ScopeRead, Namespace{"a"}, nil, ErrPermissionDenied},
		{"scope it lacks", nsAdmin, ScopeWrite, nil, nil, ErrPermissionDenied},
		{"peer scope", admin, ScopePeer, nil, nil, ErrInvalidToken},
		{"no scope", admin, 0, nil, nil, ErrInvalidToken},
		{"bad prefix", admin, ScopeRead, Namespace{"xyz"}, nil, ErrInvalidToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.p.Grant(tc.scopes, tc.ns)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err == nil && !slices.Equal(got, tc.want) {
				t.Fatalf("namespace %v, want %v", got, tc.want)
			}
		})
	}
}

func TestManagesAndPeer(t *testing.T) {
	nsAdmin := &Principal{Scopes: ScopeAdmin, Namespace: Namespace{"ab"}}
	if !nsAdmin.Manages(Record{Namespace: Namespace{"ab01"}}) || nsAdmin.Manages(Record{}) || nsAdmin.Manages(Record{Namespace: Namespace{"cd"}}) {
		t.Error("a namespaced admin manages exactly the tokens inside its namespace")
	}
	if !(&Principal{}).Manages(Record{Namespace: Namespace{"cd"}}) {
		t.Error("an unrestricted admin manages every token")
	}
	if (&Principal{Scopes: TokenScopes, CertName: "app"}).Peer() || !(&Principal{Node: true}).Peer() || !(&Principal{Scopes: ScopePeer}).Peer() {
		t.Error("Peer")
	}
}
