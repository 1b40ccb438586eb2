//go:build cuda

package cudathread

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"gorgonia.org/cu"
)

// ErrClosed is what Do returns after Close.
var ErrClosed = errors.New("cudathread: closed")

// Thread is a goroutine locked to its OS thread with a device's primary
// context current. It runs the closures handed to Do one at a time, and
// at Close releases, newest first, what its setup and closures deferred.
// It is safe for concurrent use.
type Thread struct {
	// mu orders Close against calls in flight: they hold it shared while
	// they use reqs, Close exclusively to close it.
	mu     sync.RWMutex
	closed bool
	reqs   chan req
	done   chan struct{} // closed when run returns

	undo []func() error // owned by run's goroutine
}

type req struct {
	fn  func() error
	res chan error
}

// Start starts a thread on device ordinal: it retains the device's
// primary context, makes it current, then runs setup there (which may
// call Defer). When any of it fails, what was deferred is released and
// Start returns the error.
func Start(ordinal int, setup func(t *Thread, dev cu.Device) error) (*Thread, error) {
	t := &Thread{reqs: make(chan req), done: make(chan struct{})}
	ready := make(chan error, 1)
	go t.run(ordinal, setup, ready)
	if err := <-ready; err != nil {
		<-t.done
		return nil, err
	}
	return t, nil
}

func (t *Thread) run(ordinal int, setup func(*Thread, cu.Device) error, ready chan<- error) {
	defer close(t.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer func() {
		for i := len(t.undo) - 1; i >= 0; i-- {
			_ = t.undo[i]()
		}
	}()
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		ready <- fmt.Errorf("cudathread: cuda device %d: %w", ordinal, err)
		return
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		ready <- fmt.Errorf("cudathread: cuda device %d: retaining the primary context: %w", ordinal, err)
		return
	}
	t.Defer(dev.ReleasePrimaryCtx)
	if err := cu.SetCurrentContext(ctx); err != nil {
		ready <- fmt.Errorf("cudathread: cuda device %d: making the context current: %w", ordinal, err)
		return
	}
	t.Defer(func() error { return cu.SetCurrentContext(cu.CUContext{}) })
	if err := setup(t, dev); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for r := range t.reqs {
		r.res <- r.fn()
	}
}

// Defer registers fn to run at Close (or when setup fails), after
// everything registered later. Only the thread's own code (setup, a
// closure passed to Do) may call it.
func (t *Thread) Defer(fn func() error) { t.undo = append(t.undo, fn) }

// Do runs fn on the thread and returns its error, or ErrClosed after
// Close.
func (t *Thread) Do(fn func() error) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return ErrClosed
	}
	res := make(chan error, 1)
	t.reqs <- req{fn: fn, res: res}
	return <-res
}

// Close waits for the call in flight, stops the thread and releases what
// was deferred. Calling it again does nothing.
func (t *Thread) Close() {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.reqs)
	}
	t.mu.Unlock()
	<-t.done
}
