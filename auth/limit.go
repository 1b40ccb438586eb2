package auth

import (
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
)

// Default per-caller limits.
const (
	// DefaultMaxStreams is the default per-caller stream limit.
	DefaultMaxStreams = 64
	// DefaultMaxUnary is the default per-caller limit of concurrent unary
	// calls. It is lower than the stream limit because a unary request
	// arrives whole: each call in flight holds its decoded request (a
	// Lookup of MaxLookupBatch items, its fan-out and its answer, about
	// 10 MB) however slowly the caller reads.
	DefaultMaxUnary = 16
)

// LimiterConfig configures a StreamLimiter.
type LimiterConfig struct {
	// MaxStreams bounds the calls one caller (Principal.Key) has in flight
	// at once. Default DefaultMaxStreams (DefaultMaxUnary with Unary);
	// negative means no limit.
	MaxStreams int
	// Unary makes the limiter count unary calls: its refusals wrap
	// ErrTooManyCalls instead of ErrTooManyStreams.
	Unary bool
}

// StreamLimiter bounds concurrent streams (or unary calls) per caller, so
// one client cannot hold all of a node's slots, nor its memory.
type StreamLimiter struct {
	max    int
	unary  bool
	mu     sync.Mutex
	active map[string]int
}

// NewStreamLimiter returns a StreamLimiter for cfg.
func NewStreamLimiter(cfg LimiterConfig) *StreamLimiter {
	l := &StreamLimiter{max: cfg.MaxStreams, unary: cfg.Unary, active: make(map[string]int)}
	if l.max == 0 {
		l.max = DefaultMaxStreams
		if l.unary {
			l.max = DefaultMaxUnary
		}
	}
	return l
}

// Acquire takes a slot for key. It returns the function that gives it
// back (call it at least once; calls after the first do nothing), or an
// error wrapping ErrTooManyStreams (ErrTooManyCalls) that is a
// ResourceExhausted status.
func (l *StreamLimiter) Acquire(key string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.active[key] >= l.max {
		if l.unary {
			return nil, &authError{code: codes.ResourceExhausted, err: ErrTooManyCalls,
				msg: fmt.Sprintf("%s has %d unary calls in flight, the limit", key, l.max)}
		}
		return nil, &authError{code: codes.ResourceExhausted, err: ErrTooManyStreams,
			msg: fmt.Sprintf("%s has %d streams open, the limit", key, l.max)}
	}
	l.active[key]++
	var once sync.Once
	return func() { once.Do(func() { l.release(key) }) }, nil
}

func (l *StreamLimiter) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Delete at zero so the map holds only callers with open streams.
	if l.active[key]--; l.active[key] <= 0 {
		delete(l.active, key)
	}
}

// Active returns the streams key has open.
func (l *StreamLimiter) Active(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active[key]
}

// StreamInterceptor limits streaming calls. Chain it after the Guard's
// interceptor so it keys by Principal; without one it keys by remote
// address.
func (l *StreamLimiter) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		release, err := l.Acquire(callerKey(ss))
		if err != nil {
			return err
		}
		defer release()
		return handler(srv, ss)
	}
}

func callerKey(ss grpc.ServerStream) string {
	ctx := ss.Context()
	if p, ok := FromContext(ctx); ok {
		return p.Key()
	}
	p := &Principal{Addr: "unknown"}
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		p.Addr = pr.Addr.String()
	}
	return p.Key()
}
