package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	// Injector places the requests' chunks (node-side injection); nil
	// prefills every token (prompt injection).
	Injector CacheInjector
	// MaxInjecting bounds the requests whose chunks are being injected at
	// once; 0 means no bound. The node shares its workers among the
	// injections in flight, so each of many finishes late; a bound lets
	// the first ones finish and compute while the rest wait their turn.
	MaxInjecting int
	// MaxBatchTokens bounds the prefill tokens one forward pass takes
	// (decode steps join every pass); 0 means 1024. A request longer than
	// it runs in a pass of its own.
	MaxBatchTokens int
}

// Scheduler serves many requests at once on the engine's one worker pool
// (continuous batching): each forward pass takes the next token of every
// request that is decoding and the computed tokens of requests whose
// injection is done, so the matmuls read each weight once for all of them.
// Injection runs on the requesting goroutine, outside the engine's lock,
// while other requests compute. A request that recomputes APPROXIMATE
// tokens has its prefill pass alone (the selection is per request), then
// decodes in the batch. Every token's result has the bits a request served
// alone gets (forwardSeqs). It is safe for concurrent use; Close it.
type Scheduler struct {
	e   *Engine
	cfg SchedulerConfig

	in        chan *job
	stop      chan struct{}
	injecting chan struct{} // a slot per injection in flight (nil: no bound)
	// freed is closed (and replaced) whenever a request leaves, for
	// requests waiting for cache slots.
	mu    sync.Mutex
	freed chan struct{}
	live  int // requests holding slots
	done  chan struct{}
	once  sync.Once
}

// Served is one request's outcome through the Scheduler.
type Served struct {
	// Response is the prefill's (Logits: the first token's; Seq nil).
	*Response
	// Generated are the greedily decoded tokens.
	Generated []uint32
	// TTFT is from Serve's call to the first token's logits; Total to the
	// last generated token's.
	TTFT, Total time.Duration
}

// job is one request in the scheduler.
type job struct {
	ctx      context.Context
	t0       time.Time
	req      Request
	generate int
	s        *Sequence
	state    []chunk.Match
	resp     *Response
	solo     bool // prefill alone: it recomputes APPROXIMATE tokens
	prefill  bool // its prefill has not run yet
	out      []uint32
	logits   []float32
	res      *Served
	err      error
	finished chan struct{}
}

// NewScheduler starts a scheduler on e.
func NewScheduler(e *Engine, cfg SchedulerConfig) *Scheduler {
	if cfg.MaxBatchTokens <= 0 {
		cfg.MaxBatchTokens = 1024
	}
	s := &Scheduler{e: e, cfg: cfg, in: make(chan *job), stop: make(chan struct{}), done: make(chan struct{}), freed: make(chan struct{})}
	if cfg.MaxInjecting > 0 {
		s.injecting = make(chan struct{}, cfg.MaxInjecting)
	}
	go s.loop()
	return s
}

// Close stops the scheduler; requests in it fail with ErrClosed.
func (s *Scheduler) Close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// Serve runs req (its chunks injected by the configured Injector) and
// greedily decodes generate tokens (at least 1) after it.
func (s *Scheduler) Serve(ctx context.Context, req Request, generate int) (*Served, error) {
	if generate < 1 {
		return nil, fmt.Errorf("engine: generate %d tokens: at least 1", generate)
	}
	j := &job{ctx: ctx, t0: time.Now(), req: req, generate: generate, prefill: true, finished: make(chan struct{})}
	if err := s.prepare(j); err != nil {
		return nil, err
	}
	select {
	case s.in <- j:
	case <-ctx.Done():
		s.release(j.s)
		return nil, ctx.Err()
	case <-s.stop:
		s.release(j.s)
		return nil, ErrClosed
	}
	<-j.finished
	return j.res, j.err
}

