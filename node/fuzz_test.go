package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// The handler fuzz targets feed arbitrary bytes, unmarshalled into each
// request message of a service, to the real handlers of one in-process
// node per fuzz process, over gRPC with the node's own interceptors (token
// guard, limiter, panic recovery). The caller holds a token with every
// scope but a namespace of exactly one registered model, so most mutated
// fingerprints exercise the refusal path and none waits for an unknown
// model. Each call must end in success or a status with a code a client
// can act on (never Unknown, Internal or DataLoss: Internal is also what a
// recovered panic gives, and the panic counter must stay 0), and a
// refused request must leave the node's state (entries, models, tokens,
// gossip keys, settings) as it was.

// fuzzEnv is the shared node of one fuzz process.
type fuzzEnv struct {
	n     *Node
	cc    *grpc.ClientConn
	spec  chunk.ModelSpec
	keys  []chunk.Key
	blobs [][]byte
	token string
	shm   *inject.ShmCache
	cache uint64
	// timeout bounds each call. The peer API has no namespace, so a
	// mutated fingerprint waits for its model (modelWait) until this.
	timeout time.Duration
}

// fuzzLimits keep one request's allocation small (the node allocates an
// announced entry size up front).
var fuzzLimits = chunk.Limits{MaxBlobBytes: 1 << 20, MaxRawBytes: 1 << 20, MaxTokens: 4096, MaxLayers: 64, MaxKVHeads: 64, MaxHeadDim: 256}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	f.Helper()
	key, err := gossipkey.Generate()
	if err != nil {
		f.Fatal(err)
	}
	kr, err := gossipkey.NewKeyring(key, nil)
	if err != nil {
		f.Fatal(err)
	}
	n, err := New(Config{NodeID: "fz", DataDir: f.TempDir(), HTTPAddr: "off", DRAMBytes: 32 << 20, LocalTiming: true,
		RPCTimeout: 2 * time.Second, Insecure: true, Tokens: true, GossipKeyring: kr, Limits: fuzzLimits,
		MaxChunksPerRequest: 64, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.Context(), 60*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		_ = n.Close()
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = n.Close() })
	testutil.WaitFor(f, "the node to be ready", func() bool { return n.Ready() == nil })
	e := &fuzzEnv{n: n, timeout: 5 * time.Second, spec: chunk.ModelSpec{Family: "llama", Layers: 2, KVHeads: 2, HeadDim: 8, DType: chunk.F16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 10000, TokenizerID: "fuzz"}}
	fp := e.spec.Fingerprint()
	if _, err := n.meta.RegisterModel(ctx, e.spec); err != nil {
		f.Fatal(err)
	}
	tok, rec, err := auth.NewToken("fuzz", auth.TokenScopes, auth.Namespace{fp.String()}, time.Time{})
	if err != nil {
		f.Fatal(err)
	}
	if err := n.meta.PutToken(ctx, rec); err != nil {
		f.Fatal(err)
	}
	e.token = tok.String()
	e.cc, err = grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(auth.TokenCredentials(e.token, true)),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.cc.Close() })
	for i := range 3 {
		tokens := []uint32{uint32(i), 7, 11, 13}
		key, blob := testutil.Blob(f, rand.New(rand.NewPCG(uint64(i), 0)), e.spec, tokens, chunk.StandaloneContext())
		if err := e.put(ctx, api.NewClientClient(e.cc).Put, &api.PutHeader{Key: api.ProtoKey(key), BlobBytes: uint64(len(blob))}, blob); err != nil {
			f.Fatal(err)
		}
		e.keys, e.blobs = append(e.keys, key), append(e.blobs, blob)
	}
	return e
}

