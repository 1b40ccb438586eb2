package security_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

// TestSettingsAPI: Admin.GetSettings and SetSettings need the admin scope;
// invalid settings are refused with InvalidArgument and change nothing on
// any node; valid ones, set through a follower, are committed through
// raft and show on every node, partial requests keeping the other fields.
func TestSettingsAPI(t *testing.T) {
	p := newPKI(t)
	nodes := cluster3(t, p, func(c *node.Config) { c.Tokens = true })
	n1 := nodes[0]
	root := newToken(t, n1, "root", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin, nil)
	rw := newToken(t, n1, "rw", auth.ScopeRead|auth.ScopeWrite, nil)
	creds := tlsCreds(t, files(p.dir, "app"))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	admin := func(n *node.Node, tok string) api.AdminClient {
		return api.NewAdminClient(conn(t, n.GRPCAddr(), creds, tok))
	}
	// Every node must know both tokens before they are used anywhere.
	for _, n := range nodes {
		testutil.WaitFor(t, "the tokens on "+n.ID(), func() bool {
			_, e1 := n.Meta().LookupToken(ctx, root[:16])
			_, e2 := n.Meta().LookupToken(ctx, rw[:16])
			return e1 == nil && e2 == nil
		})
	}

	follower := nodes[1]
	if id, _ := n1.Meta().Leader(); id == follower.ID() {
		follower = nodes[2]
	}
	for _, tc := range []struct {
		name string
		tok  string
		call func(api.AdminClient) error
		want codes.Code
	}{
		{"get without a token", "", func(a api.AdminClient) error { _, err := a.GetSettings(ctx, &api.GetSettingsRequest{}); return err }, codes.Unauthenticated},
		{"get without admin", rw, func(a api.AdminClient) error { _, err := a.GetSettings(ctx, &api.GetSettingsRequest{}); return err }, codes.PermissionDenied},
		{"set without admin", rw, func(a api.AdminClient) error {
			_, err := a.SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: 1, WriteQuorum: 1})
			return err
		}, codes.PermissionDenied},
		{"W above R", root, func(a api.AdminClient) error {
			_, err := a.SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: 2, WriteQuorum: 3})
			return err
		}, codes.InvalidArgument},
		{"R below the current W", root, func(a api.AdminClient) error {
			_, err := a.SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: 1})
			return err
		}, codes.InvalidArgument},
		{"R above the limit", root, func(a api.AdminClient) error {
			_, err := a.SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: meta.MaxReplicationFactor + 1})
			return err
		}, codes.InvalidArgument},
		{"R beyond uint32 sense", root, func(a api.AdminClient) error {
			_, err := a.SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: 1 << 31, WriteQuorum: 1 << 31})
			return err
		}, codes.InvalidArgument},
		{"unknown codec", root, func(a api.AdminClient) error {
			_, err := a.SetSettings(ctx, &api.SetSettingsRequest{Codec: "zstd"})
			return err
		}, codes.InvalidArgument},
	} {
		wantCode(t, tc.name, tc.call(admin(follower, tc.tok)), tc.want)
	}
	for _, n := range nodes {
		if got := n.Meta().Settings(); got != meta.DefaultSettings() {
			t.Errorf("%s after refused changes: %+v", n.ID(), got)
		}
	}

	want := meta.Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: chunk.CodecInt8}
	resp, err := admin(follower, root).SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: 2, WriteQuorum: 1, Codec: "int8"})
	if err != nil {
		t.Fatal(err)
	}
	if pr, s := resp.Previous, resp.Settings; pr.ReplicationFactor != 3 || pr.WriteQuorum != 2 || pr.Codec != meta.DefaultSettings().Codec.String() ||
		s.ReplicationFactor != 2 || s.WriteQuorum != 1 || s.Codec != "int8" {
		t.Errorf("SetSettings answered %v", resp)
	}
	// A partial change keeps the other fields: the fields this node has
	// applied, so it must have applied the first change (made through
	// another node, perhaps not yet applied here) before it merges.
	testutil.WaitFor(t, "the first change on "+nodes[2].ID(), func() bool { return nodes[2].Meta().Settings() == want })
	want.WriteQuorum = 2
	if _, err := admin(nodes[2], root).SetSettings(ctx, &api.SetSettingsRequest{WriteQuorum: 2}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		testutil.WaitFor(t, "the settings on "+n.ID(), func() bool {
			g, err := admin(n, root).GetSettings(ctx, &api.GetSettingsRequest{})
			return err == nil && g.NodeId == n.ID() && g.Settings.ReplicationFactor == 2 && g.Settings.WriteQuorum == 2 &&
				g.Settings.Codec == "int8" && n.Meta().Settings() == want
		})
	}
}

