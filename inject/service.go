package inject

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"unsafe"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pinned"
)

// Fetched is a Fetcher's answer for one chunk.
type Fetched struct {
	// Blob is the encoded entry (chunk.Encode's format), lent to the
	// Service: it only reads it and releases it exactly once when done (a
	// local tier's pin, a pooled buffer's return; pinned.Owned for bytes
	// nobody else holds).
	Blob pinned.Bytes
	// Local is true when Blob came from this node's own store (else from
	// a peer); Key is the key it is stored under there.
	Local bool
	Key   chunk.Key
	// Arriving is set when Blob is still being received (a stream from a
	// replica): its head is in place, so the Service verifies the header
	// (and with it every layer's checksum) at once, and its layers arrive
	// in order: the Service waits for layer l before using it and checks
	// it against its checksum then. Nil means Blob is whole.
	Arriving Arriving
	// Device, when set, lends the entry in device memory instead of Blob
	// (empty then): a DeviceFetcher's answer for a cache on that device,
	// Local and Key set. The Service releases it exactly once, after the
	// kernels that read it.
	Device *DeviceCopy
	// Match is MatchExact when Blob's context is the wanted one,
	// MatchApproximate for another encoding of the content, MatchMiss when
	// nothing was found
	// (Blob empty). The Service re-derives it from Blob's header, which is
	// authoritative.
	Match chunk.Match
}

// release releases what f lends: its Blob, and its device copy.
func (f *Fetched) release() {
	f.Blob.Release()
	if f.Device != nil {
		f.Device.Release()
		f.Device = nil
	}
}

// Arriving tells when the layers of an entry still being received are in
// place.
type Arriving interface {
	// Ready returns nil once layers 0 to l of the blob are in place, or
	// why they never will be (ctx's error if ctx ends first). Bytes in
	// place are never written again. It may be called concurrently.
	Ready(ctx context.Context, l int) error
}

// Fetcher finds the best stored entry for key (the wanted context in
// key.Context). The node implements it: the local kvtier Store's Best and
// Get first, else a replica over gRPC. It is called concurrently. An error
// makes the chunk a MISS (the engine prefills it), never fails the request.
type Fetcher interface {
	Fetch(ctx context.Context, key chunk.Key) (Fetched, error)
}

// BatchFetcher is a Fetcher that finds all the keys of a request at once,
// so that its lookups cost one round trip per owner node rather than one
// per chunk. The Service uses FetchBatch when its Fetcher implements it.
type BatchFetcher interface {
	Fetcher
	// FetchBatch finds every key and calls found(i, got, err) exactly once
	// for keys[i], with Fetch's meaning, as soon as that key is settled:
	// from any goroutine, possibly concurrently (the Service verifies the
	// entry inside found, so answers verify in parallel). It returns once
	// every call has returned; if ctx ends, the remaining keys are found
	// with an error.
	FetchBatch(ctx context.Context, keys []chunk.Key, found func(i int, got Fetched, err error))
}

// DeviceFetcher is a BatchFetcher that can lend local entries in device
// memory. The Service uses FetchBatchDevice for a cache registered by CUDA
// IPC: the kernel then reads a hit's layers where they lie, with no copy
// through the host.
type DeviceFetcher interface {
	BatchFetcher
	// FetchBatchDevice is FetchBatch for a cache in the memory of CUDA
	// device `device`: a key whose exact entry is local and can be lent
	// there, in a codec of cudakern.DeviceCodecs, is answered with
	// Fetched.Device; every other key as FetchBatch answers it.
	FetchBatchDevice(ctx context.Context, device int, keys []chunk.Key, found func(i int, got Fetched, err error))
}

// ModelSource resolves a model fingerprint to its spec (the node's model
// registry).
type ModelSource interface {
	Model(ctx context.Context, fp chunk.Fingerprint) (chunk.ModelSpec, error)
}

