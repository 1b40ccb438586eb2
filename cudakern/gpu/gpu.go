//go:build cuda

package gpu

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/cudakern/kern"
	"github.com/kvmesh/kvmesh/internal/cudathread"
)

// ErrCorrupt wraps chunk.ErrCorrupt: a codec payload the kernel found
// corrupt (the error bits of cudakern.DeviceErrParams and friends).
var ErrCorrupt = fmt.Errorf("gpu: %w", chunk.ErrCorrupt)

// Config configures Open.
type Config struct {
	// Device is the GPU's ordinal. Default 0.
	Device int
	// Threads is the block size, threads per token of a layer. Default 128.
	Threads int
}

// Injector runs cudakern Jobs on one device, in its primary context (so
// device pointers of other users of that context, such as the GPU tier's
// slab, are valid here). Its thread (one goroutine locked to an OS thread
// with the context current) owns the module, the stream and the buffers;
// calls are handed to it and serialized. It is safe for concurrent use.
type Injector struct {
	cfg  Config
	name string
	cc   int // compute capability, major*10+minor
	th   *cudathread.Thread

	// Owned by the thread.
	fn      cu.Function
	stream  cu.Stream
	events  []cu.Event
	meta    devBuf // job, addresses, slots, error word
	data    devBuf // a host job's source and compact cache layers
	staging []byte // the host image of meta
	pinned  []byte // page-locked staging of host sources (upload)
	tables  []table
}

// table is a RopeTable's rows in device memory, uploaded once: a job's
// cos/sin are the rows of its positions there.
type table struct {
	t   *cudakern.RopeTable
	buf devBuf
}

// maxTables bounds the tables kept on the device (a node serves a few
// models; each table is MaxPositions*RotaryDim float32).
const maxTables = 4

// rows returns the device address of t's rows, uploading them the first
// time (the oldest table makes room). Owner thread.
func (in *Injector) rows(t *cudakern.RopeTable) (cu.DevicePtr, error) {
	for i, tb := range in.tables {
		if tb.t == t {
			copy(in.tables[1:i+1], in.tables[:i]) // most recent first
			in.tables[0] = tb
			return tb.buf.ptr, nil
		}
	}
	if len(in.tables) == maxTables {
		old := in.tables[maxTables-1]
		in.tables = in.tables[:maxTables-1]
		if err := old.buf.free(); err != nil {
			return 0, cuErr("freeing a rope table", err)
		}
	}
	r := t.Rows()
	tb := table{t: t}
	if err := tb.buf.reserve(int64(4 * len(r))); err != nil {
		return 0, cuErr("allocating a rope table", err)
	}
	// On the stream, so the kernels after it see it all (a synchronous
	// copy from pageable memory may return before its DMA is done).
	if err := cu.MemcpyHtoDAsync(tb.buf.ptr, unsafe.Pointer(unsafe.SliceData(r)), int64(4*len(r)), in.stream); err != nil {
		_ = in.drain(nil)
		_ = tb.buf.free()
		return 0, cuErr("copying a rope table", err)
	}
	in.tables = append([]table{tb}, in.tables...)
	return tb.buf.ptr, nil
}

// devBuf is a device allocation that only grows.
type devBuf struct {
	ptr  cu.DevicePtr
	size int64
}

func (b *devBuf) reserve(n int64) error {
	if n <= b.size {
		return nil
	}
	if b.size > 0 {
		if err := cu.MemFree(b.ptr); err != nil {
			return err
		}
		b.size = 0
	}
	n = max(n, 2*b.size, 1<<16)
	p, err := cu.MemAlloc(n)
	if err != nil {
		return err
	}
	b.ptr, b.size = p, n
	return nil
}

func (b *devBuf) free() error {
	if b.size == 0 {
		return nil
	}
	b.size = 0
	return cu.MemFree(b.ptr)
}

func cuErr(what string, err error) error { return fmt.Errorf("gpu: cuda %s: %w", what, err) }

