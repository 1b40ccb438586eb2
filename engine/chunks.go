package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// LookupRequest asks for one chunk: Key names the content and the context
// the engine would like (its true prefix, which makes the entry EXACT);
// Tokens let the source verify the content.
type LookupRequest struct {
	Key    chunk.Key
	Tokens []uint32
}

// ChunkSource finds stored KV for chunks. For each request it returns the
// entry whose context equals the requested one if it holds it, else its best
// other encoding of the same content (which the engine treats as
// APPROXIMATE), else nil (MISS). The result has one element per request.
// The engine only reads the entries, and not after Run returns.
// An in-memory store implements it for tests; the cluster client in
// production.
type ChunkSource interface {
	Lookup(ctx context.Context, reqs []LookupRequest) ([]*chunk.Entry, error)
}

// ChunkSink stores encoded chunks.
type ChunkSink interface {
	Put(ctx context.Context, e *chunk.Entry) error
}

// ChunkStore is a source that can also be written, as the benchmark needs.
type ChunkStore interface {
	ChunkSource
	ChunkSink
}

// EncodeOptions place an encoding.
type EncodeOptions struct {
	// StartPos is the position of the first token of the encoding run (the
	// context, then the chunk). Pre-RoPE KV does not depend on it beyond
	// float32 rounding; tests use it to show that.
	StartPos int
}

// Encode runs [before, tokens] through the model and returns the chunk
// entry of tokens alone, keyed by the engine's fingerprint, the content ID of
// tokens and cx (which should describe before: WindowContext, or
// PrefixContext, or WindowOrPrefix). With nothing before, the entry is
// keyed standalone whatever cx says: one computation, one key
// (chunk.Canonical); a cx that names nothing before while before holds
// tokens is an error. K is taken before RoPE, after q/k norm.
func (e *Engine) Encode(ctx context.Context, before, tokens []uint32, cx chunk.Context, opt EncodeOptions) (*chunk.Entry, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("engine: encode of an empty chunk")
	}
	if !cx.Kind.Valid() {
		return nil, fmt.Errorf("engine: encode with context kind %v", cx.Kind)
	}
	if len(before) == 0 {
		cx = chunk.StandaloneContext()
	} else if chunk.Canonical(e.fp, cx).Kind == chunk.ContextStandalone {
		return nil, fmt.Errorf("engine: encode after %d tokens with context %v, which names nothing before the chunk", len(before), cx)
	}
	s, err := e.NewSequence(opt.StartPos)
	if err != nil {
		return nil, err
	}
	defer s.Release()
	c := &e.cfg
	kvPerTok := c.NumKVHeads * c.HeadDim
	capture := make([]float32, c.NumLayers*2*len(tokens)*kvPerTok)
	e.mu.Lock()
	all := append(append(make([]uint32, 0, len(before)+len(tokens)), before...), tokens...)
	if err := s.grow(all); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	active := e.sc.indices(0, len(all))
	_, err = e.forward(ctx, s, fwdPlan{active: active, capture: capture, capLo: len(before), capHi: len(all)})
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	ent := &chunk.Entry{
		Key:     chunk.Key{Fingerprint: e.fp, Content: chunk.ContentID(e.fp, tokens), Context: cx},
		DType:   e.spec.DType,
		Layers:  c.NumLayers,
		KVHeads: c.NumKVHeads,
		HeadDim: c.HeadDim,
		Tokens:  append([]uint32(nil), tokens...),
	}
	ent.KV = make([]byte, 0, len(capture)*e.spec.DType.Size())
	ent.KV = chunk.AppendRow(ent.KV, capture, e.spec.DType)
	return ent, nil
}

// EncodeStandalone encodes tokens alone.
func (e *Engine) EncodeStandalone(ctx context.Context, tokens []uint32) (*chunk.Entry, error) {
	return e.Encode(ctx, nil, tokens, chunk.StandaloneContext(), EncodeOptions{})
}

