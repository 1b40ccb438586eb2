package node

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/replication"
)

// The Peer service's replication seam (Replicate, Fetch, Delete, Digest)
// carries replication's sentinel errors as gRPC statuses: a code, for
// whoever reads codes only, and an errdetails.ErrorInfo whose Reason names
// the sentinel. The sending node turns the reason back into the sentinel
// (replFromStatus), so replication branches on errors.Is, never on a
// message.

// replDomain is the ErrorInfo domain of replication's refusals.
const replDomain = "replication.kvmesh"

// replRefusals maps each sentinel to its code and reason, in the order
// replToStatus tries them: an error wrapping two gets the first one's (a
// tombstoned write wraps ErrRejected and ErrTombstoned).
var replRefusals = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{replication.ErrTombstoned, codes.FailedPrecondition, "TOMBSTONED"},
	{replication.ErrNoRoom, codes.ResourceExhausted, "NO_ROOM"},
	{replication.ErrBusy, codes.ResourceExhausted, "BUSY"},
	{replication.ErrRejected, codes.InvalidArgument, "REJECTED"},
	{replication.ErrRecovering, codes.Unavailable, "RECOVERING"},
	{replication.ErrNotFound, codes.NotFound, "NOT_FOUND"},
	{replication.ErrEpochMismatch, codes.Aborted, "EPOCH_MISMATCH"},
}

// replToStatus turns an error of a replication Serve* method into the
// gRPC status a Peer handler returns: tombstoned -> FailedPrecondition, no
// room and busy -> ResourceExhausted, other refusals -> InvalidArgument,
// a recovering node's miss -> Unavailable, not found -> NotFound, epoch mismatch -> Aborted, each with its reason.
// A status passes through unchanged (unless it wraps a refusal or an
// absence), and anything else keeps its error (gRPC answers Unknown, which
// the sender treats as "unreachable, retry").
func replToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !errors.Is(err, replication.ErrRejected) && !errors.Is(err, replication.ErrNotFound) {
		return err
	}
	for _, r := range replRefusals {
		if !errors.Is(err, r.err) {
			continue
		}
		st, derr := status.New(r.code, err.Error()).WithDetails(&errdetails.ErrorInfo{Reason: r.reason, Domain: replDomain})
		if derr != nil {
			return status.Error(r.code, err.Error()) // an ErrorInfo always marshals
		}
		return st.Err()
	}
	return err
}

// replFromStatus turns the error of a Peer call into replication's
// sentinels, for the node's replication.Transport: the reason of a
// replication refusal names its sentinel (refusals wrap ErrRejected as
// well; a busy receiver's push-back wraps ErrBusy alone: send again
// later; a recovering node's miss wraps ErrRecovering and ErrNotFound). A status without one (the guard's, the interceptor's) goes by
// its code: PermissionDenied, FailedPrecondition, ResourceExhausted,
// InvalidArgument, AlreadyExists, DataLoss and OutOfRange are refusals,
// NotFound is ErrNotFound, Aborted ErrEpochMismatch. Unavailable,
// DeadlineExceeded and the rest stay as they are and count as
// "unreachable".
func replFromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch replReason(st) {
	case "TOMBSTONED":
		return fmt.Errorf("%w: %w: %w", replication.ErrRejected, replication.ErrTombstoned, err)
	case "NO_ROOM":
		return fmt.Errorf("%w: %w: %w", replication.ErrRejected, replication.ErrNoRoom, err)
	case "BUSY":
		return fmt.Errorf("%w: %w", replication.ErrBusy, err) // not a refusal
	case "REJECTED":
		return fmt.Errorf("%w: %w", replication.ErrRejected, err)
	case "RECOVERING":
		return fmt.Errorf("%w: %w: %w", replication.ErrRecovering, replication.ErrNotFound, err)
	case "NOT_FOUND":
		return fmt.Errorf("%w: %w", replication.ErrNotFound, err)
	case "EPOCH_MISMATCH":
		return fmt.Errorf("%w: %w", replication.ErrEpochMismatch, err)
	}
	switch st.Code() {
	case codes.PermissionDenied, codes.FailedPrecondition, codes.ResourceExhausted, codes.InvalidArgument,
		codes.AlreadyExists, codes.DataLoss, codes.OutOfRange:
		return fmt.Errorf("%w: %w", replication.ErrRejected, err)
	case codes.NotFound:
		return fmt.Errorf("%w: %w", replication.ErrNotFound, err)
	case codes.Aborted:
		return fmt.Errorf("%w: %w", replication.ErrEpochMismatch, err)
	}
	return err
}

// replReason is the reason of st's replication ErrorInfo, or "".
func replReason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == replDomain {
			return info.GetReason()
		}
	}
	return ""
}
