package engine

import (
	"context"
	"errors"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// errReplan ends a forward pass whose plan the injector's final answer
// contradicts (or that the injector failed under).
var errReplan = errors.New("engine: injection differs from its plan")

// layeredCall is one InjectPlanned call running beside the forward pass.
// Its goroutine owns the call; the engine reads its outcome only after
// done is closed.
type layeredCall struct {
	plan   chan []pagedkv.InjectResult // at most one plan, buffered
	layers chan int                    // layer events, buffered for every layer
	done   chan struct{}               // closed when the call returned
	res    []pagedkv.InjectResult
	err    error
	took   time.Duration
	seen   int // layers announced so far (read by the engine goroutine)
}

// startLayered runs li.InjectPlanned for chunks on its own goroutine.
func startLayered(ctx context.Context, li LayeredInjector, chunks []pagedkv.InjectChunk, layers int) *layeredCall {
	c := &layeredCall{plan: make(chan []pagedkv.InjectResult, 1), layers: make(chan int, layers), done: make(chan struct{})}
	t0 := time.Now()
	go func() {
		defer close(c.done)
		planned, next := false, 0
		onPlan := func(res []pagedkv.InjectResult) {
			if !planned {
				planned = true
				c.plan <- append([]pagedkv.InjectResult(nil), res...)
			}
		}
		// Events out of order, beyond the model or before the plan are
		// dropped: the engine then waits for the call to return.
		onLayer := func(l int) {
			if planned && l == next && l < layers {
				next++
				c.layers <- l
			}
		}
		c.res, c.err = li.InjectPlanned(ctx, chunks, onPlan, onLayer)
		c.took = time.Since(t0)
	}()
	return c
}

// waitPlan returns the plan, or false once the call returned without one.
func (c *layeredCall) waitPlan() ([]pagedkv.InjectResult, bool) {
	select {
	case p := <-c.plan:
		return p, true
	case <-c.done:
		select {
		case p := <-c.plan:
			return p, true
		default:
			return nil, false
		}
	}
}

// waiter is fwdPlan.wait for a pass that assumed planned: layer l may be
// read once the injector announced it, or once the call returned with
// exactly the plan (it writes nothing after returning).
func (c *layeredCall) waiter(ctx context.Context, planned []pagedkv.InjectResult) func(int) error {
	return func(l int) error {
		for c.seen <= l {
			select {
			case <-c.layers:
				c.seen++
			case <-c.done:
				if c.err != nil || !samePlan(planned, c.res) {
					return errReplan
				}
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
}

func samePlan(a, b []pagedkv.InjectResult) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// onlyLost reports whether final differs from planned only by planned hits
// answered MISS (their entries failed at a later layer).
func onlyLost(planned, final []pagedkv.InjectResult) bool {
	if len(planned) != len(final) {
		return false
	}
	for i := range planned {
		if final[i] != planned[i] && final[i].Match != chunk.MatchMiss {
			return false
		}
	}
	return true
}

// runLayered is RunInjected with an injector that plans: the forward pass
// starts as soon as the plan comes, and layer l reads the cache once the
// injector announced layer l. The result is bit-identical to waiting for
// the whole injection: the pass computes the same tokens from the same
// cache contents, only earlier. When the final answer contradicts the
// plan, the pass is redone from the final answer (only planned hits lost
// and no approximate recomputation: the engine never wrote an injected
// slot, so the cache holds what the sequential path would read) or, when
// it cannot tell, as a full prefill (which overwrites every slot). Called
// with e.mu held and the sequence grown.
func (e *Engine) runLayered(ctx context.Context, li LayeredInjector, req Request, starts []int, s *Sequence, state []chunk.Match, resp *Response, t1 time.Time) error {
	chunks, segOf := e.injectChunks(req, starts, s)
	if len(chunks) == 0 {
		return e.compute(ctx, s, req, state, resp, nil)
	}
	c := startLayered(ctx, li, chunks, e.cfg.NumLayers)
	// The injector writes the cache until its call returns: never leave
	// before it has.
	defer func() { <-c.done }()
	planned, ok := c.waitPlan()
	if !ok {
		<-c.done
		e.place(req, starts, segOf, state, resp, c.res, c.err)
		resp.Inject = c.took
		return e.compute(ctx, s, req, state, resp, nil)
	}
	var wait func(int) error
	approx := false
	for _, r := range planned {
		if r.Match == chunk.MatchExact || r.Match == chunk.MatchApproximate {
			wait = c.waiter(ctx, planned)
		}
		approx = approx || r.Match == chunk.MatchApproximate
	}
	e.place(req, starts, segOf, state, resp, planned, nil)
	err := e.compute(ctx, s, req, state, resp, wait)
	<-c.done
	resp.Inject = c.took
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil && !errors.Is(err, errReplan) {
		return err
	}
	if err == nil && c.err == nil && samePlan(planned, c.res) {
		return nil
	}
	// Redo the pass from what the injector finally answered.
	res, ierr := c.res, c.err
	if ierr == nil && !(onlyLost(planned, res) && (!req.repairs() || !approx)) {
		ierr = errReplan
	}
	if ierr == nil {
		e.log.Warn("engine: planned chunks came back MISS; computing again with them")
	}
	clear(state)
	resp.Chunks, resp.Injected = resp.Chunks[:0], 0
	e.place(req, starts, segOf, state, resp, res, ierr)
	return e.compute(ctx, s, req, state, resp, nil)
}
