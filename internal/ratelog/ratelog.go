// Package ratelog bounds how often one kind of log line is written: a
// burst of lines at once, then one line per interval, and the first line
// written after some were left out says how many. A flood (a client
// retrying with a bad token) then cannot fill the log, while the first
// lines and a steady sample still show who did what; counters hold the
// totals. Imports nothing of ours.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultBurst = 10
	DefaultEvery = time.Second
)

// Config configures a Limiter.
type Config struct {
	// Burst is how many lines may be written at once, after a quiet
	// spell. Default DefaultBurst.
	Burst int
	// Every is how often one more line may be written once the burst is
	// spent. Default DefaultEvery.
	Every time.Duration
}

// Limiter is a token bucket over log lines; it is safe for concurrent use.
type Limiter struct {
	burst int
	every time.Duration

	mu      sync.Mutex
	tokens  int
	last    time.Time // when tokens were last refilled
	dropped int       // lines refused since the last one allowed
}

// New returns a Limiter for cfg, its burst available at once.
func New(cfg Config) *Limiter {
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	return &Limiter{burst: cfg.Burst, every: cfg.Every, tokens: cfg.Burst, last: time.Now()}
}

// Allow reports whether a line may be written now. When it may, dropped
// is how many lines Allow refused since it last allowed one (to say in
// the line written).
func (l *Limiter) Allow() (ok bool, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if n := int(now.Sub(l.last) / l.every); n > 0 {
		l.tokens += n
		l.last = l.last.Add(time.Duration(n) * l.every)
		if l.tokens >= l.burst {
			l.tokens, l.last = l.burst, now
		}
	}
	if l.tokens == 0 {
		l.dropped++
		return false, 0
	}
	l.tokens--
	dropped, l.dropped = l.dropped, 0
	return true, dropped
}

// Log writes a record to log at level when Allow lets it, adding a
// "suppressed" attribute with the count of lines left out before it (when
// there were some). A record the logger would not write anyway takes no
// token.
func (l *Limiter) Log(ctx context.Context, log *slog.Logger, level slog.Level, msg string, args ...any) {
	if !log.Enabled(ctx, level) {
		return
	}
	ok, dropped := l.Allow()
	if !ok {
		return
	}
	if dropped > 0 {
		args = append(args, slog.Int("suppressed", dropped))
	}
	log.Log(ctx, level, msg, args...)
}
