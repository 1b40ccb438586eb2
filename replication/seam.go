package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// Replicate stores blob, an encoded and verified entry of key, on each of
// replicas (none of which is this node) as a write, and returns the IDs
// that acknowledged once every replica answered or ctx ended; replicas
// that could not be reached get a hint here. It has the shape of the
// node package's Replicator seam, for a node that stores the local copy
// and counts the quorum itself; Write does all of it.
func (r *Replicator) Replicate(ctx context.Context, key chunk.Key, blob []byte, replicas []ring.Member) []string {
	opts := ReplicateOptions{Kind: KindWrite, At: r.now()}
	acks := make([]bool, len(replicas))
	var wg sync.WaitGroup
	for i, m := range replicas {
		if m.ID == r.cfg.NodeID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := r.cfg.Transport.Replicate(ctx, m.ID, blob, opts)
			switch {
			case err == nil:
				acks[i] = true
				r.metrics.replicaWrites.Add(1)
			case !errors.Is(err, ErrRejected):
				r.metrics.replicaWriteErrors.Add(1)
				r.addHint(m.ID, key, blob, opts.At)
			default:
				r.metrics.replicaWriteErrors.Add(1)
			}
		}()
	}
	wg.Wait()
	var ids []string
	for i, ok := range acks {
		if ok {
			ids = append(ids, replicas[i].ID)
		}
	}
	return ids
}

// ToStatus turns an error of a Serve* method into the gRPC status a Peer
// handler returns, so that the caller's FromStatus gets the sentinel back:
// tombstoned -> FailedPrecondition, no room and busy -> ResourceExhausted
// (tagged), other
// refusals -> InvalidArgument, not found -> NotFound; anything else keeps
// its status (a plain error becomes Unknown, which the caller treats as
// "unreachable, retry").
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !errors.Is(err, ErrRejected) && !errors.Is(err, ErrNotFound) {
		return err
	}
	switch {
	case errors.Is(err, ErrTombstoned):
		return status.Error(codes.FailedPrecondition, tagTombstoned+err.Error())
	case errors.Is(err, ErrNoRoom):
		return status.Error(codes.ResourceExhausted, tagNoRoom+err.Error())
	case errors.Is(err, ErrBusy):
		return status.Error(codes.ResourceExhausted, tagBusy+err.Error())
	case errors.Is(err, ErrRejected):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrEpochMismatch):
		return status.Error(codes.Aborted, err.Error())
	}
	return err
}

const (
	tagTombstoned = "replication: tombstoned: "
	tagNoRoom     = "replication: no room: "
	tagBusy       = "replication: busy: "
)

// FromStatus turns the error of a Peer call into this package's sentinels,
// for Transport implementations: refusals wrap ErrRejected (and
// ErrTombstoned, ErrNoRoom where the handler said so), a busy receiver's
// push-back wraps ErrBusy (not ErrRejected), NotFound wraps
// ErrNotFound, Aborted ErrEpochMismatch; Unavailable, DeadlineExceeded and
// the rest stay as they are and count as "unreachable".
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.FailedPrecondition:
		if strings.HasPrefix(msg, tagTombstoned) {
			return fmt.Errorf("%w: %w: %w", ErrRejected, ErrTombstoned, err)
		}
		return fmt.Errorf("%w: %w", ErrRejected, err)
	case codes.ResourceExhausted:
		if strings.HasPrefix(msg, tagNoRoom) {
			return fmt.Errorf("%w: %w: %w", ErrRejected, ErrNoRoom, err)
		}
		if strings.HasPrefix(msg, tagBusy) {
			return fmt.Errorf("%w: %w", ErrBusy, err) // not a refusal: send again later
		}
		return fmt.Errorf("%w: %w", ErrRejected, err)
	case codes.InvalidArgument, codes.AlreadyExists, codes.DataLoss, codes.OutOfRange:
		return fmt.Errorf("%w: %w", ErrRejected, err)
	case codes.NotFound:
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case codes.Aborted:
		return fmt.Errorf("%w: %w", ErrEpochMismatch, err)
	}
	return err
}
