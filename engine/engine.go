package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// ErrClosed is returned by an Engine (or its Sequences) after Close.
var ErrClosed = errors.New("engine: closed")

// Config configures an Engine. The zero value is usable.
type Config struct {
	// Workers is the number of goroutines a forward pass is split over, the
	// caller included. 0 means runtime.GOMAXPROCS(0).
	Workers int
	// CacheTokens is the capacity of the paged KV cache in tokens, over all
	// sequences. 0 means 8192.
	CacheTokens int
	// BlockSize is the number of slots per cache block. 0 means 16 (vLLM's
	// CUDA default).
	BlockSize int
	// CacheOrder is the physical axis order of a cache layer: pagedkv.NHD
	// (vLLM FlashAttention's, the default) or any other pagedkv.Order.
	CacheOrder pagedkv.Order
	// MaxPositions sizes the RoPE table: injection needs target positions
	// below it (the forward pass rotates positions beyond it on the fly).
	// 0 means max(max_position_embeddings, 8192), at most 32768.
	MaxPositions int
	// KVDType is the dtype of the chunk entries the engine produces: F32
	// (the default, exact), BF16 or F16.
	KVDType chunk.DType
	// TokenizerID goes into the model spec (and so into every chunk key).
	TokenizerID string
	// PureGo disables the assembly matmul kernels (for comparison; results
	// differ from the kernels' only by float32 summation order).
	PureGo bool
	// CacheMemory, if set, allocates the paged KV cache: it gets the
	// number of layers and the layout of every layer and returns one slice
	// per layer, each layout.LayerBytes() long, 4-byte aligned, not
	// overlapping. Use it to place the cache in shared memory a node can
	// map (inject.CreateShm's Layers), so the node writes injected chunks
	// straight into it. The memory must outlive the engine; the caller
	// frees it after Close. Nil means the Go heap.
	CacheMemory func(layers int, layout pagedkv.CacheLayout) ([][]byte, error)
	// GPU, when set, runs the engine's own injections (chunks it looks up
	// itself) on device GPUDevice when it answers, with the CPU
	// Injector's bits (cudakern.NewKernel); the cache stays in host
	// memory. Nil: the CPU Injector.
	GPU       cudakern.GPU
	GPUDevice int
	// Logger receives warnings (entries that do not fit the model); nil
	// means slog.Default().
	Logger *slog.Logger
}

// cacheLayer is one layer of the paged KV cache, as float32 for the forward
// pass and as the bytes cudakern reads and writes (the same memory).
type cacheLayer struct {
	f []float32
	b []byte
}

// Engine runs one model on the CPU. It is safe for concurrent use; forward
// passes and cache allocation are serialized on one mutex.
type Engine struct {
	w      *Weights
	cfg    ModelConfig
	spec   chunk.ModelSpec
	fp     chunk.Fingerprint
	rope   *cudakern.RopeTable
	inj    cudakern.Kernel
	pool   *pool
	layout pagedkv.CacheLayout
	log    *slog.Logger
	// attnAVX: attention uses the assembly kernels (they take int32 float
	// offsets into a layer, so a layer must hold fewer than 2^31 floats).
	attnAVX bool

	mu     sync.Mutex // guards the fields below and serializes forward passes
	closed bool
	cache  []cacheLayer
	// cacheBytes lists the layers' bytes, the Dst of a cudakern.Job.
	cacheBytes [][]byte
	free       []int // free block IDs, used as a stack
	sc         scratch
}

