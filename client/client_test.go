package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pinned"
)

// fakeNode is a scripted Client service: it answers ClusterInfo from the
// shared cluster view, and Put/Get/Lookup from its own map, or fails with
// a chosen code.
type fakeNode struct {
	api.UnimplementedClientServer
	id      string
	cluster *fakeCluster

	mu       sync.Mutex
	fail     codes.Code // non-OK: every data call fails with it
	reason   string     // the ErrorInfo reason of fail's status, if any
	corrupt  bool       // Get answers with a flipped byte
	blobs    map[chunk.Key][]byte
	calls    int
	lookups  [][]int // per Lookup call: item count
	addr     string
	srv      *grpc.Server
	stopOnce sync.Once
}

type fakeCluster struct {
	mu      sync.Mutex
	epoch   uint64
	members []*api.Member
	rf      uint32
}

func (f *fakeNode) header(ctx context.Context) {
	f.cluster.mu.Lock()
	e := f.cluster.epoch
	f.cluster.mu.Unlock()
	_ = grpc.SetHeader(ctx, metadata.Pairs(api.EpochHeader, strconv.FormatUint(e, 10)))
}

func (f *fakeNode) enter() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail == codes.OK {
		return nil
	}
	st := status.New(f.fail, "scripted failure")
	if f.reason != "" {
		st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: f.reason, Domain: api.ErrorDomain})
	}
	return st.Err()
}

func (f *fakeNode) ClusterInfo(ctx context.Context, _ *api.ClusterInfoRequest) (*api.ClusterInfoResponse, error) {
	f.cluster.mu.Lock()
	defer f.cluster.mu.Unlock()
	return &api.ClusterInfoResponse{NodeId: f.id, Epoch: f.cluster.epoch, Members: f.cluster.members, ReplicationFactor: f.cluster.rf}, nil
}

func (f *fakeNode) Put(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) error {
	f.header(st.Context())
	if err := f.enter(); err != nil {
		return err
	}
	var hdr api.PutHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		return err
	}
	blob := make([]byte, hdr.BlobBytes)
	if err := api.RecvBody(st, blob); err != nil {
		return err
	}
	k, err := api.KeyFromProto(hdr.Key)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.blobs[k] = blob
	f.mu.Unlock()
	return st.SendAndClose(&api.PutResponse{StoredOn: []string{f.id}})
}

func (f *fakeNode) Get(req *api.GetRequest, st grpc.ServerStreamingServer[api.GetFrame]) error {
	if err := f.enter(); err != nil {
		return err
	}
	k, err := api.KeyFromProto(req.Key)
	if err != nil {
		return err
	}
	f.mu.Lock()
	blob, ok := f.blobs[k]
	corrupt := f.corrupt
	f.mu.Unlock()
	if !ok {
		return status.Error(codes.NotFound, "no such key")
	}
	if corrupt {
		blob = bytes.Clone(blob)
		blob[len(blob)-1] ^= 1
	}
	if err := api.SendHeader(st, &api.GetHeader{Key: req.Key, TotalBytes: uint64(len(blob))}); err != nil {
		return err
	}
	return api.SendBody(st, api.PinnedBuffer(pinned.Owned(blob)), 4096)
}

