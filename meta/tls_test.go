package meta

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// testPKI is a cluster CA with certificates written in a temporary
// directory.
type testPKI struct {
	t   testing.TB
	dir string
	ca  *tlsconf.CA
	caF string
}

func newTestPKI(t testing.TB, name string) *testPKI {
	t.Helper()
	ca, err := tlsconf.GenerateCA(name)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caF, _, err := ca.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{t: t, dir: dir, ca: ca, caF: caF}
}

// tls issues a certificate for name (valid for 127.0.0.1, where the test
// nodes listen) and loads it with this CA.
func (p *testPKI) tls(name string, usage tlsconf.Usage) *tlsconf.TLS {
	p.t.Helper()
	c, err := p.ca.Issue(tlsconf.CertRequest{Name: name, Hosts: []string{"127.0.0.1"}, Usage: usage})
	if err != nil {
		p.t.Fatal(err)
	}
	cf, kf, err := c.WriteFiles(p.dir, name)
	if err != nil {
		p.t.Fatal(err)
	}
	tl, err := tlsconf.New(tlsconf.Config{CAFile: p.caF, CertFile: cf, KeyFile: kf, Logger: testLogger()})
	if err != nil {
		p.t.Fatal(err)
	}
	return tl
}

// rawTransport is a bare raft transport over tl, to speak raft RPCs to a
// node directly, as an intruder would.
func rawTransport(t *testing.T, tl *tlsconf.TLS) *raft.NetworkTransport {
	t.Helper()
	sl, err := newStreamLayer("127.0.0.1:0", nil, tl)
	if err != nil {
		t.Fatal(err)
	}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: sl, MaxPool: 1, Timeout: 5 * time.Second, Logger: hclog.NewNullLogger(),
	})
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// requestVote asks target for its vote in term; an intruder that got
// through with a term above the cluster's would depose the leader.
func requestVote(tr *raft.NetworkTransport, target *Store, term uint64) (*raft.RequestVoteResponse, error) {
	req := &raft.RequestVoteRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte(tr.LocalAddr())},
		Term:      term,
	}
	var resp raft.RequestVoteResponse
	err := tr.RequestVote(raft.ServerID(target.NodeID()), raft.ServerAddress(target.RaftAddr()), req, &resp)
	return &resp, err
}

