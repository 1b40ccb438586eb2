package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/replication"
)

// refusalServer answers every call with what a Peer handler returns for
// the error the call's method names (replToStatus, then the interceptor's
// toStatus), over a real gRPC connection.
func refusalServer(t *testing.T, errs map[string]error) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(st)
		return toStatus(replToStatus(errs[method]))
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		<-done
	})
	return cc
}

// Every refusal a replication handler returns reaches the sending node's
// replication as the same sentinels (by the ErrorInfo reason, not the
// message), through a real gRPC round trip; a plain failure stays
// "unreachable".
func TestReplStatusRoundTrip(t *testing.T) {
	rejected := replication.ErrRejected
	tests := []struct {
		name      string
		err       error
		want, not []error
	}{
		{"tombstoned", fmt.Errorf("%w: %w: k", rejected, replication.ErrTombstoned), []error{rejected, replication.ErrTombstoned}, []error{replication.ErrNoRoom}},
		{"no room", fmt.Errorf("%w: %w: k", rejected, replication.ErrNoRoom), []error{rejected, replication.ErrNoRoom}, []error{replication.ErrTombstoned}},
		{"conflict", fmt.Errorf("%w: %w", rejected, replication.ErrConflict), []error{rejected}, []error{replication.ErrNoRoom, replication.ErrBusy}},
		{"not found", fmt.Errorf("%w: k", replication.ErrNotFound), []error{replication.ErrNotFound}, []error{rejected}},
		{"epoch", fmt.Errorf("%w: 3 vs 4", replication.ErrEpochMismatch), []error{replication.ErrEpochMismatch}, []error{rejected}},
		// Busy is push-back, not a refusal: the sender tries again later.
		{"busy", fmt.Errorf("%w: no slot free", replication.ErrBusy), []error{replication.ErrBusy}, []error{rejected}},
		// A plain failure stays "unreachable".
		{"plain", errors.New("connection refused"), nil, []error{rejected, replication.ErrBusy, replication.ErrNotFound}},
		// The reason decides, not the message: a status that merely reads
		// like push-back is a refusal by its code.
		{"message only", status.Error(codes.ResourceExhausted, "replication: busy: 3 slots"), []error{rejected}, []error{replication.ErrBusy}},
		// A peer whose stored copy was damaged dropped it: it lacks the
		// key, a repair target, not a refusal.
		{"damaged", status.Error(codes.DataLoss, "stored copy damaged"), []error{replication.ErrNotFound}, []error{rejected}},
		{"damaged copy dropped", fmt.Errorf("%w: %w: %w", replication.ErrNotFound, kvtier.ErrDamaged, chunk.ErrCorrupt), []error{replication.ErrNotFound}, []error{rejected}},
	}
	errs := map[string]error{}
	for _, tc := range tests {
		errs["/kvmesh.test.Refuse/"+tc.name] = tc.err
	}
	cc := refusalServer(t, errs)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := cc.Invoke(t.Context(), "/kvmesh.test.Refuse/"+tc.name, &emptypb.Empty{}, &emptypb.Empty{})
			if err == nil {
				t.Fatal("call succeeded")
			}
			got := replFromStatus(err)
			for _, w := range tc.want {
				if !errors.Is(got, w) {
					t.Errorf("%v does not wrap %v", got, w)
				}
			}
			for _, w := range tc.not {
				if errors.Is(got, w) {
					t.Errorf("%v wraps %v", got, w)
				}
			}
		})
	}
}

// TestOneStatusCode: a sentinel has one code, whether a client's call or a
// peer's replication call returns it; only the peer's carries the reason.
func TestOneStatusCode(t *testing.T) {
	for _, r := range statusRows {
		if r.reason == "" {
			continue
		}
		for _, e := range r.errs {
			err := fmt.Errorf("%w: k", e)
			client, peer := status.Code(toStatus(err)), status.Code(replToStatus(err))
			if client != r.code || peer != r.code {
				t.Errorf("%v: client service answers %v, Peer service %v; the table says %v", e, client, peer, r.code)
			}
			if got := replReason(status.Convert(replToStatus(err))); got != r.reason {
				t.Errorf("%v: Peer reason %q, want %q", e, got, r.reason)
			}
		}
	}
	if c := status.Code(toStatus(replication.ErrRejected)); c != codes.FailedPrecondition {
		t.Errorf("ErrRejected is %v, want FailedPrecondition", c)
	}
}
