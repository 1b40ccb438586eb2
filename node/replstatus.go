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

// replToStatus turns an error of a replication Serve* method into the
// gRPC status a Peer handler returns: the first row of statusRows that has
// a reason and that the error matches, so the codes are the client
// service's and the reason names the sentinel. A status passes through
// unchanged (unless it wraps a refusal or an absence), and anything else
// keeps its error (gRPC answers Unknown, which the sender treats as
// "unreachable, retry").
func replToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !errors.Is(err, replication.ErrRejected) && !errors.Is(err, replication.ErrNotFound) {
		return err
	}
	if i := statusRow(err, true); i >= 0 {
		return rowStatus(i, err)
	}
	return err
}

// replFromStatus turns the error of a Peer call into replication's
// sentinels, for the node's replication.Transport: the reason of a
// replication refusal names its sentinel (refusals wrap ErrRejected as
// well; a busy receiver's push-back wraps ErrBusy alone: send again
// later; a recovering node's miss wraps ErrRecovering and ErrNotFound). A status without one (the guard's, the interceptor's) goes by
// its code: PermissionDenied, FailedPrecondition, ResourceExhausted,
// InvalidArgument, AlreadyExists and OutOfRange are refusals, NotFound is
// ErrNotFound, and so is DataLoss (the peer found its stored copy damaged
// and dropped it: it lacks the key now, a repair target), Aborted
// ErrEpochMismatch. Unavailable,
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
	case "NOT_FOUND", "DAMAGED":
		return fmt.Errorf("%w: %w", replication.ErrNotFound, err)
	case "EPOCH_MISMATCH":
		return fmt.Errorf("%w: %w", replication.ErrEpochMismatch, err)
	}
	switch st.Code() {
	case codes.PermissionDenied, codes.FailedPrecondition, codes.ResourceExhausted, codes.InvalidArgument,
		codes.AlreadyExists, codes.OutOfRange:
		return fmt.Errorf("%w: %w", replication.ErrRejected, err)
	case codes.NotFound, codes.DataLoss:
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
