package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/pinned"
)

// This file is the injection path's reads from replicas: Peer.FetchMany
// on both ends, and entryReads, which opens one stream per replica node
// for the keys an injection reads there and shares each key's read with
// the injections that want it meanwhile.

// serveFetchMany answers Peer.FetchMany: every key this node holds is
// pinned for the stream's life and sent in its stored bytes, layer by layer
// (api.SendFetchMany); a key it lacks is answered with the status code a
// Fetch of it gets (NOT_FOUND; UNAVAILABLE while recovering).
func (n *Node) serveFetchMany(req *api.FetchManyRequest, st grpc.ServerStreamingServer[api.FetchManyFrame]) error {
	ctx := st.Context()
	if err := n.checkChunks("fetch_many", len(req.Keys)); err != nil {
		return err
	}
	keys := make([]chunk.Key, len(req.Keys))
	for i, pk := range req.Keys {
		k, err := api.KeyFromProto(pk)
		if err != nil {
			return invalid(fmt.Errorf("key %d: %w", i, err))
		}
		if err := checkFingerprint(ctx, k.Fingerprint); err != nil {
			return err
		}
		keys[i] = k
	}
	items := make([]api.FetchManyItem, len(keys))
	defer func() {
		for _, it := range items {
			if it.Blob != nil {
				it.Blob.Free()
			}
		}
	}()
	var total int
	for i, key := range keys {
		blob, err := n.repl.ServeFetch(ctx, key)
		if err != nil {
			items[i].Code = status.Code(replToStatus(err))
			continue
		}
		hd, err := chunk.ParseHeader(blob.Bytes(), n.cfg.Limits)
		if err != nil {
			blob.Release()
			n.log.Error("node: stored entry does not parse", "key", key, "err", err)
			items[i].Code = codes.DataLoss
			continue
		}
		items[i].Head, items[i].Blob = &hd, api.PinnedBuffer(blob)
		total += hd.BlobBytes
	}
	if err := api.SendFetchMany(st, items, n.cfg.FrameBytes); err != nil {
		return err
	}
	n.metrics.bytesOut.WithLabelValues("fetch_many").Add(float64(total))
	return nil
}

// fetchMany reads keys from addr with Peer.FetchMany into sink.
func (n *Node) fetchMany(ctx context.Context, addr string, keys []chunk.Key, sink api.FetchManySink) error {
	pc, err := n.peers.peer(addr)
	if err != nil {
		return err
	}
	req := &api.FetchManyRequest{Keys: make([]*api.Key, len(keys))}
	for i, k := range keys {
		req.Keys[i] = api.ProtoKey(k)
	}
	st, err := pc.FetchMany(ctx, req)
	if err != nil {
		return err
	}
	counted := &countingSink{FetchManySink: sink}
	err = api.RecvFetchMany(st, len(keys), n.cfg.Limits, counted)
	n.metrics.bytesIn.WithLabelValues("fetch_many").Add(float64(counted.bytes))
	return err
}

// countingSink adds up the entry bytes a stream announced.
type countingSink struct {
	api.FetchManySink
	bytes int
}

func (c *countingSink) Found(i int, blob []byte, hd *chunk.Header) {
	c.bytes += len(blob)
	c.FetchManySink.Found(i, blob, hd)
}

// readsConfig is what entryReads needs from the node.
type readsConfig struct {
	// open reads keys from the replica at addr into sink until the stream
	// ends (Node.fetchMany).
	open func(ctx context.Context, addr string, keys []chunk.Key, sink api.FetchManySink) error
	// get reads one key from any replica that has it (the fallback).
	get func(ctx context.Context, key chunk.Key) ([]byte, error)
	// timeout bounds one stream.
	timeout time.Duration
	// parallel bounds the fallback reads of one GetMany.
	parallel int
}

