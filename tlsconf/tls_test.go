package tlsconf

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// serveHealth runs a real gRPC server on loopback with creds and returns
// its address.
func serveHealth(t *testing.T, creds credentials.TransportCredentials) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

func check(ctx context.Context, addr string, creds credentials.TransportCredentials) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer cc.Close()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestGRPCMutualTLS(t *testing.T) {
	good := newPKI(t, "cluster")
	evil := newPKI(t, "evil")
	node := good.issue("n1", UsageNode, time.Time{})
	addr := serveHealth(t, load(t, node).ServerCredentials())

	goodClient := good.issue("alice", UsageClient, time.Time{})
	expired := good.issue("old", UsageClient, time.Now().Add(-time.Hour))
	evilClient := evil.issue("mallory", UsageClient, time.Time{})
	trustOnlyCA := load(t, goodClient).ClientConfig()
	trustOnlyCA.GetClientCertificate = nil // presents nothing

	cases := []struct {
		name  string
		creds credentials.TransportCredentials
		ok    bool
	}{
		{"client cert from the CA", load(t, goodClient).ClientCredentials(), true},
		{"node cert dialing as a peer", load(t, node).NodeClientCredentials(), true},
		{"no client cert", credentials.NewTLS(trustOnlyCA), false},
		{"client cert from another CA", crossTLS(t, goodClient, evilClient).ClientCredentials(), false},
		{"expired client cert", crossTLS(t, goodClient, expired).ClientCredentials(), false},
		{"client trusting another CA", load(t, evilClient).ClientCredentials(), false},
		{"plaintext client", load(t, Config{Insecure: true, Logger: discard()}).ClientCredentials(), false},
		// A node dialing a peer refuses a server that is not a node.
		{"peer dial to a client-cert server", nil, false},
	}
	clientAsServer := serveHealth(t, load(t, good.issue("srv", UsageServer, time.Time{})).ServerCredentials())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			a, creds := addr, tc.creds
			if creds == nil {
				a, creds = clientAsServer, load(t, node).NodeClientCredentials()
			}
			err := check(ctx, a, creds)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	good := newPKI(t, "cluster")
	evil := newPKI(t, "evil")
	c := good.issue("n1", UsageNode, time.Time{})
	e := evil.issue("n2", UsageNode, time.Time{})
	old := good.issue("old", UsageNode, time.Now().Add(-time.Hour))
	cases := []struct {
		name string
		cfg  Config
		want error
	}{
		{"nothing configured", Config{}, ErrNotConfigured},
		{"insecure with files", Config{Insecure: true, CAFile: c.CAFile}, nil},
		{"missing key", Config{CAFile: c.CAFile, CertFile: c.CertFile}, nil},
		{"cert from another CA", Config{CAFile: c.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile}, nil},
		{"expired cert", old, nil},
		{"key of another cert", Config{CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: e.KeyFile}, nil},
		{"CA file is not PEM", Config{CAFile: c.KeyFile + "x", CertFile: c.CertFile, KeyFile: c.KeyFile}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = discard()
			_, err := New(tc.cfg)
			if err == nil {
				t.Fatal("New succeeded")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func TestInsecureWarns(t *testing.T) {
	var buf testutil.LogBuffer
	tl, err := New(Config{Insecure: true, Logger: slogTo(&buf)})
	if err != nil {
		t.Fatal(err)
	}
	if !tl.Insecure() || tl.ServerConfig() != nil || tl.ClientConfig() != nil {
		t.Fatal("insecure TLS has configs")
	}
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "insecure") {
		t.Fatalf("no warning logged: %q", buf.String())
	}
	// Plaintext end to end works when both sides ask for it.
	addr := serveHealth(t, tl.ServerCredentials())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := check(ctx, addr, tl.ClientCredentials()); err != nil {
		t.Fatal(err)
	}
}

func TestCertFiles(t *testing.T) {
	ca, err := GenerateCA("kvmesh test CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caF, caK, err := ca.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.WriteFiles(dir); err == nil {
		t.Fatal("WriteFiles overwrote an existing CA")
	}
	ca2, err := LoadCA(caF, caK)
	if err != nil {
		t.Fatal(err)
	}
	if !ca2.Cert.Equal(ca.Cert) {
		t.Fatal("LoadCA returned another certificate")
	}
	// A certificate issued by the reloaded CA verifies against the first.
	c, err := GenerateCert(ca2, "n1", []string{"10.0.0.1", "node1.example", "::1"}, UsageNode)
	if err != nil {
		t.Fatal(err)
	}
	cf, kf, err := c.WriteFiles(dir, "n1")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		path string
		perm os.FileMode
	}{{caK, 0o600}, {kf, 0o600}, {caF, 0o644}, {cf, 0o644}} {
		st, err := os.Stat(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got&^f.perm != 0 {
			t.Errorf("%s mode %v, want at most %v", filepath.Base(f.path), got, f.perm)
		}
	}
	tl := load(t, Config{CAFile: caF, CertFile: cf, KeyFile: kf, Logger: discard()})
	leaf := tl.Leaf()
	if !IsNodeCert(leaf) || leaf.Subject.CommonName != "n1" {
		t.Fatalf("leaf %v", leaf.Subject)
	}
	if len(leaf.IPAddresses) != 2 || len(leaf.DNSNames) != 1 {
		t.Fatalf("SANs %v %v", leaf.IPAddresses, leaf.DNSNames)
	}
	if _, err := c.TLSCertificate(); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(cf, kf); err == nil {
		t.Fatal("LoadCA accepted a leaf certificate")
	}
	if _, _, err := c.WriteFiles(dir, "../escape"); err == nil {
		t.Fatal("WriteFiles accepted a path as a name")
	}
	for _, s := range []string{"server", "client", "node", "both"} {
		u, err := ParseUsage(s)
		if err != nil || (u.String() != s && s != "both") {
			t.Errorf("ParseUsage(%q) = %v, %v", s, u, err)
		}
	}
	if _, err := ParseUsage("root"); err == nil {
		t.Error("ParseUsage accepted root")
	}
	if _, err := ca.Issue(CertRequest{Name: "x", Usage: Usage(9)}); err == nil {
		t.Error("Issue accepted an invalid usage")
	}
}

func TestReload(t *testing.T) {
	p := newPKI(t, "cluster")
	cfg := p.issue("n1", UsageNode, time.Time{})
	tl := load(t, cfg)
	first := tl.Leaf()

	renew := func(name string) {
		t.Helper()
		c, err := GenerateCert(p.ca, name, []string{"127.0.0.1"}, UsageNode)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg.CertFile, c.CertPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg.KeyFile, c.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	renew("n1-renewed")
	if err := tl.Reload(); err != nil {
		t.Fatal(err)
	}
	if tl.Leaf().Equal(first) || tl.Leaf().Subject.CommonName != "n1-renewed" {
		t.Fatal("Reload kept the old certificate")
	}
	// The server picks the renewed certificate up on the next handshake.
	cs, err := tl.ServerConfig().GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || cs.Leaf.Subject.CommonName != "n1-renewed" {
		t.Fatalf("server certificate %v, %v", cs, err)
	}

	// A broken file keeps the old certificate.
	if err := os.WriteFile(cfg.KeyFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tl.Reload(); err == nil {
		t.Fatal("Reload accepted a broken key")
	}
	if tl.Leaf().Subject.CommonName != "n1-renewed" {
		t.Fatal("failed Reload dropped the certificate")
	}

	// SIGHUP reloads.
	renew("n1-hup")
	// The test's own Notify keeps SIGUSR1 from ending the test binary
	// before ReloadOnSignal's goroutine has registered; the signal is
	// sent on every poll, so the first one after that reloads.
	sink := make(chan os.Signal, 1)
	signal.Notify(sink, syscall.SIGUSR1)
	defer signal.Stop(sink)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); tl.ReloadOnSignal(ctx, syscall.SIGUSR1) }()
	defer func() { cancel(); <-done }()
	testutil.WaitFor(t, "the signal to reload the certificate", func() bool {
		if tl.Leaf().Subject.CommonName == "n1-hup" {
			return true
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGUSR1)
		return false
	})
}

// TestGenerateFiles makes a CA and a node and a client certificate the way
// `kvmesh certs` does, then a second node later with the same CA, and
// checks they load and trust each other.
func TestGenerateFiles(t *testing.T) {
	dir := t.TempDir()
	files, err := GenerateFiles(dir,
		CertRequest{Name: "n1", Hosts: []string{"127.0.0.1"}, Usage: UsageNode},
		CertRequest{Name: "alice", Usage: UsageClient})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 6 {
		t.Fatalf("wrote %v", files)
	}
	if _, err := GenerateFiles(dir, CertRequest{Name: "n2", Hosts: []string{"127.0.0.1"}, Usage: UsageNode}); err != nil {
		t.Fatal(err)
	}
	if _, err := GenerateFiles(dir, CertRequest{Name: "n2", Usage: UsageNode}); err == nil {
		t.Fatal("overwrote n2")
	}
	cfg := func(name string) Config {
		return Config{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, name+".pem"),
			KeyFile: filepath.Join(dir, name+"-key.pem"), Logger: discard()}
	}
	addr := serveHealth(t, load(t, cfg("n2")).ServerCredentials())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, who := range []string{"n1", "alice"} {
		if err := check(ctx, addr, load(t, cfg(who)).ClientCredentials()); err != nil {
			t.Fatalf("%s: %v", who, err)
		}
	}
	if err := os.Remove(filepath.Join(dir, "ca-key.pem")); err != nil {
		t.Fatal(err)
	}
	if _, err := GenerateFiles(dir); err == nil {
		t.Fatal("made a new CA over an existing ca.pem")
	}
}
