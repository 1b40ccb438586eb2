package client

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
)

// retryable reports whether another replica (or a later round) may
// succeed where err failed: the node was unreachable, overloaded, too
// slow, recovering (Unavailable), saw another ring epoch (Aborted), or
// found its own stored copy damaged (DataLoss; it dropped it).
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.DataLoss:
		return true
	}
	return false
}

// unknownModel reports whether err is a node's "unknown model" (a
// FailedPrecondition with the reason api.ReasonUnknownModel). A node
// whose metadata lags (a model registered a moment ago through another
// node) says it too, so the other replicas are asked; when all of them
// say it, the model is unknown and no later round is tried (each node
// already waited for its metadata).
func unknownModel(err error) bool {
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == api.ErrorDomain && info.GetReason() == api.ReasonUnknownModel {
			return true
		}
	}
	return false
}

// targets returns the nodes to try for content, in order: its replicas,
// or every member (then seeds) when content is nil or the ring is empty.
func (c *Client) targets(content *chunk.ID) []string {
	v := c.view.Load()
	var out []string
	if content != nil && v.ring.Len() > 0 {
		for _, m := range v.ring.Replicas(*content, v.rf) {
			out = append(out, m.GRPCAddr)
		}
		return out
	}
	return c.candidates()
}

// do runs call on the targets of content until one succeeds, failing over
// on retryable errors (and, within a round, on an unknown model) and
// refreshing the ring between rounds.
func (c *Client) do(ctx context.Context, content *chunk.ID, call func(ctx context.Context, cc *grpc.ClientConn) error) error {
	backoff := c.cfg.Backoff
	var last error = ErrNoNodes
	for round := 0; round < c.cfg.Attempts; round++ {
		for _, addr := range c.targets(content) {
			cc, err := c.conn(addr)
			if err != nil {
				last = err
				continue
			}
			actx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
			err = call(actx, cc)
			cancel()
			if err == nil {
				return nil
			}
			last = err
			if ctx.Err() != nil {
				return last
			}
			if !retryable(err) && !unknownModel(err) {
				return err
			}
		}
		if round+1 == c.cfg.Attempts || unknownModel(last) {
			break
		}
		if err := c.Refresh(ctx); err != nil {
			c.log.Debug("client: ring refresh", "err", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return last
		case <-t.C:
		}
		backoff = min(2*backoff, c.cfg.MaxBackoff)
	}
	return last
}
