// Package security_test checks kvmesh's transport security and
// authorisation end to end: in-process nodes serving real gRPC and raft
// over loopback with mutual TLS, API tokens and encrypted gossip, and
// clients and nodes that must be refused.
package security_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/daemon"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// pki is a cluster CA with node certificates n1..n4 and client
// certificate "app", and another CA with node "rogue" and client "stranger".
type pki struct{ dir, other string }

func newPKI(t testing.TB) pki {
	t.Helper()
	p := pki{dir: filepath.Join(t.TempDir(), "pki"), other: filepath.Join(t.TempDir(), "other")}
	var reqs []tlsconf.CertRequest
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		reqs = append(reqs, tlsconf.CertRequest{Name: n, Hosts: []string{"127.0.0.1"}, Usage: tlsconf.UsageNode})
	}
	reqs = append(reqs, tlsconf.CertRequest{Name: "app", Usage: tlsconf.UsageClient})
	for dir, rs := range map[string][]tlsconf.CertRequest{
		p.dir: reqs,
		p.other: {{Name: "rogue", Hosts: []string{"127.0.0.1"}, Usage: tlsconf.UsageNode},
			{Name: "stranger", Usage: tlsconf.UsageClient}},
	} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := tlsconf.GenerateFiles(dir, rs...); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// files is the identity name of the CA in dir.
func files(dir, name string) tlsconf.Config {
	return tlsconf.Config{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, name+".pem"),
		KeyFile: filepath.Join(dir, name+"-key.pem"), Logger: quiet()}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startSecureNode starts node n1 of p's CA with TLS and tokens (mod, if
// set, changes the config first) and waits until it is ready.
func startSecureNode(t *testing.T, p pki, mod func(*node.Config)) *node.Node {
	t.Helper()
	cfg := nodetest.NodeConfig(t, "n1", nil)
	cfg.TLS, cfg.Tokens = files(p.dir, "n1"), true
	if mod != nil {
		mod(&cfg)
	}
	n := nodetest.StartNode(t, cfg)
	testutil.WaitFor(t, "n1 ready", func() bool { return n.Ready() == nil })
	return n
}

// inRaft reports whether id is in n's raft configuration.
func inRaft(t *testing.T, n *node.Node, id string) bool {
	servers, err := n.Meta().Servers()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(servers, func(s meta.Server) bool { return s.ID == id })
}

// call makes one ClusterInfo (or, peer set, Digest) call to addr with
// creds and returns its error.
func call(t *testing.T, addr string, creds credentials.TransportCredentials, token string, peer bool) error {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec()))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(auth.TokenCredentials(token, true)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if peer {
		_, err = api.NewPeerClient(cc).Digest(ctx, &api.DigestRequest{})
		return err
	}
	_, err = api.NewClientClient(cc).ClusterInfo(ctx, &api.ClusterInfoRequest{})
	return err
}

func tlsCreds(t *testing.T, cfg tlsconf.Config) credentials.TransportCredentials {
	t.Helper()
	tl, err := tlsconf.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tl.ClientCredentials()
}

func spec(layers int) chunk.ModelSpec {
	s := testutil.Spec()
	s.Layers = layers
	return s
}