// EncodeWindow encodes tokens after the last w tokens of preceding, the
// segments of the prompt before them (InferScale's context-window
// encoding), keeping only the chunk's KV. A window that holds every token
// of preceding is the prefix encoding and is keyed so
// (chunk.WindowOrPrefix): EXACT for that prefix.
func (e *Engine) EncodeWindow(ctx context.Context, preceding [][]uint32, w int, tokens []uint32) (*chunk.Entry, error) {
	var all []uint32
	for _, p := range preceding {
		all = append(all, p...)
	}
	win := all[max(0, len(all)-max(w, 0)):]
	return e.Encode(ctx, win, tokens, chunk.WindowOrPrefix(e.fp, w, preceding), EncodeOptions{})
}

// EncodeAfterPrefix encodes tokens after the whole prefix, given as the
// segments of the prompt before it; the entry is EXACT for that prefix.
func (e *Engine) EncodeAfterPrefix(ctx context.Context, prefix [][]uint32, tokens []uint32) (*chunk.Entry, error) {
	_, end := chunk.PrefixChain(e.fp, prefix)
	var before []uint32
	for _, p := range prefix {
		before = append(before, p...)
	}
	return e.Encode(ctx, before, tokens, chunk.PrefixContext(end), EncodeOptions{})
}

// EncodePrompt prefills segments once and returns, for every chunk
// segment, its entry keyed by its true prefix (EXACT for this prompt), and
// nil for text segments. It is how a serving engine writes back what it
// computed, and costs one prefill however many chunks the prompt holds.
func (e *Engine) EncodePrompt(ctx context.Context, segs []Segment) ([]*chunk.Entry, error) {
	toks := make([][]uint32, len(segs))
	var all []uint32
	for i, sg := range segs {
		toks[i] = sg.Tokens
		all = append(all, sg.Tokens...)
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("engine: encode of an empty prompt")
	}
	contexts, _ := chunk.PrefixChain(e.fp, toks)
	c := &e.cfg
	kvPerTok := c.NumKVHeads * c.HeadDim
	n := len(all)
	capture := make([]float32, c.NumLayers*2*n*kvPerTok)
	s, err := e.NewSequence(0)
	if err != nil {
		return nil, err
	}
	defer s.Release()
	e.mu.Lock()
	if err := s.grow(all); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	_, err = e.forward(ctx, s, fwdPlan{active: e.sc.indices(0, n), capture: capture, capLo: 0, capHi: n})
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]*chunk.Entry, len(segs))
	lo := 0
	for i, sg := range segs {
		m := len(sg.Tokens)
		if sg.Chunk && m > 0 {
			// Slice the segment's rows out of every layer's K and V.
			kv := make([]float32, 0, c.NumLayers*2*m*kvPerTok)
			for l := 0; l < c.NumLayers; l++ {
				for half := 0; half < 2; half++ {
					base := (l*2+half)*n*kvPerTok + lo*kvPerTok
					kv = append(kv, capture[base:base+m*kvPerTok]...)
				}
			}
			ent := &chunk.Entry{
				Key:     chunk.Key{Fingerprint: e.fp, Content: chunk.ContentID(e.fp, sg.Tokens), Context: contexts[i]},
				DType:   e.spec.DType,
				Layers:  c.NumLayers,
				KVHeads: c.NumKVHeads,
				HeadDim: c.HeadDim,
				Tokens:  append([]uint32(nil), sg.Tokens...),
			}
			ent.KV = chunk.AppendRow(make([]byte, 0, len(kv)*e.spec.DType.Size()), kv, e.spec.DType)
			out[i] = ent
		}
		lo += m
	}
	return out, nil
}

// Segment is a piece of a prompt: a chunk that may be found in the store,
// or plain text (a query, an instruction) that is always prefilled.
type Segment struct {
	Tokens []uint32
	Chunk  bool
}

// Request is one prompt to run through the injection path.
type Request struct {
	// StartPos is the position of the prompt's first token.
	StartPos int
	Segments []Segment
	// Recompute is CacheBlend's ratio r in [0, 1]: the fraction of the
	// APPROXIMATE chunks' tokens recomputed after the check layer. 0 injects
	// them as they are; 1 recomputes everything (equal to prefill).
	Recompute float64
	// CheckLayer is the layer whose key deviation ranks tokens. 0 means 1
	// (CacheBlend's default); it is clamped to the last layer.
	CheckLayer int
	// Select is how the recomputed tokens are chosen at the check layer;
	// the zero value is SelectDeviation (CacheBlend's).
	Select Selection
	// FallbackBound is the guardrail. When > 0, every APPROXIMATE chunk's
	// key deviation at the check layer is measured (ChunkResult.Deviation),
	// and a chunk whose deviation exceeds the bound is recomputed whole, in
	// addition to the r fraction the selection picks among the other
	// chunks' tokens. 0 (the default) turns it off. With a bound and r = 0
	// the approximate tokens are still computed up to the check layer, to
	// be measured.
	FallbackBound float64
	// Keep returns the sequence in the response for decoding; otherwise it
	// is released.
	Keep bool
}

