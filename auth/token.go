package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

// Sentinel errors; errors returned by this package wrap them (and those
// that reach gRPC carry their status code as well).
var (
	// ErrInvalidToken: a token, record or scope list is malformed.
	ErrInvalidToken = errors.New("auth: invalid token")
	// ErrUnknownToken is what a TokenTable returns for an ID it lacks.
	ErrUnknownToken = errors.New("auth: unknown token")
	// ErrUnauthenticated: no credentials, or credentials that do not
	// verify (gRPC Unauthenticated).
	ErrUnauthenticated = errors.New("auth: unauthenticated")
	// ErrPermissionDenied: a verified caller lacks the scope or namespace
	// (gRPC PermissionDenied).
	ErrPermissionDenied = errors.New("auth: permission denied")
	// ErrTooManyStreams: the caller is at its stream limit (gRPC
	// ResourceExhausted).
	ErrTooManyStreams = errors.New("auth: too many concurrent streams")
	// ErrTooManyCalls: the caller is at its limit of concurrent unary
	// calls (gRPC ResourceExhausted).
	ErrTooManyCalls = errors.New("auth: too many concurrent calls")
)

// Token sizes and bounds.
const (
	// IDBytes random bytes name a token, written as 2*IDBytes hex digits.
	IDBytes = 8
	// SecretBytes random bytes are a token's secret, written in unpadded
	// URL-safe base64.
	SecretBytes = 32
	saltBytes   = 16
	// MaxNamespace bounds a record's fingerprint prefixes, MaxName its
	// label, so records in the Raft log stay small.
	MaxNamespace = 64
	MaxName      = 256

	idLen     = 2 * IDBytes
	secretLen = (SecretBytes*8 + 5) / 6 // 43
	// TokenLen is the length of a presented token: id "." secret.
	TokenLen = idLen + 1 + secretLen
)

// Token is a parsed presented token. Its String is the only form that
// holds the secret; never log it.
type Token struct {
	ID     string
	secret [SecretBytes]byte
}

// String is "<id>.<secret>", what a client presents.
func (t Token) String() string {
	return t.ID + "." + base64.RawURLEncoding.EncodeToString(t.secret[:])
}

// ParseToken parses "<id>.<secret>" strictly: 16 lowercase hex digits, a
// dot, 43 characters of unpadded URL-safe base64 encoding 32 bytes.
func ParseToken(s string) (Token, error) {
	var t Token
	if len(s) != TokenLen || s[idLen] != '.' {
		return t, fmt.Errorf("%w: want <id>.<secret>, %d characters", ErrInvalidToken, TokenLen)
	}
	id, sec := s[:idLen], s[idLen+1:]
	if !validID(id) {
		return t, fmt.Errorf("%w: token ID is not %d lowercase hex digits", ErrInvalidToken, idLen)
	}
	n, err := base64.RawURLEncoding.Strict().Decode(t.secret[:], []byte(sec))
	if err != nil || n != SecretBytes {
		return Token{}, fmt.Errorf("%w: token secret is not %d bytes of base64url", ErrInvalidToken, SecretBytes)
	}
	t.ID = id
	return t, nil
}

