package engine

import (
	"sync"
	"sync/atomic"
)

// task is a unit of parallel work split into index ranges. Implementations
// are long-lived structs whose fields are set before each run, so a run
// allocates nothing.
type task interface {
	// do processes items [lo, hi) on worker w (0 <= w < pool size).
	do(w, lo, hi int)
}

// pool runs tasks on a fixed set of goroutines plus the caller. One run at a
// time: the engine serialises forward passes, and run is not reentrant.
type pool struct {
	workers int  // including the caller
	avx     bool // matmul may use the assembly kernels
	start   []chan struct{}
	wg      sync.WaitGroup
	stop    chan struct{}
	done    sync.WaitGroup

	// The current run; written by run before it signals the workers.
	t     task
	total int
	grain int
	next  atomic.Int64
}

// newPool starts workers-1 goroutines; workers < 1 means 1. avx enables the
// assembly matmul kernels where the CPU has them.
func newPool(workers int, avx bool) *pool {
	if workers < 1 {
		workers = 1
	}
	p := &pool{workers: workers, avx: avx && hasAVXKernels(), stop: make(chan struct{})}
	p.start = make([]chan struct{}, workers-1)
	for i := range p.start {
		p.start[i] = make(chan struct{}, 1)
		p.done.Add(1)
		go p.loop(i+1, p.start[i])
	}
	return p
}

func (p *pool) loop(w int, start chan struct{}) {
	defer p.done.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-start:
			p.work(w)
			p.wg.Done()
		}
	}
}

// work takes grains from the shared counter until none are left.
func (p *pool) work(w int) {
	for {
		lo := int(p.next.Add(int64(p.grain))) - p.grain
		if lo >= p.total {
			return
		}
		p.t.do(w, lo, min(lo+p.grain, p.total))
	}
}

// run splits [0, total) into grains of at least grain items and waits for
// all of them. Small runs stay on the caller.
func (p *pool) run(t task, total, grain int) {
	if total <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	if p.workers == 1 || total <= grain {
		t.do(0, 0, total)
		return
	}
	// Smaller grains balance better; keep at least a few per worker.
	if g := total / (4 * p.workers); g > grain {
		grain = g
	}
	p.t, p.total, p.grain = t, total, grain
	p.next.Store(0)
	helpers := min(len(p.start), (total+grain-1)/grain-1)
	p.wg.Add(helpers)
	for i := 0; i < helpers; i++ {
		p.start[i] <- struct{}{}
	}
	p.work(0)
	p.wg.Wait()
	p.t = nil
}

// close stops the workers and waits for them.
func (p *pool) close() {
	close(p.stop)
	p.done.Wait()
}
