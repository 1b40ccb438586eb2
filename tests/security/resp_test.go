package security_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// TestRESPOverTLS: a node with TLS serves its Redis-protocol door over
// TLS with the same client-certificate rule as gRPC: plaintext and a
// client without a certificate of the CA get no reply; a client with one
// and a token works.
func TestRESPOverTLS(t *testing.T) {
	p := newPKI(t)
	n := startSecureNode(t, p, nil)
	tok := newToken(t, n, "lmcache", auth.ScopeRead|auth.ScopeWrite, nil)

	addr := nodetest.ServeRESP(t, n)

	// talk sends PING on c and returns what comes back before the end.
	talk := func(c net.Conn) string {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, "*1\r\n$4\r\nPING\r\n")
		got, _ := bufio.NewReader(c).ReadString('\n')
		return got
	}
	plain, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if got := talk(plain); strings.Contains(got, "PONG") {
		t.Fatalf("plaintext PING answered %q", got)
	}
	app, err := tlsconf.New(files(p.dir, "app"))
	if err != nil {
		t.Fatal(err)
	}
	noCert := app.ClientConfig().Clone()
	noCert.GetClientCertificate = nil
	noCert.Certificates = nil
	if c, err := tls.Dial("tcp", addr, noCert); err == nil {
		if got := talk(c); strings.Contains(got, "PONG") {
			t.Fatalf("PING without a client certificate answered %q", got)
		}
	}
	c, err := tls.Dial("tcp", addr, app.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	for _, x := range []struct{ in, want string }{
		{"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "-NOAUTH Authentication required.\r\n"},
		{"*2\r\n$4\r\nAUTH\r\n$" + strconv.Itoa(len(tok)) + "\r\n" + tok + "\r\n", "+OK\r\n"},
		{"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n", "+OK\r\n"},
		{"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "$5\r\n"},
		{"", "value\r\n"},
	} {
		if x.in != "" {
			if _, err := io.WriteString(c, x.in); err != nil {
				t.Fatal(err)
			}
		}
		got, err := r.ReadString('\n')
		if err != nil || got != x.want {
			t.Fatalf("%q: %q, %v; want %q", x.in, got, err, x.want)
		}
	}
}
