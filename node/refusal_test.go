package node_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// refusedCount reads kvmesh_requests_refused_total{method, reason}.
func refusedCount(t *testing.T, n *node.Node, method, reason string) float64 {
	t.Helper()
	mfs, err := n.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvmesh_requests_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["method"] == method && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestRefusalsAndAudit: a refused call is counted by method and reason
// and logged with its caller, whether the Guard, a handler or nobody
// refused it; every admin call, refused or not, leaves exactly one audit
// record naming the caller, the arguments and the result, and other
// calls leave none.
func TestRefusalsAndAudit(t *testing.T) {
	var logs, audit testutil.LogBuffer
	cfg := nodetest.NodeConfig(t, "n1", nil)
	cfg.Insecure, cfg.Tokens = true, true
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.AuditLogger = slog.New(slog.NewJSONHandler(&audit, nil))
	n := nodetest.StartNode(t, cfg)
	testutil.WaitFor(t, "n1 ready", func() bool { return n.Ready() == nil })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	mint := func(name string, s auth.Scope) (tok, id string) {
		tk, rec, err := auth.NewToken(name, s, nil, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Meta().PutToken(ctx, rec); err != nil {
			t.Fatal(err)
		}
		return tk.String(), rec.ID
	}
	adminTok, adminID := mint("ops", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin)
	readTok, readID := mint("reader", auth.ScopeRead)

	cc, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	as := func(tok string) context.Context {
		if tok == "" {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer "+tok)
	}
	admin, cl := api.NewAdminClient(cc), api.NewClientClient(cc)

	created, err := admin.CreateToken(as(adminTok), &api.CreateTokenRequest{Name: "rag", Scopes: "read"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.CreateToken(as(readTok), &api.CreateTokenRequest{Name: "sneaky", Scopes: "admin"})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("create token with a read token: %v", err)
	}
	_, err = admin.CreateToken(as(adminTok), &api.CreateTokenRequest{Name: "empty"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("create token without scopes: %v", err)
	}
	_, err = admin.SetSettings(as(adminTok), &api.SetSettingsRequest{ReplicationFactor: 9, WriteQuorum: 12})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("set settings W > R: %v", err)
	}
	if _, err := cl.Stats(as(""), &api.StatsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stats without a token: %v", err)
	}
	if _, err := cl.Stats(as(readTok), &api.StatsRequest{}); err != nil {
		t.Fatal(err)
	}

	create, settings, stats := api.Admin_CreateToken_FullMethodName, api.Admin_SetSettings_FullMethodName, api.Client_Stats_FullMethodName
	for _, c := range []struct {
		method, reason string
		want           float64
	}{{create, "permission_denied", 1}, {create, "invalid_argument", 1}, {settings, "invalid_argument", 1}, {stats, "unauthenticated", 1},
		{stats, "permission_denied", 0}} {
		if got := refusedCount(t, n, c.method, c.reason); got != c.want {
			t.Errorf("refused{%s, %s} = %v, want %v", c.method, c.reason, got, c.want)
		}
	}
	if got := strings.Count(logs.String(), "node: request refused"); got != 4 {
		t.Errorf("%d refusal log lines, want 4:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "caller=token:"+readID) {
		t.Errorf("no refusal line names the read token:\n%s", logs.String())
	}

	type record struct {
		Msg, Node, Method, Token, Result, Err string
		Args                                  map[string]any
	}
	var recs []record
	for line := range strings.Lines(audit.String()) {
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 4 {
		t.Fatalf("%d audit records, want 4 (create, refused create, invalid create, invalid settings):\n%s", len(recs), audit.String())
	}
	for i, want := range []struct{ method, token, result, id string }{
		{create, adminID, "OK", created.Info.Id}, {create, readID, "PermissionDenied", ""}, {create, adminID, "InvalidArgument", ""},
		{settings, adminID, "InvalidArgument", ""},
	} {
		r := recs[i]
		if r.Msg != "audit" || r.Node != "n1" || r.Method != want.method || r.Token != want.token || r.Result != want.result ||
			(want.result != "OK") != (r.Err != "") {
			t.Errorf("audit record %d: %+v, want token %s result %s", i, r, want.token, want.result)
		}
		if id, _ := r.Args["id"].(string); id != want.id {
			t.Errorf("audit record %d: created token %q, want %q", i, id, want.id)
		}
	}
	if recs[0].Args["name"] != "rag" || recs[0].Args["scopes"] != "read" {
		t.Errorf("audit record args %v, want name rag, scopes read", recs[0].Args)
	}
	if recs[3].Args["write_quorum"] != 12.0 || recs[3].Args["version"] != nil {
		t.Errorf("audit record args %v, want write_quorum 12 and no version", recs[3].Args)
	}
}

// TestAuditArgsNil: the arguments of an audit record are read from nil
// messages without a panic (a failed handler answers a typed nil), and
// they name the request's fields: the same names, with zero values, for a
// nil request as for an empty one.
func TestAuditArgsNil(t *testing.T) {
	names := func(attrs []slog.Attr) []string {
		var out []string
		for _, a := range attrs {
			out = append(out, a.Key)
		}
		return out
	}
	for _, c := range []struct {
		req, resp any
		want      []string
	}{
		{(*api.CreateTokenRequest)(nil), (*api.CreateTokenResponse)(nil), []string{"name", "scopes", "namespace", "ttl_seconds"}},
		{&api.CreateTokenRequest{}, &api.CreateTokenResponse{}, []string{"name", "scopes", "namespace", "ttl_seconds"}},
		{&api.CreateTokenRequest{}, &api.CreateTokenResponse{Info: &api.TokenInfo{Id: "t1"}}, []string{"name", "scopes", "namespace", "ttl_seconds", "id"}},
		{(*api.RevokeTokenRequest)(nil), (*api.RevokeTokenResponse)(nil), []string{"id"}},
		{(*api.GossipKeyRequest)(nil), (*api.GossipKeysResponse)(nil), []string{"op"}},
		{(*api.SetSettingsRequest)(nil), (*api.SetSettingsResponse)(nil), []string{"replication_factor", "write_quorum", "codec"}},
		{(*api.RegisterModelRequest)(nil), (*api.RegisterModelResponse)(nil), nil},
		{(*api.DrainRequest)(nil), nil, []string{"keep_membership"}},
		{nil, nil, nil},
	} {
		if got := names(node.AuditArgs(c.req, c.resp)); !slices.Equal(got, c.want) {
			t.Errorf("AuditArgs(%T, %T) names %v, want %v", c.req, c.resp, got, c.want)
		}
	}
}

// TestRefusalReason: the Peer service's push-back is the protocol, not a
// refusal, but its authentication refusals are.
func TestRefusalReason(t *testing.T) {
	for _, c := range []struct {
		method string
		code   codes.Code
		want   string
	}{
		{api.Client_Get_FullMethodName, codes.OK, ""},
		{api.Client_Get_FullMethodName, codes.NotFound, ""},
		{api.Client_Put_FullMethodName, codes.ResourceExhausted, "resource_exhausted"},
		{api.Client_Put_FullMethodName, codes.FailedPrecondition, "failed_precondition"},
		{api.Peer_Replicate_FullMethodName, codes.ResourceExhausted, ""},
		{api.Peer_Replicate_FullMethodName, codes.Unavailable, ""},
		{api.Peer_Replicate_FullMethodName, codes.PermissionDenied, "permission_denied"},
		{api.Admin_SetSettings_FullMethodName, codes.Unauthenticated, "unauthenticated"},
	} {
		if got := node.RefusalReason(c.method, c.code); got != c.want {
			t.Errorf("refusalReason(%s, %v) = %q, want %q", c.method, c.code, got, c.want)
		}
	}
}
