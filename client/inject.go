package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// CacheRegistration describes an engine's paged KV cache placed in shared
// memory (inject.CreateShm gives both the file and the offsets).
type CacheRegistration struct {
	Fingerprint chunk.Fingerprint
	Layers      int
	// Layouts holds one layout for every layer, or one per layer.
	Layouts []pagedkv.CacheLayout
	// HeadLo, HeadHi: the model KV heads the cache holds; both 0: all.
	HeadLo, HeadHi int
	// MaxPositions bounds target positions; 0: the node's default.
	MaxPositions int
	// File is the shared-memory file, open read-write: a memfd or a file
	// on tmpfs (/dev/shm) or hugetlbfs. RegisterCache hands the node this
	// descriptor (the node's cache socket); the node maps it, so the
	// caller may close File once RegisterCache returned.
	File *os.File
	// Offsets are the byte offsets of the layers in it; nil: packed.
	// With CUDA, each layer's offset in its handle's allocation (nil: 0).
	Offsets []int64
	// CUDA, instead of File, names a cache in the engine's device memory:
	// the node opens its CUDA IPC handles and writes hits into it there
	// (a kvmeshd built with the cuda tag, on the engine's GPU). Where the
	// node cannot, RegisterCache fails with ErrNoCUDAIPC: register shared
	// memory (File) of the same layout instead and copy what the node
	// writes there to the device (see RegisterCache).
	CUDA *CUDAMemory
}

// CUDAMemory is a cache in device memory exported by CUDA IPC.
type CUDAMemory struct {
	// Device is the CUDA device ordinal.
	Device int
	// Handles holds one cudaIpcMemHandle_t (64 bytes) per layer; layers
	// may share one (one allocation, several offsets).
	Handles [][]byte
}

// check refuses handles no node could open: a device below 0, or not one
// 64-byte handle per layer.
func (m *CUDAMemory) check(layers int) error {
	if m.Device < 0 {
		return fmt.Errorf("CUDA device %d", m.Device)
	}
	if len(m.Handles) != layers {
		return fmt.Errorf("%d CUDA IPC handles for %d layers", len(m.Handles), layers)
	}
	for l, h := range m.Handles {
		if len(h) != api.IPCHandleBytes {
			return fmt.Errorf("layer %d: CUDA IPC handle of %d bytes, want %d", l, len(h), api.IPCHandleBytes)
		}
	}
	return nil
}

// Injector places chunks into a cache registered with one node: it
// implements engine.CacheInjector over that node's Injector service. The
// node is chosen by address, not by the ring: it must be on the engine's
// machine, since it writes the engine's memory. Close unregisters.
type Injector struct {
	c    *Client
	addr string
	id   uint64
	ic   api.InjectorClient
}

// RegisterCache registers reg with the node at addr (the engine's local
// node) and returns the Injector that fills it: it asks the node for its
// cache socket, hands reg.File over on it (api.SendCacheFile) and
// registers the cache under the handle the socket answered. The node
// refuses (PermissionDenied, "refused") a file that is not shared memory
// large enough for the layers, or one it holds or maps already.
//
// With reg.CUDA the cache is device memory, registered by its IPC handles
// (MEMORY_KIND_CUDA_IPC) with no file; handles that cannot be (a device
// below 0, not one 64-byte handle per layer) are refused before any call.
// A node that cannot open them answers an error that is ErrNoCUDAIPC (and
// keeps the node's status): the caller may then fall back to a
// shared-memory cache of the same layout, page-locked for its GPU, and
// copy the rows the node writes there (the slots of the chunks answered
// EXACT or APPROXIMATE, layer l once InjectLayered reported it) to the
// device before its model reads them. A Go client has no CUDA of its own:
// those copies are the engine's (the Python client's CUDAPagedCache makes
// them itself). A node on another machine is refused either way
// (PermissionDenied).
func (c *Client) RegisterCache(ctx context.Context, addr string, reg CacheRegistration) (*Injector, error) {
	if (reg.File == nil) == (reg.CUDA == nil) {
		return nil, fmt.Errorf("client: register cache with %s: want a shared-memory file or CUDA memory, one of them", addr)
	}
	if reg.CUDA != nil {
		if err := reg.CUDA.check(reg.Layers); err != nil {
			return nil, fmt.Errorf("client: register cache with %s: %w", addr, err)
		}
	}
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	ic := api.NewInjectorClient(cc)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	if reg.CUDA != nil {
		req := registerRequest(reg)
		req.MemoryKind, req.Device, req.IpcHandles = api.MemoryKind_MEMORY_KIND_CUDA_IPC, int32(reg.CUDA.Device), reg.CUDA.Handles
		in, err := c.register(ctx, ic, addr, req)
		if code := status.Code(err); code == codes.Unimplemented || code == codes.InvalidArgument {
			return nil, fmt.Errorf("%w: %w", ErrNoCUDAIPC, err)
		}
		return in, err
	}
	sock, err := ic.CacheSocket(ctx, &api.CacheSocketRequest{})
	if err != nil {
		return nil, fmt.Errorf("client: register cache with %s: %w", addr, err)
	}
	handle, err := api.SendCacheFile(ctx, sock.Address, reg.File)
	if err != nil {
		return nil, fmt.Errorf("client: register cache with %s: %w", addr, err)
	}
	req := registerRequest(reg)
	req.MemoryKind, req.MemoryHandle = api.MemoryKind_MEMORY_KIND_SHM, handle
	return c.register(ctx, ic, addr, req)
}

