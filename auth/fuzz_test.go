package auth

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
)

// FuzzParseToken: the parser never panics, accepts only canonical tokens
// (String gives the input back), and a token with another secret never
// matches the record.
func FuzzParseToken(f *testing.F) {
	tok, rec, err := NewToken("", ScopeRead, nil, time.Time{})
	if err != nil {
		f.Fatal(err)
	}
	s := tok.String()
	for _, seed := range []string{s, "", ".", s[:idLen] + ".", s + "=", "0123456789abcdef." + s[idLen+1:], "Bearer " + s} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseToken(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("error %v does not wrap ErrInvalidToken", err)
			}
			return
		}
		if got.String() != in {
			t.Fatalf("ParseToken(%q) round trips to %q", in, got.String())
		}
		if got.secret != tok.secret && rec.Matches(got) {
			t.Fatalf("%q matches the record of %q", in, s)
		}
	})
}

// FuzzAuthorizationHeader: whatever a client sends as its authorization
// header, the guard answers with an error or the one valid token, and never
// panics.
func FuzzAuthorizationHeader(f *testing.F) {
	tab := newMemTable()
	tok := tab.add(f, "reader", ScopeRead, nil, time.Time{})
	g := NewGuard(Config{Verifier: NewVerifier(tab), Logger: discard()})
	for _, seed := range []string{"Bearer " + tok, "bearer " + tok, "Bearer", "Basic " + tok, tok, "", "Bearer  " + tok + " "} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, hdr string) {
		ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(AuthorizationHeader, hdr))
		p, err := g.Authorize(ctx, "/kvmesh.v1.Client/Get")
		if err == nil && p.TokenID != tok[:idLen] {
			t.Fatalf("header %q authorised as %+v", hdr, p)
		}
	})
}
