package client

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// DialOptions are the gRPC dial options the Client dials every node
// with: the security of cfg (securityOptions), the api codec and the
// largest message a call receives, then cfg.DialOptions. Tools that call
// a node service the Client does not wrap (the Admin API of `kvmesh
// token`, `gossip-key`, `settings`) dial with them too, so they speak to
// a node exactly as the Client does.
func DialOptions(cfg Config) ([]grpc.DialOption, error) {
	sec, err := securityOptions(cfg)
	if err != nil {
		return nil, err
	}
	opts := append(sec, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec()), grpc.MaxCallRecvMsgSize(maxRecvBytes)))
	// The transport tuning for tensor streams (fixed large windows, larger
	// socket buffers), as the nodes use it.
	opts = append(opts, api.DialOptions()...)
	return append(opts, cfg.DialOptions...), nil
}

// maxRecvBytes bounds one received message (a Get data frame is
// api.DefaultFrameBytes; Lookup answers of MaxLookupBatch items are far
// smaller).
const maxRecvBytes = 8 << 20

// securityOptions are the dial options of cfg's TLS identity and token:
// mutual TLS when cfg.TLS names files, plaintext otherwise (a node in
// insecure mode; the client logs nothing, the node warns); the token, if
// any, on every call, and over TLS only unless cfg.TLS.Insecure is set.
func securityOptions(cfg Config) ([]grpc.DialOption, error) {
	tc := cfg.TLS
	if tc.Logger == nil {
		tc.Logger = cfg.Logger
	}
	plaintext := tc.CAFile == "" && tc.CertFile == "" && tc.KeyFile == ""
	var opts []grpc.DialOption
	if plaintext {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		t, err := tlsconf.New(tc)
		if err != nil {
			return nil, fmt.Errorf("client: TLS: %w", err)
		}
		opts = append(opts, grpc.WithTransportCredentials(t.ClientCredentials()))
	}
	if cfg.Token != "" {
		if _, err := auth.ParseToken(cfg.Token); err != nil {
			return nil, fmt.Errorf("client: token: %w", err)
		}
		// Without TLS the token would cross the network in the clear:
		// only an explicit Insecure allows that.
		opts = append(opts, grpc.WithPerRPCCredentials(auth.TokenCredentials(cfg.Token, tc.Insecure)))
	}
	return opts, nil
}
