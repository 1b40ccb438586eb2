package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
)

// TestSettingsCompareAndSet: two admins read the same settings version
// and change the settings conditionally through different nodes: the
// first wins, the second gets FailedPrecondition and changes nothing; an
// unconditional change still wins whole. A conditional command that the
// leader refuses after a follower forwarded it comes back to the
// follower as meta.ErrSettingsVersion at once (not retried as "not the
// leader" until the deadline).
func TestSettingsCompareAndSet(t *testing.T) {
	nodes := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	admins := make([]api.AdminClient, len(nodes))
	for i, nd := range nodes {
		cc, err := grpc.NewClient(nd.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		admins[i] = api.NewAdminClient(cc)
	}
	got, err := admins[0].GetSettings(ctx, &api.GetSettingsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	v := got.Version
	for i, nd := range nodes {
		// Everyone has applied the same settings (the defaults): a node
		// that lags would catch up first anyway.
		if _, nv := nd.Meta().WaitSettingsVersion(ctx, v); nv != v {
			t.Fatalf("n%d at settings version %d, want %d", i+1, nv, v)
		}
	}

	// Admin 1 through n2, admin 2 through n3, both from version v.
	resp, err := admins[1].SetSettings(ctx, &api.SetSettingsRequest{ReplicationFactor: 2, WriteQuorum: 1, ExpectedVersion: &v})
	if err != nil {
		t.Fatalf("first conditional change: %v", err)
	}
	if resp.Version <= v || resp.Settings.ReplicationFactor != 2 || resp.Settings.WriteQuorum != 1 {
		t.Fatalf("first change answered %v", resp)
	}
	_, err = admins[2].SetSettings(ctx, &api.SetSettingsRequest{Codec: "int8", ExpectedVersion: &v})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second conditional change: %v, want FailedPrecondition", err)
	}
	want := meta.Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: meta.DefaultSettings().Codec}
	for i, nd := range nodes {
		if s, nv := nd.Meta().WaitSettingsVersion(ctx, resp.Version); s != want || nv != resp.Version {
			t.Fatalf("n%d holds %+v at %d, want %+v at %d", i+1, s, nv, want, resp.Version)
		}
	}

	// A version no node holds yet, through a follower's meta: the leader
	// refuses the forwarded command, and the follower learns why.
	var follower *node.Node
	for _, nd := range nodes {
		if !nd.Meta().IsLeader() {
			follower = nd
			break
		}
	}
	// Its own deadline, far below the test's: a forward retried as "not
	// the leader" would end in it, not in ErrSettingsVersion.
	future := resp.Version + 1000
	fctx, fcancel := context.WithTimeout(ctx, 15*time.Second)
	err = follower.Meta().SetSettings(fctx, meta.DefaultSettings(), meta.AtVersion(future))
	fcancel()
	if !errors.Is(err, meta.ErrSettingsVersion) {
		t.Fatalf("forwarded stale change: %v, want ErrSettingsVersion at once", err)
	}

	// Unconditional: the last writer wins, as before.
	if _, err := admins[2].SetSettings(ctx, &api.SetSettingsRequest{Codec: "int8"}); err != nil {
		t.Fatal(err)
	}
	got, err = admins[2].GetSettings(ctx, &api.GetSettingsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Settings.Codec != "int8" || got.Version <= resp.Version {
		t.Fatalf("after the unconditional change: %v", got)
	}
}

// TestSettingsPartialChangesKeepEachOther: two admins change different
// fields through different nodes at once, without versions. Each request
// is merged into the settings its node holds, which may lag a change
// committed through the other node; the commit is conditional on the
// settings merged from, so neither admin's field is reverted: the end
// state has the last value each admin set.
func TestSettingsPartialChangesKeepEachOther(t *testing.T) {
	nodes := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	admin := func(nd *node.Node) api.AdminClient {
		cc, err := grpc.NewClient(nd.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return api.NewAdminClient(cc)
	}
	codecs, quorums := admin(nodes[1]), admin(nodes[2])
	const rounds = 6
	type result struct {
		version uint64 // of the admin's last change
		err     error
	}
	results := make(chan result, 2)
	change := func(ac api.AdminClient, req func(i int) *api.SetSettingsRequest) {
		var last uint64
		for i := range rounds {
			resp, err := ac.SetSettings(ctx, req(i))
			if err != nil {
				results <- result{err: err}
				return
			}
			last = resp.Version
		}
		results <- result{version: last}
	}
	go change(codecs, func(i int) *api.SetSettingsRequest {
		return &api.SetSettingsRequest{Codec: []string{"raw", "lossless"}[i%2]}
	})
	go change(quorums, func(i int) *api.SetSettingsRequest {
		return &api.SetSettingsRequest{ReplicationFactor: 3, WriteQuorum: uint32(1 + i%2)}
	})
	// Each node's settings at the later of the two last changes.
	var final uint64
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		final = max(final, r.version)
	}
	for i, nd := range nodes {
		if s, _ := nd.Meta().WaitSettingsVersion(ctx, final); s.ReplicationFactor != 3 || s.WriteQuorum != 2 || s.Codec.String() != "lossless" {
			t.Fatalf("n%d holds %+v, want R=3 W=2 codec lossless", i+1, s)
		}
	}
}
