package meta

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/auth"
)

// *Store is the token table of auth.NewVerifier.
var _ auth.TokenTable = (*Store)(nil)

// LookupToken returns the API token record with id as this node has
// applied it, or an error wrapping auth.ErrUnknownToken. It is a local,
// lock-free read that never waits: a token created a moment ago through
// another node may be unknown here until this node applies it (normally
// within one commit round), and waiting for unknown IDs would let any
// client hold requests open with made-up tokens. The record's slices are
// copies; the caller may keep them.
func (s *Store) LookupToken(_ context.Context, id string) (auth.Record, error) {
	r, ok := s.fsm.token(id)
	if !ok {
		return auth.Record{}, fmt.Errorf("%w: %s", auth.ErrUnknownToken, id)
	}
	return cloneRecord(r), nil
}

// Tokens returns every API token record, sorted by ID (copies, as
// LookupToken's). It is for the admin listing; it holds no secrets.
func (s *Store) Tokens() []auth.Record {
	recs := s.fsm.tokenList()
	for i := range recs {
		recs[i] = cloneRecord(recs[i])
	}
	return recs
}

// PutToken stores rec cluster-wide, replacing a record with the same ID
// (to change its scopes, namespace or expiry). rec must pass
// auth.Record.Validate; an invalid record, or a new one beyond MaxTokens,
// fails with an error wrapping ErrInvalidCommand (and auth.ErrInvalidToken
// for a malformed record). Only the record is stored, never a secret:
// callers make it with auth.NewToken and show the token to the user once.
// Checking that the caller may manage tokens (admin scope) is the API's
// job. When it returns nil the record is applied on this node too.
func (s *Store) PutToken(ctx context.Context, rec auth.Record) error {
	if err := validateToken(&rec); err != nil {
		return err
	}
	// No shortcut when this node already holds rec: it may lag behind a
	// delete of it, and writing an idempotent command again is cheap.
	cmd, err := encodeCommand(putToken{Record: rec})
	if err != nil {
		return err
	}
	if err := s.write(ctx, cmd); err != nil {
		return err
	}
	// Read-your-write as RegisterModel; a concurrent put of the same ID
	// may replace it, so the wait only asks that some record be there.
	if !s.waitFor(ctx, func() bool { _, ok := s.fsm.token(rec.ID); return ok }) {
		return fmt.Errorf("meta: token %s committed but not yet applied on %s: %w", rec.ID, s.cfg.NodeID, context.Cause(ctx))
	}
	return nil
}

// DeleteToken removes the record with id cluster-wide; the token stops
// working on each node as soon as that node applies the delete. Deleting
// an unknown ID succeeds (deletes are retried and must be idempotent). A
// malformed ID fails with ErrInvalidCommand. When it returns nil the record
// is gone on this node too.
func (s *Store) DeleteToken(ctx context.Context, id string) error {
	if err := validateTokenID(id); err != nil {
		return err
	}
	// Always written, even when this node knows no such token: it may
	// lag behind the put, and a delete skipped for that would leave the
	// token working.
	cmd, err := encodeCommand(deleteToken{ID: id})
	if err != nil {
		return err
	}
	if err := s.write(ctx, cmd); err != nil {
		return err
	}
	if !s.waitFor(ctx, func() bool { _, ok := s.fsm.token(id); return !ok }) {
		return fmt.Errorf("meta: token %s delete committed but not yet applied on %s: %w", id, s.cfg.NodeID, context.Cause(ctx))
	}
	return nil
}

// cloneRecord copies r's slices (salt and hash in one allocation: this
// runs on every authenticated request).
func cloneRecord(r auth.Record) auth.Record {
	n := len(r.Salt)
	buf := make([]byte, n+len(r.Hash))
	copy(buf, r.Salt)
	copy(buf[n:], r.Hash)
	r.Salt, r.Hash = buf[:n:n], buf[n:]
	r.Namespace = slices.Clone(r.Namespace)
	return r
}
