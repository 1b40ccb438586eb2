package client

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// fakeInjector answers Inject with a scripted event sequence (or error)
// and records what it was asked.
type fakeInjector struct {
	api.UnimplementedInjectorServer
	mu       sync.Mutex
	reg      *api.RegisterCacheRequest
	regErr   error // RegisterCache's answer, if set
	req      *api.InjectRequest
	events   []*api.InjectEvent
	err      error
	unregged []uint64
	sock     *net.UnixListener // the cache socket; nil: CacheSocket unimplemented
	got      []os.FileInfo     // the files handed over on it
}

// fakeHandle is the handle the fake's cache socket answers.
var fakeHandle = bytes.Repeat([]byte{7}, api.CacheHandleBytes)

// listenCacheSocket starts the fake's cache socket: it takes one file per
// connection and answers fakeHandle.
// serveInjector serves fi's Injector service on a loopback port until the
// test ends and returns its address.
func serveInjector(t *testing.T, fi *fakeInjector) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(api.Codec()))
	api.RegisterInjectorServer(srv, fi)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func (f *fakeInjector) listenCacheSocket(t *testing.T) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("@kvmesh-client-test-%d-%d", os.Getpid(), rand.Uint64()), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f.sock = ln
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			file, err := api.RecvCacheFile(c)
			if err == nil {
				fi, serr := file.Stat()
				file.Close()
				if serr == nil {
					f.mu.Lock()
					f.got = append(f.got, fi)
					f.mu.Unlock()
				}
				_ = api.AnswerCacheFile(c, fakeHandle)
			}
			c.Close()
		}
	}()
}

func (f *fakeInjector) CacheSocket(context.Context, *api.CacheSocketRequest) (*api.CacheSocketResponse, error) {
	if f.sock == nil {
		return nil, status.Error(codes.Unimplemented, "no cache socket")
	}
	return &api.CacheSocketResponse{Address: f.sock.Addr().String()}, nil
}

func (f *fakeInjector) RegisterCache(_ context.Context, r *api.RegisterCacheRequest) (*api.RegisterCacheResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reg = r
	if f.regErr != nil {
		return nil, f.regErr
	}
	return &api.RegisterCacheResponse{CacheId: 42}, nil
}

func (f *fakeInjector) UnregisterCache(_ context.Context, r *api.UnregisterCacheRequest) (*api.UnregisterCacheResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unregged = append(f.unregged, r.CacheId)
	return &api.UnregisterCacheResponse{}, nil
}