// entryReads reads entries from replicas for injections: one stream per
// replica node for the keys an injection reads there (GetMany), each key
// handed over as soon as its head arrived, its layers following. A key
// being read is read once however many injections want it meanwhile
// (singleflight by the chunk key): a later one shares the read in flight.
// A stream runs as long as some injection holds one of its keys, not as
// long as the one that opened it: an injection that ends (cancelled, done)
// does not end the reads others share. A key whose read fails before its
// head arrived (not on that replica, the stream failed) is read again
// alone from any replica, by each injection that wanted it.
type entryReads struct {
	cfg     readsConfig
	base    context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup // stream goroutines
	streams prometheus.Counter
	entries *prometheus.CounterVec // how: fetched, shared, fallback

	mu      sync.Mutex // guards flights and every flight's refs and stream's refs
	flights map[chunk.Key]*entryFlight
}

func newEntryReads(cfg readsConfig) *entryReads {
	if cfg.parallel <= 0 {
		cfg.parallel = inject.DefaultFetchParallel
	}
	e := &entryReads{
		cfg:     cfg,
		flights: map[chunk.Key]*entryFlight{},
		streams: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_inject_peer_streams_total",
			Help: "FetchMany streams the injection path opened to replicas (one per replica node per injection that reads there).",
		}),
		entries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_inject_peer_entries_total",
			Help: "Entries the injection path read from replicas, by how: fetched (in a stream it opened), shared (a read in flight for another injection), fallback (alone, after the stream failed to bring it).",
		}, []string{"how"}),
	}
	for _, how := range []string{"fetched", "shared", "fallback"} {
		e.entries.WithLabelValues(how)
	}
	e.base, e.stop = context.WithCancel(context.Background())
	return e
}

// close ends every stream and waits for their goroutines.
func (e *entryReads) close() {
	e.stop()
	e.wg.Wait()
}

// readStream is one Peer.FetchMany stream, shared by the injections that
// hold its keys.
type readStream struct {
	cancel  context.CancelFunc
	flights []*entryFlight
	refs    int  // injections' holds on its keys (entryReads.mu)
	dropped bool // nobody holds it: cancelled, its keys out of the table
}

// entryFlight is one key's entry being read in a stream: filled by the
// stream's goroutine, waited on by the injections that hold it. It
// implements inject.Arriving.
type entryFlight struct {
	key  chunk.Key
	s    *readStream
	refs int // entryReads.mu

	mu      sync.Mutex
	blob    []byte
	hd      *chunk.Header
	layers  int   // layers in place
	err     error // why no more will come
	changed chan struct{}
}

