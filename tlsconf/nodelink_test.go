package tlsconf

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"
)

// nodeListener serves one-byte echoes over NodeServerConfig, as a node's
// raft listener does (package meta's stream layer is this listener and
// dialer, fed to raft).
func nodeListener(t *testing.T, tl *TLS) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !tl.Insecure() {
		ln = tls.NewListener(ln, tl.NodeServerConfig())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err == nil {
				_, _ = c.Write(b)
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return ln.Addr().String()
}

// nodeExchange dials addr over NodeClientConfig and completes one echo, so
// a refusal by either end fails it (under TLS 1.3 the server checks the
// client's certificate after the client's handshake returned).
func nodeExchange(tl *TLS, addr string) error {
	d := &net.Dialer{Timeout: 5 * time.Second}
	var c net.Conn
	var err error
	if tl.Insecure() {
		c, err = d.Dial("tcp", addr)
	} else {
		cfg := tl.NodeClientConfig()
		cfg.ServerName = "127.0.0.1"
		c, err = tls.DialWithDialer(d, "tcp", addr, cfg)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{7}); err != nil {
		return err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if b[0] != 7 {
		return io.ErrUnexpectedEOF
	}
	return nil
}

// TestNodeLink: two nodes of the cluster CA talk over the node
// configurations in both directions; every intruder is refused both ways,
// including those that New refuses to load and an attacker could still
// present (a certificate of another CA, an expired one).
func TestNodeLink(t *testing.T) {
	good := newPKI(t, "cluster")
	evil := newPKI(t, "evil")
	n1cfg := good.issue("n1", UsageNode, time.Time{})
	n1 := load(t, n1cfg)
	n2 := load(t, good.issue("n2", UsageNode, time.Time{}))
	n1addr, n2addr := nodeListener(t, n1), nodeListener(t, n2)

	if err := nodeExchange(n1, n2addr); err != nil {
		t.Fatalf("n1 -> n2: %v", err)
	}
	if err := nodeExchange(n2, n1addr); err != nil {
		t.Fatalf("n2 -> n1: %v", err)
	}

	intruders := []struct {
		name string
		tl   *TLS
	}{
		// Trusts its own CA: refuses n2 and is refused.
		{"node of another CA", load(t, evil.issue("x1", UsageNode, time.Time{}))},
		// Trusts the cluster CA, presents another CA's node certificate.
		{"cert from another CA", crossTLS(t, n1cfg, evil.issue("x2", UsageNode, time.Time{}))},
		// A valid client certificate of the cluster is not a node.
		{"client cert of the cluster", load(t, good.issue("alice", UsageClient, time.Time{}))},
		{"expired node cert", crossTLS(t, n1cfg, good.issue("x3", UsageNode, time.Now().Add(-time.Hour)))},
		{"plaintext", load(t, Config{Insecure: true, Logger: discard()})},
	}
	for _, in := range intruders {
		t.Run(in.name, func(t *testing.T) {
			if err := nodeExchange(in.tl, n2addr); err == nil {
				t.Fatal("intruder's exchange accepted")
			}
			if err := nodeExchange(n2, nodeListener(t, in.tl)); err == nil {
				t.Fatal("n2 talked to the intruder")
			}
		})
	}
}
