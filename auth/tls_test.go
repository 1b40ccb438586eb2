package auth

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvmesh/kvmesh/tlsconf"
)

// TestGuardOverMutualTLS runs the guard behind real mutual TLS on
// loopback: grpc-go's TLS peer information is what tells nodes from
// clients, and tokens still apply to clients.
func TestGuardOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	if _, err := tlsconf.GenerateFiles(dir,
		tlsconf.CertRequest{Name: "n1", Hosts: []string{"127.0.0.1"}, Usage: tlsconf.UsageNode},
		tlsconf.CertRequest{Name: "n2", Hosts: []string{"127.0.0.1"}, Usage: tlsconf.UsageNode},
		tlsconf.CertRequest{Name: "alice", Usage: tlsconf.UsageClient}); err != nil {
		t.Fatal(err)
	}
	identity := func(name string) *tlsconf.TLS {
		tl, err := tlsconf.New(tlsconf.Config{CAFile: filepath.Join(dir, "ca.pem"),
			CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem"), Logger: discard()})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	tab := newMemTable()
	reader := tab.add(t, "reader", ScopeRead, nil, time.Time{})
	g := NewGuard(Config{Verifier: NewVerifier(tab), Methods: testMethods, Logger: discard()})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(identity("n1").ServerCredentials()),
		grpc.ChainUnaryInterceptor(g.UnaryInterceptor()), grpc.ChainStreamInterceptor(g.StreamInterceptor()))
	srv.RegisterService(&testDesc, struct{}{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	defer func() {
		srv.Stop()
		<-done
	}()
	dial := func(creds credentials.TransportCredentials) *grpc.ClientConn {
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	node := dial(identity("n2").NodeClientCredentials())
	client := dial(identity("alice").ClientCredentials())

	cases := []struct {
		name   string
		cc     *grpc.ClientConn
		method string
		token  string
		want   codes.Code
	}{
		{"node calls the peer API", node, "Peer", "", codes.OK},
		{"client cert cannot", client, "Peer", reader, codes.PermissionDenied},
		{"client without token", client, "Read", "", codes.Unauthenticated},
		{"client with token", client, "Read", reader, codes.OK},
		{"token scope still applies", client, "Admin", reader, codes.PermissionDenied},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var opts []grpc.CallOption
			if tc.token != "" {
				opts = append(opts, grpc.PerRPCCredentials(TokenCredentials(tc.token, false)))
			}
			err := tc.cc.Invoke(ctx, svc+tc.method, wrapperspb.String(fpA.String()), new(wrapperspb.StringValue), opts...)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}