// addMislabelled adds seeds for the Put method sel: entries whose key their
// tokens do not give, or whose context is not canonical, each announced
// under its own (bad) key so that only the key check stands in the way.
func (e *fuzzEnv) addMislabelled(f *testing.F, sel uint8, direct bool, kind uint32) {
	bad := []func(k *chunk.Key){
		func(k *chunk.Key) { k.Content = e.keys[1].Content },
		func(k *chunk.Key) { k.Context.ID = chunk.ID{Lo: 1} },
		func(k *chunk.Key) { k.Context.Window = 4 },
		func(k *chunk.Key) {
			k.Context = chunk.PrefixContext(chunk.PrefixRoot(k.Fingerprint))
			k.Context.Window = 1
		},
		func(k *chunk.Key) { k.Context = chunk.Context{Kind: chunk.ContextWindow, ID: chunk.ID{Lo: 2}} },
		// Another key of the standalone computation.
		func(k *chunk.Key) { k.Context = chunk.PrefixContext(chunk.PrefixRoot(k.Fingerprint)) },
		func(k *chunk.Key) {
			k.Context = chunk.Context{Kind: chunk.ContextWindow, Window: 8, ID: chunk.WindowID(k.Fingerprint, nil)}
		},
	}
	for _, mod := range bad {
		k := e.keys[0]
		mod(&k)
		body := testutil.Relabel(slices.Clone(e.blobs[0]), k)
		h := &api.PutHeader{Key: api.ProtoKey(k), BlobBytes: uint64(len(body)), Direct: direct, Kind: kind}
		if direct {
			h.At = 1
		}
		b, err := proto.Marshal(h)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(sel, b, body)
	}
}

// checkPut puts body with hdr through open and, when body is a whole entry
// of the fuzzed model announced under its own key that does not name it
// (chunk.ErrNonCanonical), requires the node to refuse it as invalid.
func (e *fuzzEnv) checkPut(t *testing.T, what string, open func(context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[api.PutFrame, api.PutResponse], error),
	hdr *api.PutHeader, body []byte) {
	t.Helper()
	var err error
	e.call(t, what, true, func(ctx context.Context) error { err = e.put(ctx, open, hdr, body); return err })
	hd, perr := chunk.ParseHeader(body, fuzzLimits)
	k, kerr := api.KeyFromProto(hdr.Key)
	if !errors.Is(perr, chunk.ErrNonCanonical) || kerr != nil || k != hd.Key || hdr.BlobBytes != uint64(len(body)) ||
		hd.Key.Fingerprint != e.spec.Fingerprint() {
		return
	}
	if c := status.Code(err); c != codes.InvalidArgument && c != codes.DeadlineExceeded && c != codes.Canceled {
		t.Fatalf("%s of an entry its key does not name: %v, want InvalidArgument", what, err)
	}
}

// unrestrictedAdmin stores a token with every scope and no namespace and
// returns an Admin client that calls with it, and the token's ID.
func (e *fuzzEnv) unrestrictedAdmin(f *testing.F) (api.AdminClient, string) {
	f.Helper()
	tok, rec, err := auth.NewToken("root", auth.TokenScopes, nil, time.Time{})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.Context(), 30*time.Second)
	defer cancel()
	if err := e.n.meta.PutToken(ctx, rec); err != nil {
		f.Fatal(err)
	}
	cc, err := grpc.NewClient(e.n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(auth.TokenCredentials(tok.String(), true)),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec())))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = cc.Close() })
	return api.NewAdminClient(cc), rec.ID
}

// withCache registers a shared-memory cache for the model (Linux only).
func (e *fuzzEnv) withCache(f *testing.F) {
	f.Helper()
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 2, BlockSize: 16, KVHeads: e.spec.KVHeads, HeadDim: e.spec.HeadDim, DType: chunk.F16}
	shm, err := inject.CreateShm("", e.spec.Layers, []pagedkv.CacheLayout{lay})
	if err != nil {
		f.Skipf("shared memory: %v", err)
	}
	f.Cleanup(func() { _ = shm.Close() })
	e.shm = shm
	ctx, cancel := context.WithTimeout(f.Context(), 10*time.Second)
	defer cancel()
	ic := api.NewInjectorClient(e.cc)
	resp, err := ic.RegisterCache(ctx, e.registerRequest(handOver(f, ctx, ic, shm.Memory.File)))
	if err != nil {
		f.Fatal(err)
	}
	e.cache = resp.CacheId
}