// Open loads the kernel on cfg.Device. It fails when the device does not
// answer or is older than sm_80.
func Open(cfg Config) (*Injector, error) {
	if cfg.Threads <= 0 {
		cfg.Threads = 128
	}
	in := &Injector{cfg: cfg}
	th, err := cudathread.Start(cfg.Device, in.setup)
	if err != nil {
		return nil, err
	}
	in.th = th
	return in, nil
}

// setup, on the thread, reads the device's compute capability, loads its
// PTX and creates the stream; the thread frees everything at Close, after
// the stream drained.
func (in *Injector) setup(th *cudathread.Thread, dev cu.Device) error {
	maj, err1 := dev.Attribute(cu.ComputeCapabilityMajor)
	minor, err2 := dev.Attribute(cu.ComputeCapabilityMinor)
	if err := errors.Join(err1, err2); err != nil {
		return cuErr("compute capability", err)
	}
	in.cc = maj*10 + minor
	in.name, _ = dev.Name()
	ptx, err := kern.PTX(in.cc)
	if err != nil {
		return err
	}
	mod, err := cu.LoadData(string(ptx))
	if err != nil {
		return cuErr("loading the PTX", err)
	}
	th.Defer(mod.Unload)
	if in.fn, err = mod.Function(kern.Kernel); err != nil {
		return cuErr("finding "+kern.Kernel, err)
	}
	if in.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return cuErr("creating a stream", err)
	}
	th.Defer(in.stream.Destroy)
	th.Defer(in.meta.free)
	th.Defer(in.data.free)
	th.Defer(in.freePinned)
	th.Defer(func() error {
		for i := range in.events {
			_ = cu.DestroyEvent(&in.events[i])
		}
		for i := range in.tables {
			_ = in.tables[i].buf.free()
		}
		return nil
	})
	// Everything is freed after the stream drains.
	th.Defer(in.stream.Synchronize)
	return nil
}

// do runs fn on the thread. A failed fn may leave copies queued that
// still read the page-locked staging or the job image, or kernels that
// still use the buffers, so the stream is drained before the next call
// can reuse or free them.
func (in *Injector) do(fn func() error) error {
	err := in.th.Do(func() error {
		if err := fn(); err != nil {
			return in.drain(err)
		}
		return nil
	})
	if errors.Is(err, cudathread.ErrClosed) {
		return cudakern.ErrClosed
	}
	return err
}

// Device names the GPU and its compute capability.
func (in *Injector) Device() string {
	return fmt.Sprintf("%s (sm_%d)", in.name, in.cc)
}

// Workers is 1: one stream runs one job at a time.
func (in *Injector) Workers() int { return 1 }

// Close waits for the call in flight and frees the device state. Later
// calls return cudakern.ErrClosed.
func (in *Injector) Close() { in.th.Close() }

// Target names device memory for InjectDevice.
type Target struct {
	// Codec is the encoding of the source layers: chunk.CodecRaw (j's
	// canonical layers) or CodecInt8, CodecInt4, CodecFP8 (each layer's
	// encoded payload, cudakern.EncodedLayerBytes long), decoded in the
	// kernel's pass.
	Codec chunk.Codec
	// Src and Dst are the device addresses of each layer's source and of
	// each layer of the cache, len(j.Dst) of each; j.Src (which may be
	// nil) and j.Dst's bytes are not read.
	Src, Dst []uint64
	// LayerDone, if set, is called with each layer's index, in order, once
	// that layer's kernel has finished (its event has fired). It runs on
	// the injector's thread, so it must not call the injector (that call
	// would wait for itself), and a payload found corrupt is reported by
	// InjectDevice's error after the last layer, not before LayerDone.
	LayerDone func(layer int)
}

