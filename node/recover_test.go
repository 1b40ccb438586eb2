package node_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// headerOnlyStream is a ServerStream on which only SetHeader works.
type headerOnlyStream struct{ grpc.ServerStream }

func (headerOnlyStream) SetHeader(metadata.MD) error { return nil }

func TestInterceptorRecoversPanics(t *testing.T) {
	n := startCluster(t, 1)[0]
	unary, stream := n.Interceptors()
	before := n.Panics()
	_, err := unary(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: "/test/Unary"},
		func(ctx context.Context, req any) (any, error) { panic("boom") })
	if status.Code(err) != codes.Internal {
		t.Fatalf("unary panic: %v, want Internal", err)
	}
	err = stream(nil, headerOnlyStream{}, &grpc.StreamServerInfo{FullMethod: "/test/Stream"},
		func(srv any, ss grpc.ServerStream) error { panic("boom") })
	if status.Code(err) != codes.Internal {
		t.Fatalf("stream panic: %v, want Internal", err)
	}
	if got := n.Panics() - before; got != 2 {
		t.Fatalf("panics counted %v, want 2", got)
	}
}