func (e *fuzzEnv) registerRequest(handle []byte) *api.RegisterCacheRequest {
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 2, BlockSize: 16, KVHeads: e.spec.KVHeads, HeadDim: e.spec.HeadDim, DType: chunk.F16}
	return &api.RegisterCacheRequest{Fingerprint: api.ProtoFingerprint(e.spec.Fingerprint()), Layers: int32(e.spec.Layers),
		Layouts: []*api.CacheLayout{api.ProtoLayout(lay)}, MaxPositions: 256,
		MemoryKind: api.MemoryKind_MEMORY_KIND_SHM, MemoryHandle: handle, Offsets: e.shm.Memory.Offsets}
}

// put sends one Put or Replicate stream: hdr, then body in frames.
func (e *fuzzEnv) put(ctx context.Context, open func(context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[api.PutFrame, api.PutResponse], error),
	hdr *api.PutHeader, body []byte) error {
	st, err := open(ctx)
	if err != nil {
		return err
	}
	if err := api.SendHeader(st, hdr); err == nil && len(body) > 0 {
		_ = api.SendBody(st, mem.SliceBuffer(body), 1024)
	}
	_, err = st.CloseAndRecv()
	return err
}

// state summarises what a refused request must not change.
func (e *fuzzEnv) state() string {
	h := sha256.New()
	var keys []string
	e.n.store.Scan(func(k chunk.Key, sum uint64, size int) bool {
		keys = append(keys, fmt.Sprintf("%v/%x/%d", k, sum, size))
		return true
	})
	slices.Sort(keys)
	for _, k := range keys {
		io.WriteString(h, k)
	}
	for _, m := range e.n.meta.Models() {
		io.WriteString(h, m.Fingerprint().String())
	}
	for _, r := range e.n.meta.Tokens() {
		fmt.Fprintf(h, "%s/%s/%v", r.ID, r.Scopes, r.Namespace)
	}
	_, all := e.n.gossip.Keys()
	for _, k := range all {
		h.Write(k)
	}
	fmt.Fprintf(h, "%+v%d", e.n.meta.Settings(), e.n.meta.Ring().Epoch())
	return hex.EncodeToString(h.Sum(nil))
}

