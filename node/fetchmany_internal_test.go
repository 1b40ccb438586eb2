package node

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// openCall is one stream a fakeReplica was asked to open; it waits for
// the test's word on release (nil: send everything; an error: fail before
// any head) or for its context to end.
type openCall struct {
	ctx     context.Context
	keys    []chunk.Key
	release chan error
}

// fakeReplica stands for the replicas behind entryReads: open announces
// each stream on calls, get serves one key alone.
type fakeReplica struct {
	blobs  map[chunk.Key][]byte
	calls  chan openCall
	gets   atomic.Int64
	getErr error
}

func (r *fakeReplica) open(ctx context.Context, _ string, keys []chunk.Key, sink api.FetchManySink) error {
	c := openCall{ctx: ctx, keys: keys, release: make(chan error, 1)}
	r.calls <- c
	select {
	case err := <-c.release:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	var heads []*chunk.Header
	for i, k := range keys {
		b, ok := r.blobs[k]
		if !ok {
			sink.Missing(i, codes.NotFound)
			heads = append(heads, nil)
			continue
		}
		hd, err := chunk.ParseHeader(b, chunk.Limits{})
		if err != nil {
			return err
		}
		sink.Found(i, bytes.Clone(b), &hd)
		heads = append(heads, &hd)
	}
	for l := range testutil.Spec().Layers {
		for i, hd := range heads {
			if hd != nil {
				sink.Layer(i, l)
			}
		}
	}
	return nil
}

func (r *fakeReplica) get(_ context.Context, key chunk.Key) ([]byte, error) {
	r.gets.Add(1)
	if r.getErr != nil {
		return nil, r.getErr
	}
	if b, ok := r.blobs[key]; ok {
		return bytes.Clone(b), nil
	}
	return nil, errors.New("not here")
}

func newFakeReads(t *testing.T, n int) (*entryReads, *fakeReplica, []chunk.Key) {
	rng := rand.New(rand.NewPCG(5, 6))
	r := &fakeReplica{blobs: map[chunk.Key][]byte{}, calls: make(chan openCall, 4)}
	var keys []chunk.Key
	for range n {
		k, b := testutil.StandaloneBlob(t, rng, testutil.Spec(), 4)
		r.blobs[k] = b
		keys = append(keys, k)
	}
	e := newEntryReads(readsConfig{open: r.open, get: r.get, timeout: 30e9})
	t.Cleanup(e.close)
	return e, r, keys
}

// answer is what GetMany gave for one key.
type answer struct {
	f   inject.Fetched
	err error
}

// getMany runs GetMany on its own goroutine; the answers come on the
// channel once it returned.
func getMany(ctx context.Context, e *entryReads, keys []chunk.Key) chan []answer {
	out := make(chan []answer, 1)
	go func() {
		res := make([]answer, len(keys))
		var mu sync.Mutex
		e.GetMany(ctx, keys, make([]string, len(keys)), func(i int, f inject.Fetched, err error) {
			mu.Lock()
			res[i] = answer{f, err}
			mu.Unlock()
		})
		out <- res
	}()
	return out
}

// checkAnswers waits for every layer of each answer and compares its bytes
// with the replica's, then releases it.
func checkAnswers(t *testing.T, r *fakeReplica, keys []chunk.Key, res []answer) {
	t.Helper()
	for i, a := range res {
		if a.err != nil {
			t.Fatalf("key %d: %v", i, a.err)
		}
		if a.f.Arriving != nil {
			if err := a.f.Arriving.Ready(t.Context(), testutil.Spec().Layers-1); err != nil {
				t.Fatalf("key %d: %v", i, err)
			}
		}
		if !bytes.Equal(a.f.Blob.Bytes(), r.blobs[keys[i]]) {
			t.Fatalf("key %d: bytes differ", i)
		}
		a.f.Blob.Release()
	}
}

func (e *entryReads) refsOf(k chunk.Key) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f := e.flights[k]; f != nil {
		return f.refs
	}
	return 0
}

