package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// injector is the node's injection path: the inject
// Service with the node's TierFetcher (local tier, then the replicas over
// the Peer service), served as api.Injector.
type injector struct {
	api.UnimplementedInjectorServer
	n       *Node
	svc     *inject.Service
	fetched *prometheus.CounterVec // source: local, peer
	reads   *entryReads            // reads from replicas (fetchmany.go)
	sock    *cacheSocket           // nil where shared memory is unsupported
}

// errShmRefused is the one answer to a shared-memory registration the
// node will not map: it says nothing about the file (whether it exists,
// what it is, its size); the node logs why.
var errShmRefused = status.Error(codes.PermissionDenied, "shared memory refused")

// CacheSocket names the cache socket, to callers on this machine.
func (in *injector) CacheSocket(ctx context.Context, _ *api.CacheSocketRequest) (*api.CacheSocketResponse, error) {
	if !localPeer(ctx) {
		return nil, status.Error(codes.PermissionDenied, "shared-memory caches register from this machine only")
	}
	if in.sock == nil {
		return nil, status.Error(codes.Unimplemented, "shared-memory caches need linux")
	}
	return &api.CacheSocketResponse{Address: in.sock.address()}, nil
}

// localPeer reports whether the caller is on this machine: shared memory
// names a file here, so only a loopback (or unix socket) caller may
// register it.
func localPeer(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return false
	}
	switch a := p.Addr.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (in *injector) RegisterCache(ctx context.Context, req *api.RegisterCacheRequest) (*api.RegisterCacheResponse, error) {
	// The call naming a handle spends it, whatever becomes of the call,
	// so a failed registration leaves no file waiting on the socket.
	var shm *os.File
	if len(req.MemoryHandle) > 0 && in.sock != nil && localPeer(ctx) {
		if f, err := in.sock.take(req.MemoryHandle); err == nil {
			shm = f
			defer f.Close() // mapped by Register, or refused
		}
	}
	if req.GetFingerprint() == nil {
		return nil, status.Error(codes.InvalidArgument, "register cache without a model fingerprint")
	}
	if err := checkFingerprint(ctx, api.FingerprintFromProto(req.Fingerprint)); err != nil {
		return nil, err
	}
	d := inject.Descriptor{
		Fingerprint:  api.FingerprintFromProto(req.Fingerprint),
		Layers:       int(req.Layers),
		HeadLo:       int(req.HeadLo),
		HeadHi:       int(req.HeadHi),
		MaxPositions: int(req.MaxPositions),
		Memory:       inject.Memory{Offsets: req.Offsets, Device: int(req.Device), IPCHandles: req.IpcHandles},
	}
	for i, l := range req.Layouts {
		lay, err := api.LayoutFromProto(l)
		if err != nil {
			return nil, invalid(fmt.Errorf("layout %d: %w", i, err))
		}
		d.Layouts = append(d.Layouts, lay)
	}
	// One branch per memory kind: each says where the memory comes from
	// and what a caller must show for it.
	switch req.MemoryKind {
	case api.MemoryKind_MEMORY_KIND_SHM:
		d.Memory.Kind = inject.MemoryShm
		if !localPeer(ctx) {
			return nil, status.Error(codes.PermissionDenied, "shared-memory caches register from this machine only")
		}
		// Only a file the caller handed over on the cache socket, once.
		if shm == nil {
			return nil, errShmRefused
		}
		d.Memory.File = shm
	case api.MemoryKind_MEMORY_KIND_CUDA_IPC:
		d.Memory.Kind = inject.MemoryCUDAIPC
		// IPC handles open on this machine's GPUs only.
		if !localPeer(ctx) {
			return nil, status.Error(codes.PermissionDenied, "CUDA IPC caches register from this machine only")
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "memory kind %v", req.MemoryKind)
	}
	id, err := in.svc.Register(ctx, d)
	if errors.Is(err, inject.ErrRefused) {
		return nil, errShmRefused
	}
	if err != nil {
		return nil, toStatus(err)
	}
	in.n.sec.rememberCache(ctx, uint64(id), d.Fingerprint)
	return &api.RegisterCacheResponse{CacheId: uint64(id)}, nil
}

