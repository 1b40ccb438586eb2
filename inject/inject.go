package inject

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// Request asks to inject chunks into a registered cache. Each chunk's Key
// names the encoding wanted: a zero Fingerprint means the cache's (any
// other value makes the request invalid); a zero Content means
// chunk.ContentID of Tokens; Context is the wanted context (the prompt's
// prefix chain ID before the chunk, or a window), and an entry with
// exactly it is EXACT. Tokens, when given, are checked against the content
// ID and the entry's tokens; Pos is the absolute position of the chunk's
// first token; Slots maps token t to a cache slot, -1 to skip it (its
// length is the chunk's token count).
type Request struct {
	Cache  CacheID
	Chunks []pagedkv.InjectChunk
	// OnLayer, if set, is called on the Inject caller's goroutine, in
	// layer order, once layer l of every hit is written: the engine may
	// start computing layer l. It must return promptly: the workers run
	// at most Config.LayersAhead layers past the last one reported.
	//
	// Chunk answers come only with the Response. All verification happens
	// before the first layer is written, so a chunk written at layer l is
	// normally written at every layer. The exceptions: an entry whose
	// checksums pass but whose codec payload does not decode at a later
	// layer (only a writer that sealed a malformed payload makes one), and
	// an entry still arriving from a replica (Fetched.Arriving) whose
	// stream fails or whose layer fails its checksum: it is answered MISS
	// and its slots must be prefilled, though earlier layers of it may
	// have been written.
	OnLayer func(layer int)
	// OnPlan, if set, is called once on the Inject caller's goroutine when
	// every chunk is fetched and verified, before anything is written,
	// with one Result per chunk (the slice is the Response's: read it
	// during the call only). The Response answers the same unless a
	// planned hit fails to decode at some layer (see OnLayer): then it is
	// a MISS there. With the plan the engine knows which tokens it must
	// compute, and may start layer l as soon as OnLayer(l) comes.
	OnPlan func(results []Result)
}

// Result answers one chunk: the injector's answer every engine reads
// (Match, and the Context of the entry injected, zero on a miss), and why.
type Result struct {
	pagedkv.InjectResult
	// Reason says why a chunk is a MISS when something was found but not
	// used (verification failed, the fetch failed); nil otherwise.
	Reason error
}

// Response answers a request.
type Response struct {
	Results []Result // one per chunk, in order
	// DecodedBytes counts canonical bytes a codec decoded (raw entries
	// are read in place and count none); WrittenBytes, bytes written into
	// the cache.
	DecodedBytes int64
	WrittenBytes int64
	// Timings is where the node's time went.
	Timings Timings
}

// Timings is the time a request spent in each stage of injection, summed
// over its chunks and layers. Stages run concurrently (chunks are fetched
// and verified at once; several workers decode and write layers while
// the next ones arrive), so stages overlap and a sum may exceed the
// request's wall time.
type Timings struct {
	// Fetch is the wall time of the fetch phase: every chunk's entry (or
	// the first bytes of one still arriving) found and verified.
	Fetch time.Duration
	// Arrive is the time the pipeline waited for layers of entries still
	// arriving from a replica.
	Arrive time.Duration
	// Verify sums the checks of entries (within Fetch) and of streamed raw
	// layers as they arrive.
	Verify time.Duration
	// Decode sums codec decodes of chunk layers (raw entries have none).
	Decode time.Duration
	// Scatter sums RoPE rotations and writes into the cache's slots.
	Scatter time.Duration
}

// stageTimes accumulates a request's Timings from concurrent workers.
type stageTimes struct {
	arrive, verify, decode, scatter atomic.Int64
}

// hit is a chunk whose entry passed verification.
type hit struct {
	idx     int
	f       Fetched
	hd      chunk.Header
	pos     int
	slots   []int
	raw     bool // raw codec: the blob's layers are the source, no decode
	dec     int  // decoded bytes of one layer (the cache's head range)
	written []int64
	failed  atomic.Bool
	once    sync.Once
	err     error // why it failed after verification; set once, read after the pipeline
}

// fail marks the hit unusable from now on (a MISS).
func (h *hit) fail(err error) {
	h.once.Do(func() {
		h.err = err
		h.failed.Store(true)
	})
}

