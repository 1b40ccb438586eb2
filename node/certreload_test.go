package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// certPKI is a cluster CA, another CA and a node's certificate files,
// which tests overwrite to stage a renewal.
type certPKI struct {
	ca, other *tlsconf.CA
	files     tlsconf.Config
}

func newCertPKI(t *testing.T, id string) *certPKI {
	t.Helper()
	dir := t.TempDir()
	ca, err := tlsconf.GenerateCA("cluster")
	if err != nil {
		t.Fatal(err)
	}
	other, err := tlsconf.GenerateCA("other")
	if err != nil {
		t.Fatal(err)
	}
	caF, _, err := ca.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	p := &certPKI{ca: ca, other: other, files: tlsconf.Config{CAFile: caF,
		CertFile: filepath.Join(dir, "node.pem"), KeyFile: filepath.Join(dir, "node-key.pem")}}
	p.write(t, ca, id, tlsconf.UsageNode)
	return p
}

// write puts a certificate of ca for name and usage in the node's files.
func (p *certPKI) write(t *testing.T, ca *tlsconf.CA, name string, usage tlsconf.Usage) *x509.Certificate {
	t.Helper()
	c, err := ca.Issue(tlsconf.CertRequest{Name: name, Hosts: []string{"127.0.0.1", "localhost"}, Usage: usage})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.files.CertFile, c.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.files.KeyFile, c.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return c.Cert
}

// gatherCounter reads a counter from reg by name.
func gatherCounter(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestCertReloadRules: a reloaded certificate must, like the one a node
// starts with, name the node ID, and must be a node certificate; one that
// is not is refused with the sentinel callers branch on, logged and
// counted, and the old certificate stays in use.
func TestCertReloadRules(t *testing.T) {
	p := newCertPKI(t, "n1")
	var logs testutil.LogBuffer
	sec, err := newSecurity(Config{NodeID: "n1", TLS: p.files, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := sec.registerTLSMetrics(reg); err != nil {
		t.Fatal(err)
	}
	serving := sec.tls.Leaf()
	var wantOK, wantBad float64
	for _, tc := range []struct {
		name  string
		ca    *tlsconf.CA // nil: the cluster CA
		cn    string
		usage tlsconf.Usage
		want  error // nil: accepted
	}{
		{name: "another node's certificate", cn: "n2", usage: tlsconf.UsageNode, want: ErrCertName},
		{name: "client certificate named n1", cn: "n1", usage: tlsconf.UsageClient, want: ErrCertRole},
		{name: "server certificate named n1", cn: "n1", usage: tlsconf.UsageServer, want: ErrCertRole},
		{name: "client certificate of another name", cn: "app", usage: tlsconf.UsageClient, want: ErrCertName},
		{name: "another CA", ca: p.other, cn: "n1", usage: tlsconf.UsageNode, want: errAny},
		{name: "renewed", cn: "n1", usage: tlsconf.UsageNode},
		{name: "another node's certificate after renewal", cn: "n3", usage: tlsconf.UsageNode, want: ErrCertName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := tc.ca
			if ca == nil {
				ca = p.ca
			}
			cand := p.write(t, ca, tc.cn, tc.usage)
			err := sec.tls.Reload()
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("Reload refused a renewal: %v", err)
			case tc.want == nil:
				serving = cand
				wantOK++
			case err == nil:
				t.Fatalf("Reload accepted %s", tc.name)
			case tc.want != errAny && !errors.Is(err, tc.want):
				t.Fatalf("Reload: %v, want %v", err, tc.want)
			default:
				wantBad++
			}
			if !sec.tls.Leaf().Equal(serving) {
				t.Fatalf("in use: %q serial %v, want serial %v", sec.tls.Leaf().Subject.CommonName, sec.tls.Leaf().SerialNumber, serving.SerialNumber)
			}
			if got := gatherCounter(t, reg, "kvmesh_tls_reload_failures_total"); got != wantBad {
				t.Fatalf("failures metric %v, want %v", got, wantBad)
			}
			if got := gatherCounter(t, reg, "kvmesh_tls_reloads_total"); got != wantOK {
				t.Fatalf("reloads metric %v, want %v", got, wantOK)
			}
		})
	}
	if got := strings.Count(logs.String(), "reload refused"); got != int(wantBad) {
		t.Fatalf("%d refusals logged, want %v:\n%s", got, wantBad, logs.String())
	}
}

// errAny stands for "some error" in TestCertReloadRules.
var errAny = errors.New("any error")

// TestCertStartRules: at start, as on reload, the common name must be the
// node ID and the certificate a node certificate.
func TestCertStartRules(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cn    string
		usage tlsconf.Usage
		want  error
	}{
		{name: "node certificate", cn: "n1", usage: tlsconf.UsageNode},
		{name: "another node's certificate", cn: "n2", usage: tlsconf.UsageNode, want: ErrCertName},
		{name: "client certificate named n1", cn: "n1", usage: tlsconf.UsageClient, want: ErrCertRole},
		{name: "server certificate named n1", cn: "n1", usage: tlsconf.UsageServer, want: ErrCertRole},
		{name: "client certificate of another name", cn: "app", usage: tlsconf.UsageClient, want: ErrCertName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCertPKI(t, "n1")
			p.write(t, p.ca, tc.cn, tc.usage)
			_, err := newSecurity(Config{NodeID: "n1", TLS: p.files, Logger: slog.New(slog.DiscardHandler)})
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("newSecurity: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestCertReloadKeepsServing: on a running node with TLS, a reload of
// another node's certificate is refused, the gRPC listener keeps
// presenting the node's own certificate, and /metrics counts the refusal.
func TestCertReloadKeepsServing(t *testing.T) {
	p := newCertPKI(t, "n1")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	n, err := New(Config{NodeID: "n1", DataDir: t.TempDir(), TLS: p.files, LocalTiming: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	own := n.sec.tls.Leaf()

	client, err := p.ca.Issue(tlsconf.CertRequest{Name: "app", Usage: tlsconf.UsageClient})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := client.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.Cert)
	presented := func() *x509.Certificate {
		t.Helper()
		d := tls.Dialer{Config: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "localhost",
			Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}}}
		c, err := d.DialContext(ctx, "tcp", n.GRPCAddr())
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		defer c.Close()
		return c.(*tls.Conn).ConnectionState().PeerCertificates[0]
	}
	if !presented().Equal(own) {
		t.Fatal("the node does not serve its certificate")
	}

	p.write(t, p.ca, "n2", tlsconf.UsageNode)
	if err := n.sec.tls.Reload(); !errors.Is(err, ErrCertName) {
		t.Fatalf("Reload of n2's certificate on n1: %v, want ErrCertName", err)
	}
	if got := presented(); !got.Equal(own) {
		t.Fatalf("after a refused reload the node serves %q", got.Subject.CommonName)
	}
	if got := gatherCounter(t, n.registry, "kvmesh_tls_reload_failures_total"); got != 1 {
		t.Fatalf("kvmesh_tls_reload_failures_total = %v, want 1", got)
	}
}