func (in *injector) UnregisterCache(ctx context.Context, req *api.UnregisterCacheRequest) (*api.UnregisterCacheResponse, error) {
	if err := in.n.sec.checkCache(ctx, req.CacheId); err != nil {
		return nil, err
	}
	if err := in.svc.Unregister(inject.CacheID(req.CacheId)); err != nil {
		return nil, toStatus(err)
	}
	in.n.sec.forgetCache(req.CacheId)
	return &api.UnregisterCacheResponse{}, nil
}

func (in *injector) Inject(req *api.InjectRequest, st grpc.ServerStreamingServer[api.InjectEvent]) error {
	if err := in.n.checkChunks("inject", len(req.Chunks)); err != nil {
		return err
	}
	if err := in.n.sec.checkCache(st.Context(), req.CacheId); err != nil {
		return err
	}
	r := &inject.Request{Cache: inject.CacheID(req.CacheId), Chunks: make([]pagedkv.InjectChunk, len(req.Chunks))}
	for i, c := range req.Chunks {
		if c.GetContent() == nil {
			return status.Errorf(codes.InvalidArgument, "chunk %d has no content ID", i)
		}
		want, err := api.ContextFromProto(c.GetWant())
		if err != nil {
			return invalid(fmt.Errorf("chunk %d: %w", i, err))
		}
		slots := make([]int, len(c.Slots))
		for j, s := range c.Slots {
			slots[j] = int(s)
		}
		r.Chunks[i] = pagedkv.InjectChunk{Key: chunk.Key{Content: api.IDFromProto(c.Content), Context: want}, Tokens: c.Tokens, Pos: int(c.Pos), Slots: slots}
	}
	var sendErr error
	if req.Plan {
		r.OnPlan = func(res []inject.Result) {
			plan := &api.InjectPlan{Results: lookupResults(r, res)}
			sendErr = st.Send(&api.InjectEvent{Event: &api.InjectEvent_Plan{Plan: plan}})
		}
	}
	r.OnLayer = func(l int) {
		if sendErr == nil {
			sendErr = st.Send(&api.InjectEvent{Event: &api.InjectEvent_LayerWritten{LayerWritten: int32(l)}})
		}
	}
	resp, err := in.svc.Inject(st.Context(), r)
	if err != nil {
		return toStatus(err)
	}
	if sendErr != nil {
		return sendErr
	}
	tm := &resp.Timings
	done := &api.InjectDone{WrittenBytes: uint64(resp.WrittenBytes), DecodedBytes: uint64(resp.DecodedBytes),
		Results: lookupResults(r, resp.Results),
		Timings: &api.InjectTimings{FetchNs: uint64(tm.Fetch), ArriveNs: uint64(tm.Arrive), VerifyNs: uint64(tm.Verify),
			DecodeNs: uint64(tm.Decode), ScatterNs: uint64(tm.Scatter)}}
	return st.Send(&api.InjectEvent{Event: &api.InjectEvent_Done{Done: done}})
}

// lookupResults converts the answers to r's chunks to their wire form.
func lookupResults(r *inject.Request, results []inject.Result) []*api.LookupResult {
	out := make([]*api.LookupResult, len(results))
	for i, res := range results {
		lr := &api.LookupResult{Status: api.ProtoMatch(res.Match)}
		if res.Match != chunk.MatchMiss {
			// The cache's model is the fingerprint; the key names the
			// content and the context of the entry written.
			lr.Key = &api.Key{Content: api.ProtoID(r.Chunks[i].Key.Content), Context: api.ProtoContext(res.Context)}
		}
		out[i] = lr
	}
	return out
}