// request is one Inject call in flight.
type request struct {
	s       *Service
	ctx     context.Context
	cancel  context.CancelFunc
	c       *cache
	hits    []*hit
	heads   int
	faulted atomic.Bool
	decoded atomic.Int64
	times   stageTimes

	wg        sync.WaitGroup // tasks submitted and not finished
	remaining []atomic.Int32 // per layer: tasks not finished
	done      chan int       // layers whose tasks all finished, any order
}

// Inject fetches, verifies, decodes, rotates and writes the chunks of req
// into the registered cache, layer by layer, and answers every chunk.
//
// A malformed request returns ErrInvalidRequest before anything is
// fetched or written. A chunk whose entry is missing, unreachable or fails
// verification is a MISS, and none of its bytes is written. If ctx is
// cancelled, Inject stops the pipeline, waits for its workers and returns
// the context's error: layers already reported through OnLayer are
// written, others may be partly written, and only in the requested slots.
func (s *Service) Inject(ctx context.Context, req *Request) (*Response, error) {
	start := time.Now()
	c, err := s.acquire(req.Cache)
	if err != nil {
		return nil, err
	}
	defer s.releaseCache(c)
	s.m.requests.Inc()
	if err := s.checkRequest(c, req); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.base, cancel)
	defer stop()
	r := &request{s: s, ctx: ctx, cancel: cancel, c: c, heads: c.headHi - c.headLo}
	resp := &Response{Results: make([]Result, len(req.Chunks))}
	// The pipeline has waited for its workers, whose kernels have finished,
	// when this runs: device copies are no longer read.
	defer func() {
		for _, h := range r.hits {
			h.f.release()
		}
	}()
	fetchStart := time.Now()
	err = r.fetch(req, resp.Results)
	resp.Timings.Fetch = time.Since(fetchStart)
	if err != nil {
		if s.base.Err() != nil {
			return nil, fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return nil, err
	}
	if req.OnPlan != nil {
		req.OnPlan(resp.Results)
	}
	if len(r.hits) > 0 {
		if err := r.pipeline(req.OnLayer); err != nil {
			if r.faulted.Load() {
				s.m.faults.Inc()
				s.log.Error("inject: fault writing a registered cache", "cache", c.id)
				return nil, fmt.Errorf("%w: cache %d", ErrFault, c.id)
			}
			if s.base.Err() != nil {
				return nil, fmt.Errorf("%w: %w", ErrClosed, err)
			}
			return nil, err
		}
	}
	for _, h := range r.hits {
		if h.failed.Load() {
			resp.Results[h.idx] = Result{Reason: h.err}
			continue
		}
		for _, n := range h.written {
			resp.WrittenBytes += n
		}
		if h.f.Device != nil {
			s.m.deviceChunks.Inc()
		}
	}
	resp.DecodedBytes = r.decoded.Load()
	resp.Timings.Arrive = time.Duration(r.times.arrive.Load())
	resp.Timings.Verify = time.Duration(r.times.verify.Load())
	resp.Timings.Decode = time.Duration(r.times.decode.Load())
	resp.Timings.Scatter = time.Duration(r.times.scatter.Load())
	s.m.observeStages(&resp.Timings)
	for _, res := range resp.Results {
		s.m.chunks.WithLabelValues(res.Match.String()).Inc()
	}
	s.m.decoded.Add(float64(resp.DecodedBytes))
	s.m.written.Add(float64(resp.WrittenBytes))
	s.m.request.Observe(time.Since(start).Seconds())
	return resp, nil
}

