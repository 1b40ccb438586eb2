package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// The test service: each method takes a model fingerprint (hex), checks it
// with CheckFingerprint as a real handler does after parsing its request,
// and answers with the caller's key.
const svc = "/kvmesh.test.Echo/"

var testMethods = map[string]Scope{
	svc + "Read":   ScopeRead,
	svc + "Admin":  ScopeAdmin,
	svc + "Write":  ScopeWrite,
	svc + "Peer":   ScopePeer,
	svc + "Health": 0,
}

func parseFP(s string) (chunk.Fingerprint, error) {
	if len(s) != 32 {
		return chunk.Fingerprint{}, fmt.Errorf("fingerprint %q", s)
	}
	hi, err1 := strconv.ParseUint(s[:16], 16, 64)
	lo, err2 := strconv.ParseUint(s[16:], 16, 64)
	return chunk.Fingerprint{Hi: hi, Lo: lo}, errors.Join(err1, err2)
}

func echo(ctx context.Context, req any) (any, error) {
	fp, err := parseFP(req.(*wrapperspb.StringValue).GetValue())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := CheckFingerprint(ctx, fp); err != nil {
		return nil, err
	}
	p, _ := FromContext(ctx)
	return wrapperspb.String(p.Key()), nil
}

func unary(name string) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		if ic == nil {
			return echo(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: svc + name}, echo)
	}}
}

// writeStream answers every message like echo until the client closes.
func writeStream(_ any, ss grpc.ServerStream) error {
	for {
		in := new(wrapperspb.StringValue)
		if err := ss.RecvMsg(in); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		out, err := echo(ss.Context(), in)
		if err != nil {
			return err
		}
		if err := ss.SendMsg(out); err != nil {
			return err
		}
	}
}

var testDesc = grpc.ServiceDesc{
	ServiceName: "kvmesh.test.Echo",
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{unary("Read"), unary("Admin"), unary("Peer"), unary("Health"), unary("Unlisted")},
	Streams:     []grpc.StreamDesc{{StreamName: "Write", Handler: writeStream, ClientStreams: true, ServerStreams: true}},
}

// serve runs the test service over bufconn behind g (and l, if not nil)
// and returns a client connection.
func serve(t *testing.T, g *Guard, l *StreamLimiter) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	streams := []grpc.StreamServerInterceptor{g.StreamInterceptor()}
	if l != nil {
		streams = append(streams, l.StreamInterceptor())
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(g.UnaryInterceptor()), grpc.ChainStreamInterceptor(streams...))
	srv.RegisterService(&testDesc, struct{}{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
		<-done
	})
	return cc
}

func callUnary(ctx context.Context, cc *grpc.ClientConn, method, token string, fp chunk.Fingerprint) error {
	var opts []grpc.CallOption
	if token != "" {
		opts = append(opts, grpc.PerRPCCredentials(TokenCredentials(token, true)))
	}
	return cc.Invoke(ctx, svc+method, wrapperspb.String(fp.String()), new(wrapperspb.StringValue), opts...)
}

// openWrite opens a Write stream and completes one exchange on it, so the
// stream has passed the interceptors when it returns.
func openWrite(ctx context.Context, cc *grpc.ClientConn, token string, fp chunk.Fingerprint) (grpc.ClientStream, error) {
	var opts []grpc.CallOption
	if token != "" {
		opts = append(opts, grpc.PerRPCCredentials(TokenCredentials(token, true)))
	}
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, svc+"Write", opts...)
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(wrapperspb.String(fp.String())); err != nil && err != io.EOF {
		return nil, err
	}
	if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != nil {
		return nil, err
	}
	return cs, nil
}

