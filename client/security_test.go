package client

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// authEcho answers ClusterInfo with the authorization header it received
// as the leader ID, so a test sees what a dial sent.
type authEcho struct{ api.UnimplementedClientServer }

func (authEcho) ClusterInfo(ctx context.Context, _ *api.ClusterInfoRequest) (*api.ClusterInfoResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	got := ""
	if v := md.Get("authorization"); len(v) > 0 {
		got = v[0]
	}
	return &api.ClusterInfoResponse{LeaderId: got}, nil
}

// serveEcho serves authEcho with creds (as a node does: its codec) until
// the test ends, and returns its address.
func serveEcho(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(opts, grpc.ForceServerCodecV2(api.Codec()))...)
	api.RegisterClientServer(srv, authEcho{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// TestDialOptions: the options the Client dials with (and kvmesh's Admin
// commands, through DialOptions) connect over plaintext and mutual TLS,
// carry the token, and refuse what securityOptions refuses: a malformed
// token, unreadable TLS files, a token over plaintext without Insecure.
func TestDialOptions(t *testing.T) {
	dir := t.TempDir()
	if _, err := tlsconf.GenerateFiles(dir,
		tlsconf.CertRequest{Name: "n1", Hosts: []string{"127.0.0.1"}, Usage: tlsconf.UsageNode},
		tlsconf.CertRequest{Name: "app", Usage: tlsconf.UsageClient}); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	files := func(name string) tlsconf.Config {
		return tlsconf.Config{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, name+".pem"),
			KeyFile: filepath.Join(dir, name+"-key.pem"), Logger: quiet}
	}
	nodeTLS, err := tlsconf.New(files("n1"))
	if err != nil {
		t.Fatal(err)
	}
	plainAddr := serveEcho(t)
	tlsAddr := serveEcho(t, grpc.Creds(nodeTLS.ServerCredentials()))
	tok, _, err := auth.NewToken("t", auth.ScopeRead, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	missing := files("app")
	missing.CAFile = filepath.Join(dir, "nope.pem")

	for _, tc := range []struct {
		name     string
		cfg      Config
		addr     string
		optsErr  error // DialOptions fails wrapping it (errAnyDial: any error)
		callFail bool  // the dial or the call fails
		header   string
	}{
		{name: "plaintext", cfg: Config{}, addr: plainAddr},
		{name: "plaintext, token, insecure", cfg: Config{Token: tok.String(), TLS: tlsconf.Config{Insecure: true}}, addr: plainAddr,
			header: "Bearer " + tok.String()},
		{name: "plaintext, token without insecure", cfg: Config{Token: tok.String()}, addr: plainAddr, callFail: true},
		{name: "mutual TLS", cfg: Config{TLS: files("app")}, addr: tlsAddr},
		{name: "mutual TLS, token", cfg: Config{TLS: files("app"), Token: tok.String()}, addr: tlsAddr, header: "Bearer " + tok.String()},
		{name: "plaintext to a TLS node", cfg: Config{}, addr: tlsAddr, callFail: true},
		{name: "malformed token", cfg: Config{Token: "not-a-token"}, optsErr: auth.ErrInvalidToken},
		{name: "unreadable CA", cfg: Config{TLS: missing}, optsErr: errAnyDial},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = quiet
			opts, err := DialOptions(tc.cfg)
			if tc.optsErr != nil {
				if err == nil || tc.optsErr != errAnyDial && !errors.Is(err, tc.optsErr) {
					t.Fatalf("DialOptions: %v, want %v", err, tc.optsErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DialOptions: %v", err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			resp, err := dialInfo(ctx, tc.addr, opts)
			if tc.callFail {
				if err == nil {
					t.Fatal("the call succeeded")
				}
				return
			}
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if resp.LeaderId != tc.header {
				t.Fatalf("authorization %q, want %q", resp.LeaderId, tc.header)
			}
		})
	}
}

// errAnyDial stands for "some error" in TestDialOptions.
var errAnyDial = errors.New("any error")

// dialInfo calls ClusterInfo at addr once, dialing with opts.
func dialInfo(ctx context.Context, addr string, opts []grpc.DialOption) (*api.ClusterInfoResponse, error) {
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	return api.NewClientClient(cc).ClusterInfo(ctx, &api.ClusterInfoRequest{})
}
