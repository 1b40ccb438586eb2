package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestReflection: server reflection (what grpcurl uses) lists and describes
// the services to a caller with a valid token, and the guard refuses it,
// like any call, to a caller without one or with a forged one.
func TestReflection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := New(Config{NodeID: "r1", DataDir: t.TempDir(), HTTPAddr: "off", DRAMBytes: 16 << 20, LocalTiming: true,
		Insecure: true, Tokens: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		_ = n.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	testutil.WaitFor(t, "the node to be ready", func() bool { return n.Ready() == nil })
	tok, rec, err := auth.NewToken("reader", auth.ScopeRead, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.meta.PutToken(ctx, rec); err != nil {
		t.Fatal(err)
	}
	forged := rec.ID + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	ask := func(token string, req *reflectionv1.ServerReflectionRequest) (*reflectionv1.ServerReflectionResponse, error) {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(auth.TokenCredentials(token, true)))
		}
		cc, err := grpc.NewClient(n.GRPCAddr(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		st, err := reflectionv1.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		// A server that refuses the stream may have answered already:
		// Send then reports io.EOF and Recv the status.
		if err := st.Send(req); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		resp, err := st.Recv()
		_ = st.CloseSend()
		return resp, err
	}
	list := &reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}
	resp, err := ask(tok.String(), list)
	if err != nil {
		t.Fatalf("list with a read token: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{api.Client_ServiceDesc.ServiceName, api.Peer_ServiceDesc.ServiceName, api.Admin_ServiceDesc.ServiceName,
		api.Injector_ServiceDesc.ServiceName, reflectionv1.ServerReflection_ServiceDesc.ServiceName} {
		if !slices.Contains(names, want) {
			t.Errorf("services %v lack %s", names, want)
		}
	}
	// describe: the file defining the Client service, with its methods.
	resp, err = ask(tok.String(), &reflectionv1.ServerReflectionRequest{
		MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: api.Client_ServiceDesc.ServiceName}})
	if err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("describe %s: %v %v", api.Client_ServiceDesc.ServiceName, resp, err)
	}
	for name, token := range map[string]string{"no token": "", "a forged token": forged} {
		if _, err := ask(token, list); status.Code(err) != codes.Unauthenticated {
			t.Errorf("list with %s: %v, want Unauthenticated", name, err)
		}
	}
}
