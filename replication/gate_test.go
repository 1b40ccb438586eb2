package replication

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// oneLocalChunk starts a one-node cluster (R=W=1) holding one chunk and
// returns its replicator and the chunk's key.
func oneLocalChunk(b *testing.B) (*Replicator, chunk.Key) {
	c := newCluster(b, []string{"a"}, nil)
	c.r, c.w = 1, 1
	blob, key := makeBlob(b, 1, 0)
	if _, err := c.reps["a"].Write(b.Context(), blob); err != nil {
		b.Fatal(err)
	}
	return c.reps["a"], key
}

// BenchmarkReadLocal: a Read served from this node's store and released
// (the serving gate's begin and end included): the hot path of a node
// that holds what it is asked for. -benchmem shows what a read allocates.
func BenchmarkReadLocal(b *testing.B) {
	r, key := oneLocalChunk(b)
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		rr, err := r.Read(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		rr.Blob.Release()
	}
}

// BenchmarkServeFetch: a peer's fetch of a local chunk, released.
func BenchmarkServeFetch(b *testing.B) {
	r, key := oneLocalChunk(b)
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		got, err := r.ServeFetch(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		got.Release()
	}
}

// The serving gate: a wait returns at once when nothing is in flight, and
// is woken by the end of the last call in flight (the long d and ctx only
// bound a broken gate); under begins and ends from many goroutines every
// wait still returns, and the count ends at zero.
func TestServingGateWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	g := newServingGate()
	if g.wait(ctx, time.Hour) {
		t.Fatal("waited with no call in flight")
	}

	g.begin()
	g.begin()
	woke := make(chan bool, 1)
	go func() { woke <- g.wait(ctx, time.Hour) }()
	// Parked: the waiter has read n under mu and made idle (waiters alone
	// counts it before that read, and both ends could land in between).
	testutil.WaitFor(t, "the waiter to park", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.idle != nil
	})
	g.end()
	select {
	case <-woke:
		t.Fatal("woken with a call still in flight")
	default:
	}
	g.end()
	if !<-woke || ctx.Err() != nil {
		t.Fatalf("wait not woken by the last end (ctx %v)", ctx.Err())
	}

	var wg sync.WaitGroup
	var stop atomic.Bool
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				g.begin()
				g.end()
			}
		}()
	}
	waits := make(chan int, 1)
	go func() {
		n := 0
		for {
			g.wait(ctx, time.Hour)
			n++
			if stop.Load() {
				break
			}
		}
		waits <- n
	}()
	wg.Wait()
	stop.Store(true)
	if n := <-waits; ctx.Err() != nil {
		t.Fatalf("%d waits, ctx %v: a wait was not woken", n, ctx.Err())
	}
	if g.inFlight() != 0 {
		t.Fatalf("%d calls in flight after all ended", g.inFlight())
	}
}

// begin and end are on every read's path: they allocate nothing.
func TestServingGateAllocFree(t *testing.T) {
	g := newServingGate()
	if n := testing.AllocsPerRun(100, func() { g.begin(); g.end() }); n != 0 {
		t.Fatalf("begin+end allocates %.1f times", n)
	}
}

// A ReadResult released twice ends its serving call once: the second
// Release finds nothing to free.
func TestReadReleaseTwice(t *testing.T) {
	c := newCluster(t, []string{"a"}, nil)
	c.r, c.w = 1, 1
	blob, key := makeBlob(t, 1, 0)
	r := c.reps["a"]
	if _, err := r.Write(t.Context(), blob); err != nil {
		t.Fatal(err)
	}
	rr, err := r.Read(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if n := r.serving.inFlight(); n != 1 {
		t.Fatalf("%d serving calls in flight during the read, want 1", n)
	}
	rr.Blob.Release()
	rr.Blob.Release()
	if n := r.serving.inFlight(); n != 0 || rr.Blob.Bytes() != nil {
		t.Fatalf("%d serving calls in flight after two releases (blob kept: %v), want 0", n, rr.Blob.Bytes() != nil)
	}
}
