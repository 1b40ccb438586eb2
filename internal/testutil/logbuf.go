package testutil

import (
	"strings"
	"sync"
)

// LogBuffer is a log sink that goroutines may write while a test reads it:
// give it to slog.NewTextHandler or a daemon's output, then read String.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