// Config configures a Service. Zero fields take the defaults below.
type Config struct {
	// Fetcher finds entries (required).
	Fetcher Fetcher
	// Models resolves the fingerprint of a Descriptor without a Spec; nil
	// means every Descriptor must carry its Spec.
	Models ModelSource
	// Workers is the number of goroutines that decode and rotate, shared by
	// all requests. Default runtime.GOMAXPROCS(0).
	Workers int
	// FetchParallel bounds the concurrent Fetch calls of one request
	// (a BatchFetcher bounds its own reads). Default 16.
	FetchParallel int
	// LayersAhead is how many layers past the oldest unfinished one a
	// request may have in flight: workers decode and write layer l+1 while
	// the last chunks of layer l finish. It bounds how long a request's
	// later layers can hold the workers ahead of other requests. Default 2.
	LayersAhead int
	// MaxCaches bounds the registrations. Default 16.
	MaxCaches int
	// MaxChunks bounds the chunks of one request. Default 4096.
	MaxChunks int
	// Limits bound the entries accepted. Zero means chunk.DefaultLimits.
	Limits chunk.Limits
	// GPU, when set, runs GPUWorkers of the workers' injections into
	// caches in host memory on device GPUDevice (when it answers; the CPU
	// Injector otherwise, with the same bits), and opens caches registered
	// by CUDA IPC. Nil: the CPU Injector, and CUDA IPC registrations are
	// ErrUnsupported. cudakern/gpu.Driver is the GPU of a build with the
	// cuda tag.
	GPU       cudakern.GPU
	GPUDevice int
	// GPUWorkers is how many workers open a GPU kernel; the others use the
	// CPU Injector. Each GPU kernel holds its own stream and copies of the
	// RoPE tables in device memory (64 MiB for 131072 positions of 128
	// dims), and a job into host memory crosses the bus twice, so one per
	// Service by default rather than one per worker.
	GPUWorkers int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultFetchParallel = 16
	DefaultLayersAhead   = 2
	DefaultMaxCaches     = 16
	DefaultMaxChunks     = 4096
	DefaultGPUWorkers    = 1
)

// Service registers KV caches and injects chunks into them. It is safe
// for concurrent use; Close stops it.
type Service struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	tasks chan task
	quit  chan struct{}
	wg    sync.WaitGroup // workers
	base  context.Context
	stop  context.CancelFunc
	// kernel names the workers' injection kernel (cudakern.NewKernel's
	// choice); set by New.
	kernel string

	mu       sync.Mutex // guards the fields below and every cache's refs/gone
	closed   bool
	caches   map[CacheID]*cache
	ropes    map[ropeKey]*ropeRef
	next     CacheID
	inflight sync.WaitGroup // Add under mu while !closed
}

