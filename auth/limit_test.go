package auth

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestStreamLimiterAcquire(t *testing.T) {
	l := NewStreamLimiter(LimiterConfig{MaxStreams: 2})
	r1, err1 := l.Acquire("a")
	r2, err2 := l.Acquire("a")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	_, err := l.Acquire("a")
	if status.Code(err) != codes.ResourceExhausted || !errors.Is(err, ErrTooManyStreams) {
		t.Fatalf("third stream: %v", err)
	}
	rb, err := l.Acquire("b")
	if err != nil {
		t.Fatalf("another caller limited: %v", err)
	}
	r1()
	r1() // a second release is a no-op
	if l.Active("a") != 1 {
		t.Fatalf("active %d after one release, want 1", l.Active("a"))
	}
	r3, err := l.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	r2()
	r3()
	rb()
	if l.Active("a") != 0 || len(l.active) != 0 {
		t.Fatalf("slots left: %v", l.active)
	}
	if NewStreamLimiter(LimiterConfig{}).max != DefaultMaxStreams {
		t.Fatal("default")
	}
	unl := NewStreamLimiter(LimiterConfig{MaxStreams: -1})
	for range 1000 {
		if _, err := unl.Acquire("a"); err != nil {
			t.Fatal("unlimited limiter refused")
		}
	}
}

// TestStreamLimiterConcurrent: under contention no caller ever exceeds its
// limit and every slot comes back.
func TestStreamLimiterConcurrent(t *testing.T) {
	const limit = 3
	l := NewStreamLimiter(LimiterConfig{MaxStreams: limit})
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := map[string]int{}
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []string{"x", "y"}[i%2]
			for range 500 {
				rel, err := l.Acquire(key)
				if err != nil {
					continue
				}
				mu.Lock()
				peak[key] = max(peak[key], l.Active(key))
				mu.Unlock()
				rel()
			}
		}()
	}
	wg.Wait()
	for k, p := range peak {
		if p > limit {
			t.Errorf("%s peaked at %d streams", k, p)
		}
	}
	if len(l.active) != 0 {
		t.Fatalf("slots leaked: %v", l.active)
	}
}

func TestStreamLimiterOverGRPC(t *testing.T) {
	tab := newMemTable()
	w1 := tab.add(t, "w1", ScopeRead|ScopeWrite, nil, time.Time{})
	w2 := tab.add(t, "w2", ScopeRead|ScopeWrite, nil, time.Time{})
	l := NewStreamLimiter(LimiterConfig{MaxStreams: 2})
	cc := serve(t, NewGuard(Config{Verifier: NewVerifier(tab), Methods: testMethods, Logger: discard()}), l)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	var open []grpc.ClientStream
	for range 2 {
		cs, err := openWrite(ctx, cc, w1, fpA)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, cs)
	}
	if _, err := openWrite(ctx, cc, w1, fpA); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream of w1: %v", err)
	}
	cs, err := openWrite(ctx, cc, w2, fpA)
	if err != nil {
		t.Fatalf("w2 limited by w1's streams: %v", err)
	}
	open = append(open, cs)

	// Closing one of w1's streams gives its slot back.
	if err := open[0].CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := open[0].RecvMsg(new(wrapperspb.StringValue)); err == nil {
		t.Fatal("stream still open")
	}
	key := "token:" + w1[:idLen]
	for l.Active(key) != 1 {
		select {
		case <-ctx.Done():
			t.Fatal("slot never released")
		case <-time.After(5 * time.Millisecond):
		}
	}
	cs, err = openWrite(ctx, cc, w1, fpA)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	open = append(open, cs)
	for _, cs := range open[1:] {
		_ = cs.CloseSend()
	}
}

// TestUnaryLimiter: a unary limiter has its own default and sentinel.
func TestUnaryLimiter(t *testing.T) {
	l := NewStreamLimiter(LimiterConfig{Unary: true})
	var rel []func()
	for range DefaultMaxUnary {
		r, err := l.Acquire("token:a")
		if err != nil {
			t.Fatal(err)
		}
		rel = append(rel, r)
	}
	_, err := l.Acquire("token:a")
	if status.Code(err) != codes.ResourceExhausted || !errors.Is(err, ErrTooManyCalls) {
		t.Fatalf("call %d: %v", DefaultMaxUnary+1, err)
	}
	rel[0]()
	rel[0]() // a second release gives nothing back twice
	if _, err := l.Acquire("token:a"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire("token:a"); err == nil {
		t.Fatal("a double release freed two slots")
	}
}
