package node_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// TestInjectRPC drives the Injector service of a one-node cluster through
// the client: a shared-memory cache registered from loopback, a stored
// chunk written into exactly its slots with a layer event per layer, a
// missing chunk answered MISS, and the refusals (remote caller, unknown
// cache, bad layout).
func TestInjectRPC(t *testing.T) {
	nodes := startCluster(t, 1)
	nd := nodes[0]
	c := newClient(t, nd)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	spec := testutil.Spec()
	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := testutil.Tokens(rng, 5)
	key, blob := testutil.Blob(t, rng, spec, tokens, chunk.StandaloneContext())
	if _, err := c.Put(ctx, blob); err != nil {
		t.Fatal(err)
	}

	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, DType: chunk.F32}
	shm, err := inject.CreateShm("", spec.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Skipf("shared memory: %v", err)
	}
	defer shm.Close()
	reg := client.CacheRegistration{Fingerprint: fp, Layers: spec.Layers, Layouts: []pagedkv.CacheLayout{lay},
		MaxPositions: 1024, File: shm.Memory.File, Offsets: shm.Memory.Offsets}
	inj, err := c.RegisterCache(ctx, nd.GRPCAddr(), reg)
	if err != nil {
		t.Fatal(err)
	}
	slots := []int{17, 18, -1, 40, 41}
	missing := testutil.Tokens(rng, 3)
	res, stats, err := inj.InjectLayered(ctx, []pagedkv.InjectChunk{
		{Key: key, Tokens: tokens, Pos: 100, Slots: slots},
		{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, missing), Context: chunk.StandaloneContext()}, Tokens: missing, Pos: 105, Slots: []int{50, 51, 52}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Match != chunk.MatchExact || res[0].Context != key.Context || res[1].Match != chunk.MatchMiss {
		t.Fatalf("results %+v", res)
	}
	slotBytes := spec.KVHeads * spec.HeadDim * 4
	if stats.Layers != spec.Layers || stats.WrittenBytes != uint64(spec.Layers*2*4*slotBytes) {
		t.Fatalf("stats %+v", stats)
	}
	// The node's stage timers come through the client.
	if tm := stats.Timings; tm.Fetch <= 0 || tm.Verify <= 0 || tm.Scatter <= 0 {
		t.Errorf("timings %+v, want fetch, verify and scatter filled", tm)
	}
	// Only the four slots of the hit hold data, in K and V of every layer.
	written := map[int]bool{17: true, 18: true, 40: true, 41: true}
	for l, layer := range shm.Layers {
		half := len(layer) / 2
		for s := 0; s < lay.NumBlocks*lay.BlockSize; s++ {
			for kv := 0; kv < 2; kv++ {
				b := layer[kv*half+s*slotBytes : kv*half+(s+1)*slotBytes]
				nonzero := false
				for _, x := range b {
					nonzero = nonzero || x != 0
				}
				if nonzero != written[s] {
					t.Fatalf("layer %d kv %d slot %d: written %v, want %v", l, kv, s, nonzero, written[s])
				}
			}
		}
	}
	if local, peers := nd.InjectFetchedBytes(); local != float64(len(blob)) || peers != 0 {
		t.Errorf("fetched %v local, %v from peers; want %d, 0", local, peers, len(blob))
	}

	// Refusals.
	// Direct handler calls carry what the Guard would have put in the
	// context: an authenticated caller (any model), and its address.
	authed := auth.WithPrincipal(ctx, &auth.Principal{Addr: "test"})
	here := peer.NewContext(authed, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5}})
	remote := peer.NewContext(authed, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5}})
	preg := &api.RegisterCacheRequest{Fingerprint: api.ProtoFingerprint(fp), Layers: int32(spec.Layers),
		Layouts: []*api.CacheLayout{api.ProtoLayout(lay)}, MemoryKind: api.MemoryKind_MEMORY_KIND_SHM, Offsets: shm.Memory.Offsets}
	in := nd.Injector()
	handle := func(f *os.File) []byte {
		sock, err := in.CacheSocket(here, &api.CacheSocketRequest{})
		if err != nil {
			t.Fatal(err)
		}
		h, err := api.SendCacheFile(ctx, sock.Address, f)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	withHandle := func(h []byte) *api.RegisterCacheRequest {
		r := proto.Clone(preg).(*api.RegisterCacheRequest)
		r.MemoryHandle = h
		return r
	}
	// A fresh file registers once under its handle; the handle is spent.
	fresh, err := inject.CreateShm("", spec.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	used := handle(fresh.Memory.File)
	resp, err := in.RegisterCache(here, withHandle(used))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.UnregisterCache(here, &api.UnregisterCacheRequest{CacheId: resp.CacheId}); err != nil {
		t.Fatal(err)
	}
	disk, err := os.CreateTemp(t.TempDir(), "cache")
	if err != nil {
		t.Fatal(err)
	}
	defer disk.Close()
	if err := disk.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	onTmpfs := unix.Fstatfs(int(disk.Fd()), &fs) == nil && fs.Type == unix.TMPFS_MAGIC
	// Every refusal of the memory is the same answer, whatever the file.
	refusals := map[string]*api.RegisterCacheRequest{
		"no handle":                     withHandle(nil),
		"made-up handle":                withHandle(make([]byte, api.CacheHandleBytes)),
		"spent handle":                  withHandle(used),
		"the registered cache's file":   withHandle(handle(shm.Memory.File)),
		"the file opened again by name": withHandle(handle(reopen(t, shm.Memory.File))),
	}
	if !onTmpfs {
		refusals["a disk file"] = withHandle(handle(disk))
	}
	var answer string
	for name, r := range refusals {
		_, err := in.RegisterCache(here, r)
		st := status.Convert(err)
		if st.Code() != codes.PermissionDenied || (answer != "" && st.Message() != answer) {
			t.Errorf("%s: %v, want PermissionDenied %q", name, err, answer)
		}
		answer = st.Message()
	}
	if _, err := in.CacheSocket(remote, &api.CacheSocketRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("cache socket asked from another machine: %v", err)
	}
	bad := proto.Clone(preg).(*api.RegisterCacheRequest)
	bad.Layouts = []*api.CacheLayout{{Order: 1, NumBlocks: 4, BlockSize: 16, KvHeads: 3, HeadDim: 16, Dtype: 1}}
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"remote caller", func() error { _, err := nd.Injector().RegisterCache(remote, preg); return err }, codes.PermissionDenied},
		{"bad layout", func() error {
			bad.MemoryHandle = handle(fresh.Memory.File)
			_, err := nd.Injector().RegisterCache(here, bad)
			return err
		}, codes.InvalidArgument},
		{"no memory kind", func() error {
			r := proto.Clone(preg).(*api.RegisterCacheRequest)
			r.MemoryKind = 0
			_, err := nd.Injector().RegisterCache(here, r)
			return err
		}, codes.InvalidArgument},
		{"unknown cache", func() error {
			_, err := nd.Injector().UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: 999})
			return err
		}, codes.NotFound},
	} {
		if err := tc.call(); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
	// The failed registration (bad layout) spent its handle too.
	if _, err := in.RegisterCache(here, withHandle(bad.MemoryHandle)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the handle of a failed registration used again: %v", err)
	}
	if err := inj.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := inj.InjectChunks(ctx, []pagedkv.InjectChunk{{Key: key, Tokens: tokens, Pos: 0, Slots: slots}}); status.Code(err) != codes.NotFound {
		t.Fatalf("inject after unregister: %v", err)
	}
}