// ChunkResult reports one chunk segment.
type ChunkResult struct {
	Segment int
	Match   chunk.Match
	Context chunk.Context // of the entry used (zero on a miss)
	// Deviation is the chunk's relative key deviation at the check layer,
	// sqrt(Σ|k_fresh − k_stored|² / Σ|k_fresh|²) over its tokens and KV
	// heads: 0 for an exact copy, about 1.4 for unrelated keys of the same
	// size. It is measured for APPROXIMATE chunks under recomputation or a
	// fallback bound, and 0 otherwise.
	Deviation float64
	// Fallback: the chunk's deviation exceeded Request.FallbackBound and
	// all its tokens were recomputed.
	Fallback bool
}

// Response is the result of Run.
type Response struct {
	Logits []float32 // next-token logits after the prompt
	Chunks []ChunkResult
	// TokenLayers is the number of (token, layer) pairs the forward pass
	// computed; a full prefill computes Tokens × Layers.
	TokenLayers int
	Tokens      int // prompt length
	Injected    int // tokens whose KV came from the source
	Recomputed  int // approximate tokens kept after the check layer
	Fallbacks   int // chunks recomputed whole by the fallback bound
	Lookup      time.Duration
	Inject      time.Duration
	Compute     time.Duration
	// Seq is the sequence when Request.Keep was set; the caller releases it.
	Seq *Sequence
}

// CacheInjector fills the engine's paged KV cache itself: node-side
// injection, where the node that holds the chunks
// fetches, decodes, rotates and scatters them into cache memory the engine
// registered with it (see CacheMemory). For each chunk it writes post-RoPE K
// and V into exactly the given slots and answers EXACT, APPROXIMATE or MISS;
// it returns one result per chunk. It may write nothing else, and only
// during the call, which runs with the engine locked (it must not call the
// engine). A chunk it reports as MISS, or a call that fails, is
// prefilled, which overwrites whatever was written to its slots.
type CacheInjector interface {
	InjectChunks(ctx context.Context, chunks []pagedkv.InjectChunk) ([]pagedkv.InjectResult, error)
}

// LayeredInjector is a CacheInjector that also announces, before writing
// anything, what it expects to answer (its plan) and then each layer as it
// lands in the cache, so that RunInjected can run layer l of its forward
// pass as soon as layer l of every hit is written, instead of waiting for
// the whole injection.
type LayeredInjector interface {
	CacheInjector
	// InjectPlanned is InjectChunks that calls plan at most once, before
	// anything is written, with one expected result per chunk, then
	// layer(l) in layer order once layer l of every planned hit is written.
	// Both run on InjectPlanned's goroutine and must return promptly. The
	// returned results are final: a planned hit may come back MISS (its
	// entry failed at a later layer; some of its layers were written). An
	// injector that cannot plan (an older node) calls neither.
	InjectPlanned(ctx context.Context, chunks []pagedkv.InjectChunk, plan func([]pagedkv.InjectResult), layer func(int)) ([]pagedkv.InjectResult, error)
}

// CacheMemory exposes the cache for registration with a CacheInjector: the
// layout of every layer and the layers' bytes (little-endian float32 in
// that layout). The memory lives as long as the engine.
func (e *Engine) CacheMemory() (pagedkv.CacheLayout, [][]byte) { return e.layout, e.cacheBytes }

// Run looks up every chunk segment of req in src (nil: prefill everything,
// which is prompt injection), injects the hits through cudakern's fused
// rotate-and-scatter at their positions in the prompt, and prefills the rest
// (misses and text), repairing APPROXIMATE chunks by deviation-guided
// recomputation when req.Recompute > 0.
func (e *Engine) Run(ctx context.Context, src ChunkSource, req Request) (*Response, error) {
	return e.run(ctx, src, nil, req)
}