// New builds an engine for w. Close it to stop its workers.
func New(w *Weights, cfg Config) (*Engine, error) {
	mc := w.Config
	if err := checkModel(mc); err != nil {
		return nil, err
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.CacheTokens <= 0 {
		cfg.CacheTokens = 8192
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	if cfg.MaxPositions <= 0 {
		cfg.MaxPositions = min(max(mc.MaxPositionEmbeddings, 8192), 32768)
	}
	if cfg.CacheOrder == 0 {
		cfg.CacheOrder = pagedkv.NHD
	}
	if cfg.KVDType == chunk.DTypeInvalid {
		cfg.KVDType = chunk.F32
	}
	if cfg.KVDType != chunk.F32 && cfg.KVDType != chunk.F16 && cfg.KVDType != chunk.BF16 {
		return nil, fmt.Errorf("%w: kv dtype %v", ErrUnsupported, cfg.KVDType)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	spec := mc.Spec(cfg.KVDType)
	spec.WeightsRevision = w.Revision
	spec.TokenizerID = cfg.TokenizerID
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidModel, err)
	}
	rope, err := cudakern.NewRopeTable(spec, cfg.MaxPositions)
	if err != nil {
		return nil, fmt.Errorf("engine: rope table: %w", err)
	}
	nb := (cfg.CacheTokens + cfg.BlockSize - 1) / cfg.BlockSize
	// The engine computes in float32 and reads the cache as float32, so the
	// cache dtype is F32 whatever KVDType the chunks use.
	layout := pagedkv.CacheLayout{Order: cfg.CacheOrder, NumBlocks: nb, BlockSize: cfg.BlockSize,
		KVHeads: mc.NumKVHeads, HeadDim: mc.HeadDim, DType: chunk.F32}
	if err := layout.Validate(); err != nil {
		return nil, fmt.Errorf("engine: cache layout: %w", err)
	}
	inj, kernel, _ := cudakern.NewKernel(cfg.GPU, cfg.GPUDevice, cudakern.Config{Workers: cfg.Workers})
	if cfg.GPU != nil {
		cfg.Logger.Info("engine injection kernel", "kernel", kernel)
	}
	e := &Engine{
		w: w, cfg: mc, spec: spec, fp: spec.Fingerprint(), rope: rope, layout: layout, log: cfg.Logger,
		inj:  inj,
		pool: newPool(cfg.Workers, !cfg.PureGo),
	}
	e.attnAVX = e.pool.avx && mc.HeadDim%8 == 0 && layout.LayerBytes()/4 < math.MaxInt32
	e.cache = make([]cacheLayer, mc.NumLayers)
	var ext [][]byte
	if cfg.CacheMemory != nil {
		if ext, err = cfg.CacheMemory(mc.NumLayers, layout); err != nil {
			e.Close()
			return nil, fmt.Errorf("engine: cache memory: %w", err)
		}
		if err := checkCacheMemory(ext, mc.NumLayers, layout.LayerBytes()); err != nil {
			e.Close()
			return nil, err
		}
	}
	for l := range e.cache {
		var f []float32
		if ext != nil {
			f = bytesF32(ext[l])
			clear(f) // a reused file may hold an earlier engine's cache
		} else {
			f = make([]float32, layout.LayerBytes()/4)
		}
		e.cache[l] = cacheLayer{f: f, b: f32Bytes(f)}
		e.cacheBytes = append(e.cacheBytes, e.cache[l].b)
	}
	e.free = make([]int, nb)
	for i := range e.free {
		e.free[i] = nb - 1 - i // pop gives block 0 first
	}
	return e, nil
}

// checkCacheMemory validates what Config.CacheMemory returned.
func checkCacheMemory(layers [][]byte, n, layerBytes int) error {
	if len(layers) != n {
		return fmt.Errorf("engine: cache memory: %d layer slices for %d layers", len(layers), n)
	}
	type span struct{ lo, hi uintptr }
	spans := make([]span, n)
	for l, b := range layers {
		if len(b) != layerBytes {
			return fmt.Errorf("engine: cache memory: layer %d of %d bytes, layout needs %d", l, len(b), layerBytes)
		}
		p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if p%4 != 0 {
			return fmt.Errorf("engine: cache memory: layer %d not 4-byte aligned", l)
		}
		spans[l] = span{p, p + uintptr(len(b))}
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return fmt.Errorf("engine: cache memory: layer slices overlap")
		}
	}
	return nil
}

// bytesF32 views b (4-byte aligned, a multiple of 4 long) as float32s.
func bytesF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// f32Bytes views f as its little-endian bytes (every platform Go's CPU
// engine targets is little-endian), so cudakern writes where attention reads.
func f32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// Close stops the engine's workers. Sequences become unusable.
func (e *Engine) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.closed = true
	e.pool.close()
	e.inj.Close()
}

// Spec is the model spec of the chunks this engine produces and accepts.
func (e *Engine) Spec() chunk.ModelSpec { return e.spec }

// Fingerprint is Spec().Fingerprint().
func (e *Engine) Fingerprint() chunk.Fingerprint { return e.fp }

// Config is the model's configuration.
func (e *Engine) Config() ModelConfig { return e.cfg }

// Workers is how many goroutines a forward pass runs on (the caller
// included).
func (e *Engine) Workers() int { return e.pool.workers }

// Layout is the geometry of one layer of the engine's paged KV cache.
func (e *Engine) Layout() pagedkv.CacheLayout { return e.layout }

// FreeTokens is the number of cache slots not held by any sequence.
func (e *Engine) FreeTokens() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.free) * e.layout.BlockSize
}

// Sequence is one request's tokens and the cache blocks holding their KV.
// Token i sits at absolute position Start()+i. A Sequence is not safe for
// concurrent use; Release returns its blocks.
type Sequence struct {
	e      *Engine
	start  int
	tokens []uint32
	blocks []int
	slots  []int // slot of every token, filled as blocks are reserved
	done   bool
}

// NewSequence starts an empty sequence whose first token has position start.
func (e *Engine) NewSequence(start int) (*Sequence, error) {
	if start < 0 {
		return nil, fmt.Errorf("engine: negative start position %d", start)
	}
	return &Sequence{e: e, start: start}, nil
}

// Start is the position of token 0.
func (s *Sequence) Start() int { return s.start }

// Len is the number of tokens in the sequence.
func (s *Sequence) Len() int { return len(s.tokens) }