// prepare reserves the request's sequence and injects its chunks, on the
// caller's goroutine: the injector writes only this sequence's slots, which
// no other pass reads, so the engine's lock is held only to reserve them.
func (s *Scheduler) prepare(j *job) error {
	e, req := s.e, j.req
	if err := checkRequest(req); err != nil {
		return err
	}
	var all []uint32
	starts := segmentStarts(req.Segments)
	for _, sg := range req.Segments {
		all = append(all, sg.Tokens...)
	}
	if len(all) == 0 {
		return fmt.Errorf("engine: empty prompt")
	}
	seq, err := e.NewSequence(req.StartPos)
	if err != nil {
		return err
	}
	if err := s.reserve(j.ctx, seq, all, len(all)+j.generate-1); err != nil {
		seq.Release()
		return err
	}
	j.s, j.state, j.resp = seq, make([]chunk.Match, len(all)), &Response{Tokens: len(all)}
	if s.cfg.Injector != nil {
		if s.injecting != nil {
			select {
			case s.injecting <- struct{}{}:
			case <-j.ctx.Done():
				s.release(seq)
				return j.ctx.Err()
			}
		}
		t1 := time.Now()
		e.injectRemote(j.ctx, s.cfg.Injector, req, starts, seq, j.state, j.resp)
		j.resp.Inject = time.Since(t1)
		if s.injecting != nil {
			<-s.injecting
		}
		if err := j.ctx.Err(); err != nil {
			s.release(seq)
			return err
		}
	}
	j.solo = req.repairs() && slices.Contains(j.state, chunk.MatchApproximate)
	return nil
}

// reserve grows seq by tokens, with blocks for total tokens (what it will
// decode into), waiting while the cache is full and other requests hold
// slots (they free them as they finish): admission control, so load past
// saturation queues instead of failing.
func (s *Scheduler) reserve(ctx context.Context, seq *Sequence, tokens []uint32, total int) error {
	for {
		s.mu.Lock()
		freed, live := s.freed, s.live
		s.e.mu.Lock()
		err := seq.reserve(total)
		if err == nil {
			err = seq.grow(tokens)
		}
		s.e.mu.Unlock()
		if err == nil {
			s.live++
		}
		s.mu.Unlock()
		if !errors.Is(err, ErrCacheFull) || live == 0 {
			return err
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return ErrClosed
		}
	}
}

// checkRequest validates a request's parameters.
func checkRequest(req Request) error {
	switch {
	case req.Recompute < 0 || req.Recompute > 1 || math.IsNaN(req.Recompute):
		return fmt.Errorf("engine: recompute ratio %v outside [0, 1]", req.Recompute)
	case req.FallbackBound < 0 || math.IsNaN(req.FallbackBound):
		return fmt.Errorf("engine: fallback bound %v is negative", req.FallbackBound)
	case !req.Select.valid():
		return fmt.Errorf("engine: unknown selection %v", req.Select)
	}
	return nil
}

// active is the job's prefill rows: the tokens its state leaves to compute
// (the last one always).
func (j *job) active() []int {
	j.state[len(j.state)-1] = chunk.MatchMiss
	var out []int
	for t, m := range j.state {
		if m != chunk.MatchExact && m != chunk.MatchApproximate {
			out = append(out, t)
		}
	}
	return out
}

func (s *Scheduler) loop() {
	defer close(s.done)
	var waiting, running []*job
	for {
		if len(waiting) == 0 && len(running) == 0 {
			select {
			case j := <-s.in:
				waiting = append(waiting, j)
			case <-s.stop:
				return
			}
		}
	drain:
		for {
			select {
			case j := <-s.in:
				waiting = append(waiting, j)
			case <-s.stop:
				for _, j := range append(waiting, running...) {
					s.finish(j, ErrClosed)
				}
				return
			default:
				break drain
			}
		}
		// Requests whose caller gave up leave before their next pass.
		waiting = slices.DeleteFunc(waiting, s.cancelled)
		running = slices.DeleteFunc(running, s.cancelled)
		// A recomputing request's prefill runs alone, one per pass of the
		// others, so neither starves the other.
		batch := slices.Clone(running)
		if i := slices.IndexFunc(waiting, func(j *job) bool { return j.solo }); i >= 0 {
			j := waiting[i]
			waiting = slices.Delete(waiting, i, i+1)
			if s.soloPrefill(j) {
				batch = append(batch, j)
			}
		}
		tokens := 0
		n := 0
		for _, j := range waiting {
			if j.solo {
				break // its turn comes after this pass
			}
			m := len(j.active())
			if n > 0 && tokens+m > s.cfg.MaxBatchTokens {
				break
			}
			tokens += m
			n++
			batch = append(batch, j)
		}
		waiting = slices.Delete(waiting, 0, n)
		running = s.pass(batch)
	}
}

