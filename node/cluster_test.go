package node_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodetest"
	"github.com/kvmesh/kvmesh/replication"
)

// startCluster starts n nodes (nodetest.Start) with 64 MiB of DRAM each.
func startCluster(t testing.TB, n int) []*node.Node {
	t.Helper()
	return startClusterDRAM(t, n, 64<<20)
}

// startClusterDRAM is startCluster with a DRAM budget per node. The nodes
// serve HTTP (on any port) and give an RPC 5 s.
func startClusterDRAM(t testing.TB, n int, dram int64) []*node.Node {
	t.Helper()
	return nodetest.Start(t, n, nodetest.Config{Node: func(_ int, cfg *node.Config) {
		cfg.DRAMBytes, cfg.HTTPAddr, cfg.RPCTimeout = dram, "", 5*time.Second
	}}).Nodes
}

func newClient(t testing.TB, nodes ...*node.Node) *client.Client {
	t.Helper()
	var seeds []string
	for _, nd := range nodes {
		seeds = append(seeds, nd.GRPCAddr())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// dialFrames is a connection to n that sends and receives api.Frame with
// the zero-copy codec, as the client and peers do; opts add to it. It is
// closed when the test ends.
func dialFrames(t testing.TB, n *node.Node, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(n.GRPCAddr(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(api.Codec()))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func TestCluster3(t *testing.T) {
	testutil.SkipIfShort(t, "a 3-node cluster through failures")
	nodes := startCluster(t, 3)
	c := newClient(t, nodes[1])
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 1))
	spec := testutil.Spec()

	// An entry of a model nobody registered is refused.
	key0, blob0 := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 8), chunk.StandaloneContext())
	if _, err := c.Put(ctx, blob0); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("put before register: %v, want FailedPrecondition", err)
	}
	if _, err := c.Get(ctx, key0); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("get before register: %v, want FailedPrecondition", err)
	}

	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if fp != spec.Fingerprint() {
		t.Fatalf("fingerprint %v, want %v", fp, spec.Fingerprint())
	}
	bad := spec
	bad.Layers = 0
	if _, err := c.RegisterModel(ctx, bad); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("register invalid spec: %v, want InvalidArgument", err)
	}

	type stored struct {
		key  chunk.Key
		blob []byte
		tok  []uint32
	}
	var all []stored
	for i := range 24 {
		tok := testutil.Tokens(rng, 4+i)
		k, b := testutil.Blob(t, rng, spec, tok, chunk.StandaloneContext())
		res, err := c.Put(ctx, b)
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if len(res.StoredOn) < 2 {
			t.Fatalf("put %d stored on %v, want a write quorum of 2", i, res.StoredOn)
		}
		all = append(all, stored{k, b, tok})
	}
	// A window encoding of the first chunk, for EXACT vs APPROXIMATE.
	win := chunk.WindowContext(fp, 4, []uint32{1, 2, 3, 4})
	kw, bw := testutil.Blob(t, rng, spec, all[0].tok, win)
	if _, err := c.Put(ctx, bw); err != nil {
		t.Fatal(err)
	}

	t.Run("get", func(t *testing.T) {
		for i, s := range all {
			got, err := c.Get(ctx, s.key)
			if err != nil {
				t.Fatalf("get %d: %v", i, err)
			}
			if !bytes.Equal(got, s.blob) {
				t.Fatalf("get %d: bytes differ", i)
			}
		}
	})

	t.Run("range", func(t *testing.T) {
		s := all[3]
		hd, err := chunk.ParseHeader(s.blob, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []chunk.Range{{}, {LayerLo: 1, LayerHi: 3}, {HeadLo: 1, HeadHi: 2}, {LayerLo: 3, LayerHi: 4, HeadLo: 0, HeadHi: 1}} {
			rr, err := r.Resolve(hd.Shape)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]byte, rr.RangeBytes(hd.Shape))
			if err := chunk.DecodeRange(want, s.blob, &hd, rr, nil); err != nil {
				t.Fatal(err)
			}
			got, err := c.GetRange(ctx, s.key, r)
			if err != nil {
				t.Fatalf("range %+v: %v", r, err)
			}
			if !bytes.Equal(got.Data, want) || got.Range != rr || got.Shape != hd.Shape {
				t.Fatalf("range %+v: got %d bytes range %+v, want %d bytes %+v", r, len(got.Data), got.Range, len(want), rr)
			}
		}
		if _, err := c.GetRange(ctx, s.key, chunk.Range{LayerLo: 2, LayerHi: 9}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("range out of bounds: %v, want InvalidArgument", err)
		}
	})

	t.Run("lookup", func(t *testing.T) {
		items := []client.LookupItem{
			{Content: all[0].key.Content, Want: win},                                  // exact (window)
			{Content: all[0].key.Content, Want: chunk.PrefixContext(chunk.ID{Lo: 9})}, // approximate: best is the window
			{Content: all[1].key.Content, Want: chunk.StandaloneContext()},            // exact
			{Content: chunk.ID{Lo: 42, Hi: 42}, Want: chunk.StandaloneContext()},      // miss
		}
		for _, s := range all[2:] {
			items = append(items, client.LookupItem{Content: s.key.Content, Want: chunk.StandaloneContext()})
		}
		res, err := c.Lookup(ctx, fp, items)
		if err != nil {
			t.Fatal(err)
		}
		want := []struct {
			m chunk.Match
			k chunk.Key
		}{{chunk.MatchExact, kw}, {chunk.MatchApproximate, kw}, {chunk.MatchExact, all[1].key}, {chunk.MatchMiss, chunk.Key{}}}
		for i, w := range want {
			if res[i].Match != w.m || res[i].Key != w.k {
				t.Fatalf("item %d: %v %v, want %v %v", i, res[i].Match, res[i].Key, w.m, w.k)
			}
		}
		for i, s := range all[2:] {
			r := res[4+i]
			if r.Match != chunk.MatchExact || r.Key != s.key || len(r.Holders) != 3 {
				t.Fatalf("item %d: %v %v holders %d", 4+i, r.Match, r.Key, len(r.Holders))
			}
		}
		_, err = c.Lookup(ctx, chunk.Fingerprint{Lo: 1}, items[:1])
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("lookup of unknown model: %v, want FailedPrecondition", err)
		}
		// The reason tells a client that a fresher node may know it.
		st, _ := status.FromError(err)
		var reason string
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == api.ErrorDomain {
				reason = info.GetReason()
			}
		}
		if reason != api.ReasonUnknownModel {
			t.Fatalf("unknown model's reason %q, want %q", reason, api.ReasonUnknownModel)
		}
	})

	t.Run("malformed", func(t *testing.T) {
		// A flipped payload byte fails its layer checksum.
		k, b := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 5), chunk.StandaloneContext())
		b[len(b)-1] ^= 1
		if _, err := c.Put(ctx, b); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("corrupt put: %v, want InvalidArgument", err)
		}
		if _, err := c.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("get of a refused put: %v, want not found", err)
		}
		// A shape that does not match the registered model.
		other := spec
		other.Layers = 2
		e := &chunk.Entry{Key: chunk.Key{Fingerprint: fp, Content: chunk.ContentID(fp, []uint32{1}), Context: chunk.StandaloneContext()},
			DType: spec.DType, Layers: 2, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, Tokens: []uint32{1}}
		e.KV = make([]byte, e.Layers*e.LayerBytes())
		mb, err := chunk.Encode(nil, e, chunk.CodecRaw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Put(ctx, mb); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("mismatched shape: %v, want InvalidArgument", err)
		}
		// Entries their key does not name, on every write path: a client
		// Put and a direct Put of each replication kind (replica write,
		// hint, repair or pull, rebalance). Stored, they would make
		// lookups of the real tokens report them EXACT.
		named := testutil.NewEntry(rng, spec, testutil.Tokens(rng, 3), chunk.StandaloneContext())
		mislabelled := map[string]chunk.Key{}
		k = named.Key
		k.Content = chunk.ContentID(fp, []uint32{1001, 1002, 1003})
		mislabelled["content of other tokens"] = k
		k = named.Key
		k.Context.ID = chunk.ID{Lo: 1}
		mislabelled["standalone with an ID"] = k
		k = named.Key
		k.Context = chunk.PrefixContext(chunk.PrefixRoot(fp))
		k.Context.Window = 8
		mislabelled["prefix with a window"] = k
		k = named.Key
		k.Context = chunk.PrefixContext(chunk.PrefixRoot(fp))
		mislabelled["prefix at the chain root (standalone)"] = k
		for name, bad := range mislabelled {
			blob := testutil.Relabel(testutil.Encode(t, named, chunk.CodecRaw), bad)
			if _, err := c.Put(ctx, blob); !errors.Is(err, chunk.ErrNonCanonical) {
				t.Fatalf("client put of %s: %v, want ErrNonCanonical", name, err)
			}
			// Kind 0: a client Put through the replica set.
			for kind := replication.Kind(0); kind <= replication.KindRebalance; kind++ {
				cc, err := grpc.NewClient(nodes[0].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Fatal(err)
				}
				hdr := &api.PutHeader{Key: api.ProtoKey(bad), BlobBytes: uint64(len(blob))}
				var st grpc.ClientStreamingClient[api.PutFrame, api.PutResponse]
				if kind == 0 {
					st, err = api.NewClientClient(cc).Put(ctx, grpc.ForceCodecV2(api.Codec()))
				} else {
					hdr.Direct, hdr.Kind, hdr.At = true, uint32(kind), 1
					st, err = api.NewPeerClient(cc).Replicate(ctx, grpc.ForceCodecV2(api.Codec()))
				}
				if err == nil {
					if err = api.SendHeader(st, hdr); err == nil {
						err = api.SendBody(st, mem.SliceBuffer(blob), 1024)
					}
					_, err = st.CloseAndRecv()
				}
				cc.Close()
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("%v of %s: %v, want InvalidArgument", kind, name, err)
				}
			}
			if _, err := c.Get(ctx, bad); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("get of refused %s: %v, want not found", name, err)
			}
		}
		// Raw streams: a header whose key differs from the entry's, a
		// stream without header, a body longer than announced, and an
		// announced size over the limit.
		rawPut := func(frames ...*api.Frame) error {
			cc, err := grpc.NewClient(nodes[0].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			st, err := api.NewClientClient(cc).Put(ctx, grpc.ForceCodecV2(api.Codec()))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range frames {
				if err := st.SendMsg(f); err != nil {
					break
				}
			}
			_, err = st.CloseAndRecv()
			return err
		}
		hdr := func(k chunk.Key, n int) *api.Frame {
			return &api.Frame{Header: &api.PutHeader{Key: api.ProtoKey(k), BlobBytes: uint64(n)}}
		}
		data := func(b []byte) *api.Frame { return &api.Frame{Data: mem.BufferSlice{mem.SliceBuffer(b)}} }
		good := all[5]
		unregistered := spec
		unregistered.Salt = "never registered"
		ku, bu := testutil.Blob(t, rng, unregistered, testutil.Tokens(rng, 3), chunk.StandaloneContext())
		cases := []struct {
			name   string
			frames []*api.Frame
			code   codes.Code
		}{
			{"key mismatch", []*api.Frame{hdr(all[6].key, len(good.blob)), data(good.blob)}, codes.InvalidArgument},
			{"no header", []*api.Frame{data(good.blob)}, codes.InvalidArgument},
			{"empty header key", []*api.Frame{{Header: &api.PutHeader{BlobBytes: 10}}}, codes.InvalidArgument},
			{"long body", []*api.Frame{hdr(good.key, len(good.blob)), data(good.blob), data([]byte{1})}, codes.InvalidArgument},
			{"short body", []*api.Frame{hdr(good.key, len(good.blob)), data(good.blob[:10])}, codes.InvalidArgument},
			{"too large", []*api.Frame{hdr(good.key, 1<<40)}, codes.ResourceExhausted},
			{"unknown model", []*api.Frame{hdr(ku, len(bu)), data(bu)}, codes.FailedPrecondition},
		}
		for _, tc := range cases {
			if err := rawPut(tc.frames...); status.Code(err) != tc.code {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
			}
		}
	})

	t.Run("metadata agrees", func(t *testing.T) {
		testutil.WaitForWithin(t, 30*time.Second, "the nodes to agree on the metadata", func() bool {
			for _, nd := range nodes[1:] {
				if nd.Meta().Ring().Epoch() != nodes[0].Meta().Ring().Epoch() || len(nd.Meta().Models()) != 1 {
					return false
				}
			}
			return true
		})
		// A loaded machine may be between leaders for a moment.
		testutil.WaitForWithin(t, 20*time.Second, "a leader in ClusterInfo", func() bool {
			info, err := c.ClusterInfo(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(info.Members) != 3 || info.ReplicationFactor != 3 {
				t.Fatalf("cluster info %v", info)
			}
			return info.LeaderId != ""
		})
	})

	t.Run("digest of keys", func(t *testing.T) {
		// R=3 of 3 nodes: n1 holds every stored entry once the writes'
		// stragglers, acknowledged at W=2 and still in flight, are done.
		testutil.WaitForWithin(t, 30*time.Second, "every entry on n1", func() bool { return nodes[0].Store().Stats().Entries == len(all)+1 })
		pc, err := nodes[1].PeerClient(nodes[0].GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		req := &api.DigestRequest{}
		want := make(map[chunk.Key]bool)
		for _, s := range all {
			req.Keys = append(req.Keys, api.ProtoKey(s.key))
			want[s.key] = true
		}
		resp, err := pc.Digest(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Items) != len(all) {
			t.Fatalf("digest of %d keys answered %d items", len(all), len(resp.Items))
		}
		for _, it := range resp.Items {
			k, err := api.KeyFromProto(it.Key)
			if err != nil {
				t.Fatal(err)
			}
			if !want[k] || it.Deleted {
				t.Fatalf("digest item %v (deleted %v): not one asked for, or not held", k, it.Deleted)
			}
			delete(want, k)
		}
		// A request that asks nothing gets nothing: no scan of the store.
		if resp, err := pc.Digest(ctx, &api.DigestRequest{}); err != nil || len(resp.Items) != 0 {
			t.Fatalf("empty digest request: %d items, %v", len(resp.GetItems()), err)
		}
	})

	t.Run("http", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			var body []byte
			code := 0
			testutil.WaitForWithin(t, 20*time.Second, path+" answering 200", func() bool {
				resp, err := http.Get("http://" + nodes[2].HTTPAddr() + path)
				if err != nil {
					t.Fatal(err)
				}
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
				return code == 200
			})
			if code != 200 {
				t.Fatalf("%s: %d %s", path, code, body)
			}
			if path == "/metrics" && !strings.Contains(string(body), "kvmesh_rpc_requests_total") {
				t.Fatalf("/metrics lacks kvmesh_rpc_requests_total")
			}
		}
	})

	t.Run("delete", func(t *testing.T) {
		s := all[len(all)-1]
		n, err := c.Delete(ctx, s.key)
		if err != nil || n != 3 {
			t.Fatalf("delete: %d, %v; want 3 replicas", n, err)
		}
		if _, err := c.Get(ctx, s.key); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		// Deletes leave tombstones, so a second one is recorded again.
		if n, err := c.Delete(ctx, s.key); err != nil || n != 3 {
			t.Fatalf("second delete: %d, %v", n, err)
		}
		// A write after the delete brings the entry back.
		if _, err := c.Put(ctx, s.blob); err != nil {
			t.Fatalf("put after delete: %v", err)
		}
		if got, err := c.Get(ctx, s.key); err != nil || !bytes.Equal(got, s.blob) {
			t.Fatalf("get after delete and put: %v", err)
		}
		all = all[:len(all)-1]
	})

	t.Run("node dies", func(t *testing.T) {
		// The client's seed stays; another node goes away without leaving.
		if err := nodes[2].Close(); err != nil {
			t.Fatal(err)
		}
		for i, s := range all {
			got, err := c.Get(ctx, s.key)
			if err != nil {
				t.Fatalf("get %d after a node died: %v", i, err)
			}
			if !bytes.Equal(got, s.blob) {
				t.Fatalf("get %d after a node died: bytes differ", i)
			}
		}
		// Writes still reach W=2 of the 3 replicas.
		_, b := testutil.Blob(t, rng, spec, testutil.Tokens(rng, 7), chunk.StandaloneContext())
		res, err := c.Put(ctx, b)
		if err != nil || len(res.StoredOn) != 2 {
			t.Fatalf("put with a node down: %v %v", res, err)
		}
	})
}
