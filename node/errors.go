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

// statusRows is the node's one table from errors to the gRPC statuses
// callers branch on, tried in order: an error wrapping two sentinels gets
// the first one's row (a drain with no other member wraps
// ErrNoDrainTarget and replication's ErrNoReplicas: FailedPrecondition,
// not Unavailable; a tombstoned write wraps ErrTombstoned and ErrRejected).
// Node's own sentinels come before the ones they wrap. A row with a reason
// also carries an errdetails.ErrorInfo naming its sentinel: those are
// replication's, whose reasons the Peer service's replication seam is
// decoded by (replFromStatus), so they are the protocol between nodes.
// meta's sentinels keep the codes the forwarder (forwarder.Apply) maps
// back: a refused command, ErrLastVoter included, is InvalidArgument,
// never FailedPrecondition, which it reads as "not the leader" and retries.
var statusRows = []struct {
	errs   []error
	code   codes.Code
	reason string // replication's ErrorInfo reason, or ""
}{
	{[]error{context.DeadlineExceeded}, codes.DeadlineExceeded, ""},
	{[]error{context.Canceled}, codes.Canceled, ""},

	{[]error{ErrNoDrainTarget, ErrDraining, ErrCannotLeave}, codes.FailedPrecondition, ""},
	{[]error{gossipkey.ErrInvalidKey}, codes.InvalidArgument, ""},
	{[]error{gossip.ErrShutdown}, codes.Unavailable, ""},
	{[]error{gossip.ErrNotEncrypted, errKeyRefused}, codes.FailedPrecondition, ""},

	{[]error{auth.ErrInvalidToken}, codes.InvalidArgument, ""},
	{[]error{auth.ErrUnauthenticated}, codes.Unauthenticated, ""},
	{[]error{auth.ErrPermissionDenied}, codes.PermissionDenied, ""},
	// A token record looked up by ID (Admin.RevokeToken); the Guard
	// answers an unknown bearer token Unauthenticated itself.
	{[]error{auth.ErrUnknownToken}, codes.NotFound, ""},
	{[]error{auth.ErrTooManyStreams}, codes.ResourceExhausted, ""},

	{[]error{inject.ErrInvalidCache, inject.ErrInvalidRequest}, codes.InvalidArgument, ""},
	{[]error{inject.ErrUnsupported}, codes.Unimplemented, ""},
	{[]error{inject.ErrRefused, api.ErrCacheRefused}, codes.PermissionDenied, ""},
	{[]error{inject.ErrTooManyCaches}, codes.ResourceExhausted, ""},
	{[]error{inject.ErrUnknownCache}, codes.NotFound, ""},
	{[]error{inject.ErrFault}, codes.DataLoss, ""},
	{[]error{inject.ErrClosed}, codes.Unavailable, ""},

	{[]error{meta.ErrSettingsVersion}, codes.FailedPrecondition, ""},
	// A stored copy found bad is the store's damage, not the request's:
	// another replica may still hold a good one. Before chunk.ErrCorrupt,
	// which it wraps, and before replication's NOT_FOUND, which a replica
	// that dropped the copy also wraps: a direct reader learns it was
	// damaged, a peer that the replica lacks it now (replFromStatus).
	{[]error{kvtier.ErrDamaged}, codes.DataLoss, "DAMAGED"},
	{[]error{chunk.ErrTooLarge, kvtier.ErrNoSpace}, codes.ResourceExhausted, ""},
	{[]error{chunk.ErrCorrupt, chunk.ErrInvalidEntry, chunk.ErrInvalidSpec, chunk.ErrUnsupported, api.ErrBadMessage,
		api.ErrFrame, api.ErrLongBody, api.ErrShortBody, meta.ErrInvalidCommand}, codes.InvalidArgument, ""},

	{[]error{replication.ErrTombstoned}, codes.FailedPrecondition, "TOMBSTONED"},
	{[]error{replication.ErrNoRoom}, codes.ResourceExhausted, "NO_ROOM"},
	{[]error{replication.ErrBusy}, codes.ResourceExhausted, "BUSY"},
	// A miss that a replica with the key could still answer: the client
	// tries another node.
	{[]error{replication.ErrRecovering}, codes.Unavailable, "RECOVERING"},
	{[]error{replication.ErrUnavailable}, codes.Unavailable, ""},
	{[]error{replication.ErrNotFound}, codes.NotFound, "NOT_FOUND"},
	{[]error{kvtier.ErrNotFound}, codes.NotFound, ""},
	{[]error{kvtier.ErrConflict, replication.ErrConflict}, codes.AlreadyExists, ""},
	// A write a replica refused in its present state (a tombstone, no
	// room, an entry it would not take): not the caller's argument alone.
	{[]error{replication.ErrRejected}, codes.FailedPrecondition, "REJECTED"},
	{[]error{replication.ErrEpochMismatch}, codes.Aborted, "EPOCH_MISMATCH"},
	{[]error{replication.ErrQuorum, replication.ErrNoReplicas, replication.ErrClosed}, codes.Unavailable, ""},
	{[]error{meta.ErrStaleEpoch}, codes.Aborted, ""},
	{[]error{meta.ErrNotLeader}, codes.FailedPrecondition, ""},
	{[]error{meta.ErrNoLeader, kvtier.ErrClosed, meta.ErrClosed, errPoolClosed}, codes.Unavailable, ""},
}

// statusRow is the index of the first row of statusRows err matches, with
// only the rows that carry a reason when reasoned; -1 if none does.
func statusRow(err error, reasoned bool) int {
	for i, r := range statusRows {
		if reasoned && r.reason == "" {
			continue
		}
		for _, e := range r.errs {
			if errors.Is(err, e) {
				return i
			}
		}
	}
	return -1
}

// rowStatus is err as the status of row i: its code, and its sentinel's
// ErrorInfo when the row has a reason.
func rowStatus(i int, err error) error {
	r := statusRows[i]
	st := status.New(r.code, err.Error())
	if r.reason != "" {
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: r.reason, Domain: replDomain}); derr == nil {
			st = d // an ErrorInfo always marshals
		}
	}
	return st.Err()
}

// toStatus maps every handler's error to its status by statusRows (the
// interceptors apply it to whatever a handler returns; handlers whose
// answers tests read without the interceptors call it themselves, which is
// harmless: a status passes through unchanged). Anything no row matches
// is Internal.
//
// Not here: a handler's own refusal of a request it parsed (a status built
// where the reason is known, as invalid does).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if i := statusRow(err, false); i >= 0 {
		return rowStatus(i, err)
	}
	return status.Error(codes.Internal, err.Error())
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