// cancelled finishes a job whose context ended.
func (s *Scheduler) cancelled(j *job) bool {
	if err := j.ctx.Err(); err != nil {
		s.finish(j, err)
		return true
	}
	return false
}

// soloPrefill runs a recomputing request's prefill through compute (its
// own pass, with selection); it reports whether the job goes on decoding.
func (s *Scheduler) soloPrefill(j *job) bool {
	e := s.e
	e.mu.Lock()
	err := e.compute(j.ctx, j.s, j.req, j.state, j.resp, nil)
	e.mu.Unlock()
	if err != nil {
		s.finish(j, err)
		return false
	}
	j.prefill = false
	return s.token(j, j.resp.Logits)
}

// pass runs one forward pass over batch (prefills and decode steps) and
// returns the jobs still decoding.
func (s *Scheduler) pass(batch []*job) []*job {
	if len(batch) == 0 {
		return nil
	}
	e := s.e
	seqs := make([]fwdSeq, len(batch))
	e.mu.Lock()
	for i, j := range batch {
		var active []int
		if j.prefill {
			active = j.active()
		} else {
			if err := j.s.grow(j.out[len(j.out)-1:]); err != nil {
				e.mu.Unlock()
				return s.failAll(batch, err)
			}
			active = []int{j.s.Len() - 1}
		}
		if cap(j.logits) < e.cfg.VocabSize {
			j.logits = make([]float32, e.cfg.VocabSize)
		}
		seqs[i] = fwdSeq{s: j.s, active: active, logits: j.logits[:e.cfg.VocabSize]}
	}
	t0 := time.Now()
	_, err := e.forwardSeqs(context.Background(), seqs, fwdPlan{})
	e.mu.Unlock()
	if err != nil {
		return s.failAll(batch, err)
	}
	var next []*job
	for i, j := range batch {
		if j.prefill {
			j.prefill = false
			j.resp.Compute = time.Since(t0)
			j.resp.TokenLayers = len(seqs[i].active) * e.cfg.NumLayers
			j.resp.Logits = slices.Clone(seqs[i].logits)
		}
		if s.token(j, seqs[i].logits) {
			next = append(next, j)
		}
	}
	return next
}

// token takes the next greedy token from logits; it reports whether the
// job goes on decoding, and finishes it otherwise.
func (s *Scheduler) token(j *job, logits []float32) bool {
	if len(j.out) == 0 {
		j.res = &Served{Response: j.resp, TTFT: time.Since(j.t0)}
	}
	j.out = append(j.out, uint32(Argmax(logits)))
	if len(j.out) < j.generate {
		return true
	}
	s.finish(j, nil)
	return false
}

func (s *Scheduler) failAll(batch []*job, err error) []*job {
	for _, j := range batch {
		s.finish(j, err)
	}
	return nil
}

// finish releases the job's sequence and answers its caller.
func (s *Scheduler) finish(j *job, err error) {
	s.release(j.s)
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("engine: scheduled request: %w", err)
		}
		j.res, j.err = nil, err
	} else {
		j.res.Generated = j.out
		j.res.Total = time.Since(j.t0)
	}
	close(j.finished)
}

// release returns a request's slots and wakes the requests waiting for
// them.
func (s *Scheduler) release(seq *Sequence) {
	seq.Release()
	s.mu.Lock()
	s.live--
	close(s.freed)
	s.freed = make(chan struct{})
	s.mu.Unlock()
}
