package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// presented runs a real TLS handshake, in process over a pipe, between
// server's ServerConfig and client's ClientConfig, and returns the
// certificate the server presented.
func presented(t *testing.T, server, client *TLS) *x509.Certificate {
	t.Helper()
	sc, cc := net.Pipe()
	defer sc.Close()
	defer cc.Close()
	errc := make(chan error, 1)
	go func() {
		srv := tls.Server(sc, server.ServerConfig())
		errc <- srv.Handshake()
	}()
	ccfg := client.ClientConfig()
	ccfg.ServerName = "localhost"
	cli := tls.Client(cc, ccfg)
	if err := cli.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	return cli.ConnectionState().PeerCertificates[0]
}

// TestReloadCheck: Config.Check sees the certificate in use and the
// candidate; a refused reload is an ErrRefused error, logged and counted,
// and the old certificate keeps serving real handshakes.
func TestReloadCheck(t *testing.T) {
	p := newPKI(t, "cluster")
	other := newPKI(t, "other")
	var sawPrev []*x509.Certificate
	// Check is called synchronously from New and Reload, in this goroutine.
	check := func(prev, next *x509.Certificate) error {
		sawPrev = append(sawPrev, prev)
		if next.Subject.CommonName != "n1" {
			return fmt.Errorf("common name %q", next.Subject.CommonName)
		}
		return nil
	}
	cfg := p.issue("n1", UsageNode, time.Time{})
	var logs testutil.LogBuffer
	cfg.Logger, cfg.Check = slogTo(&logs), check
	tl := load(t, cfg)
	client := load(t, p.issue("alice", UsageClient, time.Time{}))
	first := tl.Leaf()
	if len(sawPrev) != 1 || sawPrev[0] != nil {
		t.Fatalf("New called Check with prev %v, want one call with nil", sawPrev)
	}

	// write replaces the node's files with a certificate of ca for name.
	write := func(ca *CA, name string) *x509.Certificate {
		t.Helper()
		c, err := GenerateCert(ca, name, []string{"127.0.0.1", "localhost"}, UsageNode)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg.CertFile, c.CertPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg.KeyFile, c.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		return c.Cert
	}

	serving := first
	for _, tc := range []struct {
		name    string
		ca      *CA
		cn      string
		refused bool // by Check (ErrRefused), not by the CA
		ok      bool
	}{
		{name: "another name", ca: p.ca, cn: "n2", refused: true},
		{name: "another CA", ca: other.ca, cn: "n1"},
		{name: "renewed", ca: p.ca, cn: "n1", ok: true},
		{name: "another name after renewal", ca: p.ca, cn: "mallory", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := len(sawPrev)
			cand := write(tc.ca, tc.cn)
			err := tl.Reload()
			if (err == nil) != tc.ok {
				t.Fatalf("Reload: %v, want ok %v", err, tc.ok)
			}
			if errors.Is(err, ErrRefused) != tc.refused {
				t.Fatalf("Reload: %v, want ErrRefused %v", err, tc.refused)
			}
			if tc.ca == p.ca {
				// Check ran, and saw the certificate then in use.
				if len(sawPrev) != calls+1 || !sawPrev[calls].Equal(serving) {
					t.Fatalf("Check calls %d (want %d), prev not the serving certificate", len(sawPrev)-calls, 1)
				}
			} else if len(sawPrev) != calls {
				t.Fatal("Check ran on a certificate that does not verify against the CA")
			}
			if tc.ok {
				serving = cand
			}
			if !tl.Leaf().Equal(serving) {
				t.Fatalf("Leaf is %q serial %v, want serial %v", tl.Leaf().Subject.CommonName, tl.Leaf().SerialNumber, serving.SerialNumber)
			}
			if got := presented(t, tl, client); !got.Equal(serving) {
				t.Fatalf("handshake presented %q serial %v, want serial %v", got.Subject.CommonName, got.SerialNumber, serving.SerialNumber)
			}
		})
	}
	if ok, bad := tl.ReloadCounts(); ok != 1 || bad != 3 {
		t.Fatalf("ReloadCounts = %d, %d; want 1, 3", ok, bad)
	}
	if got := strings.Count(logs.String(), "reload refused"); got != 3 {
		t.Fatalf("%d refusals logged, want 3:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "mallory") {
		t.Fatalf("the refusal log does not say why:\n%s", logs.String())
	}

	// New applies Check too, and counts nothing.
	write(p.ca, "n2")
	if _, err := New(cfg); !errors.Is(err, ErrRefused) {
		t.Fatalf("New with a certificate Check refuses: %v", err)
	}
}