// checkRequest validates what the engine asked, before any fetch.
func (s *Service) checkRequest(c *cache, req *Request) error {
	bad := func(i int, format string, a ...any) error {
		return fmt.Errorf("%w: chunk %d: %s", ErrInvalidRequest, i, fmt.Sprintf(format, a...))
	}
	if len(req.Chunks) > s.cfg.MaxChunks {
		return fmt.Errorf("%w: %d chunks exceed %d", ErrInvalidRequest, len(req.Chunks), s.cfg.MaxChunks)
	}
	nslots := c.layouts[0].Slots()
	for _, l := range c.layouts[1:] {
		nslots = min(nslots, l.Slots())
	}
	fp := c.desc.Fingerprint
	total := 0
	for i := range req.Chunks {
		ch := &req.Chunks[i]
		switch {
		case !ch.Key.Fingerprint.IsZero() && ch.Key.Fingerprint != fp:
			return bad(i, "fingerprint %v, cache holds %v", ch.Key.Fingerprint, fp)
		case len(ch.Slots) == 0:
			return bad(i, "no slots")
		case ch.Key.Content.IsZero() && len(ch.Tokens) == 0:
			return bad(i, "neither a content ID nor tokens")
		case len(ch.Tokens) != 0 && len(ch.Tokens) != len(ch.Slots):
			return bad(i, "%d tokens, %d slots", len(ch.Tokens), len(ch.Slots))
		case !ch.Key.Context.Kind.Valid():
			return bad(i, "context kind %v", ch.Key.Context.Kind)
		case ch.Pos < 0 || ch.Pos > c.rope.MaxPositions()-len(ch.Slots):
			return bad(i, "positions [%d,%d) beyond the cache's %d", ch.Pos, ch.Pos+len(ch.Slots), c.rope.MaxPositions())
		}
		for t, sl := range ch.Slots {
			if sl < -1 || sl >= nslots {
				return bad(i, "slot[%d] = %d out of range -1..%d", t, sl, nslots-1)
			}
		}
		if len(ch.Tokens) != 0 && !ch.Key.Content.IsZero() && chunk.ContentID(fp, ch.Tokens) != ch.Key.Content {
			return bad(i, "tokens do not hash to content %v", ch.Key.Content)
		}
		total += len(ch.Slots)
	}
	// Chunks are written concurrently: a slot named twice would end up
	// holding either token.
	all := make([]int, 0, total)
	for i := range req.Chunks {
		for _, sl := range req.Chunks[i].Slots {
			if sl >= 0 {
				all = append(all, sl)
			}
		}
	}
	slices.Sort(all)
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			return fmt.Errorf("%w: slot %d named twice", ErrInvalidRequest, all[i])
		}
	}
	return nil
}

// fetch runs the Fetcher for every chunk (FetchBatch for all at once when
// it is a BatchFetcher, else Fetch at most FetchParallel at once) and keeps
// the entries that pass verification as hits.
func (r *request) fetch(req *Request, results []Result) error {
	hits := make([]*hit, len(req.Chunks))
	// Each index is written by one call (the flag drops a fetcher's
	// second answer), and the calls end before fetch reads: no lock.
	// Content IDs hash every token: compute each key once, for the fetch
	// and for verification.
	keys := make([]chunk.Key, len(req.Chunks))
	for i := range req.Chunks {
		keys[i] = r.key(&req.Chunks[i])
	}
	seen := make([]atomic.Bool, len(req.Chunks))
	settle := func(i int, f Fetched, err error) {
		if i < 0 || i >= len(seen) || seen[i].Swap(true) {
			f.release()
			return
		}
		hits[i], results[i] = r.accept(i, &req.Chunks[i], keys[i], f, err, true)
	}
	var err error
	df, devices := r.s.cfg.Fetcher.(DeviceFetcher)
	bf, batches := r.s.cfg.Fetcher.(BatchFetcher)
	switch {
	case devices && r.c.dev != nil:
		df.FetchBatchDevice(r.ctx, r.c.desc.Memory.Device, keys, settle)
	case batches:
		bf.FetchBatch(r.ctx, keys, settle)
	default:
		err = r.fetchEach(keys, settle)
	}
	for _, h := range hits {
		if h != nil {
			r.hits = append(r.hits, h)
		}
	}
	if err == nil {
		err = r.ctx.Err()
	}
	return err
}

// fetchEach calls Fetch for every key, at most FetchParallel at once.
func (r *request) fetchEach(keys []chunk.Key, settle func(int, Fetched, error)) error {
	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, r.s.cfg.FetchParallel)
		err error
	)
loop:
	for i := range keys {
		select {
		case sem <- struct{}{}:
		case <-r.ctx.Done():
			err = r.ctx.Err()
			break loop
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f, err := r.s.cfg.Fetcher.Fetch(r.ctx, keys[i])
			settle(i, f, err)
		}()
	}
	wg.Wait()
	return err
}