// RunInjected is Run with the chunks placed by inj (which writes the cache
// itself) instead of looked up and injected by the engine. The time inj
// takes is reported as Inject.
func (e *Engine) RunInjected(ctx context.Context, inj CacheInjector, req Request) (*Response, error) {
	if inj == nil {
		return nil, fmt.Errorf("engine: nil injector")
	}
	return e.run(ctx, nil, inj, req)
}

func (e *Engine) run(ctx context.Context, src ChunkSource, inj CacheInjector, req Request) (*Response, error) {
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	resp := &Response{}
	var all []uint32
	starts := make([]int, len(req.Segments))
	toks := make([][]uint32, len(req.Segments))
	for i, sg := range req.Segments {
		starts[i] = len(all)
		toks[i] = sg.Tokens
		all = append(all, sg.Tokens...)
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("engine: empty prompt")
	}
	resp.Tokens = len(all)
	// cached[i]: 0 compute, 1 exact, 2 approximate.
	state := make([]chunk.Match, len(all))
	var entries []*chunk.Entry
	var segOf []int
	if src != nil {
		t0 := time.Now()
		contexts, _ := chunk.PrefixChain(e.fp, toks)
		var reqs []LookupRequest
		for i, sg := range req.Segments {
			if !sg.Chunk || len(sg.Tokens) == 0 {
				continue
			}
			reqs = append(reqs, LookupRequest{Key: chunk.Key{Fingerprint: e.fp, Content: chunk.ContentID(e.fp, sg.Tokens), Context: contexts[i]}, Tokens: sg.Tokens})
			segOf = append(segOf, i)
		}
		if len(reqs) > 0 {
			var err error
			entries, err = src.Lookup(ctx, reqs)
			if err != nil {
				// Graceful fallback: a store that is down means prefill.
				e.log.Warn("engine: chunk lookup failed; prefilling", "err", err)
				entries = nil
			} else if len(entries) != len(reqs) {
				e.log.Warn("engine: chunk source returned the wrong count; prefilling", "want", len(reqs), "got", len(entries))
				entries = nil
			}
			for j := range entries {
				if ent := entries[j]; ent != nil {
					if err := e.fits(ent, reqs[j]); err != nil {
						e.log.Warn("engine: unusable chunk entry", "key", reqs[j].Key, "err", err)
						entries[j] = nil
					}
				}
			}
			for j, i := range segOf {
				r := ChunkResult{Segment: i}
				if entries != nil && entries[j] != nil {
					r.Context = entries[j].Key.Context
					// Another key of the same computation is the same
					// tensors: EXACT, and nothing is recomputed.
					r.Match = chunk.MatchOf(reqs[j].Key.Context, chunk.Canonical(e.fp, r.Context))
				}
				resp.Chunks = append(resp.Chunks, r)
			}
		}
		resp.Lookup = time.Since(t0)
	}
	s, err := e.NewSequence(req.StartPos)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			s.Release()
		}
	}()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := s.grow(all); err != nil {
		return nil, err
	}
	t1 := time.Now()
	if li, ok := inj.(LayeredInjector); ok {
		if err := e.runLayered(ctx, li, req, starts, s, state, resp, t1); err != nil {
			return nil, err
		}
	} else {
		if inj != nil {
			e.injectRemote(ctx, inj, req, starts, s, state, resp)
		} else if err := e.injectLocal(ctx, req, starts, s, state, entries, resp); err != nil {
			return nil, err
		}
		resp.Inject = time.Since(t1)
		if err := e.compute(ctx, s, req, state, resp, nil); err != nil {
			return nil, err
		}
	}
	if req.Keep {
		keep = true
		resp.Seq = s
	}
	return resp, nil
}

