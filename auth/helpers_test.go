package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// memTable is a TokenTable in memory, as the metadata store holds one.
type memTable struct {
	mu   sync.Mutex
	recs map[string]Record
	err  error
}

func newMemTable() *memTable { return &memTable{recs: make(map[string]Record)} }

func (m *memTable) LookupToken(_ context.Context, id string) (Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return Record{}, m.err
	}
	r, ok := m.recs[id]
	if !ok {
		return Record{}, fmt.Errorf("token %s: %w", id, ErrUnknownToken)
	}
	return r, nil
}

// add makes a token, stores its record and returns the presented form.
func (m *memTable) add(tb testing.TB, name string, s Scope, ns Namespace, expires time.Time) string {
	tb.Helper()
	tok, rec, err := NewToken(name, s, ns, expires)
	if err != nil {
		tb.Fatal(err)
	}
	m.mu.Lock()
	m.recs[rec.ID] = rec
	m.mu.Unlock()
	return tok.String()
}

func (m *memTable) fail(err error) {
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
}

var errTableDown = errors.New("metadata store unavailable")

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