// key is the stored key chunk ch asks for.
func (r *request) key(ch *pagedkv.InjectChunk) chunk.Key {
	fp := r.c.desc.Fingerprint
	content := ch.Key.Content
	if content.IsZero() {
		content = chunk.ContentID(fp, ch.Tokens)
	}
	// The wanted context as the one key of its computation: the root of a
	// prefix chain finds the standalone encoding EXACT.
	return chunk.Key{Fingerprint: fp, Content: content, Context: chunk.Canonical(fp, ch.Key.Context)}
}

// accept verifies chunk i's fetched entry for key; a nil hit is a MISS
// (and f is released). A local entry that fails verification is dropped
// and fetched again from the replicas when the Fetcher is a Refetcher
// (once: refetch).
func (r *request) accept(i int, ch *pagedkv.InjectChunk, key chunk.Key, f Fetched, err error, refetch bool) (*hit, Result) {
	content := key.Content
	if err != nil || f.Match == chunk.MatchMiss || (f.Blob.Len() == 0 && f.Device == nil) {
		f.release()
		if err != nil && r.ctx.Err() == nil {
			r.s.log.Debug("inject: fetch failed; chunk is a miss", "content", content, "err", err)
		}
		return nil, Result{Reason: err}
	}
	h := &hit{idx: i, f: f, pos: ch.Pos, slots: ch.Slots}
	t0 := time.Now()
	err = r.verify(h, content, ch)
	r.times.verify.Add(int64(time.Since(t0)))
	if err != nil {
		lent := f.Device != nil
		f.release()
		if lent {
			// The device copy does not fit the cache, or the kernels cannot
			// read it: read the entry on the host, where it is checked as
			// any entry is (and fetched again from a replica when it fails).
			r.s.log.Debug("inject: device copy not used; reading the entry on the host", "content", content, "err", err)
			nf, ferr := r.s.cfg.Fetcher.Fetch(r.ctx, key)
			if nf.Device != nil { // Fetch lends none; never loop
				nf.release()
				return nil, Result{Reason: errors.New("inject: Fetch lent a device copy")}
			}
			return r.accept(i, ch, key, nf, ferr, refetch)
		}
		if rf, ok := r.s.cfg.Fetcher.(Refetcher); ok && f.Local && refetch {
			r.s.log.Warn("inject: local entry failed verification; fetching it from a replica", "content", content, "err", err)
			nf, ferr := rf.Refetch(r.ctx, f.Key, key, err)
			return r.accept(i, ch, key, nf, ferr, false)
		}
		r.s.log.Warn("inject: entry failed verification; chunk is a miss", "content", content, "err", err)
		return nil, Result{Reason: err}
	}
	want := chunk.Canonical(r.c.desc.Fingerprint, ch.Key.Context)
	return h, Result{InjectResult: pagedkv.InjectResult{Match: chunk.MatchOf(want, h.hd.Key.Context), Context: h.hd.Key.Context}}
}

// errVerify marks verification failures in Result.Reason.
var errVerify = errors.New("inject: entry does not fit")