func TestGuardOverGRPC(t *testing.T) {
	tab := newMemTable()
	reader := tab.add(t, "reader", ScopeRead, nil, time.Time{})
	writerA := tab.add(t, "writer-a", ScopeRead|ScopeWrite, Namespace{"a1a1"}, time.Time{})
	admin := tab.add(t, "admin", TokenScopes, nil, time.Time{})
	wrong := reader[:idLen+1] + admin[idLen+1:]
	cc := serve(t, NewGuard(Config{Verifier: NewVerifier(tab), Methods: testMethods, Logger: discard()}), nil)

	cases := []struct {
		name   string
		method string
		token  string
		fp     chunk.Fingerprint
		want   codes.Code
	}{
		{"no token", "Read", "", fpA, codes.Unauthenticated},
		{"wrong secret", "Read", wrong, fpA, codes.Unauthenticated},
		{"reader reads", "Read", reader, fpB, codes.OK},
		{"reader is no admin", "Admin", reader, fpB, codes.PermissionDenied},
		{"reader cannot write", "Write", reader, fpA, codes.PermissionDenied},
		{"admin administers", "Admin", admin, fpA, codes.OK},
		{"namespace A reads A", "Read", writerA, fpA, codes.OK},
		{"namespace A cannot read B", "Read", writerA, fpB, codes.PermissionDenied},
		{"namespace A writes A", "Write", writerA, fpA2, codes.OK},
		{"namespace A cannot write B", "Write", writerA, fpB, codes.PermissionDenied},
		{"method not in the table", "Unlisted", admin, fpA, codes.PermissionDenied},
		{"admin token is no peer", "Peer", admin, fpA, codes.PermissionDenied},
		{"public method", "Health", "", fpA, codes.OK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var err error
			if tc.method == "Write" {
				var cs grpc.ClientStream
				if cs, err = openWrite(ctx, cc, tc.token, tc.fp); err == nil {
					_ = cs.CloseSend()
				}
			} else {
				err = callUnary(ctx, cc, tc.method, tc.token, tc.fp)
			}
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
		})
	}

	// A client refuses to send its token in plaintext unless told to.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := cc.Invoke(ctx, svc+"Read", wrapperspb.String(fpA.String()), new(wrapperspb.StringValue),
		grpc.PerRPCCredentials(TokenCredentials(reader, false)))
	if err == nil {
		t.Fatal("token sent over plaintext")
	}
}

// tlsPeer is a context as grpc-go builds it for a caller over mutual TLS.
func tlsPeer(leaf *x509.Certificate) context.Context {
	p := &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 4000}}
	if leaf != nil {
		p.AuthInfo = credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}}
	}
	return peer.NewContext(context.Background(), p)
}

func TestGuardCertificates(t *testing.T) {
	ca, err := tlsconf.GenerateCA("test")
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(name string, u tlsconf.Usage) *x509.Certificate {
		c, err := tlsconf.GenerateCert(ca, name, []string{"10.0.0.9"}, u)
		if err != nil {
			t.Fatal(err)
		}
		return c.Cert
	}
	node, client := leaf("n1", tlsconf.UsageNode), leaf("alice", tlsconf.UsageClient)
	withTokens := NewGuard(Config{Verifier: NewVerifier(newMemTable()), Methods: testMethods, Logger: discard()})
	certOnly := NewGuard(Config{Methods: testMethods, Logger: discard()})
	readOnly := NewGuard(Config{Methods: testMethods, AnonymousScopes: ScopeRead, Logger: discard()})
	plaintext := NewGuard(Config{Methods: testMethods, InsecurePeers: true, Logger: discard()})

	cases := []struct {
		name   string
		g      *Guard
		leaf   *x509.Certificate
		method string
		want   codes.Code
		key    string
	}{
		{"node calls the peer API", withTokens, node, "Peer", codes.OK, "cert:n1"},
		{"node needs no token", withTokens, node, "Admin", codes.OK, "cert:n1"},
		{"node cannot call unlisted", withTokens, node, "Unlisted", codes.PermissionDenied, ""},
		{"client cert still needs a token", withTokens, client, "Read", codes.Unauthenticated, ""},
		{"client cert is no peer", withTokens, client, "Peer", codes.PermissionDenied, ""},
		{"tokens off: client cert suffices", certOnly, client, "Admin", codes.OK, "cert:alice"},
		{"tokens off: still no peer", certOnly, client, "Peer", codes.PermissionDenied, ""},
		{"tokens off: anonymous scopes", readOnly, client, "Write", codes.PermissionDenied, ""},
		{"plaintext cluster: peers open", plaintext, nil, "Peer", codes.OK, "addr:10.0.0.9"},
		{"plaintext flag: a client cert is still no peer", plaintext, client, "Peer", codes.PermissionDenied, ""},
		{"plaintext cluster: no cert, no peer without the flag", certOnly, nil, "Peer", codes.PermissionDenied, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.g.Authorize(tlsPeer(tc.leaf), svc+tc.method)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			if err == nil && p.Key() != tc.key {
				t.Fatalf("key %q, want %q", p.Key(), tc.key)
			}
		})
	}
}