// TestEntryReadsShare: a key already being read for one injection is not
// read again for another: the second opens a stream only for its other
// key, and both get every byte.
func TestEntryReadsShare(t *testing.T) {
	e, r, keys := newFakeReads(t, 3)
	a := getMany(t.Context(), e, keys[:2])
	first := <-r.calls
	b := getMany(t.Context(), e, keys[1:])
	second := <-r.calls
	if !slices.Equal(first.keys, keys[:2]) || !slices.Equal(second.keys, keys[2:]) {
		t.Fatalf("streams for %v and %v", first.keys, second.keys)
	}
	first.release <- nil
	second.release <- nil
	checkAnswers(t, r, keys[:2], <-a)
	checkAnswers(t, r, keys[1:], <-b)
	if got := readCounter(e.streams); got != 2 {
		t.Errorf("%v streams, want 2", got)
	}
	if f, s := readCounter(e.entries.WithLabelValues("fetched")), readCounter(e.entries.WithLabelValues("shared")); f != 3 || s != 1 {
		t.Errorf("fetched %v, shared %v; want 3, 1", f, s)
	}
	testutil.WaitFor(t, "the table empty", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.flights) == 0
	})
}

// TestEntryReadsLeaderCancelled: the injection that opened a stream ending
// does not end it while another holds one of its keys; once nobody holds
// it, it is cancelled.
func TestEntryReadsLeaderCancelled(t *testing.T) {
	e, r, keys := newFakeReads(t, 2)
	ctx, cancel := context.WithCancel(t.Context())
	a := getMany(ctx, e, keys[:1])
	call := <-r.calls
	b := getMany(t.Context(), e, keys[:1])
	testutil.WaitFor(t, "the second injection sharing the read", func() bool { return e.refsOf(keys[0]) == 2 })
	cancel()
	if res := <-a; !errors.Is(res[0].err, context.Canceled) {
		t.Fatalf("cancelled leader: %v", res[0].err)
	}
	if call.ctx.Err() != nil {
		t.Fatal("the stream ended with its leader though another injection holds it")
	}
	call.release <- nil
	checkAnswers(t, r, keys[:1], <-b)

	// Nobody left: the stream is cancelled and its key leaves the table.
	ctx, cancel = context.WithCancel(t.Context())
	c := getMany(ctx, e, keys[1:])
	call = <-r.calls
	cancel()
	<-c
	<-call.ctx.Done()
	if e.refsOf(keys[1]) != 0 {
		t.Fatal("an abandoned read is still in the table")
	}
}

// TestEntryReadsLeaderFails: when the stream fails before the heads came,
// every injection that wanted its keys reads them again alone; when that
// fails too, the error names both failures. A key the replica lacks is
// read alone as well.
func TestEntryReadsLeaderFails(t *testing.T) {
	e, r, keys := newFakeReads(t, 2)
	broken := errors.New("stream broke")
	a := getMany(t.Context(), e, keys[:1])
	call := <-r.calls
	b := getMany(t.Context(), e, keys[:1])
	testutil.WaitFor(t, "the second injection sharing the read", func() bool { return e.refsOf(keys[0]) == 2 })
	call.release <- broken
	checkAnswers(t, r, keys[:1], <-a)
	checkAnswers(t, r, keys[:1], <-b)
	if got := r.gets.Load(); got != 2 {
		t.Fatalf("%d reads alone, want 2 (each injection retries)", got)
	}

	missing := chunk.Key{Fingerprint: keys[1].Fingerprint, Content: chunk.ID{Hi: 1}, Context: chunk.StandaloneContext()}
	r.getErr = errors.New("no replica")
	m := getMany(t.Context(), e, []chunk.Key{keys[1], missing})
	call = <-r.calls
	call.release <- nil
	res := <-m
	checkAnswers(t, r, keys[1:2], res[:1])
	if err := res[1].err; !errors.Is(err, r.getErr) || status.Code(err) != codes.NotFound {
		t.Fatalf("missing key: %v", err)
	}
}
