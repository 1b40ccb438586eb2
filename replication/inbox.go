package replication

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// The receiver's side of a rebalance. A node that joins takes a share of
// the whole cluster's data while it serves reads; what it costs is storing
// the blobs (the first touch of fresh DRAM-arena pages), not receiving
// them, so the per-sender rate limit cannot protect it when several
// senders push at once. The receiver therefore keeps its own budget:
//
//   - at most IncomingRebalanceStreams rebalance blobs are stored at once;
//     others wait for a slot, holding their sender's stream open (the
//     sender's concurrency then bounds what it sends: back-pressure);
//   - a blob that cannot get a slot within IncomingRebalanceWait (or
//     before its call's deadline), or that would raise the bytes waiting
//     past IncomingRebalanceQueueBytes, is refused with ErrBusy: the sender
//     backs off and sends it again, it is not a failure;
//   - a blob that got its slot waits up to ServingYield for the serving
//     work in flight here (reads, writes, fetches by peers) to finish
//     before it is stored: incoming rebalance work yields to serving, and
//     still progresses under constant load;
//   - IncomingRebalanceBytesPerSec, when set, caps the stored rebalance
//     bytes per second over all senders.
//
// Read repairs that store on this node take the same slots and yield too.

// ErrBusy: the receiver's rebalance budget is spent; send again later.
// It is not a refusal (it does not wrap ErrRejected).
var ErrBusy = errors.New("replication: receiver busy, retry later")

// inbox is the receiver's budget for incoming rebalance blobs.
type inbox struct {
	slots     chan struct{}
	limiter   *rate.Limiter // nil: no byte rate
	maxQueued int64
	maxWait   time.Duration
	yield     time.Duration
	waiting   atomic.Int64 // bytes of blobs waiting for a slot
}

func newInbox(c *Config) *inbox {
	in := &inbox{
		slots:     make(chan struct{}, c.IncomingRebalanceStreams),
		maxQueued: c.IncomingRebalanceQueueBytes,
		maxWait:   c.IncomingRebalanceWait,
		yield:     c.ServingYield,
	}
	if c.IncomingRebalanceBytesPerSec > 0 {
		in.limiter = rate.NewLimiter(rate.Limit(c.IncomingRebalanceBytesPerSec), int(min(c.IncomingRebalanceBytesPerSec, 1<<30)))
	}
	return in
}

// callMargin is left of a call's deadline for the answer to get back.
const callMargin = 500 * time.Millisecond

// inboxSlot takes a slot for storing size bytes of incoming rebalance work,
// yields to serving, takes size bytes of the byte rate, and returns the
// func that frees the slot. Work of other nodes is refusable (ErrBusy);
// this node's own (a read repair) waits as long as ctx allows.
func (r *Replicator) inboxSlot(ctx context.Context, size int, refusable bool) (func(), error) {
	in := r.inbox
	m := &r.metrics
	if refusable && in.waiting.Load() > 0 && in.waiting.Load()+int64(size) > in.maxQueued {
		m.incomingBusy.Add(1)
		return nil, fmt.Errorf("%w: %d bytes already wait", ErrBusy, in.waiting.Load())
	}
	in.waiting.Add(int64(size))
	m.incomingWaiting.Add(1)
	select {
	case in.slots <- struct{}{}:
	default:
		var timeout <-chan time.Time
		if refusable {
			wait := in.maxWait
			if dl, ok := ctx.Deadline(); ok {
				wait = min(wait, time.Until(dl)-callMargin)
			}
			t := time.NewTimer(max(wait, 0))
			defer t.Stop()
			timeout = t.C
		}
		select {
		case in.slots <- struct{}{}:
		case <-timeout:
			in.waiting.Add(-int64(size))
			m.incomingWaiting.Add(-1)
			m.incomingBusy.Add(1)
			return nil, fmt.Errorf("%w: no slot free", ErrBusy)
		case <-ctx.Done():
			in.waiting.Add(-int64(size))
			m.incomingWaiting.Add(-1)
			return nil, ctx.Err()
		}
	}
	in.waiting.Add(-int64(size))
	m.incomingWaiting.Add(-1)
	release := func() { <-in.slots }
	if r.serving.wait(ctx, in.yield) {
		m.incomingYields.Add(1)
	}
	if in.limiter != nil {
		if err := waitLimiter(ctx, in.limiter, size); err != nil {
			release()
			return nil, err
		}
	}
	return release, nil
}