// verify checks everything about h's entry that can be checked before
// decoding: header, key, tokens, shape, every layer checksum (of an entry
// still arriving: the header, whose checksum covers the layers'; each
// layer is checked when it arrived), and that cudakern accepts the job for
// every layer. After it, only a codec payload that was sealed malformed by
// its writer, or a layer of an arriving entry that does not arrive or
// fails its checksum, can fail.
//
// An entry lent in device memory (Fetched.Device) is checked from its
// header alone, the one the store parsed when the bytes entered device
// memory, after it had checked every layer's checksum on them: the same
// checks of key, tokens and shape, plus what the kernels need to read the
// layers where they lie (a device decoder for the codec, payloads of the
// size it reads, aligned raw layers).
func (r *request) verify(h *hit, content chunk.ID, ch *pagedkv.InjectChunk) error {
	c := r.c
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", errVerify, fmt.Sprintf(format, a...))
	}
	var hd chunk.Header
	if dc := h.f.Device; dc != nil {
		if dc.Header == nil {
			return bad("a device copy without its header")
		}
		hd = *dc.Header
	} else {
		var err error
		if hd, err = chunk.ParseHeader(h.f.Blob.Bytes(), r.s.cfg.Limits); err != nil {
			return err
		}
	}
	sh, spec := hd.Shape, c.spec
	switch {
	case hd.Key.Fingerprint != c.desc.Fingerprint:
		return bad("fingerprint %v, cache holds %v", hd.Key.Fingerprint, c.desc.Fingerprint)
	case hd.Key.Content != content:
		return bad("content %v, asked for %v", hd.Key.Content, content)
	case sh.Tokens != len(ch.Slots):
		return bad("%d tokens for %d slots", sh.Tokens, len(ch.Slots))
	case sh.Layers != spec.Layers || sh.KVHeads != spec.KVHeads || sh.HeadDim != spec.HeadDim || sh.DType != spec.DType:
		return bad("shape %d layers × %d heads × %d dims %v, model has %d × %d × %d %v",
			sh.Layers, sh.KVHeads, sh.HeadDim, sh.DType, spec.Layers, spec.KVHeads, spec.HeadDim, spec.DType)
	}
	if len(ch.Tokens) != 0 && !slices.Equal(hd.Tokens, ch.Tokens) {
		return bad("tokens differ from the chunk's")
	}
	for l := range hd.Layers {
		// An entry still arriving has its layers checked as they come
		// (process); the header checked here covers their checksums.
		if h.f.Arriving == nil && h.f.Device == nil {
			if _, err := hd.LayerPayload(h.f.Blob.Bytes(), l); err != nil {
				return err
			}
		}
		if hd.Codec == chunk.CodecRaw && hd.Layers[l].Length != uint64(sh.LayerBytes()) {
			return bad("raw layer %d of %d bytes, shape needs %d", l, hd.Layers[l].Length, sh.LayerBytes())
		}
	}
	h.hd = hd
	h.raw = hd.Codec == chunk.CodecRaw
	h.dec = 2 * sh.Tokens * r.heads * sh.HeadDim * sh.DType.Size()
	// Validate the rotate job of every distinct layout now (no source or
	// destination bytes: those sizes are right by construction), so that
	// no layer can be refused after earlier ones were written.
	for l, lay := range c.layouts {
		if l > 0 && lay == c.layouts[l-1] {
			continue
		}
		var j cudakern.Job
		r.job(&j, h, l, nil, nil)
		if err := j.Validate(); err != nil {
			return bad("layer %d: %v", l, err)
		}
		if h.f.Device != nil {
			j.Dst = [][]byte{nil}
			if _, err := cudakern.DeviceJobOf(&j, hd.Codec); err != nil {
				return bad("layer %d on the device: %v", l, err)
			}
		}
	}
	if dc := h.f.Device; dc != nil {
		if err := r.deviceLayers(h, dc); err != nil {
			return err
		}
	}
	h.written = make([]int64, len(c.layouts))
	for l, lay := range c.layouts {
		n := 0
		for _, sl := range h.slots {
			if sl >= 0 {
				n++
			}
		}
		h.written[l] = int64(2 * n * lay.KVHeads * lay.HeadDim * lay.DType.Size())
	}
	return nil
}

// deviceLayers checks that the kernels can read h's layers in its device
// copy dc: each a codec payload of the size the kernel reads, or a raw
// layer aligned for its elements (its size verify checked).
func (r *request) deviceLayers(h *hit, dc *DeviceCopy) error {
	sh := h.hd.Shape
	for l, ref := range h.hd.Layers {
		at := dc.Ptr + uint64(h.hd.PayloadStart) + ref.Offset
		if h.raw {
			if at%uint64(sh.DType.Size()) != 0 {
				return fmt.Errorf("%w: raw layer %d at %#x, not aligned for %v", errVerify, l, at, sh.DType)
			}
			continue
		}
		if n := cudakern.EncodedLayerBytes(h.hd.Codec, sh.DType, sh.Tokens, sh.KVHeads, sh.HeadDim); ref.Length != uint64(n) {
			return fmt.Errorf("%w: %v layer %d of %d bytes, the device decoder reads %d", errVerify, h.hd.Codec, l, ref.Length, n)
		}
	}
	return nil
}

