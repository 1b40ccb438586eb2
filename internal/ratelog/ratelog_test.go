package ratelog

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// allowed counts how many of n calls to Allow pass and sums the dropped
// counts they report.
func allowed(l *Limiter, n int) (ok, dropped int) {
	for range n {
		if a, d := l.Allow(); a {
			ok++
			dropped += d
		}
	}
	return ok, dropped
}

// TestBurstThenRate: the burst passes at once, then one line per
// interval, never more than the burst after a long quiet spell; the first
// line after refusals reports them.
func TestBurstThenRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New(Config{Burst: 3, Every: time.Second})
		if ok, d := allowed(l, 10); ok != 3 || d != 0 {
			t.Fatalf("first 10: %d allowed (dropped %d), want 3 (0)", ok, d)
		}
		time.Sleep(time.Second)
		if ok, d := l.Allow(); !ok || d != 7 {
			t.Fatalf("after 1s: allowed %v dropped %d, want true 7", ok, d)
		}
		if ok, _ := l.Allow(); ok {
			t.Fatal("second line within the interval allowed")
		}
		time.Sleep(2500 * time.Millisecond)
		if ok, d := allowed(l, 5); ok != 2 || d != 1 {
			t.Fatalf("after 2.5s: %d allowed (dropped %d), want 2 (1)", ok, d)
		}
		// Half an interval was left over: one more line 0.5 s later.
		time.Sleep(500 * time.Millisecond)
		if ok, _ := allowed(l, 3); ok != 1 {
			t.Fatalf("after 0.5s more: %d allowed, want 1", ok)
		}
		time.Sleep(time.Hour)
		if ok, _ := allowed(l, 10); ok != 3 {
			t.Fatalf("after an hour: %d allowed, want the burst of 3", ok)
		}
	})
}

// TestLog: Log writes what Allow lets through with the count left out,
// and a record below the logger's level takes no token.
func TestLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
		l := New(Config{Burst: 1, Every: time.Minute})
		ctx := context.Background()
		for range 5 {
			l.Log(ctx, log, slog.LevelDebug, "hidden")
		}
		for i := range 4 {
			l.Log(ctx, log, slog.LevelWarn, "refused", "i", i)
		}
		time.Sleep(time.Minute)
		l.Log(ctx, log, slog.LevelWarn, "refused", "i", 4)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], "i=0") || strings.Contains(lines[0], "suppressed") ||
			!strings.Contains(lines[1], "i=4 suppressed=3") {
			t.Fatalf("log:\n%s\nwant i=0, then i=4 with suppressed=3", buf.String())
		}
	})
}
