package node

import (
	"context"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
)

// record writes one audit record of an admin call: who (the presented
// token's ID, the certificate's name, the remote address), what (the
// method and the arguments that matter, never a secret: gossip keys by
// fingerprint, tokens by ID), and the result (the status code, and the
// message of a failure).
func (o *callObserver) record(ctx context.Context, method string, who *auth.Principal, req, resp any, err error) {
	attrs := []slog.Attr{
		slog.String("method", method),
		slog.String("caller", who.Key()),
		slog.String("token", who.TokenID),
		slog.String("cert", who.CertName),
		slog.String("peer", who.Addr),
	}
	if err != nil {
		// A handler that fails returns a typed nil answer.
		resp = nil
	}
	if args := auditArgs(req, resp); len(args) > 0 {
		attrs = append(attrs, slog.Attr{Key: "args", Value: slog.GroupValue(args...)})
	}
	code := status.Code(err)
	attrs = append(attrs, slog.String("result", code.String()))
	if code != codes.OK {
		attrs = append(attrs, slog.String("err", status.Convert(err).Message()))
	}
	o.audit.LogAttrs(ctx, slog.LevelInfo, "audit", attrs...)
}

// auditArgs are the arguments of an admin request (and what its answer
// created, when resp is not nil) that an audit record keeps. It reads
// through the getters, which take nil messages.
func auditArgs(req, resp any) []slog.Attr {
	var a []slog.Attr
	switch r := req.(type) {
	case *api.CreateTokenRequest:
		a = append(a, slog.String("name", r.GetName()), slog.String("scopes", r.GetScopes()), slog.Any("namespace", r.GetNamespace()),
			slog.Int64("ttl_seconds", r.GetTtlSeconds()))
		if out, ok := resp.(*api.CreateTokenResponse); ok && out.GetInfo() != nil {
			a = append(a, slog.String("id", out.GetInfo().GetId()))
		}
	case *api.RevokeTokenRequest:
		a = append(a, slog.String("id", r.GetId()))
	case *api.GossipKeyRequest:
		a = append(a, slog.String("op", r.GetOp().String()))
		if len(r.GetKey()) > 0 {
			a = append(a, slog.String("key", keyFingerprint(r.GetKey())))
		}
	case *api.SetSettingsRequest:
		a = append(a, slog.Uint64("replication_factor", uint64(r.GetReplicationFactor())), slog.Uint64("write_quorum", uint64(r.GetWriteQuorum())),
			slog.String("codec", r.GetCodec()))
		if r != nil && r.ExpectedVersion != nil {
			a = append(a, slog.Uint64("expected_version", r.GetExpectedVersion()))
		}
		if out, ok := resp.(*api.SetSettingsResponse); ok && out != nil {
			a = append(a, slog.Uint64("version", out.GetVersion()))
		}
	case *api.RegisterModelRequest:
		if spec, err := api.SpecFromProto(r.GetSpec()); err == nil {
			a = append(a, slog.String("fingerprint", spec.Fingerprint().String()), slog.String("family", spec.Family),
				slog.String("revision", spec.WeightsRevision))
		}
	case *api.DrainRequest:
		a = append(a, slog.Bool("keep_membership", r.GetKeepMembership()))
	}
	return a
}