// pipeline writes every layer of every hit and calls onLayer in layer
// order. A submitter hands the workers (layer, batch of hits) tasks in
// layer order, at most LayersAhead layers past the oldest unreported one;
// each worker decodes a chunk's layer into its own scratch and writes it
// at once, while it is still in cache, so layer l+1 decodes on some
// workers while the last chunks of layer l are written on others.
func (r *request) pipeline(onLayer func(int)) error {
	s := r.s
	layers := r.c.desc.Layers
	n := len(r.hits)
	batch := max(1, (n+2*s.cfg.Workers-1)/(2*s.cfg.Workers))
	perLayer := (n + batch - 1) / batch
	r.remaining = make([]atomic.Int32, layers)
	for l := range r.remaining {
		r.remaining[l].Store(int32(perLayer))
	}
	r.done = make(chan int, layers)
	window := make(chan struct{}, min(s.cfg.LayersAhead+1, layers))
	for range cap(window) {
		window <- struct{}{}
	}
	starts := make([]time.Time, layers)
	subErr := make(chan error, 1)
	go func() {
		for l := 0; l < layers; l++ {
			select {
			case <-window:
			case <-r.ctx.Done():
				subErr <- r.ctx.Err()
				return
			}
			if err := r.arrived(l); err != nil {
				subErr <- err
				return
			}
			starts[l] = time.Now()
			for lo := 0; lo < n; lo += batch {
				r.wg.Add(1)
				select {
				case s.tasks <- task{r: r, layer: l, lo: lo, hi: min(lo+batch, n)}:
				case <-r.ctx.Done():
					r.wg.Done()
					subErr <- r.ctx.Err()
					return
				}
			}
		}
		subErr <- nil
	}()
	finished := make([]bool, layers)
	next := 0
	var err error
	for next < layers && err == nil {
		select {
		case l := <-r.done:
			finished[l] = true
			for next < layers && finished[next] {
				if r.ctx.Err() != nil {
					break
				}
				s.m.layer.Observe(time.Since(starts[next]).Seconds())
				if onLayer != nil {
					onLayer(next)
				}
				next++
				if next+cap(window)-1 < layers {
					window <- struct{}{}
				}
			}
		case <-r.ctx.Done():
			err = r.ctx.Err()
		}
	}
	if err != nil {
		r.cancel()
	}
	if serr := <-subErr; err == nil {
		err = serr
	}
	r.wg.Wait()
	if err == nil {
		err = r.ctx.Err()
	}
	return err
}

// arrived waits until layer l of every hit still arriving is in place. A
// hit whose layer will not come (its stream failed) is a MISS from now on;
// only the end of the request's context is an error.
func (r *request) arrived(l int) error {
	t0 := time.Now()
	waited := false
	defer func() {
		if waited {
			r.times.arrive.Add(int64(time.Since(t0)))
		}
	}()
	for _, h := range r.hits {
		if h.f.Arriving == nil || h.failed.Load() {
			continue
		}
		waited = true
		if err := h.f.Arriving.Ready(r.ctx, l); err != nil {
			if r.ctx.Err() != nil {
				return r.ctx.Err()
			}
			h.fail(fmt.Errorf("inject: layer %d did not arrive: %w", l, err))
			r.s.m.arrivalFailures.Inc()
			r.s.log.Warn("inject: entry stopped arriving; chunk is a miss", "key", h.hd.Key, "layer", l, "err", err)
		}
	}
	return nil
}

// finish counts a task of layer t.layer done and announces the layer when
// it was the last.
func (r *request) finish(t task) {
	if r.remaining[t.layer].Add(-1) == 0 {
		r.done <- t.layer // buffered for every layer: never blocks
	}
}

// job fills w.job for layer l of h from src: a raw entry's layer payload
// (all heads; cudakern selects the cache's) or a decoded layer of the
// cache's heads.
func (r *request) job(j *cudakern.Job, h *hit, layer int, src []byte, dst [][]byte) {
	c := r.c
	*j = cudakern.Job{Rope: c.rope, Src: src, SrcDType: h.hd.Shape.DType, Tokens: len(h.slots), SrcHeads: r.heads,
		Pos: h.pos, Slots: h.slots, Layout: c.layouts[layer], Dst: dst}
	if h.raw || h.f.Device != nil {
		// The whole entry's layer: cudakern selects the cache's heads (a
		// device kernel decodes a codec payload of every head).
		j.SrcHeads, j.HeadLo, j.HeadHi = h.hd.Shape.KVHeads, c.headLo, c.headHi
	}
}

