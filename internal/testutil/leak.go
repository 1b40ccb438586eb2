package testutil

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// VerifyNoLeaks runs a package's tests and then fails the run if any
// goroutine they started is still running (go.uber.org/goleak, which
// retries for a while so goroutines that are ending get to end). A
// package's TestMain is just
//
//	func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
//
// Every package whose code or tests start goroutines has one. extra names
// goroutines that the package knows outlive its tests, by any function on
// their stack, each with a comment in the caller saying why.
func VerifyNoLeaks(m *testing.M, extra ...string) {
	code := m.Run()
	if code == 0 {
		if err := Leaks(extra...); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines left running after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Leaks returns an error naming the goroutines still running other than
// the test runner's and those named in extra (by any function on their
// stack), or nil;
// for a TestMain that has its own work to do around m.Run.
func Leaks(extra ...string) error {
	opts := make([]goleak.Option, 0, len(ignored)+len(extra))
	for _, fn := range append(append([]string(nil), ignored...), extra...) {
		opts = append(opts, goleak.IgnoreAnyFunction(fn))
	}
	// goleak alone retries for about half a second; goroutines that are
	// ending may need longer on a loaded machine under -race.
	deadline := time.Now().Add(leakGrace)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leakGrace is how long goroutines get to end after the tests did.
const leakGrace = 10 * time.Second

// ignored are goroutines of libraries that outlive every Close by design.
var ignored = []string{}