// New starts a Service and its workers.
func New(cfg Config) (*Service, error) {
	if cfg.Fetcher == nil {
		return nil, errors.New("inject: Config.Fetcher is required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.FetchParallel <= 0 {
		cfg.FetchParallel = DefaultFetchParallel
	}
	if cfg.LayersAhead <= 0 {
		cfg.LayersAhead = DefaultLayersAhead
	}
	if cfg.MaxCaches <= 0 {
		cfg.MaxCaches = DefaultMaxCaches
	}
	if cfg.GPUWorkers <= 0 {
		cfg.GPUWorkers = DefaultGPUWorkers
	}
	if cfg.MaxChunks <= 0 {
		cfg.MaxChunks = DefaultMaxChunks
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Service{
		cfg:    cfg,
		log:    cfg.Logger,
		m:      newMetrics(),
		tasks:  make(chan task, 4*cfg.Workers),
		quit:   make(chan struct{}),
		caches: map[CacheID]*cache{},
		ropes:  map[ropeKey]*ropeRef{},
	}
	s.base, s.stop = context.WithCancel(context.Background())
	gpu := cfg.GPU
	for i := 0; i < cfg.Workers; i++ {
		if i == cfg.GPUWorkers {
			gpu = nil
		}
		// A CUDA kernel where a GPU is configured and its device answers,
		// the CPU Injector otherwise; the same bits.
		inj, kind, onGPU := cudakern.NewKernel(gpu, cfg.GPUDevice, cudakern.Config{Workers: 1})
		if i == 0 {
			s.kernel = kind
			s.log.Info("injection kernel", "kernel", kind, "gpu_workers", min(cfg.GPUWorkers, cfg.Workers), "workers", cfg.Workers)
			if !onGPU {
				gpu = nil // asked once: the other workers take the CPU too
			}
		}
		w := &worker{inj: inj}
		s.wg.Add(1)
		go s.work(w)
	}
	return s, nil
}

// Kernel names the kernel the workers inject with: "cpu (...)" or the
// GPU's name, as cudakern.NewKernel chose at New.
func (s *Service) Kernel() string { return s.kernel }

// Close cancels the requests in flight, waits for them, stops the workers
// and unmaps every registration.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.stop()
	s.inflight.Wait()
	close(s.quit)
	s.wg.Wait()
	s.mu.Lock()
	caches := s.caches
	s.caches = map[CacheID]*cache{}
	s.mu.Unlock()
	for _, c := range caches {
		s.drop(c)
	}
	s.m.caches.Set(0)
	return nil
}

// Register maps the memory d names and registers it. Each memory kind
// has its own branch: shared memory (MemoryShm) is mapped here; CUDA IPC
// (MemoryCUDAIPC) is opened through Config.GPU (ErrUnsupported without
// one); in-process memory goes through
// RegisterInProcess.
func (s *Service) Register(ctx context.Context, d Descriptor) (CacheID, error) {
	switch d.Memory.Kind {
	case MemoryShm:
		return s.registerShm(ctx, d)
	case MemoryCUDAIPC:
		return s.registerIPC(ctx, d)
	case MemoryInProcess:
		return 0, fmt.Errorf("%w: in-process memory goes through RegisterInProcess", ErrInvalidCache)
	}
	return 0, fmt.Errorf("%w: memory kind %v", ErrInvalidCache, d.Memory.Kind)
}

// registerIPC opens the engine's device memory d names: one CUDA IPC
// handle per layer (64 bytes each) on device d.Memory.Device, each layer
// at its offset in the handle's allocation. The handles and sizes are
// checked here; opening them needs Config.GPU (cudakern/gpu.Driver in a
// cuda build; ErrUnsupported without it), which refuses a handle it
// cannot open or an allocation too small for its layer (ErrInvalidCache).
// Hits are then written straight into that memory, their source staged
// through the device.
func (s *Service) registerIPC(ctx context.Context, d Descriptor) (CacheID, error) {
	c, err := s.prepare(ctx, &d)
	if err != nil {
		return 0, err
	}
	m := d.Memory
	bad := func(format string, a ...any) (CacheID, error) {
		return 0, fmt.Errorf("%w: CUDA IPC: %s", ErrInvalidCache, fmt.Sprintf(format, a...))
	}
	switch {
	case m.File != nil:
		return bad("a file is for shared memory")
	case m.Device < 0:
		return bad("device %d", m.Device)
	case len(m.IPCHandles) != len(c.layouts):
		return bad("%d handles for %d layers", len(m.IPCHandles), len(c.layouts))
	case m.Offsets != nil && len(m.Offsets) != len(c.layouts):
		return bad("%d offsets for %d layers", len(m.Offsets), len(c.layouts))
	}
	sizes := make([]int, len(c.layouts))
	for l, h := range m.IPCHandles {
		if len(h) != cudakern.IPCHandleBytes {
			return bad("layer %d handle of %d bytes, want %d", l, len(h), cudakern.IPCHandleBytes)
		}
		sizes[l] = c.layouts[l].LayerBytes()
		if m.Offsets != nil && (m.Offsets[l] < 0 || m.Offsets[l]%Alignment != 0) {
			return bad("layer %d offset %d: want a multiple of %d", l, m.Offsets[l], Alignment)
		}
	}
	if s.cfg.GPU == nil {
		return 0, fmt.Errorf("%w: %v (CUDA IPC needs a node built with the cuda tag)", ErrUnsupported, m.Kind)
	}
	dev, err := s.cfg.GPU.OpenIPC(m.Device, m.IPCHandles, m.Offsets, sizes)
	if err != nil {
		return 0, fmt.Errorf("%w: CUDA IPC: %w", ErrInvalidCache, err)
	}
	c.dev = dev
	c.unmap = func() {
		if err := dev.Close(); err != nil {
			s.log.Warn("inject: closing a CUDA IPC cache", "err", err)
		}
	}
	c.desc.Memory.IPCHandles = nil // not kept: the mapping outlives the descriptor
	return s.add(c)
}

// registerShm maps d.Memory.File: shared memory of at least the layers'
// size that no registration maps already (a second registration of one
// file would let two callers write each other's cache). Refusals of the
// file are ErrRefused alone; the reason goes to the log.
func (s *Service) registerShm(ctx context.Context, d Descriptor) (CacheID, error) {
	c, err := s.prepare(ctx, &d)
	if err != nil {
		return 0, err
	}
	offs, end, err := shmOffsets(&d.Memory, c.layouts)
	if err != nil {
		return 0, err
	}
	c.desc.Memory.Offsets = offs
	c.desc.Memory.File = nil // not kept: the mapping outlives the descriptor
	var why string
	if c.layers, c.unmap, c.file, why, err = mapShm(d.Memory.File, offs, c.layouts, end); err != nil {
		if why != "" {
			s.log.Warn("inject: shared memory refused", "why", why)
		}
		return 0, err
	}
	c.shared = true
	return s.add(c)
}

// RegisterInProcess registers layers, one slice per layer of d, each its
// layout's LayerBytes long and not overlapping another. The Service
// writes into them until Unregister returns (or an inject that started
// before it ends). d.Memory.Kind must be MemoryInProcess or zero.
func (s *Service) RegisterInProcess(ctx context.Context, d Descriptor, layers [][]byte) (CacheID, error) {
	if d.Memory.Kind != MemoryInProcess && d.Memory.Kind != MemoryInvalid {
		return 0, fmt.Errorf("%w: memory kind %v given to RegisterInProcess", ErrInvalidCache, d.Memory.Kind)
	}
	d.Memory = Memory{Kind: MemoryInProcess}
	c, err := s.prepare(ctx, &d)
	if err != nil {
		return 0, err
	}
	if len(layers) != d.Layers {
		return 0, fmt.Errorf("%w: %d layer slices for %d layers", ErrInvalidCache, len(layers), d.Layers)
	}
	type span struct{ lo, hi uintptr }
	spans := make([]span, len(layers))
	for l, b := range layers {
		if len(b) != c.layouts[l].LayerBytes() {
			return 0, fmt.Errorf("%w: layer %d of %d bytes, layout needs %d", ErrInvalidCache, l, len(b), c.layouts[l].LayerBytes())
		}
		p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		spans[l] = span{p, p + uintptr(len(b))}
	}
	slices.SortFunc(spans, func(a, b span) int {
		if a.lo < b.lo {
			return -1
		}
		if a.lo > b.lo {
			return 1
		}
		return 0
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return 0, fmt.Errorf("%w: layer slices overlap", ErrInvalidCache)
		}
	}
	c.layers = slices.Clone(layers)
	return s.add(c)
}

// prepare resolves the spec and validates the geometry of d.
func (s *Service) prepare(ctx context.Context, d *Descriptor) (*cache, error) {
	spec := d.Spec
	if spec.Family != "" {
		if err := spec.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidCache, err)
		}
		if fp := spec.Fingerprint(); fp != d.Fingerprint {
			return nil, fmt.Errorf("%w: spec fingerprint %v, descriptor says %v", ErrInvalidCache, fp, d.Fingerprint)
		}
	} else {
		if s.cfg.Models == nil {
			return nil, fmt.Errorf("%w: no spec and no model source to resolve %v", ErrInvalidCache, d.Fingerprint)
		}
		var err error
		if spec, err = s.cfg.Models.Model(ctx, d.Fingerprint); err != nil {
			return nil, fmt.Errorf("inject: model %v: %w", d.Fingerprint, err)
		}
		if spec.Fingerprint() != d.Fingerprint {
			return nil, fmt.Errorf("%w: model source returned a spec of another fingerprint", ErrInvalidCache)
		}
	}
	layouts, lo, hi, err := checkGeometry(d, spec)
	if err != nil {
		return nil, err
	}
	maxPos := d.MaxPositions
	if maxPos == 0 {
		maxPos = DefaultMaxPositions
	}
	if maxPos < 0 || maxPos > cudakern.MaxTablePositions {
		return nil, fmt.Errorf("%w: max positions %d out of range 1..%d", ErrInvalidCache, maxPos, cudakern.MaxTablePositions)
	}
	return &cache{desc: *d, spec: spec, ropeKey: ropeKey{spec.Fingerprint(), maxPos}, layouts: layouts, headLo: lo, headHi: hi}, nil
}

