package testutil

import (
	"testing"
	"time"
)

// WaitTimeout bounds WaitFor. It is a failure bound, not a timing
// assertion: a condition that holds returns at once, and only a failing
// test (or a very loaded machine) waits this long.
const WaitTimeout = 60 * time.Second

// WaitFor polls cond until it holds, failing t with what after
// WaitTimeout. Polling starts at a millisecond and backs off to 20 ms, so a
// condition that is nearly true costs little and a slow one little CPU.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitForWithin(t, WaitTimeout, what, cond)
}

// WaitForWithin is WaitFor with its own failure bound d, for a test whose
// bound means something (a shorter one that the test's own deadline must
// fit in).
func WaitForWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(pause)
		if pause < 20*time.Millisecond {
			pause *= 2
		}
	}
}

// SkipIfShort skips a test that starts processes, whole clusters or long
// scenarios when the tests run with -short (make test-short); why says
// what it does.
func SkipIfShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: skips %s", why)
	}
}