func (f *entryFlight) update(fn func()) {
	f.mu.Lock()
	fn()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// head waits until the entry's head arrived and returns its blob, or why
// it will not.
func (f *entryFlight) head(ctx context.Context) ([]byte, error) {
	for {
		f.mu.Lock()
		blob, err, ch := f.blob, f.err, f.changed
		f.mu.Unlock()
		switch {
		case blob != nil:
			return blob, nil
		case err != nil:
			return nil, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Ready implements inject.Arriving.
func (f *entryFlight) Ready(ctx context.Context, l int) error {
	for {
		f.mu.Lock()
		n, err, ch := f.layers, f.err, f.changed
		f.mu.Unlock()
		switch {
		case l < n:
			return nil
		case err != nil:
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// flightSink is a stream's api.FetchManySink: entry i is flights[i].
type flightSink struct {
	e       *entryReads
	flights []*entryFlight
}

func (s flightSink) Found(i int, blob []byte, hd *chunk.Header) {
	f := s.flights[i]
	f.update(func() { f.blob, f.hd = blob, hd })
	if len(hd.Layers) == 0 {
		s.e.land(f)
	}
}

func (s flightSink) Missing(i int, code codes.Code) {
	f := s.flights[i]
	s.e.fail(f, status.Errorf(code, "node: replica does not serve %v", f.key))
}

func (s flightSink) Layer(i, l int) {
	f := s.flights[i]
	f.update(func() { f.layers = l + 1 })
	if l+1 == len(f.hd.Layers) {
		s.e.land(f)
	}
}

// land takes a flight whose every layer arrived out of the table: later
// injections read afresh.
func (e *entryReads) land(f *entryFlight) {
	e.mu.Lock()
	if e.flights[f.key] == f {
		delete(e.flights, f.key)
	}
	e.mu.Unlock()
}

// fail ends f with err (unless it already ended) and takes it out of the
// table.
func (e *entryReads) fail(f *entryFlight, err error) {
	f.update(func() {
		if f.err == nil && (f.hd == nil || f.layers < len(f.hd.Layers)) {
			f.err = err
		}
	})
	e.land(f)
}

// release drops an injection's hold on f; a stream nobody holds any more
// is cancelled and its keys leave the table at once, so no later
// injection joins a read about to fail.
func (e *entryReads) release(f *entryFlight) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f.refs--
	s := f.s
	if s.refs--; s.refs > 0 || s.dropped {
		return
	}
	s.dropped = true
	for _, g := range s.flights {
		if e.flights[g.key] == g {
			delete(e.flights, g.key)
		}
	}
	s.cancel()
}

// GetMany implements inject.StreamRemote's read: keys in flight are
// shared, the others are read with one stream per replica (from[i]); each
// key is answered once its head arrived, or, when its stream could not
// bring it, read alone from any replica (cfg.get).
func (e *entryReads) GetMany(ctx context.Context, keys []chunk.Key, from []string, got func(i int, f inject.Fetched, err error)) {
	flights := make([]*entryFlight, len(keys))
	shared := make([]bool, len(keys))
	groups := map[string][]int{}
	var order []string
	e.mu.Lock()
	for i, k := range keys {
		// In flight for another injection, or named twice here: share.
		if f := e.flights[k]; f != nil {
			f.refs++
			if f.s != nil {
				f.s.refs++
			}
			flights[i], shared[i] = f, f.s != nil
			continue
		}
		f := &entryFlight{key: k, refs: 1, changed: make(chan struct{})}
		e.flights[k] = f
		flights[i] = f
		if _, ok := groups[from[i]]; !ok {
			order = append(order, from[i])
		}
		groups[from[i]] = append(groups[from[i]], i)
	}
	for _, addr := range order {
		idx := groups[addr]
		ctx, cancel := context.WithTimeout(e.base, e.cfg.timeout)
		s := &readStream{cancel: cancel}
		ks := make([]chunk.Key, len(idx))
		for j, i := range idx {
			f := flights[i]
			f.s = s
			s.refs += f.refs
			s.flights = append(s.flights, f)
			ks[j] = f.key
		}
		e.streams.Inc()
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer cancel()
			err := e.cfg.open(ctx, addr, ks, flightSink{e: e, flights: s.flights})
			if err == nil {
				return // every layer of every entry arrived
			}
			for _, f := range s.flights {
				e.fail(f, fmt.Errorf("node: read from %s: %w", addr, err))
			}
		}()
	}
	e.mu.Unlock()

	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, e.cfg.parallel)
	)
	defer wg.Wait()
	for i, f := range flights {
		blob, err := f.head(ctx)
		if err == nil {
			how := "fetched"
			if shared[i] {
				how = "shared"
			}
			e.entries.WithLabelValues(how).Inc()
			got(i, inject.Fetched{Blob: pinned.NewFunc(blob, sync.OnceFunc(func() { e.release(f) })), Arriving: f}, nil)
			continue
		}
		e.release(f)
		if ctx.Err() != nil {
			got(i, inject.Fetched{}, ctx.Err())
			continue
		}
		// Read alone, from any replica: the stream's replica lacked it,
		// or the stream failed before its head came.
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			got(i, inject.Fetched{}, ctx.Err())
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			blob, gerr := e.cfg.get(ctx, keys[i])
			if gerr != nil {
				got(i, inject.Fetched{}, fmt.Errorf("%w; alone: %w", err, gerr))
				return
			}
			e.entries.WithLabelValues("fallback").Inc()
			got(i, inject.Fetched{Blob: pinned.Owned(blob)}, nil)
		}()
	}
}
