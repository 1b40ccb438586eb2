package auth

import (
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
)

// BenchmarkVerify is the per-call cost of token authentication: parse,
// table lookup (in memory here), HMAC-SHA256, constant-time compare.
func BenchmarkVerify(b *testing.B) {
	tab := newMemTable()
	tok := tab.add(b, "bench", ScopeRead, Namespace{"a1"}, time.Time{})
	v := NewVerifier(tab)
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, tok); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuthorize is the whole interceptor decision for one call.
func BenchmarkAuthorize(b *testing.B) {
	tab := newMemTable()
	tok := tab.add(b, "bench", ScopeRead, Namespace{"a1"}, time.Time{})
	g := NewGuard(Config{Verifier: NewVerifier(tab), Logger: discard()})
	ctx := metadata.NewIncomingContext(b.Context(), metadata.Pairs(AuthorizationHeader, "Bearer "+tok))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Authorize(ctx, "/kvmesh.v1.Client/Get"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckFingerprint is the per-request namespace check handlers
// make; it must not allocate.
func BenchmarkCheckFingerprint(b *testing.B) {
	ctx := WithPrincipal(b.Context(), &Principal{Scopes: ScopeRead, Namespace: Namespace{"ffff", "b2", "a1a1"}})
	b.ReportAllocs()
	for b.Loop() {
		if err := CheckFingerprint(ctx, fpA); err != nil {
			b.Fatal(err)
		}
	}
}