// shmSum hashes the registered cache's memory.
func (e *fuzzEnv) shmSum() string {
	h := sha256.New()
	if e.shm != nil {
		for _, l := range e.shm.Layers {
			h.Write(l)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// check fails t if err is not a status a client can act on, or if a
// handler panicked.
func (e *fuzzEnv) check(t *testing.T, what string, err error) {
	t.Helper()
	if p := readCounter(e.n.metrics.panics); p > 0 {
		t.Fatalf("%s: %v handler panics recovered", what, p)
	}
	if err == nil {
		return
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("%s: error %v is not a gRPC status", what, err)
	}
	switch st.Code() {
	case codes.Unknown, codes.Internal, codes.DataLoss:
		t.Fatalf("%s: %v", what, err)
	}
}

// call runs one fuzzed request: mutating requests must change nothing
// when refused.
func (e *fuzzEnv) call(t *testing.T, what string, mutates bool, do func(ctx context.Context) error) {
	t.Helper()
	var before string
	if mutates {
		before = e.state()
	}
	ctx, cancel := context.WithTimeout(t.Context(), e.timeout)
	err := do(ctx)
	cancel()
	e.check(t, what, err)
	// A call cut by its deadline may still have completed on the node.
	if c := status.Code(err); err != nil && mutates && c != codes.DeadlineExceeded && c != codes.Canceled {
		if after := e.state(); after != before {
			t.Fatalf("%s refused (%v) but changed the node's state", what, err)
		}
	}
}

// seeds adds (selector, message) seeds: each seed message under each
// selector, so every method starts from every shape.
func addSeeds(f *testing.F, methods int, msgs []proto.Message, bodies [][]byte) {
	for m := range methods {
		for i, msg := range msgs {
			b, err := proto.Marshal(msg)
			if err != nil {
				f.Fatal(err)
			}
			body := []byte(nil)
			if len(bodies) > 0 {
				body = bodies[i%len(bodies)]
			}
			f.Add(uint8(m), b, body)
		}
	}
}

// FuzzClientService fuzzes every Client RPC but Drain (which takes the
// node out of the cluster; its request is one bool).
func FuzzClientService(f *testing.F) {
	e := newFuzzEnv(f)
	pk := api.ProtoKey(e.keys[0])
	fp := api.ProtoFingerprint(e.spec.Fingerprint())
	// Message i is sent with body i%3 (addSeeds): each Put header names
	// the key of its body, so the seeds get past the entry checks to the
	// store.
	addSeeds(f, 8, []proto.Message{
		&api.RegisterModelRequest{Spec: api.ProtoSpec(e.spec)},
		&api.PutHeader{Key: api.ProtoKey(e.keys[1]), BlobBytes: uint64(len(e.blobs[1]))},
		&api.PutHeader{Key: api.ProtoKey(e.keys[2]), BlobBytes: uint64(len(e.blobs[2])), Direct: true, Kind: 2, At: 1},
		&api.GetRequest{Key: pk, Format: api.Format_FORMAT_RAW, LayerHi: 1, HeadLo: 1},
		&api.LookupRequest{Fingerprint: fp, Items: []*api.LookupItem{{Content: pk.Content, Want: pk.Context}}},
		&api.DeleteRequest{Key: api.ProtoKey(e.keys[2]), At: 5},
	}, e.blobs)
	e.addMislabelled(f, 2, false, 0)
	e.addMislabelled(f, 2, true, 3)
	cl := api.NewClientClient(e.cc)
	f.Fuzz(func(t *testing.T, sel uint8, msg, body []byte) {
		switch sel % 8 {
		case 0:
			var req api.RegisterModelRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "RegisterModel", true, func(ctx context.Context) error { _, err := cl.RegisterModel(ctx, &req); return err })
			}
		case 1:
			e.call(t, "Models", false, func(ctx context.Context) error { _, err := cl.Models(ctx, &api.ModelsRequest{}); return err })
		case 2:
			var hdr api.PutHeader
			if proto.Unmarshal(msg, &hdr) == nil {
				e.checkPut(t, "Put", cl.Put, &hdr, body)
			}
		case 3:
			var req api.GetRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "Get", false, func(ctx context.Context) error {
					st, err := cl.Get(ctx, &req)
					for err == nil {
						_, err = st.Recv()
					}
					if err == io.EOF {
						return nil
					}
					return err
				})
			}
		case 4:
			var req api.LookupRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "Lookup", false, func(ctx context.Context) error { _, err := cl.Lookup(ctx, &req); return err })
			}
		case 5:
			var req api.DeleteRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "Delete", true, func(ctx context.Context) error { _, err := cl.Delete(ctx, &req); return err })
			}
		case 6:
			e.call(t, "Stats", false, func(ctx context.Context) error { _, err := cl.Stats(ctx, &api.StatsRequest{}); return err })
		case 7:
			e.call(t, "ClusterInfo", false, func(ctx context.Context) error {
				_, err := cl.ClusterInfo(ctx, &api.ClusterInfoRequest{})
				return err
			})
		}
	})
}