// leaveCommand is meta's raft leave command as a node forwards it over
// Peer.MetaApply (version 1, kind 6, JSON); meta.LeaveOf checks the
// encoding has not drifted.
func leaveCommand(t *testing.T, id string) []byte {
	t.Helper()
	body, err := json.Marshal(map[string]any{"id": id, "incarnation": 1})
	if err != nil {
		t.Fatal(err)
	}
	cmd := append([]byte{1, 6}, body...)
	if got, ok := meta.LeaveOf(cmd); !ok || got != id {
		t.Fatalf("hand-made leave command for %s reads as %q %v", id, got, ok)
	}
	return cmd
}

// TestLeaveTiedToSender: a raft leave forwarded over Peer.MetaApply for
// node X is refused unless X's own certificate sends it: another node's
// certificate (a member's or not) cannot take X out of the cluster. The
// legitimate path, an operator draining X through Drain on X (admin),
// still ends with X out of the ring and raft. A node whose certificate
// does not name its ID does not start.
func TestLeaveTiedToSender(t *testing.T) {
	p := newPKI(t)
	cfg := nodetest.NodeConfig(t, "n7", nil)
	cfg.TLS = files(p.dir, "n2")
	if _, err := node.New(cfg); !errors.Is(err, node.ErrCertName) {
		t.Fatalf("New with n2's certificate as n7: %v, want ErrCertName", err)
	}

	nodes := cluster3(t, p, nil)
	n1, n3 := nodes[0], nodes[2]
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var leader *node.Node
	testutil.WaitFor(t, "a leader", func() bool {
		id, _ := n1.Meta().Leader()
		for _, n := range nodes {
			if n.ID() == id {
				leader = n
			}
		}
		return leader != nil
	})
	victim := n3
	if leader == n3 {
		victim = nodes[1]
	}
	for _, sender := range []string{"n1", "n2", "n3", "n4"} {
		if sender == victim.ID() {
			continue
		}
		peer := api.NewPeerClient(conn(t, leader.GRPCAddr(), tlsCreds(t, files(p.dir, sender)), ""))
		_, err := peer.MetaApply(ctx, &api.MetaApplyRequest{Command: leaveCommand(t, victim.ID())})
		wantCode(t, "leave of "+victim.ID()+" forwarded with "+sender+"'s certificate", err, codes.PermissionDenied)
	}
	for _, n := range nodes {
		if !n.Meta().Ring().Contains(victim.ID()) || !inRaft(t, leader, victim.ID()) {
			t.Fatalf("%s left after refused leaves (ring of %s: %v)", victim.ID(), n.ID(), n.Meta().Ring().Members())
		}
	}
	// A malformed leave is refused too (the leader's decoding).
	peer := api.NewPeerClient(conn(t, leader.GRPCAddr(), tlsCreds(t, files(p.dir, "n4")), ""))
	if _, err := peer.MetaApply(ctx, &api.MetaApplyRequest{Command: []byte{1, 6, '{'}}); err == nil {
		t.Error("a malformed leave was applied")
	}

	// The operator's way: Drain on the victim, whose own leave passes.
	c := dial(t, victim, client.Config{TLS: files(p.dir, "app")})
	if _, err := c.Drain(ctx, victim.GRPCAddr(), false, nil); err != nil {
		t.Fatalf("drain of %s: %v", victim.ID(), err)
	}
	testutil.WaitFor(t, victim.ID()+" out of the ring and raft", func() bool {
		return !leader.Meta().Ring().Contains(victim.ID()) && !inRaft(t, leader, victim.ID())
	})
}
