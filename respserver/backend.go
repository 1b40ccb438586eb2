package respserver

import (
	"context"
	"errors"
)

// Errors a Backend and its Keyspaces return (wrapped); each maps to one
// Redis error reply.
var (
	// ErrNotFound: no value under the key (a nil reply, not an error).
	ErrNotFound = errors.New("respserver: no such key")
	// ErrAuthRequired: the backend needs a token before any command.
	ErrAuthRequired = errors.New("respserver: authentication required")
	// ErrBadToken: the token is not valid (WRONGPASS).
	ErrBadToken = errors.New("respserver: invalid token")
	// ErrNoAuth: AUTH was given to a backend that takes no tokens.
	ErrNoAuth = errors.New("respserver: no tokens configured")
	// ErrNoPerm: the token does not allow the command (NOPERM).
	ErrNoPerm = errors.New("respserver: permission denied")
	// ErrOtherValue: SET could not be stored over another value of the
	// key that the store holds or deleted (in kvmesh: a version stamped
	// ahead of this node's clock).
	ErrOtherValue = errors.New("respserver: key holds another value")
	// ErrTooLarge: the key and value exceed what one value may hold.
	ErrTooLarge = errors.New("respserver: value too large")
)

// Backend opens the keyspace of a client.
type Backend interface {
	// Open returns the keyspace a token gives ("" for none: an error
	// wrapping ErrAuthRequired when tokens are required, ErrBadToken for a
	// token that is not valid, ErrNoAuth for a token where none are).
	Open(ctx context.Context, token string) (Keyspace, error)
}

// Keyspace holds one namespace's values. Keys and values are bytes the
// caller owns; returned values belong to the caller. Every method may fail
// with an error wrapping ErrNoPerm, and with the store's own errors.
type Keyspace interface {
	// Get returns the value under key (ErrNotFound when none).
	Get(ctx context.Context, key []byte) ([]byte, error)
	// Len returns the length of the value under key (ErrNotFound).
	Len(ctx context.Context, key []byte) (int, error)
	// Set stores value under key, replacing any value it holds, and
	// returns once the store has acknowledged it; ErrOtherValue when
	// the store keeps another value over it.
	Set(ctx context.Context, key, value []byte) error
	// Delete removes key and reports whether it held a value.
	Delete(ctx context.Context, key []byte) (bool, error)
}