// TestDefaultMethodsCoverAPI: every RPC kvmesh serves has a scope, so a new
// RPC is denied until someone decides who may call it, and this test says
// so.
func TestDefaultMethodsCoverAPI(t *testing.T) {
	m := DefaultMethods()
	n := 0
	for _, sd := range []grpc.ServiceDesc{api.Client_ServiceDesc, api.Peer_ServiceDesc, api.Injector_ServiceDesc, api.Admin_ServiceDesc,
		reflectionv1.ServerReflection_ServiceDesc, reflectionv1alpha.ServerReflection_ServiceDesc} {
		var names []string
		for _, md := range sd.Methods {
			names = append(names, md.MethodName)
		}
		for _, st := range sd.Streams {
			names = append(names, st.StreamName)
		}
		for _, name := range names {
			full := "/" + sd.ServiceName + "/" + name
			s, ok := m[full]
			if !ok {
				t.Errorf("%s has no scope in DefaultMethods", full)
			}
			if peerSvc := sd.ServiceName == api.Peer_ServiceDesc.ServiceName; peerSvc != (s == ScopePeer) {
				t.Errorf("%s: scope %v", full, s)
			}
			if adminSvc := sd.ServiceName == api.Admin_ServiceDesc.ServiceName; adminSvc && s&^ScopeCluster != ScopeAdmin {
				t.Errorf("%s: scope %v, want admin", full, s)
			}
			n++
		}
	}
	if n != len(m) {
		t.Errorf("DefaultMethods has %d entries, the API %d methods", len(m), n)
	}
	if m[api.Client_RegisterModel_FullMethodName] != ScopeAdmin || m[api.Client_Put_FullMethodName] != ScopeWrite {
		t.Error("admin/write assignments")
	}
}

// TestIdentify: Identify names a caller the Guard refuses as far as the
// call shows it (address, certificate, the presented token's ID) and one
// it lets in as Authorize does.
func TestIdentify(t *testing.T) {
	ca, err := tlsconf.GenerateCA("test")
	if err != nil {
		t.Fatal(err)
	}
	alice, err := tlsconf.GenerateCert(ca, "alice", []string{"10.0.0.9"}, tlsconf.UsageClient)
	if err != nil {
		t.Fatal(err)
	}
	table := newMemTable()
	reader := table.add(t, "reader", ScopeRead, nil, time.Time{})
	id, _, _ := strings.Cut(reader, ".")
	g := NewGuard(Config{Verifier: NewVerifier(table), Methods: testMethods, Logger: discard()})
	withToken := func(ctx context.Context, tok string) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs(AuthorizationHeader, "Bearer "+tok))
	}
	forged := id + "." + strings.Repeat("A", 43)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want codes.Code
		p    Principal
	}{
		{"no certificate, no token", tlsPeer(nil), codes.Unauthenticated, Principal{Addr: "10.0.0.9:4000"}},
		{"certificate, malformed token", withToken(tlsPeer(alice.Cert), "junk"), codes.Unauthenticated,
			Principal{CertName: "alice", Addr: "10.0.0.9:4000"}},
		{"forged secret", withToken(tlsPeer(alice.Cert), forged), codes.Unauthenticated,
			Principal{TokenID: id, CertName: "alice", Addr: "10.0.0.9:4000"}},
		{"valid token", withToken(tlsPeer(alice.Cert), reader), codes.OK,
			Principal{TokenID: id, CertName: "alice", Addr: "10.0.0.9:4000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := g.Authorize(tc.ctx, svc+"Read")
			if got := status.Code(err); got != tc.want {
				t.Fatalf("Authorize: %v, want %v", err, tc.want)
			}
			if got := g.Identify(tc.ctx); !reflect.DeepEqual(*got, tc.p) {
				t.Fatalf("Identify: %+v, want %+v", *got, tc.p)
			}
		})
	}
	if s, ok := g.Scope(svc + "Admin"); !ok || s != ScopeAdmin {
		t.Errorf("Scope(Admin) = %v %v", s, ok)
	}
	if _, ok := g.Scope(svc + "Unlisted"); ok {
		t.Error("Scope(Unlisted) known")
	}
}
