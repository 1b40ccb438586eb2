package meta

import (
	"fmt"
	"maps"

	"github.com/kvmesh/kvmesh/auth"
)

// putToken adds an API token record, or replaces the record with its ID.
// The record holds the salted hash of the secret, never the secret.
type putToken struct {
	Record auth.Record `json:"record"`
}

func (putToken) kind() cmdKind { return kindPutToken }

func (c putToken) validate() error { return validateToken(&c.Record) }

func (c putToken) apply(cur *fsmState, _ uint64) (*fsmState, error) {
	rec := c.Record
	old, ok := cur.tokens[rec.ID]
	if ok && recordsEqual(old, rec) {
		return cur, nil
	}
	if !ok && len(cur.tokens) >= MaxTokens {
		return cur, fmt.Errorf("%w: %d token records, the most allowed", ErrInvalidCommand, MaxTokens)
	}
	next := *cur
	next.tokens = maps.Clone(cur.tokens)
	next.tokens[rec.ID] = rec
	return &next, nil
}

// deleteToken removes the record with ID; an absent ID is a no-op, so a
// retried delete succeeds.
type deleteToken struct {
	ID string `json:"id"`
}

func (deleteToken) kind() cmdKind { return kindDeleteToken }

func (c deleteToken) validate() error { return validateTokenID(c.ID) }

func (c deleteToken) apply(cur *fsmState, _ uint64) (*fsmState, error) {
	if _, ok := cur.tokens[c.ID]; !ok {
		return cur, nil
	}
	next := *cur
	next.tokens = maps.Clone(cur.tokens)
	delete(next.tokens, c.ID)
	return &next, nil
}

// validateToken is auth's record validation, as ErrInvalidCommand.
func validateToken(r *auth.Record) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCommand, err)
	}
	return nil
}

// validateTokenID checks id has the shape of a token ID (auth.IDBytes
// bytes in lowercase hex), so that a delete cannot carry arbitrary bytes
// into the log.
func validateTokenID(id string) error {
	ok := len(id) == 2*auth.IDBytes
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= '0' && c <= '9' || c >= 'a' && c <= 'f'
	}
	if !ok {
		// Not quoted: a malformed ID may be megabytes of anything.
		return fmt.Errorf("%w: %w: token ID of %d bytes is not %d lowercase hex digits", ErrInvalidCommand, auth.ErrInvalidToken, len(id), 2*auth.IDBytes)
	}
	return nil
}
