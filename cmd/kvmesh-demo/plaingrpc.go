package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvmesh/kvmesh/api"
)

// plainGRPC is the reference a remote hit is held to: one plain streaming
// RPC on this machine's loopback moving n bytes, with the nodes' transport
// settings (api.ServerOptions, api.DialOptions, the zero-copy codec, 1 MiB
// frames) and nothing else: no store, no lookup, no verification.
type plainGRPC struct {
	srv  *grpc.Server
	conn *grpc.ClientConn
	lis  net.Listener
}

// plainMethod streams back as many bytes as its request asks for.
const plainMethod = "/kvmesh.demo.Plain/Bytes"

func startPlainGRPC(maxBytes int) (*plainGRPC, error) {
	body := make([]byte, maxBytes)
	for i := range body {
		body[i] = byte(i)
	}
	desc := grpc.ServiceDesc{
		ServiceName: "kvmesh.demo.Plain",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Bytes", ServerStreams: true,
			Handler: func(_ any, st grpc.ServerStream) error {
				var n wrapperspb.UInt64Value
				if err := st.RecvMsg(&n); err != nil {
					return err
				}
				if n.Value > uint64(len(body)) {
					return fmt.Errorf("demo: %d bytes asked, %d held", n.Value, len(body))
				}
				return api.SendBody(st, mem.SliceBuffer(body[:n.Value]), 0)
			}}},
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(append(api.ServerOptions(), grpc.ForceServerCodecV2(api.Codec()))...)
	srv.RegisterService(&desc, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), append(api.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))...)
	if err != nil {
		srv.Stop()
		return nil, err
	}
	return &plainGRPC{srv: srv, conn: conn, lis: lis}, nil
}

// fetch times one stream of n bytes into dst (n long).
func (p *plainGRPC) fetch(ctx context.Context, dst []byte) (time.Duration, error) {
	t0 := time.Now()
	st, err := p.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, plainMethod)
	if err != nil {
		return 0, err
	}
	if err := st.SendMsg(wrapperspb.UInt64(uint64(len(dst)))); err != nil {
		return 0, err
	}
	if err := st.CloseSend(); err != nil {
		return 0, err
	}
	if err := api.RecvBody(st, dst); err != nil {
		return 0, err
	}
	var f api.Frame
	if err := st.RecvMsg(&f); !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("demo: plain stream did not end: %v", err)
	}
	return time.Since(t0), nil
}

func (p *plainGRPC) close() {
	_ = p.conn.Close()
	p.srv.Stop()
}

// plainRef times plain streams of any size: it starts a plainGRPC holding
// twice the bytes first asked for, and a larger one when a stream asks
// for more than it holds.
type plainRef struct {
	p   *plainGRPC
	buf []byte
}

// time times one plain stream of n bytes.
func (r *plainRef) time(ctx context.Context, n int) (time.Duration, error) {
	if r.p == nil || n > len(r.buf) {
		r.close()
		p, err := startPlainGRPC(2 * n)
		if err != nil {
			return 0, err
		}
		r.p, r.buf = p, make([]byte, 2*n)
	}
	return r.p.fetch(ctx, r.buf[:n])
}

func (r *plainRef) close() {
	if r.p != nil {
		r.p.close()
		r.p = nil
	}
}