func (f *fakeNode) Lookup(ctx context.Context, req *api.LookupRequest) (*api.LookupResponse, error) {
	f.header(ctx)
	if err := f.enter(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.lookups = append(f.lookups, []int{len(req.Items)})
	f.mu.Unlock()
	resp := &api.LookupResponse{}
	for _, it := range req.Items {
		r := &api.LookupResult{}
		if it.Content.GetLo()%2 == 0 {
			r.Status = api.LookupStatus_LOOKUP_STATUS_EXACT
			r.Key = &api.Key{Fingerprint: req.Fingerprint, Content: it.Content, Context: it.Want}
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

func (f *fakeNode) stop() { f.stopOnce.Do(f.srv.Stop) }

func startFakes(t *testing.T, n int) (*fakeCluster, []*fakeNode) {
	t.Helper()
	cl := &fakeCluster{epoch: 1, rf: 3}
	var nodes []*fakeNode
	for i := range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeNode{id: fmt.Sprintf("f%d", i), cluster: cl, blobs: make(map[chunk.Key][]byte), addr: lis.Addr().String()}
		f.srv = grpc.NewServer(grpc.ForceServerCodecV2(api.Codec()))
		api.RegisterClientServer(f.srv, f)
		go func() { _ = f.srv.Serve(lis) }()
		t.Cleanup(f.stop)
		nodes = append(nodes, f)
		cl.members = append(cl.members, &api.Member{Id: f.id, GrpcAddr: f.addr})
	}
	return cl, nodes
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTestClient(t *testing.T, seeds ...string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := New(ctx, Config{Seeds: seeds, RPCTimeout: 2 * time.Second, Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testBlob is an entry of three random tokens of testutil.Spec, raw.
func testBlob(t *testing.T, seed uint64) (chunk.Key, []byte) {
	return testutil.StandaloneBlob(t, rand.New(rand.NewPCG(seed, seed)), testutil.Spec(), 3)
}

// replicaNodes maps the client's replica order for content to fakes.
func replicaNodes(c *Client, nodes []*fakeNode, content chunk.ID) []*fakeNode {
	byID := make(map[string]*fakeNode)
	for _, f := range nodes {
		byID[f.id] = f
	}
	var out []*fakeNode
	for _, m := range c.Ring().Replicas(content, c.ReplicationFactor()) {
		out = append(out, byID[m.ID])
	}
	return out
}

func TestFailover(t *testing.T) {
	tests := []struct {
		name     string
		failures []codes.Code // per replica in ring order
		reasons  []string     // their ErrorInfo reasons (nil: none)
		wantErr  codes.Code
		served   int // index of the replica that should serve
	}{
		{"first answers", []codes.Code{codes.OK, codes.OK, codes.OK}, nil, codes.OK, 0},
		{"first unavailable", []codes.Code{codes.Unavailable, codes.OK, codes.OK}, nil, codes.OK, 1},
		{"two unavailable", []codes.Code{codes.Unavailable, codes.Unavailable, codes.OK}, nil, codes.OK, 2},
		{"non-retryable stops", []codes.Code{codes.FailedPrecondition, codes.OK, codes.OK}, nil, codes.FailedPrecondition, -1},
		// A node whose metadata lags does not know a model registered a
		// moment ago: another replica may.
		{"unknown model fails over", []codes.Code{codes.FailedPrecondition, codes.OK, codes.OK},
			[]string{api.ReasonUnknownModel, "", ""}, codes.OK, 1},
		{"unknown model everywhere", []codes.Code{codes.FailedPrecondition, codes.FailedPrecondition, codes.FailedPrecondition},
			[]string{api.ReasonUnknownModel, api.ReasonUnknownModel, api.ReasonUnknownModel}, codes.FailedPrecondition, -1},
		{"all unavailable", []codes.Code{codes.Unavailable, codes.Unavailable, codes.Unavailable}, nil, codes.Unavailable, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, nodes := startFakes(t, 3)
			c := newTestClient(t, nodes[0].addr)
			key, blob := testBlob(t, 1)
			reps := replicaNodes(c, nodes, key.Content)
			for i, f := range reps {
				f.fail = tt.failures[i]
				if tt.reasons != nil {
					f.reason = tt.reasons[i]
				}
			}
			res, err := c.Put(t.Context(), blob)
			if status.Code(err) != tt.wantErr {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if tt.served >= 0 && (len(res.StoredOn) != 1 || res.StoredOn[0] != reps[tt.served].id) {
				t.Fatalf("stored on %v, want %s", res.StoredOn, reps[tt.served].id)
			}
			if tt.wantErr == codes.Unavailable && reps[0].calls != c.cfg.Attempts {
				t.Fatalf("first replica called %d times, want one per round (%d)", reps[0].calls, c.cfg.Attempts)
			}
		})
	}
}

func TestFailoverToDeadNode(t *testing.T) {
	_, nodes := startFakes(t, 3)
	c := newTestClient(t, nodes[0].addr)
	key, blob := testBlob(t, 2)
	reps := replicaNodes(c, nodes, key.Content)
	reps[0].stop() // connection refused: Unavailable
	res, err := c.Put(t.Context(), blob)
	if err != nil || res.StoredOn[0] != reps[1].id {
		t.Fatalf("put with the first replica down: %v %v", res, err)
	}
	got, err := c.Get(t.Context(), key)
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("get with the first replica down: %v", err)
	}
}

func TestGetSkipsCorruptReplica(t *testing.T) {
	_, nodes := startFakes(t, 3)
	c := newTestClient(t, nodes[0].addr)
	key, blob := testBlob(t, 3)
	reps := replicaNodes(c, nodes, key.Content)
	for _, f := range reps {
		f.blobs[key] = blob
	}
	reps[0].corrupt = true
	got, err := c.Get(t.Context(), key)
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("get: %v", err)
	}
	if reps[1].calls != 1 {
		t.Fatalf("second replica called %d times, want 1", reps[1].calls)
	}
	for _, f := range reps {
		f.corrupt = true
	}
	if _, err := c.Get(t.Context(), key); err == nil {
		t.Fatal("get returned corrupt bytes")
	}
}

// GetInto reads into the caller's buffer when it is large enough, and into
// a new one when it is not; either way the bytes are the entry's.
func TestGetIntoReusesBuffer(t *testing.T) {
	_, nodes := startFakes(t, 3)
	c := newTestClient(t, nodes[0].addr)
	key, blob := testBlob(t, 6)
	for _, f := range replicaNodes(c, nodes, key.Content) {
		f.blobs[key] = blob
	}
	big := make([]byte, 0, len(blob)+10)
	got, err := c.GetInto(t.Context(), key, big)
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("get into a large buffer: %v", err)
	}
	if &got[0] != &big[:1][0] {
		t.Fatal("a buffer with room was not reused")
	}
	small := make([]byte, 0, len(blob)-1)
	got, err = c.GetInto(t.Context(), key, small)
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("get into a small buffer: %v", err)
	}
	if cap(got) < len(blob) {
		t.Fatalf("result capacity %d", cap(got))
	}
}

func TestNotFound(t *testing.T) {
	_, nodes := startFakes(t, 3)
	c := newTestClient(t, nodes[0].addr)
	key, _ := testBlob(t, 4)
	if _, err := c.Get(t.Context(), key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of a missing key: %v, want ErrNotFound", err)
	}
}

func TestDeadlineBoundsRetries(t *testing.T) {
	_, nodes := startFakes(t, 3)
	ctx0, cancel0 := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel0()
	c, err := New(ctx0, Config{Seeds: []string{nodes[0].addr}, Attempts: 1000, Backoff: 20 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, f := range nodes {
		f.fail = codes.Unavailable
	}
	_, blob := testBlob(t, 5)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Put(ctx, blob)
	if status.Code(err) != codes.Unavailable && !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("err %v", err)
	}
	if ctx.Err() == nil {
		t.Fatal("gave up before the deadline with attempts left")
	}
}

func TestEpochRefresh(t *testing.T) {
	cl, nodes := startFakes(t, 4)
	// The client first sees three members.
	cl.members = cl.members[:3]
	c := newTestClient(t, nodes[0].addr)
	if c.Ring().Len() != 3 || c.Ring().Epoch() != 1 {
		t.Fatalf("ring %d members epoch %d", c.Ring().Len(), c.Ring().Epoch())
	}
	// A fourth joins: the epoch grows and the next answer says so.
	cl.mu.Lock()
	cl.epoch = 2
	cl.members = append(cl.members, &api.Member{Id: nodes[3].id, GrpcAddr: nodes[3].addr})
	cl.mu.Unlock()
	// The refresh runs in the background, one try per answer that shows
	// the newer epoch (bounded by RPCTimeout, which a loaded machine may
	// exceed): ask again until it took.
	testutil.WaitForWithin(t, 30*time.Second, "the ring refreshed after a newer epoch was seen", func() bool {
		if _, err := c.Lookup(t.Context(), chunk.Fingerprint{Lo: 1}, []LookupItem{{Content: chunk.ID{Lo: 2}, Want: chunk.StandaloneContext()}}); err != nil {
			t.Fatal(err)
		}
		return c.Ring().Epoch() == 2
	})
	if c.Ring().Len() != 4 {
		t.Fatalf("ring has %d members", c.Ring().Len())
	}
}

func TestLookupBatchesByOwner(t *testing.T) {
	_, nodes := startFakes(t, 3)
	c := newTestClient(t, nodes[0].addr)
	const n = 300
	items := make([]LookupItem, n)
	owners := make(map[string]int)
	for i := range items {
		items[i] = LookupItem{Content: chunk.ID{Lo: uint64(i), Hi: uint64(i) * 31}, Want: chunk.StandaloneContext()}
		m, _ := c.Ring().Owner(items[i].Content)
		owners[m.ID]++
	}
	res, err := c.Lookup(t.Context(), chunk.Fingerprint{Lo: 9}, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		want := chunk.MatchMiss
		if i%2 == 0 {
			want = chunk.MatchExact
		}
		if r.Match != want || (want == chunk.MatchExact && r.Key.Content != items[i].Content) {
			t.Fatalf("item %d: %v %v, want %v", i, r.Match, r.Key, want)
		}
	}
	// One call per owner, carrying exactly its items.
	for _, f := range nodes {
		if owners[f.id] == 0 {
			continue
		}
		if len(f.lookups) != 1 || f.lookups[0][0] != owners[f.id] {
			t.Fatalf("%s: lookups %v, want one batch of %d", f.id, f.lookups, owners[f.id])
		}
	}
}

// TestDefaultConfig: DefaultConfig is what New gives zero fields, and
// Validate refuses a Config without seeds.
func TestDefaultConfig(t *testing.T) {
	d := DefaultConfig()
	if d.RPCTimeout <= 0 || d.Attempts <= 0 || d.Backoff <= 0 || d.MaxBackoff < d.Backoff || d.FrameBytes <= 0 {
		t.Fatalf("DefaultConfig %+v has a field New would replace", d)
	}
	if err := (Config{}).Validate(); err == nil {
		t.Error("Validate took a Config without seeds")
	}
	if err := (Config{Seeds: []string{"127.0.0.1:1"}}).Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}