func validID(id string) bool {
	if len(id) != idLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Record is what the cluster stores for a token: never the secret, only a
// salted HMAC of it. The JSON form is what the metadata store keeps.
type Record struct {
	ID   string `json:"id"`
	Salt []byte `json:"salt"`
	// Hash is HMAC-SHA256 keyed by Salt over the 32 secret bytes.
	Hash   []byte `json:"hash"`
	Scopes Scope  `json:"scopes"`
	// Namespace, if not empty, limits the token to models whose
	// fingerprint (32 lowercase hex digits, chunk.Fingerprint.String)
	// starts with one of these prefixes.
	Namespace Namespace `json:"namespace,omitempty"`
	// Name is a human label ("rag-frontend"); not secret, not unique.
	Name    string    `json:"name,omitempty"`
	Created time.Time `json:"created"`
	// Expires, if not zero, is when the token stops working.
	Expires time.Time `json:"expires,omitzero"`
}

// NewToken makes a token with a fresh random ID and secret and the Record
// to store for it. Show the Token to the user once; keep only the Record.
func NewToken(name string, scopes Scope, ns Namespace, expires time.Time) (Token, Record, error) {
	var t Token
	var id [IDBytes]byte
	rec := Record{Salt: make([]byte, saltBytes), Scopes: scopes, Name: name, Created: time.Now().UTC(), Expires: expires}
	for _, b := range [][]byte{id[:], t.secret[:], rec.Salt} {
		if _, err := rand.Read(b); err != nil {
			return Token{}, Record{}, fmt.Errorf("auth: random: %w", err)
		}
	}
	t.ID = hex.EncodeToString(id[:])
	rec.ID = t.ID
	rec.Hash = tokenMAC(rec.Salt, t.secret[:])
	var err error
	if rec.Namespace, err = ns.normalized(); err != nil {
		return Token{}, Record{}, err
	}
	if err := rec.Validate(); err != nil {
		return Token{}, Record{}, err
	}
	return t, rec, nil
}

func tokenMAC(salt, secret []byte) []byte {
	m := hmac.New(sha256.New, salt)
	m.Write(secret)
	return m.Sum(nil)
}

// Matches reports, in constant time, whether t's secret is the one r was
// made for. It does not check the ID, scopes or expiry.
func (r *Record) Matches(t Token) bool {
	return hmac.Equal(tokenMAC(r.Salt, t.secret[:]), r.Hash)
}

// Validate checks a record's shape, as a metadata store should before it
// accepts one into its log.
func (r *Record) Validate() error {
	switch {
	case !validID(r.ID):
		return fmt.Errorf("%w: record ID %q", ErrInvalidToken, r.ID)
	case len(r.Salt) != saltBytes:
		return fmt.Errorf("%w: record salt is %d bytes, want %d", ErrInvalidToken, len(r.Salt), saltBytes)
	case len(r.Hash) != sha256.Size:
		return fmt.Errorf("%w: record hash is %d bytes, want %d", ErrInvalidToken, len(r.Hash), sha256.Size)
	case r.Scopes == 0 || r.Scopes&^TokenScopes != 0:
		return fmt.Errorf("%w: record scopes %q", ErrInvalidToken, r.Scopes)
	case len(r.Name) > MaxName:
		return fmt.Errorf("%w: record name longer than %d bytes", ErrInvalidToken, MaxName)
	}
	return r.Namespace.Validate()
}

// Namespace is a set of model fingerprint prefixes in lowercase hex; empty
// means every model.
type Namespace []string

// ParseNamespace parses comma-separated fingerprint prefixes ("" is every
// model); upper-case hex is lowered.
func ParseNamespace(s string) (Namespace, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ns Namespace
	for p := range strings.SplitSeq(s, ",") {
		ns = append(ns, strings.TrimSpace(p))
	}
	return ns.normalized()
}

func (ns Namespace) normalized() (Namespace, error) {
	if len(ns) == 0 {
		return nil, nil
	}
	out := make(Namespace, len(ns))
	for i, p := range ns {
		out[i] = strings.ToLower(p)
	}
	return out, out.Validate()
}

// Validate checks every prefix is 1 to 32 lowercase hex digits and that
// there are at most MaxNamespace of them.
func (ns Namespace) Validate() error {
	if len(ns) > MaxNamespace {
		return fmt.Errorf("%w: namespace of %d prefixes, at most %d", ErrInvalidToken, len(ns), MaxNamespace)
	}
	for _, p := range ns {
		if len(p) == 0 || len(p) > 32 {
			return fmt.Errorf("%w: namespace prefix %q is not 1 to 32 hex digits", ErrInvalidToken, p)
		}
		for i := 0; i < len(p); i++ {
			if c := p[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return fmt.Errorf("%w: namespace prefix %q is not lowercase hex", ErrInvalidToken, p)
			}
		}
	}
	return nil
}

// Allows reports whether fp is inside the namespace.
func (ns Namespace) Allows(fp chunk.Fingerprint) bool {
	if len(ns) == 0 {
		return true
	}
	// The hex form on the stack: this runs on every request.
	var buf [32]byte
	const digits = "0123456789abcdef"
	for i := range 16 {
		buf[15-i] = digits[(fp.Hi>>(4*i))&0xf]
		buf[31-i] = digits[(fp.Lo>>(4*i))&0xf]
	}
	for _, p := range ns {
		if len(p) <= 32 && string(buf[:len(p)]) == p {
			return true
		}
	}
	return false
}