// Inject runs j on the device with the bits of cudakern.Injector, for a
// cache in host memory (the fallback where the node cannot reach the
// engine's device memory): j's source is copied to the device, the kernel
// writes the tokens' head vectors into a compact device cache (one slot
// per token), those bytes come back and are copied to their slots. Only
// the bytes read and written cross the bus, not whole cache layers.
func (in *Injector) Inject(ctx context.Context, j *cudakern.Job) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := j.Validate(); err != nil {
		return err
	}
	if j.Tokens == 0 || len(j.Dst) == 0 {
		return nil
	}
	c := cudakern.CompactJob(j)
	dj, err := cudakern.DeviceJobOf(&c, chunk.CodecRaw)
	if err != nil {
		return err
	}
	layers := len(j.Dst)
	clb := int64(c.Layout.LayerBytes())
	err = in.do(func() error {
		sb := int64(len(j.Src))
		at := (sb + 255) &^ 255 // the compact cache, aligned
		if err := in.data.reserve(at + int64(layers)*clb); err != nil {
			return cuErr("allocating buffers", err)
		}
		src := make([]uint64, layers)
		dst := make([]uint64, layers)
		for i := range src {
			src[i] = uint64(in.data.ptr) + uint64(int64(i)*(sb/int64(layers)))
			dst[i] = uint64(in.data.ptr) + uint64(at+int64(i)*clb)
		}
		// Queued on the stream, so the kernel follows the copy.
		if err := in.upload(in.data.ptr, j.Src); err != nil {
			return err
		}
		if err := in.launch(ctx, &c, dj, src, dst, nil); err != nil {
			return err
		}
		for i, d := range c.Dst {
			if err := cu.MemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(d)), cu.DevicePtr(dst[i]), clb, in.stream); err != nil {
				return cuErr("copying the result out", err)
			}
		}
		if err := in.stream.Synchronize(); err != nil {
			return cuErr("copying the result out", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	cudakern.ScatterCompact(j, &c)
	return nil
}

// InjectDevice runs j from and into device memory (t): one launch per
// layer on the injector's stream, an event recorded after each, so a
// consumer can start on layer l while later layers are still written.
// It returns when every layer is done. An invalid j, or a Target that does
// not match it, writes nothing.
func (in *Injector) InjectDevice(ctx context.Context, j *cudakern.Job, t Target) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dj, err := cudakern.DeviceJobOf(j, t.Codec)
	if err != nil {
		return err
	}
	if err := checkTarget(j, t); err != nil {
		return err
	}
	if j.Tokens == 0 || len(j.Dst) == 0 {
		return nil
	}
	return in.do(func() error { return in.launch(ctx, j, dj, t.Src, t.Dst, t.LayerDone) })
}

// checkTarget refuses addresses that cannot be the job's: a count that is
// not one per layer, a null address, or one not aligned for the dtype's
// elements.
func checkTarget(j *cudakern.Job, t Target) error {
	if len(t.Src) != len(j.Dst) || len(t.Dst) != len(j.Dst) {
		return fmt.Errorf("%w: %d source and %d cache addresses for %d layers", cudakern.ErrInvalidJob, len(t.Src), len(t.Dst), len(j.Dst))
	}
	srcAlign := uint64(j.SrcDType.Size())
	if t.Codec != chunk.CodecRaw {
		srcAlign = 1
	}
	for l := range t.Src {
		if t.Src[l] == 0 || t.Dst[l] == 0 || t.Src[l]%srcAlign != 0 || t.Dst[l]%uint64(j.Layout.DType.Size()) != 0 {
			return fmt.Errorf("%w: layer %d: source %#x or cache %#x null or misaligned", cudakern.ErrInvalidJob, l, t.Src[l], t.Dst[l])
		}
	}
	return nil
}

