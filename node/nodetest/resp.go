package nodetest

import (
	"context"
	"net"
	"testing"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/respserver"
)

// ServeRESP serves n's Redis-protocol door (respserver over
// node.RESPConfig, the node's TLS and tokens) on a loopback port until the
// test ends and returns its address.
func ServeRESP(t testing.TB, n *node.Node) string {
	t.Helper()
	srv, err := respserver.New(n.RESPConfig())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("resp server: %v", err)
		}
	})
	return ln.Addr().String()
}