func (s *Service) add(c *cache) (CacheID, error) {
	// Registrations of one model (a tensor-parallel engine's ranks) share
	// one RoPE table: 16 MiB for 32768 positions of a 128-dim head.
	s.mu.Lock()
	shared := s.ropes[c.ropeKey]
	s.mu.Unlock()
	var table *cudakern.RopeTable
	if shared == nil {
		var err error
		if table, err = cudakern.NewRopeTable(c.spec, c.ropeKey.maxPos); err != nil {
			if c.unmap != nil {
				c.unmap()
			}
			return 0, fmt.Errorf("%w: %w", ErrInvalidCache, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(err error) (CacheID, error) {
		if c.unmap != nil {
			c.unmap()
		}
		return 0, err
	}
	if s.closed {
		return fail(ErrClosed)
	}
	if len(s.caches) >= s.cfg.MaxCaches {
		return fail(fmt.Errorf("%w: %d held", ErrTooManyCaches, len(s.caches)))
	}
	if c.file != (fileID{}) {
		for _, o := range s.caches {
			if o.file == c.file {
				s.log.Warn("inject: shared memory refused", "why", "the file is registered already", "cache", o.id)
				return fail(ErrRefused)
			}
		}
	}
	if shared = s.ropes[c.ropeKey]; shared == nil {
		shared = &ropeRef{t: table}
		s.ropes[c.ropeKey] = shared
	}
	shared.n++
	c.rope = shared.t
	s.next++
	c.id = s.next
	s.caches[c.id] = c
	s.m.caches.Set(float64(len(s.caches)))
	s.log.Info("inject: cache registered", "id", c.id, "model", c.desc.Fingerprint, "memory", c.desc.Memory.Kind,
		"layers", c.desc.Layers, "heads", fmt.Sprintf("[%d,%d)", c.headLo, c.headHi), "layer_bytes", c.layouts[0].LayerBytes())
	return c.id, nil
}

// Unregister removes a registration. An inject already using it finishes
// first; the memory is unmapped when the last one ends.
func (s *Service) Unregister(id CacheID) error {
	s.mu.Lock()
	c, ok := s.caches[id]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrUnknownCache, id)
	}
	delete(s.caches, id)
	s.m.caches.Set(float64(len(s.caches)))
	c.gone = true
	drop := c.refs == 0
	s.mu.Unlock()
	if drop {
		s.drop(c)
	}
	return nil
}

// Caches is the number of registrations.
func (s *Service) Caches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.caches)
}

