package auth_test

import (
	"context"

	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
)

// Wiring a node's gRPC server: the guard first (it puts the caller in the
// context), then the stream limiter (it counts per caller), then the
// node's own interceptors. table is the metadata store's token table.
func Example() {
	var table auth.TokenTable // the meta store
	guard := auth.NewGuard(auth.Config{Verifier: auth.NewVerifier(table)})
	limiter := auth.NewStreamLimiter(auth.LimiterConfig{MaxStreams: 64})
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(guard.UnaryInterceptor() /*, node's */),
		grpc.ChainStreamInterceptor(guard.StreamInterceptor(), limiter.StreamInterceptor() /*, node's */),
	)
	defer srv.Stop()
}

// A handler checks each model of a request once it has parsed it, before
// it stores or returns anything.
func ExampleCheckFingerprint() {
	get := func(ctx context.Context, fp chunk.Fingerprint) error {
		if err := auth.CheckFingerprint(ctx, fp); err != nil {
			return err // PermissionDenied, as a gRPC status
		}
		// ... fetch and stream the chunk
		return nil
	}
	_ = get
}
