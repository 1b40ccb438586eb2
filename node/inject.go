package node

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/kvtier"
)

// startInject builds the injection service; Start calls it once the store
// and the metadata are open, and registers the returned server.
func (n *Node) startInject() (*injector, error) {
	in := &injector{n: n, fetched: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_inject_fetched_bytes_total",
		Help: "Entry bytes the injection path read, by source (local: this node's store, read on the host; gpu: its GPU tier's device copies, read in device memory by the kernel; peer: a replica).",
	}, []string{"source"})}
	// Every source has a series from the start.
	in.fetched.WithLabelValues("local")
	in.fetched.WithLabelValues("gpu")
	in.fetched.WithLabelValues("peer")
	remote := replicaRemote{n: n}
	in.reads = newEntryReads(readsConfig{open: n.fetchMany, get: remote.Get, timeout: n.cfg.RPCTimeout})
	remote.reads = in.reads
	svc, err := inject.New(inject.Config{
		Fetcher:   countingFetcher{f: inject.TierFetcher{Local: n.injectLocal(), Remote: remote}, c: in.fetched, drop: n.repl.DropCorrupt},
		Models:    nodeModels{n},
		Limits:    n.cfg.Limits,
		GPU:       n.cfg.GPU,
		GPUDevice: n.cfg.GPUDevice,
		Logger:    n.log,
	})
	if err != nil {
		return nil, fmt.Errorf("node: start injection: %w", err)
	}
	if err := n.registry.Register(svc); err != nil {
		_ = svc.Close()
		return nil, fmt.Errorf("node: register injection metrics: %w", err)
	}
	for _, c := range []prometheus.Collector{in.fetched, in.reads.streams, in.reads.entries} {
		if err := n.registry.Register(c); err != nil {
			_ = svc.Close()
			return nil, fmt.Errorf("node: register injection metrics: %w", err)
		}
	}
	in.svc = svc
	if runtime.GOOS == "linux" {
		if in.sock, err = listenCacheSocket(n.log); err != nil {
			_ = svc.Close()
			return nil, err
		}
		if err := n.registry.Register(in.sock.files); err != nil {
			_ = errors.Join(in.sock.close(), svc.Close())
			return nil, fmt.Errorf("node: register injection metrics: %w", err)
		}
	}
	return in, nil
}

// injectLocal is the store as the injection path reads it: with a GPU
// tier, an inject.DeviceLocal that lends the tier's entries to caches on
// its device.
func (n *Node) injectLocal() inject.Local {
	if n.cfg.GPUBytes <= 0 {
		return n.store
	}
	return gpuLocal{Store: n.store, device: n.cfg.GPUDevice}
}

// gpuLocal is inject.DeviceLocal over the store's GPU tier on device. Its
// slab and the injection path's device caches live in the device's
// primary context in this process, so a copy's address is valid for their
// kernels.
type gpuLocal struct {
	*kvtier.Store
	device int
}

// errOtherDevice: a cache on another device than the GPU tier's.
var errOtherDevice = errors.New("node: the GPU tier is on another device")

// GetDevice implements inject.DeviceLocal.
func (l gpuLocal) GetDevice(ctx context.Context, key chunk.Key, device int, codecs []chunk.Codec) (inject.DeviceCopy, error) {
	if device != l.device {
		return inject.DeviceCopy{}, fmt.Errorf("%w: %d, not %d", errOtherDevice, l.device, device)
	}
	h, err := l.Store.GetDevice(ctx, key, codecs...)
	if err != nil {
		return inject.DeviceCopy{}, err
	}
	return inject.DeviceCopy{Ptr: uint64(h.Ptr), Header: h.Header, Release: h.Release}, nil
}

// close stops the service: requests in flight end, registrations are
// unmapped. Called after the gRPC server stopped, before the store closes.
func (in *injector) close() error {
	if in == nil || in.svc == nil {
		return nil
	}
	err := errors.Join(in.sock.close(), in.svc.Close())
	in.reads.close()
	return err
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

// InjectKernel names the kernel the injection service runs on: the CPU
// Injector or the GPU (inject.Service.Kernel).
func (n *Node) InjectKernel() string {
	if n.inj == nil {
		return ""
	}
	return n.inj.svc.Kernel()
}

// InjectStageTotals reports the time the injection path spent in each
// stage over every request so far (inject.Service.StageTotals).
func (n *Node) InjectStageTotals() inject.Timings {
	if n.inj == nil {
		return inject.Timings{}
	}
	return n.inj.svc.StageTotals()
}

// nodeModels resolves fingerprints through the metadata's model registry.
type nodeModels struct{ n *Node }

func (m nodeModels) Model(ctx context.Context, fp chunk.Fingerprint) (chunk.ModelSpec, error) {
	return m.n.model(ctx, fp)
}

// countingFetcher counts the bytes a Fetcher returns by where they came
// from: the local tier or a peer. It is an inject.Refetcher: a local copy
// the injector found corrupt is dropped (drop: replication's DropCorrupt,
// which has it repaired from a replica) and the key fetched again.
type countingFetcher struct {
	f    inject.Fetcher
	c    *prometheus.CounterVec
	drop func(chunk.Key, error)
}

// Refetch implements inject.Refetcher.
func (f countingFetcher) Refetch(ctx context.Context, stored, want chunk.Key, why error) (inject.Fetched, error) {
	f.drop(stored, why)
	return f.Fetch(ctx, want)
}

func (f countingFetcher) Fetch(ctx context.Context, key chunk.Key) (inject.Fetched, error) {
	got, err := f.f.Fetch(ctx, key)
	f.count(got, err)
	return got, err
}

// FetchBatchDevice implements inject.DeviceFetcher (FetchBatch when the
// wrapped Fetcher lends nothing in device memory).
func (f countingFetcher) FetchBatchDevice(ctx context.Context, device int, keys []chunk.Key, found func(int, inject.Fetched, error)) {
	df, ok := f.f.(inject.DeviceFetcher)
	if !ok {
		f.FetchBatch(ctx, keys, found)
		return
	}
	df.FetchBatchDevice(ctx, device, keys, func(i int, got inject.Fetched, err error) {
		f.count(got, err)
		found(i, got, err)
	})
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
	if err == nil && got.Device != nil && got.Device.Header != nil {
		f.c.WithLabelValues("gpu").Add(float64(got.Device.Header.BlobBytes))
		return
	}
	if err == nil && got.Blob.Len() > 0 {
		src := "peer"
		if got.Local {
			src = "local"
		}
		f.c.WithLabelValues(src).Add(float64(got.Blob.Len()))
	}
}

// replicaRemote is inject.StreamRemote over the other replicas of a
// content ID: a direct Lookup to each (in parallel), then the entries read
// through reads (one FetchMany stream per replica node, shared reads of
// the same key); Get reads one key with a Fetch from the first replica in
// ring order that holds it, failing over to the next.
type replicaRemote struct {
	n     *Node
	reads *entryReads
}

// GetMany implements inject.StreamRemote.
func (r replicaRemote) GetMany(ctx context.Context, keys []chunk.Key, from []string, got func(int, inject.Fetched, error)) {
	r.reads.GetMany(ctx, keys, from, got)
}

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
	from := make([]string, len(keys)) // the replica that answered best
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
				best[i], from[i] = a, c.addr
			}
		}
	}
	for i := range keys {
		out[i] = r.pick(asked[i] > 0, answered[i], best[i], errs[i])
		out[i].From = from[i]
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