// launch uploads the job's metadata (the job, the layer addresses and the
// slots; the cos/sin rows are the table's, uploaded once) in one copy,
// launches one kernel per layer, records an event after each and waits
// for them in order. Owner thread.
func (in *Injector) launch(ctx context.Context, j *cudakern.Job, dj cudakern.DeviceJob, src, dst []uint64, layerDone func(int)) error {
	layers := len(dst)
	rows, err := in.rows(j.Rope)
	if err != nil {
		return err
	}
	jobBytes := int(unsafe.Sizeof(dj))
	off := func(n int) int { return (n + 255) &^ 255 }
	addrAt := off(jobBytes)
	slotAt := addrAt + off(16*layers)
	errAt := slotAt + off(8*j.Tokens)
	total := errAt + 256
	if err := in.meta.reserve(int64(total)); err != nil {
		return cuErr("allocating the job", err)
	}
	if cap(in.staging) < total {
		in.staging = make([]byte, total)
	}
	img := in.staging[:total]
	clear(img)
	base := uint64(in.meta.ptr)
	dj.Src = base + uint64(addrAt)
	dj.Dst = base + uint64(addrAt+8*layers)
	dj.Slots = base + uint64(slotAt)
	dj.CS = uint64(rows) + uint64(4*j.Pos*2*int(dj.Half))
	dj.Err = base + uint64(errAt)
	*(*cudakern.DeviceJob)(unsafe.Pointer(&img[0])) = dj
	copy(unsafe.Slice((*uint64)(unsafe.Pointer(&img[addrAt])), layers), src)
	copy(unsafe.Slice((*uint64)(unsafe.Pointer(&img[addrAt+8*layers])), layers), dst)
	slots := unsafe.Slice((*int64)(unsafe.Pointer(&img[slotAt])), j.Tokens)
	for i, s := range j.Slots {
		slots[i] = int64(s)
	}
	if err := cu.MemcpyHtoDAsync(in.meta.ptr, unsafe.Pointer(&img[0]), int64(total), in.stream); err != nil {
		return cuErr("copying the job in", err)
	}
	for len(in.events) < layers {
		ev, err := cu.MakeEvent(cu.DisableTiming)
		if err != nil {
			return cuErr("creating an event", err)
		}
		in.events = append(in.events, ev)
	}
	jobPtr := in.meta.ptr
	for l := 0; l < layers; l++ {
		layer := int64(l)
		args := []unsafe.Pointer{unsafe.Pointer(&jobPtr), unsafe.Pointer(&layer)}
		if err := in.fn.Launch(j.Tokens, 1, 1, in.cfg.Threads, 1, 1, 0, in.stream, args); err != nil {
			return cuErr(fmt.Sprintf("launching layer %d", l), err)
		}
		if err := in.events[l].Record(in.stream); err != nil {
			return cuErr("recording an event", err)
		}
	}
	for l := 0; l < layers; l++ {
		if err := in.events[l].Synchronize(); err != nil {
			return cuErr(fmt.Sprintf("layer %d", l), err)
		}
		if layerDone != nil {
			layerDone(l)
		}
	}
	bits := (*uint32)(unsafe.Pointer(&img[errAt]))
	if err := cu.MemcpyDtoHAsync(unsafe.Pointer(bits), in.meta.ptr+cu.DevicePtr(errAt), 4, in.stream); err != nil {
		return cuErr("reading the error word", err)
	}
	if err := in.stream.Synchronize(); err != nil {
		return cuErr("reading the error word", err)
	}
	if *bits != 0 {
		return fmt.Errorf("%w: device decode error bits %#x", ErrCorrupt, *bits)
	}
	return ctx.Err()
}

// drain waits for the stream after a failure (do calls it), so that
// nothing queued still reads the staging image, and returns err.
func (in *Injector) drain(err error) error {
	if serr := in.stream.Synchronize(); serr != nil {
		return errors.Join(err, cuErr("synchronizing", serr))
	}
	return err
}

// Driver is cudakern.GPU over this package: kernels and IPC caches on
// the machine's CUDA devices. The zero value is ready; a daemon built with
// the cuda tag hands it to the node.
type Driver struct{}

var _ cudakern.GPU = Driver{}

// Kernel implements cudakern.GPU: an Injector on device.
func (Driver) Kernel(device int) (cudakern.Kernel, string, error) {
	in, err := Open(Config{Device: device})
	if err != nil {
		return nil, "", err
	}
	return in, "cuda " + in.Device(), nil
}
