package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/ring"
)

func TestRingDiff(t *testing.T) {
	ours := []ring.Member{
		{ID: "n1", GRPCAddr: "a:1", RaftAddr: "a:2", Weight: 32.66},
		{ID: "n2", GRPCAddr: "b:1", RaftAddr: "b:2", Weight: 72.66},
		{ID: "n3", GRPCAddr: "c:1", RaftAddr: "c:2"},
	}
	leader := func(mod func(ms []ring.Member) []ring.Member) []*api.Member {
		ms := mod(append([]ring.Member(nil), ours...))
		out := make([]*api.Member, 0, len(ms))
		for _, m := range ms {
			out = append(out, api.ProtoMember(m))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		mod  func(ms []ring.Member) []ring.Member
		want string
	}{
		{"same", func(ms []ring.Member) []ring.Member { return ms }, ""},
		{"weight", func(ms []ring.Member) []ring.Member { ms[1].Weight = 32.66; return ms },
			"n2 has weight 72.66 here, 32.66 on the leader"},
		{"address", func(ms []ring.Member) []ring.Member { ms[2].RaftAddr = "c:3"; return ms }, "n3 is "},
		{"extra here", func(ms []ring.Member) []ring.Member { return ms[:2] }, "n3 is not in the leader's ring"},
		{"missing here", func(ms []ring.Member) []ring.Member { return append(ms, ring.Member{ID: "n4"}) }, "n4 is missing here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ringDiff(ours, leader(tc.mod))
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("ringDiff = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRingDisagreementNotReady: while the ring differs from the leader's,
// the node is recovering and says why; once it agrees the reason goes.
func TestRingDisagreementNotReady(t *testing.T) {
	n := &Node{log: slog.New(slog.DiscardHandler)}
	err := fmt.Errorf("%w: epoch 5, leader n1: n2 has weight 72.66 here, 32.66 on the leader", errRingDisagrees)
	n.noteRing(err)
	if got := n.recovering(); !errors.Is(got, ErrRecovering) || !strings.Contains(got.Error(), "72.66 here, 32.66 on the leader") {
		t.Fatalf("recovering() = %v, want ErrRecovering with the ring difference", got)
	}
	n.noteRing(errors.New("leader n1: cluster info: unavailable"))
	if got := n.recovering(); got == nil || strings.Contains(got.Error(), "72.66") {
		t.Fatalf("recovering() after another catch-up error = %v, want the catch-up reason", got)
	}
	n.rec.metaCaughtUp.Store(true)
	n.rec.pullDone.Store(true) // every start waits for its startup pull too
	n.noteRing(nil)
	if got := n.recovering(); got != nil {
		t.Fatalf("recovering() once caught up = %v", got)
	}
}

// TestRingCheckedAtEachEpoch drives watchRing with a scripted check: a
// started node checks once per ring epoch it applies, a difference found
// later makes it not ready (and sets the gauge's state), a check that
// cannot compare changes nothing, and agreement makes it ready again.
func TestRingCheckedAtEachEpoch(t *testing.T) {
	n := &Node{log: slog.New(slog.DiscardHandler)}
	n.rec.metaCaughtUp.Store(true)
	n.rec.pullDone.Store(true)
	var epoch atomic.Uint64
	epoch.Store(5)
	type answer struct {
		compared bool
		err      error
	}
	calls := make(chan uint64)   // the epoch each check ran at
	answers := make(chan answer) // what that check returns
	idle := make(chan struct{})  // the loop waits (it handled the last wake)
	wake := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan struct{})
	wait := func() bool {
		select {
		case idle <- struct{}{}:
		case <-stop:
			return false
		}
		select {
		case <-wake:
			return true
		case <-stop:
			return false
		}
	}
	check := func(context.Context) (bool, error) {
		select {
		case calls <- epoch.Load():
		case <-stop:
			return false, nil
		}
		select {
		case a := <-answers:
			return a.compared, a.err
		case <-stop:
			return false, nil
		}
	}
	go func() {
		defer close(done)
		n.watchRing(t.Context(), wait, epoch.Load, check)
	}()
	t.Cleanup(func() { close(stop); <-done })
	// next returns the loop's next move after a wake: the epoch of a
	// check, or ok false when it went back to waiting without one.
	next := func() (ep uint64, ok bool) {
		t.Helper()
		select {
		case ep := <-calls:
			return ep, true
		case <-idle:
			return 0, false
		case <-time.After(30 * time.Second):
			t.Fatal("timed out waiting for the ring check loop")
		}
		return 0, false
	}
	// step wakes the loop (unless first), expects a check at epoch want
	// answered with a, and waits for the loop to be idle again.
	step := func(first bool, want uint64, a answer) {
		t.Helper()
		if !first {
			wake <- struct{}{}
		}
		if ep, ok := next(); !ok || ep != want {
			t.Fatalf("check at epoch %d (%v), want one at %d", ep, ok, want)
		}
		answers <- a
		if ep, ok := next(); ok {
			t.Fatalf("a second check at epoch %d without a wake", ep)
		}
	}
	// quiet wakes the loop and expects no check.
	quiet := func() {
		t.Helper()
		wake <- struct{}{}
		if ep, ok := next(); ok {
			t.Fatalf("a check at epoch %d with nothing to check", ep)
		}
	}
	diff := fmt.Errorf("%w: epoch 6, leader n1: n2 has weight 72.66 here, 32.66 on the leader", errRingDisagrees)

	step(true, 5, answer{true, nil}) // the first check after the start
	if err := n.recovering(); err != nil {
		t.Fatalf("agreeing: recovering() = %v", err)
	}
	quiet() // the same epoch, agreed: no call to the leader

	epoch.Store(6)
	step(false, 6, answer{true, diff}) // a new epoch is checked, and differs
	if err := n.recovering(); !errors.Is(err, ErrRecovering) || !strings.Contains(err.Error(), "72.66 here, 32.66 on the leader") {
		t.Fatalf("after a difference at epoch 6: recovering() = %v, want ErrRecovering with the difference", err)
	}
	if n.rec.ringWhy.Load() == nil {
		t.Fatal("kvmesh_node_ring_disagrees reads no difference")
	}
	// Still differing, it checks again at each wake; a check that cannot
	// compare (the leader unreachable) keeps the node not ready.
	step(false, 6, answer{false, errors.New("leader n1: cluster info: unavailable")})
	if err := n.recovering(); !errors.Is(err, ErrRecovering) || !strings.Contains(err.Error(), "72.66") {
		t.Fatalf("after a check that could not compare: recovering() = %v, want the difference kept", err)
	}
	step(false, 6, answer{true, nil})
	if err := n.recovering(); err != nil {
		t.Fatalf("agreeing again: recovering() = %v", err)
	}
	quiet()

	// A leader at another epoch cannot be compared: it is asked again at
	// the next wake, and the node stays ready meanwhile.
	epoch.Store(7)
	step(false, 7, answer{false, nil})
	if err := n.recovering(); err != nil {
		t.Fatalf("epoch 7 not compared yet: recovering() = %v", err)
	}
	step(false, 7, answer{true, nil})
	quiet()
}