// TestReplicaBestBatch: ranking many keys with one Lookup per replica node
// answers every key as ranking it alone does (exact, approximate, miss),
// also with a replica down.
func TestReplicaBestBatch(t *testing.T) {
	nodes := startCluster(t, 3)
	c := newClient(t, nodes...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	spec := testutil.Spec()
	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	want := chunk.PrefixContext(chunk.ID{Lo: 77})
	var keys []chunk.Key
	for i := range 12 {
		tokens := testutil.Tokens(rng, 4)
		content := chunk.ContentID(fp, tokens)
		switch i % 3 {
		case 0: // exact
			_, blob := testutil.Blob(t, rng, spec, tokens, want)
			if _, err := c.Put(ctx, blob); err != nil {
				t.Fatal(err)
			}
		case 1: // approximate
			_, blob := testutil.Blob(t, rng, spec, tokens, chunk.StandaloneContext())
			if _, err := c.Put(ctx, blob); err != nil {
				t.Fatal(err)
			}
		}
		keys = append(keys, chunk.Key{Fingerprint: fp, Content: content, Context: want})
	}
	r := node.RemoteOf(nodes[0])
	check := func(name string) {
		got := r.BestBatch(ctx, keys)
		if len(got) != len(keys) {
			t.Fatalf("%s: %d answers for %d keys", name, len(got), len(keys))
		}
		for i, k := range keys {
			key, m, err := r.Best(ctx, k.Fingerprint, k.Content, k.Context)
			if m != got[i].Match || key != got[i].Key || (err != nil) != (got[i].Err != nil) {
				t.Errorf("%s: key %d: batch %v %v (%v), alone %v %v (%v)", name, i, got[i].Match, got[i].Key, got[i].Err, m, key, err)
			}
			if len(r.Others(k.Content)) > 0 && got[i].Err == nil {
				if wantM := []chunk.Match{chunk.MatchExact, chunk.MatchApproximate, chunk.MatchMiss}[i%3]; got[i].Match != wantM {
					t.Errorf("%s: key %d: %v, want %v", name, i, got[i].Match, wantM)
				}
			}
		}
	}
	check("all up")
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	check("one replica down")
}

// reopen opens f again through /proc/self/fd, as another process holding
// it could, and closes the new file with the test.
func reopen(t *testing.T, f *os.File) *os.File {
	t.Helper()
	g, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}