func newToken(t *testing.T, n *node.Node, name string, scopes auth.Scope, ns auth.Namespace) string {
	t.Helper()
	tok, rec, err := auth.NewToken(name, scopes, ns, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// A raft write, perhaps forwarded or waiting out an election.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := n.Meta().PutToken(ctx, rec); err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

func dial(t *testing.T, n *node.Node, cfg client.Config) *client.Client {
	t.Helper()
	cfg.Seeds, cfg.Logger, cfg.Attempts = []string{n.GRPCAddr()}, quiet(), 1
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v (code %v), want %v", what, err, got, want)
	}
}

// TestNoTLSRefused: a node with neither TLS files nor Insecure does not
// start, in process or as kvmeshd.
func TestNoTLSRefused(t *testing.T) {
	cfg := nodetest.NodeConfig(t, "n1", nil)
	if _, err := node.New(cfg); !errors.Is(err, node.ErrNoTLS) {
		t.Fatalf("New without TLS: %v, want ErrNoTLS", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := daemon.Run(ctx, []string{"-id", "d1", "-data-dir", t.TempDir(), "-bootstrap", "-grpc", "127.0.0.1:0", "-log-level", "error"}, io.Discard, io.Discard)
	if !errors.Is(err, node.ErrNoTLS) {
		t.Fatalf("kvmeshd without TLS: %v, want ErrNoTLS", err)
	}
	cfg.Insecure, cfg.TLS = true, files(t.TempDir(), "n1")
	if _, err := node.New(cfg); err == nil {
		t.Fatal("New with Insecure and TLS files succeeded")
	}
}

// TestClientAccess: a TLS node with tokens refuses clients without a
// certificate of its CA, without a valid token, or with a token lacking
// the scope or namespace, and serves the others.
func TestClientAccess(t *testing.T) {
	p := newPKI(t)
	const maxChunks = 16
	n1 := startSecureNode(t, p, func(c *node.Config) { c.MaxChunksPerRequest = maxChunks })
	addr := n1.GRPCAddr()

	specA, specB := spec(2), spec(3)
	fpA, fpB := specA.Fingerprint(), specB.Fingerprint()
	nsA := auth.Namespace{fpA.String()[:16]}
	if strings.HasPrefix(fpB.String(), nsA[0]) {
		t.Fatal("test models share a fingerprint prefix")
	}
	admin := newToken(t, n1, "ops", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin, nil)
	reader := newToken(t, n1, "reader", auth.ScopeRead, nil)
	tenantA := newToken(t, n1, "tenant-a", auth.ScopeRead|auth.ScopeWrite, nsA)
	id, _, _ := strings.Cut(reader, ".")
	_, secret, _ := strings.Cut(admin, ".")
	forged := id + "." + secret

	app := files(p.dir, "app")
	appCreds := tlsCreds(t, app)
	// Transport and token checks, one raw call each.
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(app.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	noCert := credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		token string
		peer  bool
		want  codes.Code
	}{
		{"plaintext", insecure.NewCredentials(), admin, false, codes.Unavailable},
		{"no client certificate", noCert, admin, false, codes.Unavailable},
		{"certificate of another CA", tlsCreds(t, files(p.other, "stranger")), admin, false, codes.Unavailable},
		{"node certificate of another CA", tlsCreds(t, files(p.other, "rogue")), "", false, codes.Unavailable},
		{"no token", appCreds, "", false, codes.Unauthenticated},
		{"malformed token", appCreds, "not-a-token", false, codes.Unauthenticated},
		{"forged secret", appCreds, forged, false, codes.Unauthenticated},
		{"read token", appCreds, reader, false, codes.OK},
		{"client calls the peer API", appCreds, admin, true, codes.PermissionDenied},
		{"node certificate calls the peer API", tlsCreds(t, files(p.dir, "n2")), "", true, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := call(t, addr, tc.creds, tc.token, tc.peer)
			if tc.want == codes.Unavailable {
				// Refused in the handshake: any failure, but never OK.
				if err == nil {
					t.Fatal("call succeeded")
				}
				return
			}
			wantCode(t, tc.name, err, tc.want)
		})
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	ops := dial(t, n1, client.Config{TLS: app, Token: admin})
	for _, s := range []chunk.ModelSpec{specA, specB} {
		if _, err := ops.RegisterModel(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	keyA, blobA := testutil.StandaloneBlob(t, rng, specA, 4)
	keyB, blobB := testutil.StandaloneBlob(t, rng, specB, 4)
	for _, b := range [][]byte{blobA, blobB} {
		if _, err := ops.Put(ctx, b); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("read token cannot write", func(t *testing.T) {
		c := dial(t, n1, client.Config{TLS: app, Token: reader})
		if _, err := c.Get(ctx, keyA); err != nil {
			t.Fatalf("get: %v", err)
		}
		_, err := c.Put(ctx, blobA)
		wantCode(t, "put", err, codes.PermissionDenied)
		_, err = c.Delete(ctx, keyA)
		wantCode(t, "delete", err, codes.PermissionDenied)
		_, err = c.RegisterModel(ctx, spec(4))
		wantCode(t, "register", err, codes.PermissionDenied)
	})
	t.Run("namespace A cannot touch B", func(t *testing.T) {
		c := dial(t, n1, client.Config{TLS: app, Token: tenantA})
		if got, err := c.Get(ctx, keyA); err != nil || len(got) != len(blobA) {
			t.Fatalf("get A: %d bytes, %v", len(got), err)
		}
		if _, err := c.Put(ctx, blobA); err != nil {
			t.Fatalf("put A: %v", err)
		}
		_, err := c.Get(ctx, keyB)
		wantCode(t, "get B", err, codes.PermissionDenied)
		_, err = c.Put(ctx, blobB)
		wantCode(t, "put B", err, codes.PermissionDenied)
		_, err = c.Lookup(ctx, fpB, []client.LookupItem{{Content: keyB.Content, Want: keyB.Context}})
		wantCode(t, "lookup B", err, codes.PermissionDenied)
		_, err = c.Delete(ctx, keyB)
		wantCode(t, "delete B", err, codes.PermissionDenied)
		_, err = c.RegisterModel(ctx, specB)
		wantCode(t, "register B", err, codes.PermissionDenied)
		// Models lists only what the namespace holds; an unrestricted
		// token lists both.
		for _, tc := range []struct {
			c    *client.Client
			want []chunk.Fingerprint
		}{{c, []chunk.Fingerprint{fpA}}, {ops, []chunk.Fingerprint{fpA, fpB}}} {
			specs, err := tc.c.Models(ctx)
			if err != nil {
				t.Fatalf("models: %v", err)
			}
			var got []chunk.Fingerprint
			for _, s := range specs {
				got = append(got, s.Fingerprint())
			}
			slices.SortFunc(got, func(a, b chunk.Fingerprint) int { return strings.Compare(a.String(), b.String()) })
			slices.SortFunc(tc.want, func(a, b chunk.Fingerprint) int { return strings.Compare(a.String(), b.String()) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("models: %v, want %v", got, tc.want)
			}
		}
	})
	t.Run("chunks per request", func(t *testing.T) {
		// The client splits lookups at node.MaxLookupBatch; this node's
		// own limit is lower.
		items := make([]client.LookupItem, maxChunks+1)
		for i := range items {
			items[i] = client.LookupItem{Content: keyA.Content, Want: keyA.Context}
		}
		_, err := ops.Lookup(ctx, fpA, items)
		wantCode(t, "lookup", err, codes.ResourceExhausted)
	})
}

// TestNodeNeedsNodeCertificate: a node holding only a client certificate
// of the cluster CA does not start (node.ErrCertRole, the rule a reload
// applies too); one holding a node certificate of another CA is kept out
// of raft and the ring, and neither certificate can use the peer API; a
// node with a proper certificate joins. That peers refuse a client
// certificate on Raft as well (a node built without the start check) is
// meta's TestRaftStreamLayer ("client cert of the cluster").
func TestNodeNeedsNodeCertificate(t *testing.T) {
	p := newPKI(t)
	app := nodetest.NodeConfig(t, "app", nil)
	app.TLS = files(p.dir, "app")
	if n, err := node.New(app); !errors.Is(err, node.ErrCertRole) {
		if n != nil {
			_ = n.Close()
		}
		t.Fatalf("node.New with a client certificate: %v, want ErrCertRole", err)
	}
	var out strings.Builder
	err := daemon.Run(t.Context(), []string{"-id", "app", "-data-dir", t.TempDir(), "-bootstrap", "-grpc", "127.0.0.1:0", "-http", "off", "-log-level", "error",
		"-tls-ca", app.TLS.CAFile, "-tls-cert", app.TLS.CertFile, "-tls-key", app.TLS.KeyFile}, &out, io.Discard)
	if !errors.Is(err, node.ErrCertRole) || out.Len() != 0 {
		t.Fatalf("kvmeshd with a client certificate: %v (printed %q), want ErrCertRole before it listens", err, out.String())
	}

	cfg := nodetest.NodeConfig(t, "n1", nil)
	cfg.TLS = files(p.dir, "n1")
	n1 := nodetest.StartNode(t, cfg)
	testutil.WaitFor(t, "n1 ready", func() bool { return n1.Ready() == nil })
	seeds := []string{n1.GossipAddr()}

	rogue := nodetest.NodeConfig(t, "rogue", seeds)
	rogue.TLS = files(p.other, "rogue") // a node certificate of another CA
	nodetest.StartNode(t, rogue)
	good := nodetest.NodeConfig(t, "n2", seeds)
	good.TLS = files(p.dir, "n2")
	n2 := nodetest.StartNode(t, good)
	testutil.WaitFor(t, "n2 in the ring", func() bool { return n2.Ready() == nil && n1.Meta().Ring().Contains("n2") })
	testutil.WaitFor(t, "the impostor refused", func() bool { return n1.Meta().Stats().Refused >= 1 })
	if n1.Meta().Ring().Contains("rogue") || inRaft(t, n1, "rogue") {
		t.Error("rogue joined")
	}
	if !inRaft(t, n1, "n2") {
		t.Error("n2 not in raft")
	}
	// The peer API: the rogue's handshake fails, the client certificate
	// lacks the peer scope.
	if err := call(t, n1.GRPCAddr(), tlsCreds(t, files(p.other, "rogue")), "", true); err == nil {
		t.Error("rogue node called Digest")
	}
	err = call(t, n1.GRPCAddr(), tlsCreds(t, files(p.dir, "app")), "", true)
	wantCode(t, "client certificate calls Digest", err, codes.PermissionDenied)

	// The members' own traffic runs over TLS: a model registered through
	// n2 (forwarded to the leader), an entry written through n1
	// (replicated to n2) and read back from n2 alone.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c2 := dial(t, n2, client.Config{TLS: files(p.dir, "app")})
	s := spec(2)
	if _, err := c2.RegisterModel(ctx, s); err != nil {
		t.Fatal(err)
	}
	key, blob := testutil.StandaloneBlob(t, rand.New(rand.NewPCG(3, 4)), s, 4)
	c1 := dial(t, n1, client.Config{TLS: files(p.dir, "app")})
	testutil.WaitFor(t, "the model on n1", func() bool { _, err := c1.Put(ctx, blob); return err == nil })
	get := &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_ENTRY, Direct: true}
	cc, err := grpc.NewClient(n2.GRPCAddr(), grpc.WithTransportCredentials(tlsCreds(t, files(p.dir, "app"))),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	testutil.WaitFor(t, "the entry on n2", func() bool {
		st, err := api.NewClientClient(cc).Get(ctx, get)
		if err != nil {
			return false
		}
		_, err = st.Recv()
		return err == nil
	})
}

// TestGossipKeyRequired: a node without the cluster's gossip key cannot
// join; one with it does.
func TestGossipKeyRequired(t *testing.T) {
	keyring := func(t *testing.T) *memberlist.Keyring {
		k, err := gossipkey.Generate()
		if err != nil {
			t.Fatal(err)
		}
		kr, err := gossipkey.NewKeyring(k, nil)
		if err != nil {
			t.Fatal(err)
		}
		return kr
	}
	p := newPKI(t)
	cluster := keyring(t)
	cfg := nodetest.NodeConfig(t, "n1", nil)
	cfg.TLS, cfg.GossipKeyring = files(p.dir, "n1"), cluster
	n1 := nodetest.StartNode(t, cfg)
	testutil.WaitFor(t, "n1 ready", func() bool { return n1.Ready() == nil })
	seeds := []string{n1.GossipAddr()}

	// Valid node certificates, wrong or no gossip key.
	for i, kr := range []*memberlist.Keyring{keyring(t), nil} {
		id := fmt.Sprintf("n%d", i+3)
		bc := nodetest.NodeConfig(t, id, seeds)
		bc.TLS, bc.GossipKeyring = files(p.dir, id), kr
		nodetest.StartNode(t, bc)
	}
	gc := nodetest.NodeConfig(t, "n2", seeds)
	gc.TLS, gc.GossipKeyring = files(p.dir, "n2"), cluster
	n2 := nodetest.StartNode(t, gc)
	testutil.WaitFor(t, "n2 in the ring", func() bool { return n2.Ready() == nil && n1.Meta().Ring().Contains("n2") })
	for _, id := range []string{"n3", "n4"} {
		if n1.Meta().Ring().Contains(id) || inRaft(t, n1, id) {
			t.Errorf("%s joined without the gossip key", id)
		}
	}
}
