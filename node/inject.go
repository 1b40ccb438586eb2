package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/kvtier"
)

// injector is the node's injection path: the inject
// Service with the node's TierFetcher (local tier, then the replicas over
// the Peer service), served as api.Injector.
type injector struct {
	api.UnimplementedInjectorServer
	n       *Node
	svc     *inject.Service
	fetched *prometheus.CounterVec // source: local, peer
}

// startInject builds the injection service; Start calls it once the store
// and the metadata are open, and registers the returned server.
func (n *Node) startInject() (*injector, error) {
	in := &injector{n: n, fetched: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_inject_fetched_bytes_total",
		Help: "Entry bytes the injection path read, by source (local tier, peer replica).",
	}, []string{"source"})}
	svc, err := inject.New(inject.Config{
		Fetcher: countingFetcher{f: inject.TierFetcher{Local: n.store, Remote: replicaRemote{n}}, c: in.fetched},
		Models:  nodeModels{n},
		Limits:  n.cfg.Limits,
		Logger:  n.log,
	})
	if err != nil {
		return nil, fmt.Errorf("node: start injection: %w", err)
	}
	if err := n.registry.Register(svc); err != nil {
		_ = svc.Close()
		return nil, fmt.Errorf("node: register injection metrics: %w", err)
	}
	if err := n.registry.Register(in.fetched); err != nil {
		_ = svc.Close()
		return nil, fmt.Errorf("node: register injection metrics: %w", err)
	}
	in.svc = svc
	return in, nil
}

// close stops the service: requests in flight end, registrations are
// unmapped. Called after the gRPC server stopped, before the store closes.
func (in *injector) close() error {
	if in == nil || in.svc == nil {
		return nil
	}
	return in.svc.Close()
}

// InjectFetchedBytes reports the entry bytes the injection path read from
// the local tier and from peer replicas (also exported as
// kvmesh_inject_fetched_bytes_total).
func (n *Node) InjectFetchedBytes() (local, peers float64) {
	if n.inj == nil {
		return 0, 0
	}
	return readCounter(n.inj.fetched.WithLabelValues("local")), readCounter(n.inj.fetched.WithLabelValues("peer"))
}

// nodeModels resolves fingerprints through the metadata's model registry.
type nodeModels struct{ n *Node }

func (m nodeModels) Model(ctx context.Context, fp chunk.Fingerprint) (chunk.ModelSpec, error) {
	return m.n.model(ctx, fp)
}

// countingFetcher counts the bytes a Fetcher returns by where they came
// from: the local tier or a peer.
type countingFetcher struct {
	f inject.Fetcher
	c *prometheus.CounterVec
}

func (f countingFetcher) Fetch(ctx context.Context, key chunk.Key) (inject.Fetched, error) {
	got, err := f.f.Fetch(ctx, key)
	f.count(got, err)
	return got, err
}

// FetchBatch implements inject.BatchFetcher (over Fetch calls when the
// wrapped Fetcher has no FetchBatch).
func (f countingFetcher) FetchBatch(ctx context.Context, keys []chunk.Key, found func(int, inject.Fetched, error)) {
	count := func(i int, got inject.Fetched, err error) {
		f.count(got, err)
		found(i, got, err)
	}
	if bf, ok := f.f.(inject.BatchFetcher); ok {
		bf.FetchBatch(ctx, keys, count)
		return
	}
	for i, k := range keys {
		got, err := f.f.Fetch(ctx, k)
		count(i, got, err)
	}
}

func (f countingFetcher) count(got inject.Fetched, err error) {
	if err == nil && got.Blob.Len() > 0 {
		src := "peer"
		if got.Local {
			src = "local"
		}
		f.c.WithLabelValues(src).Add(float64(got.Blob.Len()))
	}
}

// replicaRemote is inject.Remote over the other replicas of a content ID:
// a direct Lookup to each (in parallel), then a Fetch from the first in
// ring order that holds the key, failing over to the next.
type replicaRemote struct{ n *Node }

// others are the replicas of content other than this node, in ring order.
func (r replicaRemote) others(content chunk.ID) []string {
	n := r.n
	var addrs []string
	for _, m := range n.meta.Ring().Replicas(content, n.meta.Settings().ReplicationFactor) {
		if m.ID != n.cfg.NodeID && m.GRPCAddr != "" {
			addrs = append(addrs, m.GRPCAddr)
		}
	}
	return addrs
}

func (r replicaRemote) Best(ctx context.Context, fp chunk.Fingerprint, content chunk.ID, want chunk.Context) (chunk.Key, chunk.Match, error) {
	f := r.BestBatch(ctx, []chunk.Key{{Fingerprint: fp, Content: content, Context: want}})[0]
	return f.Key, f.Match, f.Err
}