// TestClusterOverTLS runs a three-node cluster with raft over mutual TLS:
// writes through followers, token records put, deleted and kept across a
// follower's crash and a whole-cluster restart. Peers with a certificate
// of another CA, or a client certificate of the cluster's CA, get no raft
// RPC through; a node with another CA's certificate that gossip lists
// never receives the cluster's state.
func TestClusterOverTLS(t *testing.T) {
	pki := newTestPKI(t, "cluster CA")
	nodeTLS := make(map[string]*tlsconf.TLS)
	for _, id := range ids(3) {
		nodeTLS[id] = pki.tls(id, tlsconf.UsageNode)
	}
	rogue := newTestPKI(t, "rogue CA")
	nodeTLS["n09"] = rogue.tls("n09", tlsconf.UsageNode)

	c := newCluster(t, 3)
	c.tweak = func(cfg *Config) {
		cfg.TLS = nodeTLS[cfg.NodeID]
		if cfg.NodeID == "n09" {
			cfg.BootstrapExpect = 0
		}
	}
	for _, id := range ids(3) {
		c.start(id)
	}
	c.waitAgree(ids(3))
	fp, err := c.follower().RegisterModel(ctxT(t), testSpec(1))
	if err != nil {
		t.Fatal(err)
	}

	// Tokens: put and delete through followers (forwarded to the leader),
	// visible on every node.
	toks := make(map[string]auth.Token)
	var recs []auth.Record
	for _, name := range []string{"ops", "reader", "doomed"} {
		tok, rec := newRecord(t, name, auth.ScopeRead)
		if err := c.follower().PutToken(ctxT(t), rec); err != nil {
			t.Fatal(err)
		}
		toks[rec.ID], recs = tok, append(recs, rec)
	}
	doomed := recs[2].ID
	if err := c.follower().DeleteToken(ctxT(t), doomed); err != nil {
		t.Fatal(err)
	}
	want := []string{recs[0].ID, recs[1].ID}
	slices.Sort(want)
	checkTokens := func(what string, want []string) {
		t.Helper()
		testutil.WaitFor(t, what, func() bool {
			for _, id := range c.running() {
				if !slices.Equal(tokenIDs(c.node(id).Tokens()), want) {
					return false
				}
			}
			return true
		})
		for _, id := range c.running() {
			v := auth.NewVerifier(c.node(id))
			for _, tid := range want {
				if _, err := v.Verify(ctxT(t), toks[tid].String()); err != nil {
					t.Fatalf("%s: token %s on %s: %v", what, tid, id, err)
				}
			}
			if _, err := c.node(id).LookupToken(ctxT(t), doomed); !errors.Is(err, auth.ErrUnknownToken) {
				t.Fatalf("%s: deleted token on %s: %v", what, id, err)
			}
		}
	}
	checkTokens("tokens on every node", want)

	// Intruders: another CA's node certificate, and the cluster CA's
	// client certificate, reach no node's raft. A genuine node
	// certificate does (the control): its stale vote request is answered.
	l := c.leader()
	term := l.Stats().Term
	for name, tl := range map[string]*tlsconf.TLS{
		"other CA":    rogue.tls("rogue-raw", tlsconf.UsageNode),
		"client cert": pki.tls("a-client", tlsconf.UsageClient),
	} {
		tr := rawTransport(t, tl)
		for _, id := range c.running() {
			if _, err := requestVote(tr, c.node(id), term+100); err == nil {
				t.Fatalf("%s: vote request reached %s", name, id)
			}
		}
	}
	good := rawTransport(t, pki.tls("n08", tlsconf.UsageNode))
	if resp, err := requestVote(good, l, 0); err != nil || resp.Granted || resp.Term < term {
		t.Fatalf("node certificate: vote response %+v, %v", resp, err)
	}
	// Had a vote request got through, its term would have been adopted.
	// (The term may still move by an ordinary election on a busy machine.)
	for _, id := range c.running() {
		if got := c.node(id).Stats().Term; got >= term+100 {
			t.Fatalf("%s adopted the intruders' term %d", id, got)
		}
	}
	l = c.leader()

	// A node with another CA's certificate, listed by gossip (it would
	// need the gossip key for that): the leader refuses to add it to raft
	// or the ring, the cluster goes on, and it never receives a byte of
	// the cluster's state.
	// leaderOf3 is the genuine nodes' leader (c.leader wants the intruder
	// to know it too); it may change by an ordinary election.
	leaderOf3 := func() *Store {
		for _, id := range ids(3) {
			if s := c.node(id); s.IsLeader() {
				return s
			}
		}
		return nil
	}
	intruder := c.start("n09")
	testutil.WaitFor(t, "leader to refuse n09", func() bool { l := leaderOf3(); return l != nil && l.Stats().Refused == 1 })
	fp2, err := c.node("n00").RegisterModel(ctxT(t), testSpec(2))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids(3) {
		if _, ok := c.node(id).WaitModel(ctxT(t), fp2); !ok {
			t.Fatalf("%s lacks model 2", id)
		}
	}
	testutil.WaitFor(t, "a genuine leader", func() bool { l = leaderOf3(); return l != nil })
	if v, nv := voters(t, l); !slices.Equal(v, ids(3)) || len(nv) != 0 {
		t.Fatalf("voters %v nonvoters %v with the intruder around", v, nv)
	}
	if slices.Contains(ringIDs(l), "n09") {
		t.Fatal("intruder in the ring")
	}
	if id, _ := intruder.Leader(); id != "" || len(intruder.Models()) != 0 || len(intruder.Tokens()) != 0 || intruder.Ring().Len() != 0 {
		t.Fatalf("intruder got state: leader %q, %d models, %d tokens, ring %d", id, len(intruder.Models()), len(intruder.Tokens()), intruder.Ring().Len())
	}
	c.stop("n09")
	testutil.WaitFor(t, "refusal forgotten", func() bool { l := c.leader(); return l.Stats().Refused == 0 })

	// A follower crashes; a token is put while it is down; it comes back
	// with everything.
	f := c.follower().NodeID()
	c.stop(f)
	tok, rec := newRecord(t, "late", auth.ScopeWrite, "a1b2")
	if err := c.leader().PutToken(ctxT(t), rec); err != nil {
		t.Fatal(err)
	}
	toks[rec.ID] = tok
	want = append(want, rec.ID)
	slices.Sort(want)
	c.start(f)
	checkTokens("tokens after a follower restart", want)

	// The whole cluster restarts, once like a crash (log replay) and once
	// gracefully (snapshot restore).
	for _, graceful := range []bool{false, true} {
		for _, id := range ids(3) {
			c.stopWith(id, graceful)
		}
		for _, id := range ids(3) {
			c.start(id)
		}
		c.leader()
		checkTokens("tokens after a whole-cluster restart", want)
		for _, id := range ids(3) {
			if _, ok := c.node(id).WaitModel(ctxT(t), fp); !ok {
				t.Fatalf("%s lost model 1", id)
			}
		}
	}
}