// registerRequest is reg's request but for its memory.
func registerRequest(reg CacheRegistration) *api.RegisterCacheRequest {
	req := &api.RegisterCacheRequest{Fingerprint: api.ProtoFingerprint(reg.Fingerprint), Layers: int32(reg.Layers),
		HeadLo: int32(reg.HeadLo), HeadHi: int32(reg.HeadHi), MaxPositions: int32(reg.MaxPositions), Offsets: reg.Offsets}
	for _, l := range reg.Layouts {
		req.Layouts = append(req.Layouts, api.ProtoLayout(l))
	}
	return req
}

func (c *Client) register(ctx context.Context, ic api.InjectorClient, addr string, req *api.RegisterCacheRequest) (*Injector, error) {
	resp, err := ic.RegisterCache(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("client: register cache with %s: %w", addr, err)
	}
	return &Injector{c: c, addr: addr, id: resp.CacheId, ic: ic}, nil
}

// Close unregisters the cache. The engine may free its memory afterwards.
func (in *Injector) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, in.c.cfg.RPCTimeout)
	defer cancel()
	if _, err := in.ic.UnregisterCache(ctx, &api.UnregisterCacheRequest{CacheId: in.id}); err != nil {
		return fmt.Errorf("client: unregister cache %d on %s: %w", in.id, in.addr, err)
	}
	return nil
}

// InjectStats is what the node reported for one InjectChunks call.
type InjectStats struct {
	Layers       int // layer events received
	WrittenBytes uint64
	DecodedBytes uint64
	// Timings is the node's own split of its time (zero from a node that
	// predates it).
	Timings InjectTimings
}

// InjectTimings is the time the node spent in each stage of an inject,
// summed over chunks and layers; stages overlap, so a sum may exceed the
// call's wall time (api.InjectTimings says what each covers).
type InjectTimings struct {
	Fetch, Arrive, Verify, Decode, Scatter time.Duration
}

// InjectChunks implements engine.CacheInjector.
func (in *Injector) InjectChunks(ctx context.Context, chunks []pagedkv.InjectChunk) ([]pagedkv.InjectResult, error) {
	res, _, err := in.InjectLayered(ctx, chunks, nil)
	return res, err
}

// InjectPlanned implements engine.LayeredInjector: the node sends its
// plan (every chunk fetched and verified) before writing, then each layer
// as it is written, so RunInjected overlaps its forward pass with the
// injection. A node that predates plans sends none; the engine then waits
// for the results.
func (in *Injector) InjectPlanned(ctx context.Context, chunks []pagedkv.InjectChunk, plan func([]pagedkv.InjectResult), layer func(int)) ([]pagedkv.InjectResult, error) {
	res, _, err := in.inject(ctx, chunks, plan, layer)
	return res, err
}