func (f *fakeInjector) Inject(r *api.InjectRequest, st grpc.ServerStreamingServer[api.InjectEvent]) error {
	f.mu.Lock()
	f.req = r
	evs, err := f.events, f.err
	f.mu.Unlock()
	for _, ev := range evs {
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	return err
}

func layerEv(l int32) *api.InjectEvent {
	return &api.InjectEvent{Event: &api.InjectEvent_LayerWritten{LayerWritten: l}}
}

func planEv(rs ...*api.LookupResult) *api.InjectEvent {
	return &api.InjectEvent{Event: &api.InjectEvent_Plan{Plan: &api.InjectPlan{Results: rs}}}
}

func doneEv(rs ...*api.LookupResult) *api.InjectEvent {
	return &api.InjectEvent{Event: &api.InjectEvent_Done{Done: &api.InjectDone{Results: rs, WrittenBytes: 1000, DecodedBytes: 10}}}
}

func TestInjectorOverRPC(t *testing.T) {
	_, fakes := startFakes(t, 1)
	c := newTestClient(t, fakes[0].addr)
	fi := &fakeInjector{}
	fi.listenCacheSocket(t)
	addr := serveInjector(t, fi)

	ctx := t.Context()
	fp := chunk.Fingerprint{Lo: 5, Hi: 6}
	// An order with K and V inside each block (FlashInfer's) goes over the
	// wire as the others do.
	lay := pagedkv.CacheLayout{Order: pagedkv.BlockHND, NumBlocks: 8, BlockSize: 16, KVHeads: 2, HeadDim: 16, DType: chunk.F32}
	shm, err := os.CreateTemp(t.TempDir(), "cache")
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	inj, err := c.RegisterCache(ctx, addr, CacheRegistration{Fingerprint: fp, Layers: 4,
		Layouts: []pagedkv.CacheLayout{lay}, File: shm, Offsets: []int64{0, 4096, 8192, 12288}})
	if err != nil {
		t.Fatal(err)
	}
	// The file went over the cache socket as a descriptor, and the
	// registration names it by the handle the socket answered.
	mine, err := shm.Stat()
	if err != nil {
		t.Fatal(err)
	}
	fi.mu.Lock()
	got := fi.got
	fi.mu.Unlock()
	if len(got) != 1 || !os.SameFile(got[0], mine) {
		t.Fatalf("the cache socket got %v, want the registered file", got)
	}
	if got, _ := api.LayoutFromProto(fi.reg.Layouts[0]); got != lay || !bytes.Equal(fi.reg.MemoryHandle, fakeHandle) || fi.reg.MemoryKind != api.MemoryKind_MEMORY_KIND_SHM ||
		api.FingerprintFromProto(fi.reg.Fingerprint) != fp || !slices.Equal(fi.reg.Offsets, []int64{0, 4096, 8192, 12288}) {
		t.Fatalf("registration sent %v", fi.reg)
	}

	cx1, cx2 := chunk.PrefixContext(chunk.ID{Lo: 9}), chunk.WindowContext(fp, 3, []uint32{1, 2, 3})
	chunks := []pagedkv.InjectChunk{
		{Key: chunk.Key{Fingerprint: fp, Content: chunk.ID{Lo: 1}, Context: cx1}, Tokens: []uint32{1, 2}, Pos: 7, Slots: []int{3, -1}},
		{Key: chunk.Key{Fingerprint: fp, Content: chunk.ID{Lo: 2}, Context: cx1}, Tokens: []uint32{3}, Pos: 9, Slots: []int{4}},
		{Key: chunk.Key{Fingerprint: fp, Content: chunk.ID{Lo: 3}, Context: cx1}, Tokens: []uint32{4}, Pos: 10, Slots: []int{5}},
	}
	exact := &api.LookupResult{Status: api.LookupStatus_LOOKUP_STATUS_EXACT, Key: &api.Key{Context: api.ProtoContext(cx1)}}
	approx := &api.LookupResult{Status: api.LookupStatus_LOOKUP_STATUS_APPROXIMATE, Key: &api.Key{Context: api.ProtoContext(cx2)}}
	miss := &api.LookupResult{}
	badCx := &api.LookupResult{Status: api.LookupStatus_LOOKUP_STATUS_EXACT, Key: &api.Key{Context: &api.Context{Kind: 9}}}
	tests := []struct {
		name   string
		events []*api.InjectEvent
		err    error
		want   []pagedkv.InjectResult
		layers []int
		fails  bool
		// planned: call InjectPlanned and expect plan (nil: none sent).
		planned bool
		plan    []pagedkv.InjectResult
	}{
		{name: "layers then results", events: []*api.InjectEvent{layerEv(0), layerEv(1), layerEv(2), layerEv(3), doneEv(exact, approx, miss)},
			want:   []pagedkv.InjectResult{{Match: chunk.MatchExact, Context: cx1}, {Match: chunk.MatchApproximate, Context: cx2}, {}},
			layers: []int{0, 1, 2, 3}},
		{name: "all miss, no layers", events: []*api.InjectEvent{doneEv(miss, miss, miss)}, want: make([]pagedkv.InjectResult, 3)},
		{name: "stream ends without results", events: []*api.InjectEvent{layerEv(0)}, fails: true},
		{name: "wrong result count", events: []*api.InjectEvent{doneEv(exact)}, fails: true},
		{name: "bad context", events: []*api.InjectEvent{doneEv(exact, badCx, miss)}, fails: true},
		{name: "empty event", events: []*api.InjectEvent{{}}, fails: true},
		{name: "server error", err: status.Error(codes.NotFound, "unknown cache"), fails: true},
		{name: "plan, layers, results", planned: true,
			events: []*api.InjectEvent{planEv(exact, approx, exact), layerEv(0), layerEv(1), doneEv(exact, approx, miss)},
			plan:   []pagedkv.InjectResult{{Match: chunk.MatchExact, Context: cx1}, {Match: chunk.MatchApproximate, Context: cx2}, {Match: chunk.MatchExact, Context: cx1}},
			want:   []pagedkv.InjectResult{{Match: chunk.MatchExact, Context: cx1}, {Match: chunk.MatchApproximate, Context: cx2}, {}},
			layers: []int{0, 1}},
		{name: "node without plans", planned: true, events: []*api.InjectEvent{layerEv(0), doneEv(miss, miss, exact)},
			want: []pagedkv.InjectResult{{}, {}, {Match: chunk.MatchExact, Context: cx1}}, layers: []int{0}},
		{name: "plan after a layer", planned: true, events: []*api.InjectEvent{layerEv(0), planEv(miss, miss, miss), doneEv(miss, miss, miss)}, fails: true},
		{name: "two plans", planned: true, events: []*api.InjectEvent{planEv(miss, miss, miss), planEv(miss, miss, miss), doneEv(miss, miss, miss)}, fails: true},
		{name: "plan of the wrong count", planned: true, events: []*api.InjectEvent{planEv(miss), doneEv(miss, miss, miss)}, fails: true},
		{name: "plan not asked for", events: []*api.InjectEvent{planEv(miss, miss, miss), doneEv(miss, miss, miss)}, fails: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fi.mu.Lock()
			fi.events, fi.err = tc.events, tc.err
			fi.mu.Unlock()
			var layers []int
			var plan []pagedkv.InjectResult
			var got []pagedkv.InjectResult
			var stats InjectStats
			var err error
			onLayer := func(l int) { layers = append(layers, l) }
			if tc.planned {
				got, err = inj.InjectPlanned(ctx, chunks, func(p []pagedkv.InjectResult) { plan = p }, onLayer)
				stats = InjectStats{Layers: len(layers), WrittenBytes: 1000}
			} else {
				got, stats, err = inj.InjectLayered(ctx, chunks, onLayer)
			}
			if tc.fails {
				if err == nil {
					t.Fatalf("no error; results %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || !slices.Equal(layers, tc.layers) || stats.Layers != len(tc.layers) || stats.WrittenBytes != 1000 {
				t.Fatalf("got %v layers %v stats %+v; want %v layers %v", got, layers, stats, tc.want, tc.layers)
			}
			r := fi.req
			if !slices.Equal(plan, tc.plan) || r.Plan != tc.planned {
				t.Fatalf("plan %v (asked %v), want %v", plan, r.Plan, tc.plan)
			}
			if r.CacheId != 42 || len(r.Chunks) != 3 || r.Chunks[0].Pos != 7 || !slices.Equal(r.Chunks[0].Slots, []int64{3, -1}) ||
				api.IDFromProto(r.Chunks[1].Content) != (chunk.ID{Lo: 2}) || !slices.Equal(r.Chunks[0].Tokens, []uint32{1, 2}) {
				t.Fatalf("request sent %v", r)
			}
			if want, _ := api.ContextFromProto(r.Chunks[2].Want); want != cx1 {
				t.Fatalf("want context sent %v", want)
			}
		})
	}
	var _ engine.LayeredInjector = inj
	if err := inj.Close(ctx); err != nil || !slices.Equal(fi.unregged, []uint64{42}) {
		t.Fatalf("close: %v, unregistered %v", err, fi.unregged)
	}
	if _, err := c.RegisterCache(ctx, "127.0.0.1:1", CacheRegistration{}); err == nil {
		t.Fatal("registration with no node answered")
	}
}

// FuzzInjectResults: a plan or done event from the wire either is refused
// or gives one result per chunk, a hit exactly where the status says so.
func FuzzInjectResults(f *testing.F) {
	seed := func(rs ...*api.LookupResult) {
		b, err := proto.Marshal(&api.InjectPlan{Results: rs})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(len(rs)))
	}
	cx := api.ProtoContext(chunk.PrefixContext(chunk.ID{Lo: 3}))
	seed(&api.LookupResult{Status: api.LookupStatus_LOOKUP_STATUS_EXACT, Key: &api.Key{Context: cx}}, &api.LookupResult{})
	seed(&api.LookupResult{Status: api.LookupStatus_LOOKUP_STATUS_APPROXIMATE, Key: &api.Key{Context: &api.Context{Kind: 9}}})
	seed(&api.LookupResult{Status: 7})
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		var p api.InjectPlan
		if err := proto.Unmarshal(b, &p); err != nil {
			return
		}
		out, err := injectResults(p.Results, int(n))
		if err != nil {
			return
		}
		if len(out) != int(n) {
			t.Fatalf("%d results for %d chunks", len(out), n)
		}
		for i, r := range p.Results {
			hit := r.Status == api.LookupStatus_LOOKUP_STATUS_EXACT || r.Status == api.LookupStatus_LOOKUP_STATUS_APPROXIMATE
			if hit != (out[i].Match != chunk.MatchMiss) || (out[i].Match == chunk.MatchExact) != (r.Status == api.LookupStatus_LOOKUP_STATUS_EXACT) {
				t.Fatalf("result %d: status %v gave %v", i, r.Status, out[i].Match)
			}
		}
	})
}