// compute runs the forward pass over the tokens state leaves to compute
// (misses, text, approximate tokens under recomputation) and fills resp's
// logits, work and Compute time. wait, if not nil, is called before layer
// l reads the cache (see fwdPlan.wait). Called with e.mu held.
func (e *Engine) compute(ctx context.Context, s *Sequence, req Request, state []chunk.Match, resp *Response, wait func(int) error) error {
	t2 := time.Now()
	// The last token's hidden state gives the logits, so it is always
	// computed (vLLM's connector reports one token fewer for the same reason).
	state[len(state)-1] = chunk.MatchMiss
	plan := fwdPlan{logits: make([]float32, e.cfg.VocabSize), wait: wait}
	var nApprox int
	for t, m := range state {
		if m == chunk.MatchExact || (m == chunk.MatchApproximate && !req.repairs()) {
			continue
		}
		plan.active = append(plan.active, t)
		if m == chunk.MatchApproximate {
			nApprox++
		}
	}
	if nApprox > 0 {
		// group[t] is the index in resp.Chunks of the chunk token t belongs to.
		group := make([]int, len(state))
		for t := range group {
			group[t] = -1
		}
		starts := segmentStarts(req.Segments)
		for j, cr := range resp.Chunks {
			lo := starts[cr.Segment]
			for t := lo; t < lo+len(req.Segments[cr.Segment].Tokens) && t < len(state); t++ {
				group[t] = j
			}
		}
		plan.approx = make([]bool, len(plan.active))
		plan.group = make([]int, len(plan.active))
		for r, t := range plan.active {
			plan.approx[r] = state[t] == chunk.MatchApproximate
			plan.group[r] = group[t]
		}
		plan.groups = len(resp.Chunks)
		plan.check = req.CheckLayer
		if plan.check <= 0 {
			plan.check = 1
		}
		plan.check = min(plan.check, e.cfg.NumLayers-1)
		plan.keep = int(math.Ceil(req.Recompute * float64(nApprox)))
		plan.sel, plan.bound = req.Select, req.FallbackBound
	}
	st, err := e.forward(ctx, s, plan)
	if err != nil {
		return err
	}
	resp.Compute = time.Since(t2)
	resp.Logits = plan.logits
	resp.TokenLayers = st.tokenLayers
	resp.Recomputed = st.selected
	for j, d := range st.deviation {
		resp.Chunks[j].Deviation = d
		if st.fallback[j] {
			resp.Chunks[j].Fallback = true
			resp.Fallbacks++
		}
	}
	return nil
}

// repairs reports whether APPROXIMATE tokens are computed up to the check
// layer: to be recomputed, or to be measured against the fallback bound.
func (r *Request) repairs() bool { return r.Recompute > 0 || r.FallbackBound > 0 }

// segmentStarts is the index of each segment's first token in the prompt.
func segmentStarts(segs []Segment) []int {
	starts := make([]int, len(segs))
	n := 0
	for i, sg := range segs {
		starts[i] = n
		n += len(sg.Tokens)
	}
	return starts
}

// injectLocal writes the looked-up entries through cudakern and records
// what it placed. Called with e.mu held and the sequence grown.
func (e *Engine) injectLocal(ctx context.Context, req Request, starts []int, s *Sequence, state []chunk.Match, entries []*chunk.Entry, resp *Response) error {
	for j, cr := range resp.Chunks {
		if cr.Match == chunk.MatchMiss {
			continue
		}
		i := cr.Segment
		ent := entries[j]
		lo, n := starts[i], len(req.Segments[i].Tokens)
		job := cudakern.Job{Rope: e.rope, Src: ent.KV, SrcDType: ent.DType, Tokens: n, SrcHeads: ent.KVHeads,
			Pos: req.StartPos + lo, Slots: s.slots[lo : lo+n], Layout: e.layout, Dst: e.cacheBytes}
		if err := e.inj.Inject(ctx, &job); err != nil {
			if ctx.Err() != nil {
				return err
			}
			e.log.Warn("engine: inject failed; prefilling the chunk", "segment", i, "err", err)
			resp.Chunks[j].Match = chunk.MatchMiss
			continue
		}
		for t := lo; t < lo+n; t++ {
			state[t] = cr.Match
		}
		resp.Injected += n
	}
	return nil
}

// injectRemote asks inj to place every chunk segment and records what it
// placed. Called with e.mu held and the sequence grown.
func (e *Engine) injectRemote(ctx context.Context, inj CacheInjector, req Request, starts []int, s *Sequence, state []chunk.Match, resp *Response) {
	chunks, segOf := e.injectChunks(req, starts, s)
	if len(chunks) == 0 {
		return
	}
	res, err := inj.InjectChunks(ctx, chunks)
	e.place(req, starts, segOf, state, resp, res, err)
}

