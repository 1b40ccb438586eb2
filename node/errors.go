package node

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/replication"
)

// toStatus is the node's one mapping from errors to the gRPC statuses
// callers branch on: every handler's error passes through it (the
// interceptors apply it to whatever a handler returns; handlers whose
// answers tests read without the interceptors call it themselves, which
// is harmless: a status passes through unchanged). Sentinels of the
// packages a handler calls (chunk, kvtier, meta, replication, auth,
// inject, gossipkey, ring) and of node itself (drain, gossip key changes)
// each have one code; anything else is Internal. The cases run in order,
// so an error wrapping two sentinels gets the first one's code (a drain
// with no other member wraps ErrNoDrainTarget and replication's
// ErrNoReplicas: FailedPrecondition, not Unavailable). meta's sentinels
// keep the codes the forwarder (forwarder.Apply) maps back: a refused
// command, ErrLastVoter included, is InvalidArgument, never
// FailedPrecondition, which it reads as "not the leader" and retries.
//
// Not here: the Peer service's replication seam (Replicate, Fetch,
// Delete, Digest) answers through replToStatus, whose codes and
// ErrorInfo reasons are the protocol replFromStatus decodes on the
// sending node; and a handler's own refusal of a request it parsed (a
// status built where the reason is known, as invalid does).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var code codes.Code
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled

	// Node's own sentinels come before the ones they wrap.
	case errors.Is(err, ErrNoDrainTarget), errors.Is(err, ErrDraining), errors.Is(err, ErrCannotLeave):
		code = codes.FailedPrecondition
	case errors.Is(err, gossipkey.ErrInvalidKey):
		code = codes.InvalidArgument
	case errors.Is(err, gossip.ErrShutdown):
		code = codes.Unavailable
	case errors.Is(err, gossip.ErrNotEncrypted), errors.Is(err, errKeyRefused):
		code = codes.FailedPrecondition

	case errors.Is(err, auth.ErrInvalidToken):
		code = codes.InvalidArgument
	case errors.Is(err, auth.ErrUnauthenticated):
		code = codes.Unauthenticated
	case errors.Is(err, auth.ErrPermissionDenied):
		code = codes.PermissionDenied
	case errors.Is(err, auth.ErrUnknownToken):
		// A token record looked up by ID (Admin.RevokeToken); the Guard
		// answers an unknown bearer token Unauthenticated itself.
		code = codes.NotFound
	case errors.Is(err, auth.ErrTooManyStreams):
		code = codes.ResourceExhausted

	case errors.Is(err, inject.ErrInvalidCache), errors.Is(err, inject.ErrInvalidRequest):
		code = codes.InvalidArgument
	case errors.Is(err, inject.ErrUnsupported):
		code = codes.Unimplemented
	case errors.Is(err, inject.ErrTooManyCaches):
		code = codes.ResourceExhausted
	case errors.Is(err, inject.ErrUnknownCache):
		code = codes.NotFound
	case errors.Is(err, inject.ErrFault):
		code = codes.DataLoss
	case errors.Is(err, inject.ErrClosed):
		code = codes.Unavailable

	case errors.Is(err, meta.ErrSettingsVersion):
		code = codes.FailedPrecondition
	case errors.Is(err, chunk.ErrTooLarge), errors.Is(err, kvtier.ErrNoSpace):
		code = codes.ResourceExhausted
	case errors.Is(err, chunk.ErrCorrupt), errors.Is(err, chunk.ErrInvalidEntry), errors.Is(err, chunk.ErrInvalidSpec),
		errors.Is(err, chunk.ErrUnsupported), errors.Is(err, api.ErrBadMessage), errors.Is(err, api.ErrFrame),
		errors.Is(err, api.ErrLongBody), errors.Is(err, api.ErrShortBody), errors.Is(err, meta.ErrInvalidCommand):
		code = codes.InvalidArgument
	case errors.Is(err, replication.ErrNoRoom):
		code = codes.ResourceExhausted
	case errors.Is(err, replication.ErrRecovering), errors.Is(err, replication.ErrUnavailable):
		// A miss that a replica with the key could still answer: the
		// client tries another node.
		code = codes.Unavailable
	case errors.Is(err, kvtier.ErrNotFound), errors.Is(err, replication.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, kvtier.ErrConflict), errors.Is(err, replication.ErrConflict):
		code = codes.AlreadyExists
	case errors.Is(err, replication.ErrRejected):
		code = codes.FailedPrecondition
	case errors.Is(err, replication.ErrEpochMismatch):
		code = codes.Aborted
	case errors.Is(err, replication.ErrQuorum), errors.Is(err, replication.ErrNoReplicas), errors.Is(err, replication.ErrClosed):
		code = codes.Unavailable
	case errors.Is(err, meta.ErrStaleEpoch):
		code = codes.Aborted
	case errors.Is(err, meta.ErrNotLeader):
		code = codes.FailedPrecondition
	case errors.Is(err, meta.ErrNoLeader), errors.Is(err, kvtier.ErrClosed), errors.Is(err, meta.ErrClosed), errors.Is(err, errPoolClosed):
		code = codes.Unavailable
	default:
		code = codes.Internal
	}
	return status.Error(code, err.Error())
}

// errUnknownModel is the FailedPrecondition answer for a fingerprint the
// cluster has not registered.
// It carries the reason api.ReasonUnknownModel: a client asks another
// replica, whose metadata may be fresher, before giving up.
func errUnknownModel(fp chunk.Fingerprint) error {
	st := status.Newf(codes.FailedPrecondition, "unknown model fingerprint %s: register the model first", fp)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: api.ReasonUnknownModel, Domain: api.ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// EpochHeader is the response header that carries the ring epoch the
// answering node uses; clients refresh their ring when it changes.
const EpochHeader = api.EpochHeader

func (n *Node) epochMD() metadata.MD {
	return metadata.Pairs(EpochHeader, strconv.FormatUint(n.meta.Ring().Epoch(), 10))
}

func (n *Node) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			err = n.recovered(info.FullMethod, r)
		}
		n.observe(info.FullMethod, start, err)
	}()
	_ = grpc.SetHeader(ctx, n.epochMD())
	resp, err = handler(ctx, req)
	return resp, toStatus(err)
}

func (n *Node) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			err = n.recovered(info.FullMethod, r)
		}
		n.observe(info.FullMethod, start, err)
	}()
	_ = ss.SetHeader(n.epochMD())
	return toStatus(handler(srv, ss))
}

func (n *Node) recovered(method string, r any) error {
	n.metrics.panics.Inc()
	n.log.Error("node: panic in handler", "method", method, "panic", r, "stack", string(debug.Stack()))
	return status.Error(codes.Internal, fmt.Sprintf("internal error in %s", method))
}

func (n *Node) observe(method string, start time.Time, err error) {
	n.metrics.requests.WithLabelValues(method, status.Code(err).String()).Inc()
	n.metrics.latency.WithLabelValues(method).Observe(time.Since(start).Seconds())
}