// BestBatch implements inject.BatchRemote: the keys are grouped by
// replica node, and each node gets one direct Lookup for all the keys it
// replicates (split at the per-request chunk limit), all nodes at once;
// each key then takes the best answer among its replicas.
func (r replicaRemote) BestBatch(ctx context.Context, keys []chunk.Key) []inject.Found {
	type group struct {
		addr string
		fp   chunk.Fingerprint
	}
	type call struct {
		group
		idx []int // indices into keys
		res []*api.LookupResult
		err error
	}
	out := make([]inject.Found, len(keys))
	limit := max(1, min(r.n.cfg.MaxChunksPerRequest, MaxLookupBatch))
	var calls []*call
	open := map[group]*call{}
	asked := make([]int, len(keys)) // replicas asked per key
	for i, k := range keys {
		for _, addr := range r.others(k.Content) {
			g := group{addr, k.Fingerprint}
			c := open[g]
			if c == nil || len(c.idx) == limit {
				c = &call{group: g}
				open[g] = c
				calls = append(calls, c)
			}
			c.idx = append(c.idx, i)
			asked[i]++
		}
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			items := make([]lookupItem, len(c.idx))
			for j, i := range c.idx {
				items[j] = lookupItem{content: keys[i].Content, want: keys[i].Context}
			}
			c.res, c.err = r.n.remoteLookup(ctx, c.addr, api.ProtoFingerprint(c.fp), items)
		}()
	}
	wg.Wait()
	best := make([]*api.LookupResult, len(keys))
	answered := make([]bool, len(keys))
	errs := make([][]error, len(keys))
	for _, c := range calls {
		for j, i := range c.idx {
			if c.err != nil {
				errs[i] = append(errs[i], c.err)
				continue
			}
			a := c.res[j]
			answered[i] = true
			if betterAnswer(keys[i].Context, a, best[i]) {
				best[i] = a
			}
		}
	}
	for i := range keys {
		out[i] = r.pick(asked[i] > 0, answered[i], best[i], errs[i])
	}
	return out
}

// pick turns the replicas' best answer for one key into an inject.Found.
func (r replicaRemote) pick(asked, answered bool, best *api.LookupResult, errs []error) inject.Found {
	switch {
	case !asked:
		return inject.Found{Match: chunk.MatchMiss}
	case !answered:
		return inject.Found{Err: fmt.Errorf("node: no replica answered: %w", errors.Join(errs...))}
	}
	key, ok := hitOf(best)
	if !ok {
		return inject.Found{Match: chunk.MatchMiss}
	}
	return inject.Found{Key: key, Match: api.MatchFromProto(best.Status)}
}

func (r replicaRemote) Get(ctx context.Context, key chunk.Key) ([]byte, error) {
	var errs []error
	for _, addr := range r.others(key.Content) {
		blob, err := r.n.fetchEntry(ctx, addr, key)
		if err == nil {
			return blob, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	if len(errs) == 0 {
		return nil, kvtier.ErrNotFound
	}
	return nil, errors.Join(errs...)
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
		Memory: inject.Memory{Path: req.Path, Offsets: req.Offsets, Device: int(req.Device),
			IPCHandles: req.IpcHandles},
	}
	for i, l := range req.Layouts {
		lay, err := api.LayoutFromProto(l)
		if err != nil {
			return nil, invalid(fmt.Errorf("layout %d: %w", i, err))
		}
		d.Layouts = append(d.Layouts, lay)
	}
	switch req.MemoryKind {
	case api.MemoryKind_MEMORY_KIND_SHM:
		d.Memory.Kind = inject.MemoryShm
		if !localPeer(ctx) {
			return nil, status.Error(codes.PermissionDenied, "shared-memory caches register from this machine only")
		}
	case api.MemoryKind_MEMORY_KIND_CUDA_IPC:
		d.Memory.Kind = inject.MemoryCUDAIPC
	default:
		return nil, status.Errorf(codes.InvalidArgument, "memory kind %v", req.MemoryKind)
	}
	id, err := in.svc.Register(ctx, d)
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
	r := &inject.Request{Cache: inject.CacheID(req.CacheId), Chunks: make([]inject.Chunk, len(req.Chunks))}
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
		r.Chunks[i] = inject.Chunk{Content: api.IDFromProto(c.Content), Tokens: c.Tokens, Context: want,
			Pos: int(c.Pos), Slots: slots}
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
	done := &api.InjectDone{WrittenBytes: uint64(resp.WrittenBytes), DecodedBytes: uint64(resp.DecodedBytes),
		Results: lookupResults(r, resp.Results)}
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
			lr.Key = &api.Key{Content: api.ProtoID(r.Chunks[i].Content), Context: api.ProtoContext(res.Context)}
		}
		out[i] = lr
	}
	return out
}