// waitLimiter takes n bytes from l, in bursts.
func waitLimiter(ctx context.Context, l *rate.Limiter, n int) error {
	for n > 0 {
		take := min(n, l.Burst())
		if err := l.WaitN(ctx, take); err != nil {
			return err
		}
		n -= take
	}
	return nil
}

// servingGate counts the serving calls in flight on this node (reads,
// writes, fetches by peers), so that background work can wait for a gap.
// begin and end are on every read's path: two atomic adds, no allocation;
// only a waiter (background work, rare) takes the mutex and makes the
// channel it waits on.
type servingGate struct {
	n       atomic.Int64
	waiters atomic.Int32 // goroutines in wait; end looks for them only when non-zero
	mu      sync.Mutex
	idle    chan struct{} // made by the first waiter, closed (and cleared) when n reaches 0
}

func newServingGate() *servingGate { return &servingGate{} }

// begin counts a serving call; end must be called once for it.
func (g *servingGate) begin() { g.n.Add(1) }

// endServing is a servingGate as the pinned.Releaser that ends one
// serving call: a lent blob ends its read's call when released (a
// conversion, not a closure: it allocates nothing).
type endServing servingGate

// Release ends the serving call.
func (e *endServing) Release() { (*servingGate)(e).end() }

// end ends a serving call counted by begin.
func (g *servingGate) end() {
	if g.n.Add(-1) == 0 && g.waiters.Load() > 0 {
		g.mu.Lock()
		// A call that began since finds n > 0 here: its own end wakes
		// the waiters.
		if g.idle != nil && g.n.Load() == 0 {
			close(g.idle)
			g.idle = nil
		}
		g.mu.Unlock()
	}
}

// inFlight is the number of serving calls in flight.
func (g *servingGate) inFlight() int { return int(g.n.Load()) }

// wait returns once no serving call is in flight, at most after d (or
// when ctx ends); it reports whether it had to wait.
func (g *servingGate) wait(ctx context.Context, d time.Duration) bool {
	if g.n.Load() == 0 || d <= 0 {
		return false
	}
	// Counted before n is read again: an end that brings n to 0 after
	// that read sees the waiter and closes idle (both atomics are
	// sequentially consistent).
	g.waiters.Add(1)
	defer g.waiters.Add(-1)
	g.mu.Lock()
	if g.n.Load() == 0 {
		g.mu.Unlock()
		return false
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	case <-ctx.Done():
	}
	return true
}

// Busy back-off of a rebalance sender: a refused blob is sent again after
// a jittered wait that doubles from busyBackoffMin to busyBackoffMax; after
// busyGiveUp of refusals the key stays pending for the next pass.
const (
	busyBackoffMin = 50 * time.Millisecond
	busyBackoffMax = 2 * time.Second
	busyGiveUp     = time.Minute
)

// sendBusy calls send until it returns something other than ErrBusy,
// backing off between refusals. send is called afresh for each attempt
// and must hold nothing (a store pin) across calls: the back-off may last
// busyGiveUp.
func (r *Replicator) sendBusy(ctx context.Context, send func() error) error {
	backoff := busyBackoffMin
	deadline := time.Now().Add(busyGiveUp)
	for {
		err := send()
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			return err
		}
		r.metrics.rebalanceBusy.Add(1)
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, busyBackoffMax)
	}
}