func (s *Service) acquire(id CacheID) (*cache, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	c, ok := s.caches[id]
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrUnknownCache, id)
	}
	c.refs++
	s.inflight.Add(1)
	return c, nil
}

func (s *Service) releaseCache(c *cache) {
	s.mu.Lock()
	c.refs--
	drop := c.gone && c.refs == 0
	s.mu.Unlock()
	if drop {
		s.drop(c)
	}
	s.inflight.Done()
}

// drop releases what a registration holds once nothing uses it.
func (s *Service) drop(c *cache) {
	if c.unmap != nil {
		c.unmap()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.ropes[c.ropeKey]; r != nil {
		if r.n--; r.n == 0 {
			delete(s.ropes, c.ropeKey)
		}
	}
}

// worker is one pipeline goroutine's state: its own single-threaded
// injector (so workers write different chunks at once) and scratch that
// lives as long as the worker, so a request allocates none.
type worker struct {
	inj     cudakern.Kernel
	job     cudakern.Job
	dst     [1][]byte
	buf     []byte // one decoded chunk layer
	scratch []byte // DecodeRange's whole-layer scratch for a head subset
}

// task is hits [lo, hi) of one layer of one request. It is sent by value,
// so submitting allocates nothing.
type task struct {
	r      *request
	layer  int
	lo, hi int
}

func (s *Service) work(w *worker) {
	defer s.wg.Done()
	defer w.inj.Close()
	// A registered shared-memory file that its owner shrinks makes our
	// mapping fault; turn that into an error instead of a crash.
	debug.SetPanicOnFault(true)
	for {
		select {
		case <-s.quit:
			return
		case t := <-s.tasks:
			s.run(w, t)
		}
	}
}

func (s *Service) run(w *worker, t task) {
	r := t.r
	defer r.wg.Done()
	defer r.finish(t)
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(interface{ Addr() uintptr }); !ok {
				panic(p)
			}
			r.faulted.Store(true)
			r.cancel()
		}
	}()
	for i := t.lo; i < t.hi; i++ {
		if r.ctx.Err() != nil {
			return
		}
		r.process(w, t.layer, i)
	}
}
