package tlsconf

import (
	"crypto/tls"
	"log/slog"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// pki is a CA with files written in a temporary directory.
type pki struct {
	t   *testing.T
	dir string
	ca  *CA
	caF string
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	ca, err := GenerateCA(name)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caF, _, err := ca.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &pki{t: t, dir: dir, ca: ca, caF: caF}
}

// issue writes a certificate and returns a Config using it with this CA.
func (p *pki) issue(name string, usage Usage, notAfter time.Time) Config {
	p.t.Helper()
	req := CertRequest{Name: name, Hosts: []string{"127.0.0.1", "localhost"}, Usage: usage, NotAfter: notAfter}
	if !notAfter.IsZero() {
		req.NotBefore = notAfter.Add(-time.Hour)
	}
	c, err := p.ca.Issue(req)
	if err != nil {
		p.t.Fatal(err)
	}
	cf, kf, err := c.WriteFiles(p.dir, name)
	if err != nil {
		p.t.Fatal(err)
	}
	return Config{CAFile: p.caF, CertFile: cf, KeyFile: kf, Logger: discard()}
}

// load is New that fails the test on error.
func load(t *testing.T, cfg Config) *TLS {
	t.Helper()
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// crossTLS trusts trust's CA but presents other's certificate, which New
// refuses to load: it is what an attacker with another CA's certificate
// would present.
func crossTLS(t *testing.T, trust, other Config) *TLS {
	t.Helper()
	tl := load(t, trust)
	pair, err := tls.LoadX509KeyPair(other.CertFile, other.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	tl.cert.Store(&pair)
	return tl
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func slogTo(l *testutil.LogBuffer) *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }
