package auth

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

func TestTokenRoundTrip(t *testing.T) {
	tok, rec, err := NewToken("rag", ScopeRead|ScopeWrite, Namespace{"AB12"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	s := tok.String()
	if len(s) != TokenLen || !strings.HasPrefix(s, rec.ID+".") {
		t.Fatalf("token %q (len %d), record ID %q", s, len(s), rec.ID)
	}
	if strings.Contains(string(rec.Hash), s[idLen+1:]) {
		t.Fatal("record holds the secret")
	}
	back, err := ParseToken(s)
	if err != nil {
		t.Fatal(err)
	}
	if back != tok || !rec.Matches(back) {
		t.Fatal("parsed token does not match its record")
	}
	if rec.Namespace[0] != "ab12" {
		t.Fatalf("namespace not lowered: %v", rec.Namespace)
	}

	// The record survives the metadata store's JSON.
	js, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var rec2 Record
	if err := json.Unmarshal(js, &rec2); err != nil {
		t.Fatal(err)
	}
	if err := rec2.Validate(); err != nil || !rec2.Matches(tok) || rec2.Scopes != rec.Scopes || rec2.Namespace[0] != "ab12" {
		t.Fatalf("JSON round trip: %+v, %v (%s)", rec2, err, js)
	}

	// Every other secret fails: flip each bit of the secret in turn.
	for i := range SecretBytes * 8 {
		bad := tok
		bad.secret[i/8] ^= 1 << (i % 8)
		if rec.Matches(bad) {
			t.Fatalf("secret with bit %d flipped matches", i)
		}
	}
	// Two tokens never share ID, secret or salt.
	tok2, rec2b, err := NewToken("rag", ScopeRead, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if tok2.ID == tok.ID || tok2.secret == tok.secret || string(rec2b.Salt) == string(rec.Salt) || rec.Matches(tok2) {
		t.Fatal("tokens not independent")
	}
}

func TestParseTokenRejects(t *testing.T) {
	tok, _, err := NewToken("", ScopeRead, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	s := tok.String()
	cases := map[string]string{
		"empty":           "",
		"no dot":          strings.Replace(s, ".", "x", 1),
		"upper hex id":    strings.ToUpper(s[:idLen]) + s[idLen:],
		"non-hex id":      "g" + s[1:],
		"short":           s[:len(s)-1],
		"long":            s + "A",
		"padded":          s[:len(s)-1] + "=",
		"std base64":      s[:len(s)-1] + "+",
		"trailing bits":   s[:len(s)-1] + "B", // 43 chars carry 258 bits; the last 2 must be 0
		"space":           " " + s[1:],
		"dot in secret":   s[:len(s)-1] + ".",
		"bearer included": "Bearer " + s,
	}
	for name, in := range cases {
		if name == "trailing bits" && strings.HasSuffix(s, "B") {
			continue
		}
		if _, err := ParseToken(in); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("%s: ParseToken(%q) err %v", name, in, err)
		}
	}
}

func TestScopes(t *testing.T) {
	cases := []struct {
		in   string
		want Scope
		ok   bool
	}{
		{"read", ScopeRead, true},
		{"read,write", ScopeRead | ScopeWrite, true},
		{" Admin , read ", ScopeRead | ScopeAdmin, true},
		{"read,write,admin", TokenScopes, true},
		{"peer", 0, false},
		{"", 0, false},
		{"read,", 0, false},
		{"root", 0, false},
	}
	for _, tc := range cases {
		got, err := ParseScopes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseScopes(%q) = %v, %v", tc.in, got, err)
		}
		if tc.ok {
			var back Scope
			txt, _ := got.MarshalText()
			if err := back.UnmarshalText(txt); err != nil || back != got {
				t.Errorf("text round trip of %v: %v %v", got, back, err)
			}
		}
	}
	if !TokenScopes.Has(ScopeRead|ScopeAdmin) || ScopeRead.Has(ScopeWrite) || TokenScopes.Has(ScopePeer) {
		t.Error("Has")
	}
	if s := Scope(0xff).String(); s != "read,write,admin,peer,cluster,0xe0" {
		t.Errorf("String %q", s)
	}
}

func TestRecordValidate(t *testing.T) {
	_, good, err := NewToken("x", ScopeRead, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*Record){
		"bad id":       func(r *Record) { r.ID = "xyz" },
		"short salt":   func(r *Record) { r.Salt = r.Salt[:3] },
		"short hash":   func(r *Record) { r.Hash = r.Hash[:31] },
		"no scope":     func(r *Record) { r.Scopes = 0 },
		"peer scope":   func(r *Record) { r.Scopes |= ScopePeer },
		"long name":    func(r *Record) { r.Name = strings.Repeat("n", MaxName+1) },
		"bad prefix":   func(r *Record) { r.Namespace = Namespace{"xy"} },
		"empty prefix": func(r *Record) { r.Namespace = Namespace{""} },
		"long prefix":  func(r *Record) { r.Namespace = Namespace{strings.Repeat("a", 33)} },
		"many":         func(r *Record) { r.Namespace = make(Namespace, MaxNamespace+1) },
	}
	for name, mut := range cases {
		r := good
		mut(&r)
		if err := r.Validate(); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	if _, _, err := NewToken("x", ScopeRead, Namespace{"zz"}, time.Time{}); err == nil {
		t.Error("NewToken accepted a bad namespace")
	}
	if _, _, err := NewToken("x", ScopePeer, nil, time.Time{}); err == nil {
		t.Error("NewToken made a peer token")
	}
}

// TestNamespaceProperty: a fingerprint is inside every prefix of its own
// hex form and outside any prefix that differs in one digit.
func TestNamespaceProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		fp := chunk.Fingerprint{Lo: r.Uint64(), Hi: r.Uint64()}
		hex := fp.String()
		n := 1 + r.IntN(32)
		if !(Namespace{hex[:n]}).Allows(fp) {
			t.Fatalf("%s not in its prefix %s", hex, hex[:n])
		}
		i := r.IntN(n)
		other := []byte(hex[:n])
		other[i] = "0123456789abcdef"[(strings.IndexByte("0123456789abcdef", other[i])+1+r.IntN(15))%16]
		if (Namespace{string(other)}).Allows(fp) {
			t.Fatalf("%s inside %s", hex, other)
		}
		if !(Namespace{string(other), hex[:n]}).Allows(fp) || !(Namespace(nil)).Allows(fp) {
			t.Fatal("set or empty namespace")
		}
	}
	ns, err := ParseNamespace("AB, 00ff")
	if err != nil || len(ns) != 2 || ns[0] != "ab" || ns[1] != "00ff" {
		t.Fatalf("ParseNamespace: %v %v", ns, err)
	}
	if ns, err := ParseNamespace(" "); err != nil || ns != nil {
		t.Fatalf("empty namespace: %v %v", ns, err)
	}
	if _, err := ParseNamespace("ab,,cd"); err == nil {
		t.Fatal("empty prefix accepted")
	}
}