// Tokens returns the sequence's tokens (aliased; do not modify).
func (s *Sequence) Tokens() []uint32 { return s.tokens }

// Slots returns the cache slot of every token (aliased; do not modify).
func (s *Sequence) Slots() []int { return s.slots[:len(s.tokens)] }

// Release returns the sequence's cache blocks. The sequence is unusable
// afterwards; releasing twice is a no-op.
func (s *Sequence) Release() {
	e := s.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.done {
		return
	}
	s.done = true
	e.free = append(e.free, s.blocks...)
	s.blocks, s.slots, s.tokens = nil, nil, nil
}

// grow appends tokens and reserves slots for them. Called with e.mu held.
func (s *Sequence) grow(tokens []uint32) error {
	e := s.e
	if s.done {
		return fmt.Errorf("engine: sequence released")
	}
	if e.closed {
		return ErrClosed
	}
	for _, t := range tokens {
		if int(t) >= e.cfg.VocabSize {
			return fmt.Errorf("%w: token %d outside vocabulary of %d", ErrInvalidModel, t, e.cfg.VocabSize)
		}
	}
	n := len(s.tokens) + len(tokens)
	if sw := e.cfg.SlidingWindow; sw > 0 && n > sw {
		return fmt.Errorf("%w: %d tokens exceed the sliding window %d (windowed attention is not implemented)", ErrUnsupported, n, sw)
	}
	if err := s.reserve(n); err != nil {
		return err
	}
	s.tokens = append(s.tokens, tokens...)
	return nil
}

// reserve makes sure the sequence holds blocks for n tokens in all (a
// scheduler reserves what a request will decode into, so decoding never
// finds the cache full). Called with e.mu held.
func (s *Sequence) reserve(n int) error {
	e := s.e
	bs := e.layout.BlockSize
	need := (n+bs-1)/bs - len(s.blocks)
	if need > len(e.free) {
		return fmt.Errorf("%w: need %d blocks, %d free", ErrCacheFull, need, len(e.free))
	}
	for ; need > 0; need-- {
		b := e.free[len(e.free)-1]
		e.free = e.free[:len(e.free)-1]
		s.blocks = append(s.blocks, b)
		for o := 0; o < bs; o++ {
			s.slots = append(s.slots, b*bs+o)
		}
	}
	return nil
}

// Append adds tokens to the sequence, runs them through the model and
// returns the logits of the last one (a fresh slice of VocabSize).
// Prefill and decode are the same call.
func (s *Sequence) Append(ctx context.Context, tokens []uint32) ([]float32, error) {
	return s.AppendTo(ctx, nil, tokens)
}

// AppendTo is Append writing the logits into dst when it can hold them (a
// decode loop that reuses dst allocates nothing per token).
func (s *Sequence) AppendTo(ctx context.Context, dst []float32, tokens []uint32) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("engine: append of no tokens")
	}
	e := s.e
	e.mu.Lock()
	defer e.mu.Unlock()
	first := len(s.tokens)
	if err := s.grow(tokens); err != nil {
		return nil, err
	}
	active := e.sc.indices(first, len(s.tokens))
	logits := dst
	if cap(logits) < e.cfg.VocabSize {
		logits = make([]float32, e.cfg.VocabSize)
	}
	logits = logits[:e.cfg.VocabSize]
	if _, err := e.forward(ctx, s, fwdPlan{active: active, logits: logits}); err != nil {
		s.truncate(first)
		return nil, err
	}
	return logits, nil
}

// truncate drops tokens from n on (after a failed forward); their slots
// stay reserved and are overwritten by the next append.
func (s *Sequence) truncate(n int) { s.tokens = s.tokens[:n] }

// Generate appends prompt (if any) and then n greedily chosen tokens, and
// returns the generated tokens.
func (s *Sequence) Generate(ctx context.Context, prompt []uint32, n int) ([]uint32, error) {
	var logits []float32
	var err error
	if len(prompt) > 0 {
		if logits, err = s.Append(ctx, prompt); err != nil {
			return nil, err
		}
	} else if s.Len() == 0 {
		return nil, fmt.Errorf("engine: generate needs a prompt or a non-empty sequence")
	} else {
		// Recompute the last token's logits.
		s.e.mu.Lock()
		last := s.tokens[len(s.tokens)-1]
		s.tokens = s.tokens[:len(s.tokens)-1]
		s.e.mu.Unlock()
		if logits, err = s.Append(ctx, []uint32{last}); err != nil {
			return nil, err
		}
	}
	out := make([]uint32, 0, n)
	tok := make([]uint32, 1)
	for len(out) < n {
		tok[0] = uint32(Argmax(logits))
		out = append(out, tok[0])
		if len(out) == n {
			break
		}
		if logits, err = s.AppendTo(ctx, logits, tok); err != nil {
			return out, err
		}
	}
	return out, nil
}

// Argmax is the index of the largest value (the first on ties).
func Argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}
