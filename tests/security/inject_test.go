package security_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestInjectNamespace: a token for namespace B can neither register a
// cache for a model of namespace A nor inject into or unregister the cache
// a namespace-A token registered; nor can another token of namespace A:
// a cache ID is bound to the token that registered it.
func TestInjectNamespace(t *testing.T) {
	p := newPKI(t)
	cfg := nodetest.NodeConfig(t, "n1", nil)
	cfg.TLS, cfg.Tokens = files(p.dir, "n1"), true
	n1 := nodetest.StartNode(t, cfg)
	testutil.WaitFor(t, "n1 ready", func() bool { return n1.Ready() == nil })

	specA, specB := spec(2), spec(3)
	fpA, fpB := specA.Fingerprint(), specB.Fingerprint()
	admin := newToken(t, n1, "ops", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin, nil)
	tenantA := newToken(t, n1, "a", auth.ScopeRead, auth.Namespace{fpA.String()[:16]})
	tenantB := newToken(t, n1, "b", auth.ScopeRead, auth.Namespace{fpB.String()[:16]})
	otherA := newToken(t, n1, "a2", auth.ScopeRead, auth.Namespace{fpA.String()[:16]})
	app := files(p.dir, "app")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ops := dial(t, n1, client.Config{TLS: app, Token: admin})
	for _, s := range []chunk.ModelSpec{specA, specB} {
		if _, err := ops.RegisterModel(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: specA.KVHeads, HeadDim: specA.HeadDim, DType: chunk.F32}
	shm, err := inject.CreateShm("", specA.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Skipf("shared memory: %v", err)
	}
	defer shm.Close()
	reg := &api.RegisterCacheRequest{Fingerprint: api.ProtoFingerprint(fpA), Layers: int32(specA.Layers),
		Layouts: []*api.CacheLayout{api.ProtoLayout(lay)}, MaxPositions: 1024,
		MemoryKind: api.MemoryKind_MEMORY_KIND_SHM, Path: shm.Memory.Path, Offsets: shm.Memory.Offsets}

	creds := tlsCreds(t, app)
	injector := func(token string) api.InjectorClient {
		cc, err := grpc.NewClient(n1.GRPCAddr(), grpc.WithTransportCredentials(creds),
			grpc.WithPerRPCCredentials(auth.TokenCredentials(token, false)),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return api.NewInjectorClient(cc)
	}
	a, b, a2 := injector(tenantA), injector(tenantB), injector(otherA)

	_, err = b.RegisterCache(ctx, reg)
	wantCode(t, "B registers a cache of model A", err, codes.PermissionDenied)
	resp, err := a.RegisterCache(ctx, reg)
	if err != nil {
		t.Fatalf("A registers its cache: %v", err)
	}
	st, err := b.Inject(ctx, &api.InjectRequest{CacheId: resp.CacheId})
	if err == nil {
		_, err = st.Recv()
	}
	wantCode(t, "B injects into A's cache", err, codes.PermissionDenied)
	_, err = b.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: resp.CacheId})
	wantCode(t, "B unregisters A's cache", err, codes.PermissionDenied)
	st, err = a2.Inject(ctx, &api.InjectRequest{CacheId: resp.CacheId})
	if err == nil {
		_, err = st.Recv()
	}
	wantCode(t, "another namespace-A token injects into A's cache", err, codes.PermissionDenied)
	_, err = a2.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: resp.CacheId})
	wantCode(t, "another namespace-A token unregisters A's cache", err, codes.PermissionDenied)
	// The owner still can: the refusals changed nothing.
	st, err = a.Inject(ctx, &api.InjectRequest{CacheId: resp.CacheId})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) == codes.PermissionDenied {
		t.Errorf("A injects into its own cache: %v", err)
	}
	if _, err := a.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: resp.CacheId}); err != nil {
		t.Fatalf("A unregisters its cache: %v", err)
	}
}