// FuzzPeerService fuzzes every Peer RPC (the node runs without TLS, so the
// fuzzing caller counts as a member), MetaApply's raft commands included.
func FuzzPeerService(f *testing.F) {
	e := newFuzzEnv(f)
	e.timeout = 300 * time.Millisecond
	pk := api.ProtoKey(e.keys[1])
	addSeeds(f, 7, []proto.Message{
		// Sent with body 0 (addSeeds): its own key.
		&api.PutHeader{Key: api.ProtoKey(e.keys[0]), BlobBytes: uint64(len(e.blobs[0])), Direct: true, Kind: 3},
		&api.GetRequest{Key: pk, Direct: true},
		&api.DigestRequest{},
		&api.DigestRequest{From: "fz", Epoch: e.n.meta.Ring().Epoch(), Replicas: 1, Keys: []*api.Key{pk}},
		&api.MetaApplyRequest{Command: []byte(`{"kind":1}`)},
		&api.DeleteRequest{Key: pk, Direct: true, At: 1},
		&api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_INSTALL, Key: bytes.Repeat([]byte{1}, 32)},
		&api.FetchManyRequest{Keys: []*api.Key{pk, api.ProtoKey(e.keys[0]), pk}},
	}, e.blobs)
	for kind := uint32(1); kind <= 4; kind++ {
		e.addMislabelled(f, 0, true, kind)
	}
	pc := api.NewPeerClient(e.cc)
	f.Fuzz(func(t *testing.T, sel uint8, msg, body []byte) {
		switch sel % 7 {
		case 0:
			var hdr api.PutHeader
			if proto.Unmarshal(msg, &hdr) == nil {
				e.checkPut(t, "Replicate", pc.Replicate, &hdr, body)
			}
		case 1:
			var req api.GetRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "Fetch", false, func(ctx context.Context) error {
					st, err := pc.Fetch(ctx, &req)
					for err == nil {
						_, err = st.Recv()
					}
					if err == io.EOF {
						return nil
					}
					return err
				})
			}
		case 2:
			var req api.DigestRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "Digest", false, func(ctx context.Context) error { _, err := pc.Digest(ctx, &req); return err })
			}
		case 3:
			var req api.MetaApplyRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "MetaApply", true, func(ctx context.Context) error { _, err := pc.MetaApply(ctx, &req); return err })
			}
		case 4:
			var req api.DeleteRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "Peer.Delete", true, func(ctx context.Context) error { _, err := pc.Delete(ctx, &req); return err })
			}
		case 5:
			var req api.GossipKeyRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "GossipKey", true, func(ctx context.Context) error { _, err := pc.GossipKey(ctx, &req); return err })
			}
		case 6:
			var req api.FetchManyRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "FetchMany", false, func(ctx context.Context) error {
					st, err := pc.FetchMany(ctx, &req)
					if err != nil {
						return err
					}
					// A stream the node sends must be well formed.
					return api.RecvFetchMany(st, len(req.Keys), fuzzLimits, discardSink{})
				})
			}
		}
	})
}

// discardSink reads a FetchMany stream and keeps nothing.
type discardSink struct{}

func (discardSink) Found(int, []byte, *chunk.Header) {}
func (discardSink) Missing(int, codes.Code)          {}
func (discardSink) Layer(int, int)                   {}