// injectChunks are the chunk segments of req as a CacheInjector's
// requests, and the segment of each.
func (e *Engine) injectChunks(req Request, starts []int, s *Sequence) ([]pagedkv.InjectChunk, []int) {
	toks := make([][]uint32, len(req.Segments))
	for i, sg := range req.Segments {
		toks[i] = sg.Tokens
	}
	contexts, _ := chunk.PrefixChain(e.fp, toks)
	var chunks []pagedkv.InjectChunk
	var segOf []int
	for i, sg := range req.Segments {
		if !sg.Chunk || len(sg.Tokens) == 0 {
			continue
		}
		lo, n := starts[i], len(sg.Tokens)
		chunks = append(chunks, pagedkv.InjectChunk{
			Key:    chunk.Key{Fingerprint: e.fp, Content: chunk.ContentID(e.fp, sg.Tokens), Context: contexts[i]},
			Tokens: sg.Tokens, Pos: req.StartPos + lo, Slots: s.slots[lo : lo+n],
		})
		segOf = append(segOf, i)
	}
	return chunks, segOf
}

// place records an injector's answers (res for the chunks of segments
// segOf, or err) in state and resp; a failed call places nothing.
func (e *Engine) place(req Request, starts, segOf []int, state []chunk.Match, resp *Response, res []pagedkv.InjectResult, err error) {
	if err == nil && len(res) != len(segOf) {
		err = fmt.Errorf("%d results for %d chunks", len(res), len(segOf))
	}
	if err != nil {
		e.log.Warn("engine: injector failed; prefilling", "err", err)
		res = nil
	}
	for j, i := range segOf {
		r := ChunkResult{Segment: i}
		if res != nil && (res[j].Match == chunk.MatchExact || res[j].Match == chunk.MatchApproximate) {
			r.Match, r.Context = res[j].Match, res[j].Context
			lo, n := starts[i], len(req.Segments[i].Tokens)
			for t := lo; t < lo+n; t++ {
				state[t] = r.Match
			}
			resp.Injected += n
		}
		resp.Chunks = append(resp.Chunks, r)
	}
}

// fits checks that an entry can be injected for a request.
func (e *Engine) fits(ent *chunk.Entry, r LookupRequest) error {
	c := &e.cfg
	switch {
	case ent.Key.Fingerprint != e.fp:
		return fmt.Errorf("fingerprint %v, engine has %v", ent.Key.Fingerprint, e.fp)
	case ent.Key.Content != r.Key.Content:
		return fmt.Errorf("content %v, asked for %v", ent.Key.Content, r.Key.Content)
	case ent.Layers != c.NumLayers || ent.KVHeads != c.NumKVHeads || ent.HeadDim != c.HeadDim:
		return fmt.Errorf("shape %d layers × %d heads × %d dims, model has %d × %d × %d",
			ent.Layers, ent.KVHeads, ent.HeadDim, c.NumLayers, c.NumKVHeads, c.HeadDim)
	case len(ent.Tokens) != len(r.Tokens):
		return fmt.Errorf("%d tokens, chunk has %d", len(ent.Tokens), len(r.Tokens))
	case len(ent.KV) != ent.Shape().RawBytes():
		return fmt.Errorf("%d KV bytes, shape needs %d", len(ent.KV), ent.Shape().RawBytes())
	}
	for i, t := range ent.Tokens {
		if t != r.Tokens[i] {
			return fmt.Errorf("token %d is %d, chunk has %d", i, t, r.Tokens[i])
		}
	}
	return nil
}

// EntryF32 widens an entry's KV to float32 (canonical layout).
func EntryF32(ent *chunk.Entry) ([]float32, error) {
	n := ent.Shape().RawBytes() / max(1, ent.DType.Size())
	if ent.DType != chunk.F32 && ent.DType != chunk.F16 && ent.DType != chunk.BF16 {
		return nil, fmt.Errorf("%w: entry dtype %v", ErrUnsupported, ent.DType)
	}
	if len(ent.KV) != n*ent.DType.Size() {
		return nil, errors.New("engine: entry KV size does not match its shape")
	}
	out := make([]float32, n)
	chunk.WidenRow(out, ent.KV, ent.DType)
	return out, nil
}
