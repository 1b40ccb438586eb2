package node

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/replication"
)

// headerOnlyStream is a ServerStream on which only SetHeader works.
type headerOnlyStream struct{ grpc.ServerStream }

func (headerOnlyStream) SetHeader(metadata.MD) error { return nil }

func TestInterceptorRecoversPanics(t *testing.T) {
	n := startCluster(t, 1)[0]
	before := readCounter(n.metrics.panics)
	_, err := n.unaryInterceptor(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/test/Unary"},
		func(ctx context.Context, req any) (any, error) { panic("boom") })
	if status.Code(err) != codes.Internal {
		t.Fatalf("unary panic: %v, want Internal", err)
	}
	err = n.streamInterceptor(nil, headerOnlyStream{}, &grpc.StreamServerInfo{FullMethod: "/test/Stream"},
		func(srv any, ss grpc.ServerStream) error { panic("boom") })
	if status.Code(err) != codes.Internal {
		t.Fatalf("stream panic: %v, want Internal", err)
	}
	if got := readCounter(n.metrics.panics) - before; got != 2 {
		t.Fatalf("panics counted %v, want 2", got)
	}
}

func TestToStatus(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{chunk.ErrCorrupt, codes.InvalidArgument},
		{chunk.ErrTooLarge, codes.ResourceExhausted},
		{kvtier.ErrNoSpace, codes.ResourceExhausted},
		{kvtier.ErrNotFound, codes.NotFound},
		{replication.ErrNotFound, codes.NotFound},
		{replication.ErrQuorum, codes.Unavailable},
		{replication.ErrRejected, codes.FailedPrecondition},
		{meta.ErrInvalidCommand, codes.InvalidArgument},
		{meta.ErrNotLeader, codes.FailedPrecondition},
		{meta.ErrStaleEpoch, codes.Aborted},
		{meta.ErrNoLeader, codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("other"), codes.Internal},
		{status.Error(codes.PermissionDenied, "kept"), codes.PermissionDenied},
	}
	for _, tt := range tests {
		if got := status.Code(toStatus(tt.err)); got != tt.want {
			t.Errorf("toStatus(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	// The forwarder turns statuses back into meta's sentinels, and the
	// replication transport into replication's.
	for _, tt := range []struct {
		err  error
		want error
	}{
		{status.Error(codes.NotFound, ""), replication.ErrNotFound},
		{status.Error(codes.InvalidArgument, ""), replication.ErrRejected},
		{status.Error(codes.Aborted, ""), replication.ErrEpochMismatch},
	} {
		if got := replErr(tt.err); !errors.Is(got, tt.want) {
			t.Errorf("replErr(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	if err := replErr(status.Error(codes.Unavailable, "")); errors.Is(err, replication.ErrRejected) {
		t.Errorf("Unavailable must stay retryable, got %v", err)
	}
}