// InjectLayered is InjectChunks that also calls onLayer (if not nil) as
// the node reports each layer written for every hit, in layer order, so a
// caller may start computing layer l before later layers land.
func (in *Injector) InjectLayered(ctx context.Context, chunks []pagedkv.InjectChunk, onLayer func(int)) ([]pagedkv.InjectResult, InjectStats, error) {
	return in.inject(ctx, chunks, nil, onLayer)
}

func (in *Injector) inject(ctx context.Context, chunks []pagedkv.InjectChunk, onPlan func([]pagedkv.InjectResult), onLayer func(int)) ([]pagedkv.InjectResult, InjectStats, error) {
	var stats InjectStats
	req := &api.InjectRequest{CacheId: in.id, Chunks: make([]*api.InjectChunk, len(chunks)), Plan: onPlan != nil}
	for i, c := range chunks {
		slots := make([]int64, len(c.Slots))
		for j, s := range c.Slots {
			slots[j] = int64(s)
		}
		req.Chunks[i] = &api.InjectChunk{Content: api.ProtoID(c.Key.Content), Tokens: c.Tokens, Want: api.ProtoContext(c.Key.Context),
			Pos: int64(c.Pos), Slots: slots}
	}
	ctx, cancel := context.WithTimeout(ctx, in.c.cfg.RPCTimeout)
	defer cancel()
	st, err := in.ic.Inject(ctx, req)
	if err != nil {
		return nil, stats, fmt.Errorf("client: inject on %s: %w", in.addr, err)
	}
	planned := false
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil, stats, fmt.Errorf("client: inject on %s: %w: stream ended without results", in.addr, api.ErrBadMessage)
		}
		if err != nil {
			return nil, stats, fmt.Errorf("client: inject on %s: %w", in.addr, err)
		}
		switch e := ev.Event.(type) {
		case *api.InjectEvent_LayerWritten:
			stats.Layers++
			if onLayer != nil {
				onLayer(int(e.LayerWritten))
			}
		case *api.InjectEvent_Plan:
			if onPlan == nil || planned || stats.Layers > 0 {
				return nil, stats, fmt.Errorf("client: inject on %s: %w: unexpected plan", in.addr, api.ErrBadMessage)
			}
			planned = true
			out, err := injectResults(e.Plan.Results, len(chunks))
			if err != nil {
				return nil, stats, fmt.Errorf("client: inject on %s: plan: %w", in.addr, err)
			}
			onPlan(out)
		case *api.InjectEvent_Done:
			d := e.Done
			stats.WrittenBytes, stats.DecodedBytes = d.WrittenBytes, d.DecodedBytes
			if tm := d.GetTimings(); tm != nil {
				stats.Timings = InjectTimings{Fetch: time.Duration(tm.FetchNs), Arrive: time.Duration(tm.ArriveNs),
					Verify: time.Duration(tm.VerifyNs), Decode: time.Duration(tm.DecodeNs), Scatter: time.Duration(tm.ScatterNs)}
			}
			out, err := injectResults(d.Results, len(chunks))
			if err != nil {
				return nil, stats, fmt.Errorf("client: inject on %s: %w", in.addr, err)
			}
			return out, stats, nil
		default:
			return nil, stats, fmt.Errorf("client: inject on %s: %w: unknown event", in.addr, api.ErrBadMessage)
		}
	}
}

// injectResults converts a plan's or a done's results, one per chunk.
func injectResults(rs []*api.LookupResult, chunks int) ([]pagedkv.InjectResult, error) {
	if len(rs) != chunks {
		return nil, fmt.Errorf("%w: %d results for %d chunks", api.ErrBadMessage, len(rs), chunks)
	}
	out := make([]pagedkv.InjectResult, chunks)
	for i, r := range rs {
		m := api.MatchFromProto(r.Status)
		if m == chunk.MatchMiss {
			continue
		}
		cx, err := api.ContextFromProto(r.GetKey().GetContext())
		if err != nil {
			return nil, fmt.Errorf("result %d: %w", i, err)
		}
		out[i] = pagedkv.InjectResult{Match: m, Context: cx}
	}
	return out, nil
}
