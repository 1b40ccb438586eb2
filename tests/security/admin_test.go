package security_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// conn dials addr with creds and, if token is set, the token.
func conn(t *testing.T, addr string, creds credentials.TransportCredentials, token string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec()))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(auth.TokenCredentials(token, false)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// cluster3 starts n1 (bootstrap) and n2, n3 joining it with cfg's
// settings, and waits until all three are in the ring.
func cluster3(t *testing.T, p pki, mod func(*node.Config)) []*node.Node {
	t.Helper()
	return nodetest.Start(t, 3, nodetest.Config{Join: true, Node: func(i int, cfg *node.Config) {
		cfg.Insecure, cfg.TLS = false, files(p.dir, cfg.NodeID)
		// Calls between members (a gossip key step on each, which
		// syncs a keyring file; forwarded raft writes) get more than
		// nodetest's 3 s: a loaded 2-core machine exceeds that.
		cfg.RPCTimeout = 15 * time.Second
		if mod != nil {
			mod(cfg)
		}
	}}).Nodes
}

// TestTokenAPI: an admin token creates a token over the Admin API (its
// secret returned once, only its hash stored through raft), lists tokens
// without secrets, cannot grant beyond itself, and revokes a token, which
// every node then refuses as soon as it has applied the delete.
func TestTokenAPI(t *testing.T) {
	p := newPKI(t)
	nodes := cluster3(t, p, func(c *node.Config) { c.Tokens = true })
	n1, n3 := nodes[0], nodes[2]
	root := newToken(t, n1, "root", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin, nil)
	creds := tlsCreds(t, files(p.dir, "app"))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	admin := api.NewAdminClient(conn(t, n1.GRPCAddr(), creds, root))

	resp, err := admin.CreateToken(ctx, &api.CreateTokenRequest{Name: "reader", Scopes: "read", TtlSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := auth.ParseToken(resp.Token)
	if err != nil {
		t.Fatalf("created token %q: %v", resp.Token, err)
	}
	if resp.Info.Id != tok.ID || resp.Info.Scopes != "read" || resp.Info.Expires == 0 {
		t.Errorf("info %+v", resp.Info)
	}
	// Only a salted hash is stored: the record holds no secret.
	var rec auth.Record
	testutil.WaitFor(t, "the token's record on n3", func() bool {
		rec, err = n3.Meta().LookupToken(ctx, tok.ID)
		return err == nil
	})
	stored, _ := json.Marshal(rec)
	secret := resp.Token[strings.IndexByte(resp.Token, '.')+1:]
	if bytes.Contains(stored, []byte(secret)) || !rec.Matches(tok) {
		t.Errorf("stored record %s: holds the secret or does not match it", stored)
	}

	list, err := api.NewAdminClient(conn(t, n3.GRPCAddr(), creds, root)).ListTokens(ctx, &api.ListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list.Tokens, func(ti *api.TokenInfo) bool { return ti.Id == tok.ID && ti.Name == "reader" }) {
		t.Errorf("list lacks the new token: %v", list.Tokens)
	}

	// The new token reads on every node, and is no admin.
	for _, n := range nodes {
		testutil.WaitFor(t, "the token works on "+n.ID(), func() bool { return call(t, n.GRPCAddr(), creds, resp.Token, false) == nil })
	}
	_, err = api.NewAdminClient(conn(t, n1.GRPCAddr(), creds, resp.Token)).CreateToken(ctx, &api.CreateTokenRequest{Scopes: "read"})
	wantCode(t, "a read token creates a token", err, codes.PermissionDenied)

	// A namespaced admin grants only inside its namespace and scopes.
	nsAdmin := newToken(t, n1, "ns-admin", auth.ScopeRead|auth.ScopeAdmin, auth.Namespace{"ab"})
	na := api.NewAdminClient(conn(t, n1.GRPCAddr(), creds, nsAdmin))
	for _, bad := range []*api.CreateTokenRequest{
		{Scopes: "read", Namespace: []string{"cd"}},
		{Scopes: "read", Namespace: []string{"a"}},
		{Scopes: "read,write"},
	} {
		_, err := na.CreateToken(ctx, bad)
		wantCode(t, "namespaced admin grants "+bad.String(), err, codes.PermissionDenied)
	}
	sub, err := na.CreateToken(ctx, &api.CreateTokenRequest{Scopes: "read"})
	if err != nil || !slices.Equal(sub.GetInfo().GetNamespace(), []string{"ab"}) {
		t.Errorf("namespaced admin's token inherits its namespace: %v %v", sub.GetInfo(), err)
	}
	_, err = na.RevokeToken(ctx, &api.RevokeTokenRequest{Id: tok.ID})
	// As if it did not exist: token IDs outside a namespace cannot be probed.
	wantCode(t, "namespaced admin revokes an unrestricted token", err, codes.NotFound)
	for _, bad := range []*api.CreateTokenRequest{{}, {Scopes: "peer"}, {Scopes: "read", TtlSeconds: -1}, {Scopes: "read", Namespace: []string{"xyz"}}} {
		_, err := admin.CreateToken(ctx, bad)
		wantCode(t, "create "+bad.String(), err, codes.InvalidArgument)
	}
	_, err = admin.RevokeToken(ctx, &api.RevokeTokenRequest{Id: "not-an-id"})
	wantCode(t, "revoke a malformed ID", err, codes.InvalidArgument)

	// Revoke through n3: n3 refuses at once, and each node refuses the
	// token as soon as it has applied the delete.
	if _, err := api.NewAdminClient(conn(t, n3.GRPCAddr(), creds, root)).RevokeToken(ctx, &api.RevokeTokenRequest{Id: tok.ID}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "revoked token on the revoking node", call(t, n3.GRPCAddr(), creds, resp.Token, false), codes.Unauthenticated)
	for _, n := range nodes {
		testutil.WaitFor(t, "the delete applied on "+n.ID(), func() bool {
			_, err := n.Meta().LookupToken(ctx, tok.ID)
			return errors.Is(err, auth.ErrUnknownToken)
		})
		wantCode(t, "revoked token on "+n.ID(), call(t, n.GRPCAddr(), creds, resp.Token, false), codes.Unauthenticated)
	}
	list, err = admin.ListTokens(ctx, &api.ListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(list.Tokens, func(ti *api.TokenInfo) bool { return ti.Id == tok.ID }) {
		t.Error("revoked token still listed")
	}
}

// TestGossipKeyRotationLive rotates a running 3-node cluster's gossip key
// over the Admin API (install, use, remove on every member), checks the
// steps that would break the cluster are refused without changing
// anything, that a node's keyring file follows, and then that a node with
// only the old key cannot join while one with the new key can.
func TestGossipKeyRotationLive(t *testing.T) {
	p := newPKI(t)
	if _, err := tlsconf.GenerateFiles(p.dir, tlsconf.CertRequest{Name: "n5", Hosts: []string{"127.0.0.1"}, Usage: tlsconf.UsageNode}); err != nil {
		t.Fatal(err)
	}
	oldKey, err := gossipkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := gossipkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	keyring := func(t *testing.T, k []byte) *memberlist.Keyring {
		kr, err := gossipkey.NewKeyring(k, nil)
		if err != nil {
			t.Fatal(err)
		}
		return kr
	}
	keyFile := filepath.Join(t.TempDir(), "gossip.keys")
	if err := gossipkey.WriteFile(keyFile, oldKey); err != nil {
		t.Fatal(err)
	}
	nodes := cluster3(t, p, func(c *node.Config) {
		kr, err := gossipkey.LoadFile(keyFile)
		if err != nil {
			t.Fatal(err)
		}
		c.GossipKeyring = kr
		if c.NodeID == "n1" {
			c.GossipKeyringFile = keyFile
		}
	})
	n1 := nodes[0]
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// Tokens are off: the client certificate is the authorisation.
	admin := api.NewAdminClient(conn(t, nodes[1].GRPCAddr(), tlsCreds(t, files(p.dir, "app")), ""))
	// step applies a rotation step until all three members report it done,
	// as an operator would: a step reaches the members n2's gossip holds
	// alive at that moment, each within the RPC timeout, and on a loaded
	// machine gossip may hold a member failed for a moment or a member may
	// answer late. Steps are idempotent (installing a key held, using the
	// primary, removing a key gone), so repeating one is safe; a step
	// that never succeeds fails the test with its last answer.
	step := func(op api.GossipKeyOp, key []byte) *api.GossipKeysResponse {
		t.Helper()
		var resp *api.GossipKeysResponse
		var err error
		deadline := time.Now().Add(time.Minute)
		for {
			resp, err = admin.GossipKeys(ctx, &api.GossipKeyRequest{Op: op, Key: key})
			if err == nil && resp.Failed == 0 && len(resp.Nodes) == 3 {
				return resp
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%v: %v", op, err)
		}
		t.Fatalf("%v: %d failed of %v", op, resp.Failed, resp.Nodes)
		return nil
	}
	// The ring is agreed through Raft; gossip may still be spreading the
	// third member to the node we ask, and key operations reach only the
	// members it knows.
	before := listKeys(t, ctx, admin, 3)
	oldFP := before.Nodes[0].Primary
	for _, r := range before.Nodes {
		if r.Primary != oldFP || len(r.Keys) != 1 {
			t.Fatalf("before rotation: %v", before.Nodes)
		}
	}

	_, err = admin.GossipKeys(ctx, &api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_USE, Key: newKey})
	wantCode(t, "use a key no member has", err, codes.Aborted)
	_, err = admin.GossipKeys(ctx, &api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE, Key: oldKey})
	wantCode(t, "remove the primary key", err, codes.Aborted)
	_, err = admin.GossipKeys(ctx, &api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_INSTALL, Key: []byte("short")})
	wantCode(t, "install a malformed key", err, codes.InvalidArgument)

	installed := step(api.GossipKeyOp_GOSSIP_KEY_OP_INSTALL, newKey)
	var newFP string
	for _, r := range installed.Nodes {
		if r.Primary != oldFP || len(r.Keys) != 2 {
			t.Fatalf("after install: %v", installed.Nodes)
		}
		newFP = r.Keys[slices.IndexFunc(r.Keys, func(k string) bool { return k != oldFP })]
	}
	used := step(api.GossipKeyOp_GOSSIP_KEY_OP_USE, newKey)
	for _, r := range used.Nodes {
		if r.Primary != newFP {
			t.Fatalf("after use: %v", used.Nodes)
		}
	}
	_, err = admin.GossipKeys(ctx, &api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE, Key: newKey})
	wantCode(t, "remove the new primary key", err, codes.Aborted)
	removed := step(api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE, oldKey)
	for _, r := range removed.Nodes {
		if r.Primary != newFP || !slices.Equal(r.Keys, []string{newFP}) {
			t.Fatalf("after remove: %v", removed.Nodes)
		}
	}
	// n1's keyring file now holds the new key alone.
	primary, all, err := gossipkey.ParseKeyring(mustRead(t, keyFile))
	if err != nil || !bytes.Equal(primary, newKey) || len(all) != 1 {
		t.Fatalf("n1's keyring file after rotation: %d keys, primary new %v, err %v", len(all), bytes.Equal(primary, newKey), err)
	}

	// A node holding only the old key cannot join; one with the new key
	// (started after it) does, through the same seed.
	seeds := []string{n1.GossipAddr()}
	oc := nodetest.NodeConfig(t, "n4", seeds)
	oc.TLS, oc.GossipKeyring = files(p.dir, "n4"), keyring(t, oldKey)
	nodetest.StartNode(t, oc)
	nc := nodetest.NodeConfig(t, "n5", seeds)
	nc.TLS, nc.GossipKeyring = files(p.dir, "n5"), keyring(t, newKey)
	n5 := nodetest.StartNode(t, nc)
	testutil.WaitFor(t, "n5 in the ring", func() bool { return n5.Ready() == nil && n1.Meta().Ring().Contains("n5") })
	if n1.Meta().Ring().Contains("n4") || inRaft(t, n1, "n4") {
		t.Error("n4 joined with the old gossip key")
	}
	after := listKeys(t, ctx, admin, 4)
	if slices.ContainsFunc(after.Nodes, func(r *api.GossipKeyNodeResult) bool { return r.NodeId == "n4" }) {
		t.Error("n4 is a gossip member")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func randSource(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

// putStream sends blob as key in one Put or Replicate stream with hdr
// (Key and BlobBytes filled in) and returns the answer's error.
func putStream(ctx context.Context, open func(context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[api.PutFrame, api.PutResponse], error),
	key chunk.Key, blob []byte, hdr *api.PutHeader) error {
	st, err := open(ctx)
	if err != nil {
		return err
	}
	hdr.Key, hdr.BlobBytes = api.ProtoKey(key), uint64(len(blob))
	if err := api.SendHeader(st, hdr); err == nil {
		_ = api.SendBody(st, mem.SliceBuffer(blob), api.DefaultFrameBytes)
	}
	_, err = st.CloseAndRecv()
	return err
}

// listKeys waits until want gossip members list their keys through admin.
func listKeys(t *testing.T, ctx context.Context, admin api.AdminClient, want int) *api.GossipKeysResponse {
	t.Helper()
	var resp *api.GossipKeysResponse
	testutil.WaitFor(t, fmt.Sprintf("%d members list their keys", want), func() bool {
		r, err := admin.GossipKeys(ctx, &api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_LIST})
		if err != nil || r.Failed != 0 || len(r.Nodes) != want {
			return false
		}
		resp = r
		return true
	})
	return resp
}

// TestPeerAPINeedsNodeCertificate: a client certificate of the cluster CA,
// even with an admin token, can call none of the peer RPCs, nor the
// direct (this node only) forms of Put and Delete that replication uses;
// nothing is stored or deleted. A node certificate can.
func TestPeerAPINeedsNodeCertificate(t *testing.T) {
	p := newPKI(t)
	n1 := startSecureNode(t, p, nil)
	root := newToken(t, n1, "root", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s := spec(2)
	ops := dial(t, n1, client.Config{TLS: files(p.dir, "app"), Token: root})
	if _, err := ops.RegisterModel(ctx, s); err != nil {
		t.Fatal(err)
	}
	key, blob := testutil.StandaloneBlob(t, randSource(7), s, 4)
	if _, err := ops.Put(ctx, blob); err != nil {
		t.Fatal(err)
	}
	other, otherBlob := testutil.StandaloneBlob(t, randSource(8), s, 4)

	app := conn(t, n1.GRPCAddr(), tlsCreds(t, files(p.dir, "app")), root)
	peer, cl := api.NewPeerClient(app), api.NewClientClient(app)
	pkey := api.ProtoKey(key)
	refused := map[string]func() error{
		"Peer.Digest": func() error { _, err := peer.Digest(ctx, &api.DigestRequest{}); return err },
		"Peer.Delete": func() error { _, err := peer.Delete(ctx, &api.DeleteRequest{Key: pkey, Direct: true}); return err },
		"Peer.MetaApply": func() error {
			_, err := peer.MetaApply(ctx, &api.MetaApplyRequest{Command: []byte("{}")})
			return err
		},
		"Peer.GossipKey": func() error {
			_, err := peer.GossipKey(ctx, &api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_LIST})
			return err
		},
		"Peer.Fetch": func() error {
			st, err := peer.Fetch(ctx, &api.GetRequest{Key: pkey, Direct: true})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		},
		"Peer.FetchMany": func() error {
			st, err := peer.FetchMany(ctx, &api.FetchManyRequest{Keys: []*api.Key{pkey}})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		},
		"Peer.Replicate": func() error {
			return putStream(ctx, peer.Replicate, other, otherBlob, &api.PutHeader{Direct: true, Kind: 1})
		},
		"Client.Put direct": func() error {
			return putStream(ctx, cl.Put, other, otherBlob, &api.PutHeader{Direct: true})
		},
		"Client.Put with a time": func() error {
			return putStream(ctx, cl.Put, other, otherBlob, &api.PutHeader{At: time.Now().Add(time.Hour).UnixNano()})
		},
		"Client.Delete direct": func() error {
			_, err := cl.Delete(ctx, &api.DeleteRequest{Key: pkey, Direct: true})
			return err
		},
		"Client.Delete in the future": func() error {
			_, err := cl.Delete(ctx, &api.DeleteRequest{Key: pkey, At: time.Now().Add(time.Hour).UnixNano()})
			return err
		},
	}
	for name, f := range refused {
		wantCode(t, name+" with a client certificate", f(), codes.PermissionDenied)
	}
	// Nothing was deleted or stored.
	if _, err := ops.Get(ctx, key); err != nil {
		t.Errorf("the entry after the refused deletes: %v", err)
	}
	if _, err := ops.Get(ctx, other); err == nil {
		t.Error("a refused put stored its entry")
	}

	// A node certificate may (here n2's, not a member: the peer API
	// trusts the certificate's role, raft membership is separate).
	nodeConn := conn(t, n1.GRPCAddr(), tlsCreds(t, files(p.dir, "n2")), "")
	if _, err := api.NewPeerClient(nodeConn).Digest(ctx, &api.DigestRequest{}); err != nil {
		t.Errorf("Digest with a node certificate: %v", err)
	}
}
