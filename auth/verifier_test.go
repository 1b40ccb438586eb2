package auth

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/chunk"
)

var (
	fpA  = chunk.Fingerprint{Hi: 0xa1a1000000000000, Lo: 1} // namespace "a1a1"
	fpA2 = chunk.Fingerprint{Hi: 0xa1a1ffff00000000, Lo: 7}
	fpB  = chunk.Fingerprint{Hi: 0xb2b2000000000000, Lo: 1} // namespace "b2b2"
)

func TestVerifierCheck(t *testing.T) {
	tab := newMemTable()
	reader := tab.add(t, "reader", ScopeRead, nil, time.Time{})
	writerA := tab.add(t, "writer-a", ScopeRead|ScopeWrite, Namespace{"a1a1"}, time.Time{})
	admin := tab.add(t, "admin", TokenScopes, nil, time.Time{})
	expired := tab.add(t, "old", TokenScopes, nil, time.Now().Add(-time.Second))
	future := tab.add(t, "fresh", ScopeRead, nil, time.Now().Add(time.Hour))
	stranger, _, err := NewToken("not stored", TokenScopes, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	wrongSecret := reader[:idLen+1] + admin[idLen+1:]

	v := NewVerifier(tab)
	cases := []struct {
		name  string
		token string
		need  Scope
		fp    chunk.Fingerprint
		want  codes.Code
	}{
		{"reader reads", reader, ScopeRead, fpB, codes.OK},
		{"reader cannot write", reader, ScopeWrite, fpB, codes.PermissionDenied},
		{"reader is no admin", reader, ScopeAdmin, fpB, codes.PermissionDenied},
		{"namespace A reads A", writerA, ScopeRead, fpA, codes.OK},
		{"namespace A writes A", writerA, ScopeWrite, fpA2, codes.OK},
		{"namespace A cannot read B", writerA, ScopeRead, fpB, codes.PermissionDenied},
		{"namespace A cannot write B", writerA, ScopeWrite, fpB, codes.PermissionDenied},
		{"admin administers", admin, ScopeAdmin, fpB, codes.OK},
		{"no token can be a peer", admin, ScopePeer, fpB, codes.PermissionDenied},
		{"expired", expired, ScopeRead, fpA, codes.Unauthenticated},
		{"not yet expired", future, ScopeRead, fpA, codes.OK},
		{"unknown id", stranger.String(), ScopeRead, fpA, codes.Unauthenticated},
		{"wrong secret", wrongSecret, ScopeRead, fpA, codes.Unauthenticated},
		{"malformed", "hello", ScopeRead, fpA, codes.Unauthenticated},
		{"empty", "", ScopeRead, fpA, codes.Unauthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := v.Check(t.Context(), tc.token, tc.need, tc.fp)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			switch tc.want {
			case codes.Unauthenticated:
				if !errors.Is(err, ErrUnauthenticated) {
					t.Fatalf("%v does not wrap ErrUnauthenticated", err)
				}
			case codes.PermissionDenied:
				if !errors.Is(err, ErrPermissionDenied) {
					t.Fatalf("%v does not wrap ErrPermissionDenied", err)
				}
			}
			if err != nil && strings.Contains(err.Error(), tc.token[min(len(tc.token), idLen+1):]) && len(tc.token) > idLen+1 {
				t.Fatalf("error %q repeats the secret", err)
			}
		})
	}

	tab.fail(errTableDown)
	err = v.Check(t.Context(), reader, ScopeRead, fpA)
	if status.Code(err) != codes.Unavailable || !errors.Is(err, errTableDown) {
		t.Fatalf("table down: %v", err)
	}
}

func TestCheckFingerprintFailsClosed(t *testing.T) {
	if err := CheckFingerprint(t.Context(), fpA); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("no principal: %v", err)
	}
	ctx := WithPrincipal(t.Context(), &Principal{TokenID: "t", Scopes: ScopeRead, Namespace: Namespace{"a1"}})
	if err := CheckFingerprint(ctx, fpA); err != nil {
		t.Fatal(err)
	}
	if err := CheckFingerprint(ctx, fpB); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("other namespace: %v", err)
	}
}

func TestPrincipalKey(t *testing.T) {
	cases := []struct {
		p    Principal
		want string
	}{
		{Principal{TokenID: "ab", CertName: "c", Addr: "1.2.3.4:5"}, "token:ab"},
		{Principal{CertName: "c", Addr: "1.2.3.4:5"}, "cert:c"},
		{Principal{Addr: "1.2.3.4:5"}, "addr:1.2.3.4"},
		{Principal{Addr: "[::1]:80"}, "addr:::1"},
		{Principal{Addr: "bufconn"}, "addr:bufconn"},
	}
	for _, tc := range cases {
		if got := tc.p.Key(); got != tc.want {
			t.Errorf("%+v: Key %q, want %q", tc.p, got, tc.want)
		}
	}
}

// TestClusterScope: an admin token without a namespace holds the cluster
// scope (settings, gossip keys, drain); one with a namespace does not,
// and its refusal says why.
func TestClusterScope(t *testing.T) {
	tab := newMemTable()
	root := tab.add(t, "root", TokenScopes, nil, time.Time{})
	adminA := tab.add(t, "admin-a", TokenScopes, Namespace{"a1a1"}, time.Time{})
	writer := tab.add(t, "writer", ScopeRead|ScopeWrite, nil, time.Time{})
	v := NewVerifier(tab)
	for _, tc := range []struct {
		name  string
		token string
		want  codes.Code
	}{
		{"unrestricted admin", root, codes.OK},
		{"namespaced admin", adminA, codes.PermissionDenied},
		{"no admin", writer, codes.PermissionDenied},
	} {
		err := v.Check(t.Context(), tc.token, ScopeAdmin|ScopeCluster, fpA)
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: code %v (%v), want %v", tc.name, got, err, tc.want)
		}
	}
	err := v.Check(t.Context(), adminA, ScopeAdmin|ScopeCluster, fpA)
	if !strings.Contains(err.Error(), "namespace") {
		t.Errorf("the namespaced admin's refusal does not say why: %v", err)
	}
	if _, err := ParseScopes("cluster"); err == nil {
		t.Error("a token can name the cluster scope")
	}
}

// TestRefusalsAlike: an expired token, a wrong secret and an unknown ID get
// the same answer, so a caller learns neither that an ID exists nor which
// check failed.
func TestRefusalsAlike(t *testing.T) {
	tab := newMemTable()
	expired := tab.add(t, "old", TokenScopes, nil, time.Now().Add(-time.Second))
	good := tab.add(t, "good", TokenScopes, nil, time.Time{})
	stranger, _, err := NewToken("not stored", TokenScopes, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	v := NewVerifier(tab)
	msg := func(tok string) string {
		_, err := v.Verify(t.Context(), tok)
		return status.Convert(err).Message()
	}
	want := msg(stranger.String())
	for name, tok := range map[string]string{"expired": expired, "wrong secret": good[:idLen+1] + stranger.String()[idLen+1:]} {
		if got := msg(tok); got != want {
			t.Errorf("%s: %q, an unknown ID gets %q", name, got, want)
		}
	}
}
