package node

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/replication"
)

// authErr is a malformed token request as auth reports it.
func authErr(t *testing.T) error {
	t.Helper()
	_, err := auth.ParseScopes("read,fly")
	if err == nil {
		t.Fatal("ParseScopes accepted an unknown scope")
	}
	return err
}

// grantErr is auth's refusal (a status error) of a grant beyond the
// caller's own scopes.
func grantErr(t *testing.T) error {
	t.Helper()
	p := &auth.Principal{Scopes: auth.ScopeRead}
	_, err := p.Grant(auth.ScopeAdmin, nil)
	if err == nil {
		t.Fatal("a read-only caller granted admin")
	}
	return err
}

// TestToStatus: every sentinel a handler may return, bare or wrapped,
// gets its one code; an error wrapping two sentinels gets the code of the
// one the node branches on first.
func TestToStatus(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("handler: %w", err) }
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
		{replication.ErrNoReplicas, codes.Unavailable},
		{replication.ErrRejected, codes.FailedPrecondition},
		{meta.ErrInvalidCommand, codes.InvalidArgument},
		{meta.ErrNotLeader, codes.FailedPrecondition},
		{meta.ErrStaleEpoch, codes.Aborted},
		{meta.ErrSettingsVersion, codes.FailedPrecondition},
		{meta.ErrNoLeader, codes.Unavailable},
		// A refused raft command (a forwarded leave of the last voter) is
		// InvalidArgument: the forwarder reads FailedPrecondition as "not
		// the leader" and would retry it.
		{fmt.Errorf("%w: %w: n1", meta.ErrInvalidCommand, meta.ErrLastVoter), codes.InvalidArgument},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{errors.New("other"), codes.Internal},
		{status.Error(codes.PermissionDenied, "kept"), codes.PermissionDenied},

		// Auth (Admin token handlers); auth's own status errors pass.
		{auth.ErrInvalidToken, codes.InvalidArgument},
		{auth.ErrUnauthenticated, codes.Unauthenticated},
		{auth.ErrPermissionDenied, codes.PermissionDenied},
		{auth.ErrUnknownToken, codes.NotFound},
		{auth.ErrTooManyStreams, codes.ResourceExhausted},
		{authErr(t), codes.InvalidArgument},
		{grantErr(t), codes.PermissionDenied},

		// Drain.
		{ErrDraining, codes.FailedPrecondition},
		{fmt.Errorf("%w: %w", ErrNoDrainTarget, replication.ErrNoReplicas), codes.FailedPrecondition},
		{fmt.Errorf("%w: %w", ErrCannotLeave, fmt.Errorf("%w: %w: n1", meta.ErrInvalidCommand, meta.ErrLastVoter)), codes.FailedPrecondition},

		// Gossip key rotation (Admin.GossipKeys, Peer.GossipKey).
		{gossipkey.ErrInvalidKey, codes.InvalidArgument},
		{fmt.Errorf("%w: %w", errKeyRefused, gossipkey.ErrInvalidKey), codes.InvalidArgument},
		{fmt.Errorf("%w: %w", errKeyRefused, errors.New("key is not in the keyring")), codes.FailedPrecondition},
		{fmt.Errorf("%w: %w", errKeyRefused, gossip.ErrNotEncrypted), codes.FailedPrecondition},
		{fmt.Errorf("%w: %w", errKeyRefused, gossip.ErrShutdown), codes.Unavailable},

		// Injection.
		{inject.ErrInvalidCache, codes.InvalidArgument},
		{inject.ErrInvalidRequest, codes.InvalidArgument},
		{inject.ErrUnsupported, codes.Unimplemented},
		{inject.ErrTooManyCaches, codes.ResourceExhausted},
		{inject.ErrUnknownCache, codes.NotFound},
		{inject.ErrFault, codes.DataLoss},
		{inject.ErrClosed, codes.Unavailable},

		// A stored copy found bad is the store's damage, not the caller's.
		{fmt.Errorf("get: %w: %w", kvtier.ErrDamaged, chunk.ErrCorrupt), codes.DataLoss},
		{fmt.Errorf("put: %w", chunk.ErrCorrupt), codes.InvalidArgument},
	}
	for _, tt := range tests {
		if got := status.Code(toStatus(tt.err)); got != tt.want {
			t.Errorf("toStatus(%v) = %v, want %v", tt.err, got, tt.want)
		}
		if tt.err == nil {
			continue
		}
		if got := status.Code(toStatus(wrap(tt.err))); got != tt.want {
			t.Errorf("toStatus(%v) = %v, want %v", wrap(tt.err), got, tt.want)
		}
		// A status passes through unchanged: handlers that call
		// toStatus themselves and the interceptor that calls it again
		// agree.
		once := toStatus(tt.err)
		if twice := toStatus(once); twice != once {
			t.Errorf("toStatus(toStatus(%v)) = %v, want %v", tt.err, twice, once)
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
		{status.Error(codes.PermissionDenied, ""), replication.ErrRejected},
	} {
		if got := replFromStatus(tt.err); !errors.Is(got, tt.want) {
			t.Errorf("replFromStatus(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	if err := replFromStatus(status.Error(codes.Unavailable, "")); errors.Is(err, replication.ErrRejected) {
		t.Errorf("Unavailable must stay retryable, got %v", err)
	}
}