// process decodes layer l of hit i (unless it is raw: then the blob's
// verified layer is the source, with no copy) and writes it into the
// cache.
func (r *request) process(w *worker, layer, i int) {
	h := r.hits[i]
	if h.failed.Load() {
		return
	}
	if h.f.Device != nil {
		r.processDevice(w, layer, h)
		return
	}
	c := r.c
	var src []byte
	t0 := time.Now()
	switch {
	case h.raw && h.f.Arriving != nil:
		// Arrived just now: checked here, before it is written.
		var err error
		src, err = h.hd.LayerPayload(h.f.Blob.Bytes(), layer)
		t1 := time.Now()
		r.times.verify.Add(int64(t1.Sub(t0)))
		t0 = t1
		if err != nil {
			h.fail(fmt.Errorf("%w: %w", errVerify, err))
			r.s.log.Warn("inject: entry failed verification; chunk is a miss", "key", h.hd.Key, "layer", layer, "err", err)
			return
		}
	case h.raw:
		ref := h.hd.Layers[layer]
		at := h.hd.PayloadStart + int(ref.Offset)
		src = h.f.Blob.Bytes()[at : at+int(ref.Length)]
	default:
		// DecodeRange checks the layer's checksum first.
		if cap(w.buf) < h.dec {
			w.buf = make([]byte, h.dec)
		}
		src = w.buf[:h.dec]
		if c.headHi-c.headLo != h.hd.Shape.KVHeads {
			if lb := h.hd.Shape.LayerBytes(); len(w.scratch) < lb {
				w.scratch = make([]byte, lb)
			}
		}
		rg := chunk.Range{LayerLo: layer, LayerHi: layer + 1, HeadLo: c.headLo, HeadHi: c.headHi}
		err := chunk.DecodeRange(src, h.f.Blob.Bytes(), &h.hd, rg, w.scratch)
		t1 := time.Now()
		r.times.decode.Add(int64(t1.Sub(t0)))
		t0 = t1
		if err != nil {
			h.fail(fmt.Errorf("%w: layer %d: %w", errVerify, layer, err))
			r.s.log.Warn("inject: entry failed to decode; chunk is a miss", "key", h.hd.Key, "layer", layer, "err", err)
			return
		}
		r.decoded.Add(int64(h.dec))
	}
	var err error
	if c.dev != nil {
		// Device memory (CUDA IPC): one nil layer names the cache's layer.
		r.job(&w.job, h, layer, src, w.dst[:])
		err = c.dev.Inject(r.ctx, &w.job, layer)
	} else {
		w.dst[0] = c.layers[layer]
		r.job(&w.job, h, layer, src, w.dst[:])
		err = w.inj.Inject(r.ctx, &w.job)
	}
	r.times.scatter.Add(int64(time.Since(t0)))
	w.job = cudakern.Job{}
	w.dst[0] = nil
	if err != nil && r.ctx.Err() == nil {
		// verify validated this job; only a bug gets here.
		r.s.log.Error("inject: cudakern refused a verified job", "key", h.hd.Key, "layer", layer, "err", err)
		h.fail(fmt.Errorf("inject: layer %d: %w", layer, err))
	}
}

// processDevice writes layer l of h, an entry lent in device memory, into
// the device cache: the kernel reads the layer where it lies (and decodes
// a codec payload in the same pass), so nothing crosses the bus.
func (r *request) processDevice(w *worker, layer int, h *hit) {
	t0 := time.Now()
	ref := h.hd.Layers[layer]
	src := h.f.Device.Ptr + uint64(h.hd.PayloadStart) + ref.Offset
	r.job(&w.job, h, layer, nil, w.dst[:])
	err := r.c.dev.InjectDevice(r.ctx, &w.job, layer, src, h.hd.Codec)
	r.times.scatter.Add(int64(time.Since(t0)))
	w.job = cudakern.Job{}
	switch {
	case err == nil:
		if !h.raw {
			r.decoded.Add(int64(h.dec))
		}
	case r.ctx.Err() != nil:
	case errors.Is(err, chunk.ErrCorrupt):
		// A payload sealed malformed by its writer, as DecodeRange finds
		// on the host.
		h.fail(fmt.Errorf("%w: layer %d: %w", errVerify, layer, err))
		r.s.log.Warn("inject: entry failed to decode on the device; chunk is a miss", "key", h.hd.Key, "layer", layer, "err", err)
	default:
		r.s.log.Error("inject: the device refused a verified job", "key", h.hd.Key, "layer", layer, "err", err)
		h.fail(fmt.Errorf("inject: layer %d: %w", layer, err))
	}
}
