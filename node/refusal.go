package node

import (
	"context"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/ratelog"
)

// refusalReason names the refusal a call's answer is, as the "reason"
// label of kvmesh_requests_refused_total and in the refusal log line, or
// "" when the answer is not a refusal: success, a miss (NotFound), a
// conflict, a timeout or cancellation, a failure of the node itself. The
// Peer service's push-back (busy, full, another epoch, not ready) is the
// replication protocol between nodes, not a refusal; only its
// authentication and permission refusals count.
func refusalReason(method string, code codes.Code) string {
	reason := ""
	switch code {
	case codes.Unauthenticated:
		return "unauthenticated"
	case codes.PermissionDenied:
		return "permission_denied"
	case codes.InvalidArgument:
		reason = "invalid_argument"
	case codes.OutOfRange:
		reason = "out_of_range"
	case codes.ResourceExhausted:
		reason = "resource_exhausted"
	case codes.FailedPrecondition:
		reason = "failed_precondition"
	case codes.Unavailable:
		reason = "unavailable"
	}
	if strings.HasPrefix(method, "/"+api.Peer_ServiceDesc.ServiceName+"/") {
		return ""
	}
	return reason
}

// callObserver sees every gRPC call's final answer, before the Guard runs
// and after everything else: it counts and logs refusals (the Guard's,
// the stream limiter's and the handlers') and writes the audit log of
// admin calls. It is the first interceptor of the chain (serverOptions).
type callObserver struct {
	n        *Node
	refused  *ratelog.Limiter // one log line per refusal, rate-limited
	audit    *slog.Logger     // nil: no audit log
	identify func(context.Context) *auth.Principal
	scope    func(method string) (auth.Scope, bool)
}

func newCallObserver(n *Node, g *auth.Guard) *callObserver {
	o := &callObserver{n: n, refused: ratelog.New(ratelog.Config{}), identify: g.Identify, scope: g.Scope}
	if n.cfg.AuditLogger != nil {
		o.audit = n.cfg.AuditLogger.With("node", n.cfg.NodeID)
	}
	return o
}

// audited reports whether calls of method go to the audit log: every
// method that needs the admin scope.
func (o *callObserver) audited(method string) bool {
	s, ok := o.scope(method)
	return o.audit != nil && ok && s.Has(auth.ScopeAdmin)
}

func (o *callObserver) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	releaseSlot(ctx)
	o.done(ctx, info.FullMethod, req, resp, err)
	return resp, err
}

func (o *callObserver) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	defer releaseSlot(ss.Context())
	if !o.audited(info.FullMethod) {
		err := handler(srv, ss)
		o.done(ss.Context(), info.FullMethod, nil, nil, err)
		return err
	}
	// An audited stream keeps its first request for the record.
	rs := &recvFirst{ServerStream: ss}
	err := handler(srv, rs)
	o.done(ss.Context(), info.FullMethod, rs.first, nil, err)
	return err
}

// malformed counts and logs a request gRPC could not decode.
func (o *callObserver) malformed(ctx context.Context, method string, err error) {
	who := o.identify(ctx)
	o.n.metrics.refused.WithLabelValues(method, "malformed").Inc()
	o.refused.Log(ctx, o.n.log, slog.LevelWarn, "node: request refused", "method", method, "reason", "malformed",
		"caller", who.Key(), "peer", who.Addr, "err", status.Convert(err).Message())
}

// done counts and logs a refusal and writes the audit record of an admin
// call.
func (o *callObserver) done(ctx context.Context, method string, req, resp any, err error) {
	// It runs outside the handlers' panic recovery: a fault here must
	// not take the server down.
	defer func() {
		if r := recover(); r != nil {
			o.n.log.Error("node: panic observing a call", "method", method, "panic", r)
		}
	}()
	code := status.Code(err)
	reason := refusalReason(method, code)
	audit := o.audited(method)
	if reason == "" && !audit {
		return
	}
	who := o.identify(ctx)
	if reason != "" {
		o.n.metrics.refused.WithLabelValues(method, reason).Inc()
		o.refused.Log(ctx, o.n.log, slog.LevelWarn, "node: request refused", "method", method, "reason", reason,
			"caller", who.Key(), "peer", who.Addr, "err", status.Convert(err).Message())
	}
	if audit {
		o.record(ctx, method, who, req, resp, err)
	}
}

// recvFirst is a server stream that keeps the first message it receives.
type recvFirst struct {
	grpc.ServerStream
	first any
}

func (s *recvFirst) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && s.first == nil {
		s.first = m
	}
	return err
}
