package client

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/tlsconf"
)

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