// TestBootstrapRefusesImpostor: a node with another CA's certificate whose
// ID puts it in the bootstrap set holds the bootstrap up (no node
// bootstraps a configuration with it) until it is gone; then the genuine
// nodes bootstrap among themselves.
func TestBootstrapRefusesImpostor(t *testing.T) {
	pki := newTestPKI(t, "cluster CA")
	rogue := newTestPKI(t, "rogue CA")
	nodeTLS := map[string]*tlsconf.TLS{"n00": rogue.tls("n00", tlsconf.UsageNode)}
	genuine := []string{"n01", "n02", "n03"}
	for _, id := range genuine {
		nodeTLS[id] = pki.tls(id, tlsconf.UsageNode)
	}
	var logs testutil.LogBuffer
	c := newCluster(t, 3)
	c.tweak = func(cfg *Config) {
		cfg.TLS = nodeTLS[cfg.NodeID]
		if cfg.NodeID == "n01" {
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
	}
	for _, id := range append([]string{"n00"}, genuine...) {
		c.start(id)
	}
	testutil.WaitFor(t, "n01 to refuse bootstrapping with n00", func() bool {
		return strings.Contains(logs.String(), "not bootstrapping") && strings.Contains(logs.String(), "server=n00")
	})
	for _, id := range c.running() {
		if servers, err := c.node(id).Servers(); err != nil || len(servers) != 0 {
			t.Fatalf("%s has raft configuration %v (%v) with the impostor in the bootstrap set", id, servers, err)
		}
	}
	c.stop("n00")
	l := c.leader()
	c.waitAgree(genuine)
	if v, nv := voters(t, l); !slices.Equal(v, genuine) || len(nv) != 0 {
		t.Fatalf("voters %v nonvoters %v", v, nv)
	}
}

// TestInsecureTLS: a TLS in insecure mode is raft over plain TCP, which a
// peer without any certificate can speak.
func TestInsecureTLS(t *testing.T) {
	tl, err := tlsconf.New(tlsconf.Config{Insecure: true, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig("plain", t.TempDir())
	cfg.BootstrapExpect = 1
	cfg.TLS = tl
	s, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RegisterModel(ctxT(t), testSpec(1)); err != nil {
		t.Fatal(err)
	}
	if resp, err := requestVote(rawTransport(t, tl), s, 0); err != nil || resp.Granted {
		t.Fatalf("plain vote request: %+v, %v", resp, err)
	}
	if s.tlsLayer != nil {
		t.Fatal("insecure mode checks certificates at admission")
	}
}
