package security_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestInjectNamespace: a token for namespace B can neither register a
// cache for a model of namespace A nor inject into or unregister the cache
// a namespace-A token registered; nor can another token of namespace A:
// a cache ID is bound to the token that registered it, and anyone else is
// answered as for an ID that does not exist.
func TestInjectNamespace(t *testing.T) {
	p := newPKI(t)
	n1 := startSecureNode(t, p, nil)

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
		MemoryKind: api.MemoryKind_MEMORY_KIND_SHM, Offsets: shm.Memory.Offsets}

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
	withHandle := func(ic api.InjectorClient) *api.RegisterCacheRequest {
		sock, err := ic.CacheSocket(ctx, &api.CacheSocketRequest{})
		if err != nil {
			t.Fatal(err)
		}
		h, err := api.SendCacheFile(ctx, sock.Address, shm.Memory.File)
		if err != nil {
			t.Fatal(err)
		}
		r := proto.Clone(reg).(*api.RegisterCacheRequest)
		r.MemoryHandle = h
		return r
	}

	_, err = b.RegisterCache(ctx, withHandle(b))
	wantCode(t, "B registers a cache of model A", err, codes.PermissionDenied)
	resp, err := a.RegisterCache(ctx, withHandle(a))
	if err != nil {
		t.Fatalf("A registers its cache: %v", err)
	}
	// What a caller other than A hears of A's cache is what anyone hears
	// of an ID nobody registered.
	unknown := resp.CacheId + 1000
	inject := func(ic api.InjectorClient, id uint64) error {
		st, err := ic.Inject(ctx, &api.InjectRequest{CacheId: id})
		if err == nil {
			_, err = st.Recv()
		}
		return err
	}
	unregister := func(ic api.InjectorClient, id uint64) error {
		_, err := ic.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: id})
		return err
	}
	same := func(what string, got, want error) {
		t.Helper()
		g, w := status.Convert(got), status.Convert(want)
		wm := strings.ReplaceAll(w.Message(), fmt.Sprint(unknown), fmt.Sprint(resp.CacheId))
		if got == nil || g.Code() != w.Code() || g.Message() != wm {
			t.Errorf("%s: %v; an unknown ID gets %v", what, got, want)
		}
	}
	same("B injects into A's cache", inject(b, resp.CacheId), inject(b, unknown))
	same("B unregisters A's cache", unregister(b, resp.CacheId), unregister(b, unknown))
	same("another namespace-A token injects into A's cache", inject(a2, resp.CacheId), inject(a2, unknown))
	same("another namespace-A token unregisters A's cache", unregister(a2, resp.CacheId), unregister(a2, unknown))
	wantCode(t, "an unknown cache", inject(a2, unknown), codes.NotFound)
	// Nor can B register A's file as a cache of its own model.
	regB := withHandle(b)
	layB := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 1, BlockSize: 16, KVHeads: specB.KVHeads, HeadDim: specB.HeadDim, DType: chunk.F32}
	regB.Fingerprint, regB.Layers, regB.Layouts, regB.Offsets = api.ProtoFingerprint(fpB), int32(specB.Layers), []*api.CacheLayout{api.ProtoLayout(layB)}, nil
	_, err = b.RegisterCache(ctx, regB)
	wantCode(t, "B registers A's registered file for its own model", err, codes.PermissionDenied)
	// The owner still can: the refusals changed nothing.
	if err := inject(a, resp.CacheId); status.Code(err) == codes.PermissionDenied || status.Code(err) == codes.NotFound {
		t.Errorf("A injects into its own cache: %v", err)
	}
	if _, err := a.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: resp.CacheId}); err != nil {
		t.Fatalf("A unregisters its cache: %v", err)
	}
}