// FuzzInjectorService fuzzes RegisterCache (its path kept to the test's
// own shared memory: a fuzzed path must not map another process's files),
// UnregisterCache and Inject; a refused Inject must not have written the
// cache.
func FuzzInjectorService(f *testing.F) {
	e := newFuzzEnv(f)
	e.withCache(f)
	pk := api.ProtoKey(e.keys[0])
	addSeeds(f, 3, []proto.Message{
		e.registerRequest(nil),
		e.registerRequest(bytes.Repeat([]byte{9}, api.CacheHandleBytes)),
		&api.UnregisterCacheRequest{CacheId: e.cache + 1},
		&api.InjectRequest{CacheId: e.cache, Chunks: []*api.InjectChunk{{Content: pk.Content, Tokens: []uint32{0, 7, 11, 13}, Want: pk.Context, Pos: 3, Slots: []int64{0, 1, 2, -1}}}},
	}, nil)
	ic := api.NewInjectorClient(e.cc)
	f.Fuzz(func(t *testing.T, sel uint8, msg, _ []byte) {
		switch sel % 3 {
		case 0:
			var req api.RegisterCacheRequest
			if proto.Unmarshal(msg, &req) != nil {
				return
			}
			// A request without a handle gets one: a fresh memfd of a
			// fuzzed size, or (odd selectors) the registered cache's own
			// file, which must be refused. Any other handle is the
			// fuzzer's, and refused unless it guessed one.
			if req.MemoryKind == api.MemoryKind_MEMORY_KIND_SHM && len(req.MemoryHandle) == 0 {
				ctx, cancel := context.WithTimeout(t.Context(), e.timeout)
				file := e.shm.Memory.File
				if sel&4 == 0 {
					file = memfd(t, int64(len(msg))*512)
				}
				req.MemoryHandle = handOver(t, ctx, ic, file)
				cancel()
				if sel&4 != 0 {
					e.call(t, "RegisterCache", false, func(ctx context.Context) error {
						resp, err := ic.RegisterCache(ctx, &req)
						if err == nil {
							t.Fatalf("registered the registered cache's file again as %d", resp.CacheId)
						}
						return err
					})
					return
				}
			}
			e.call(t, "RegisterCache", false, func(ctx context.Context) error {
				resp, err := ic.RegisterCache(ctx, &req)
				if err == nil && resp.CacheId != e.cache {
					_, err = ic.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: resp.CacheId})
				}
				return err
			})
		case 1:
			var req api.UnregisterCacheRequest
			if proto.Unmarshal(msg, &req) == nil && req.CacheId != e.cache {
				e.call(t, "UnregisterCache", false, func(ctx context.Context) error { _, err := ic.UnregisterCache(ctx, &req); return err })
			}
		case 2:
			var req api.InjectRequest
			if proto.Unmarshal(msg, &req) != nil {
				return
			}
			before := e.shmSum()
			e.call(t, "Inject", false, func(ctx context.Context) error {
				st, err := ic.Inject(ctx, &req)
				for err == nil {
					_, err = st.Recv()
				}
				if err == io.EOF {
					return nil
				}
				if after := e.shmSum(); after != before {
					t.Fatalf("Inject refused (%v) but wrote the cache", err)
				}
				return err
			})
		}
	})
}

// FuzzAdminService fuzzes the token, gossip key and settings RPCs.
// RevokeToken, GossipKeys, GetSettings and SetSettings go, for every other
// selector value past the first six, through an unrestricted admin: the
// namespaced caller's revoke of a token this node does not know ends at
// NotFound in the handler, and only an unrestricted one reaches the
// metadata's own checks (the ID's form) and the raft write; the cluster's
// gossip keys and settings refuse the namespaced caller (PermissionDenied,
// always) and only an unrestricted one reaches their handlers.
func FuzzAdminService(f *testing.F) {
	e := newFuzzEnv(f)
	fp := e.spec.Fingerprint().String()
	id, _, _ := strings.Cut(e.token, ".")
	rootAC, rootID := e.unrestrictedAdmin(f)
	for _, rid := range []string{"0123456789abcdef", "not a token id", strings.Repeat("A", 16), id} {
		b, err := proto.Marshal(&api.RevokeTokenRequest{Id: rid})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(6+2), b, []byte(nil))
	}
	addSeeds(f, 12, []proto.Message{
		&api.CreateTokenRequest{Name: "x", Scopes: "read,write", Namespace: []string{fp}, TtlSeconds: 60},
		&api.CreateTokenRequest{Scopes: "admin", Namespace: []string{fp[:4]}},
		&api.RevokeTokenRequest{Id: "0123456789abcdef"},
		&api.GossipKeyRequest{Op: api.GossipKeyOp_GOSSIP_KEY_OP_REMOVE, Key: bytes.Repeat([]byte{2}, 16)},
		&api.GetSettingsRequest{},
		&api.SetSettingsRequest{ReplicationFactor: 2, WriteQuorum: 1, Codec: "lossless"},
		&api.SetSettingsRequest{WriteQuorum: 4},
		&api.SetSettingsRequest{ReplicationFactor: 1 << 31, Codec: "zstd"},
	}, nil)
	ac := api.NewAdminClient(e.cc)
	f.Fuzz(func(t *testing.T, sel uint8, msg, _ []byte) {
		root := sel/6%2 == 1
		cluster := ac // the caller of the cluster's own state
		if root {
			cluster = rootAC
		}
		// namespaced checks that the namespaced caller was refused the
		// cluster's state, whatever it asked.
		namespaced := func(err error) error {
			if !root && status.Code(err) != codes.PermissionDenied {
				t.Fatalf("a namespaced admin reached the cluster's state: %v", err)
			}
			return err
		}
		switch sel % 6 {
		case 0:
			var req api.CreateTokenRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "CreateToken", true, func(ctx context.Context) error {
					resp, err := ac.CreateToken(ctx, &req)
					if err == nil {
						if _, perr := auth.ParseToken(resp.Token); perr != nil || !auth.Namespace(resp.Info.Namespace).Within(auth.Namespace{fp}) {
							t.Fatalf("created %q (%v) with namespace %v beyond the creator's", resp.Token, perr, resp.Info.Namespace)
						}
					}
					return err
				})
			}
		case 1:
			e.call(t, "ListTokens", false, func(ctx context.Context) error { _, err := ac.ListTokens(ctx, &api.ListTokensRequest{}); return err })
		case 2:
			var req api.RevokeTokenRequest
			if proto.Unmarshal(msg, &req) == nil && req.Id != id && req.Id != rootID {
				e.call(t, "RevokeToken", true, func(ctx context.Context) error { _, err := cluster.RevokeToken(ctx, &req); return err })
			}
		case 3:
			var req api.GossipKeyRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "GossipKeys", true, func(ctx context.Context) error {
					resp, err := cluster.GossipKeys(ctx, &req)
					if err == nil && resp.Failed > 0 && req.Op != api.GossipKeyOp_GOSSIP_KEY_OP_LIST {
						// Per-node failures after the checks passed: on
						// one node, nothing may have changed either.
						return status.Error(codes.FailedPrecondition, resp.Nodes[0].Error)
					}
					return namespaced(err)
				})
			}
		case 4:
			e.call(t, "GetSettings", false, func(ctx context.Context) error {
				resp, err := cluster.GetSettings(ctx, &api.GetSettingsRequest{})
				if err == nil && resp.Settings.Codec != e.n.meta.Settings().Codec.String() {
					t.Fatalf("GetSettings answered %v, the node holds %+v", resp.Settings, e.n.meta.Settings())
				}
				return namespaced(err)
			})
		case 5:
			var req api.SetSettingsRequest
			if proto.Unmarshal(msg, &req) == nil {
				e.call(t, "SetSettings", true, func(ctx context.Context) error {
					_, err := cluster.SetSettings(ctx, &req)
					if namespaced(err) == nil {
						if got := e.n.meta.Settings(); got.Validate() != nil ||
							req.ReplicationFactor != 0 && got.ReplicationFactor != int(req.ReplicationFactor) ||
							req.WriteQuorum != 0 && got.WriteQuorum != int(req.WriteQuorum) ||
							req.Codec != "" && got.Codec.String() != req.Codec {
							t.Fatalf("SetSettings(%v) accepted, the node holds %+v", &req, got)
						}
					}
					return err
				})
			}
		}
	})
}
