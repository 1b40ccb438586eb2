package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
)

// DefaultFrameBytes is the data frame size senders use unless told
// otherwise: large enough that per-frame costs vanish, small enough to stay
// well under gRPC's default 4 MiB message limit.
const DefaultFrameBytes = 1 << 20

// MsgSender is the sending half of a gRPC stream.
type MsgSender interface{ SendMsg(m any) error }

// MsgReceiver is the receiving half of a gRPC stream.
type MsgReceiver interface{ RecvMsg(m any) error }

// ErrShortBody is returned when a stream ends before its body is complete,
// and ErrLongBody when it carries more than its header announced.
var (
	ErrShortBody = errors.New("api: stream ended before the body was complete")
	ErrLongBody  = errors.New("api: stream body longer than announced")
)

// SendHeader sends hdr as a header frame.
func SendHeader(s MsgSender, hdr proto.Message) error {
	return s.SendMsg(&Frame{Header: hdr})
}

// SendBody sends body as data frames of at most frameBytes (0 means
// DefaultFrameBytes). Each frame references body; the caller keeps its own
// reference and may Free it when SendBody returns.
func SendBody(s MsgSender, body mem.Buffer, frameBytes int) error {
	if frameBytes <= 0 {
		frameBytes = DefaultFrameBytes
	}
	n := body.Len()
	for off := 0; off < n; off += frameBytes {
		part := body.Slice(off, min(off+frameBytes, n))
		err := s.SendMsg(&Frame{Data: mem.BufferSlice{part}})
		part.Free()
		if err != nil {
			return err
		}
	}
	return nil
}

// RecvHeader receives the header frame into hdr.
func RecvHeader(r MsgReceiver, hdr proto.Message) error {
	f := Frame{Header: hdr}
	if err := r.RecvMsg(&f); err != nil {
		return err
	}
	if !f.IsHeader {
		f.Data.Free()
		return fmt.Errorf("%w: data frame where a header was expected", ErrFrame)
	}
	return nil
}

// RecvBody receives data frames into dst until it is full. A header frame,
// or more data than dst holds, is an error; so is the end of the stream
// before dst is full (ErrShortBody).
func RecvBody(r MsgReceiver, dst []byte) error { return RecvBodyEach(r, dst, nil) }

// RecvBodyEach is RecvBody that also hands each data frame to each (unless
// nil) as it arrives, with the body received so far (as
// BodyPool.RecvBodyEach does).
func RecvBodyEach(r MsgReceiver, dst []byte, each func(frame mem.BufferSlice, sofar []byte)) error {
	off := 0
	for off < len(dst) {
		var f Frame
		if err := r.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%w: %d of %d bytes", ErrShortBody, off, len(dst))
			}
			return err
		}
		if f.IsHeader {
			return fmt.Errorf("%w: header frame inside a body", ErrFrame)
		}
		n := f.Data.Len()
		if n > len(dst)-off {
			f.Data.Free()
			return fmt.Errorf("%w: %d bytes past %d", ErrLongBody, n-(len(dst)-off), len(dst))
		}
		f.Data.CopyTo(dst[off:])
		off += n
		if each != nil {
			each(f.Data, dst[:off])
		}
		f.Data.Free()
	}
	return nil
}

// RecvBodyGrow receives data frames until total bytes arrived, into a
// buffer that starts with room for min(total, initial) bytes and grows
// (doubling) as data arrives: memory follows what the sender actually
// sent, so a header announcing a large body reserves nothing by itself.
// Errors are RecvBody's.
func RecvBodyGrow(r MsgReceiver, total, initial int) ([]byte, error) {
	return (*BodyPool)(nil).RecvBody(r, total, initial)
}

// BodyPool recycles body buffers in power-of-two size classes, so that a
// node receiving entries does not allocate (and fault in, and clear) a
// fresh buffer of the entry's size per request. The nil *BodyPool
// allocates and recycles nothing. Safe for concurrent use.
type BodyPool struct {
	classes [bodyClasses]sync.Pool
}

// Size classes: 64 KiB << i. Larger buffers are allocated and dropped.
const (
	bodyMinShift = 16
	bodyClasses  = 11 // up to 64 MiB
)

func bodyClass(n int) int {
	c := 0
	for n > 1<<(bodyMinShift+c) {
		c++
	}
	return c
}

// Get returns a buffer of length 0 and capacity at least n.
func (p *BodyPool) Get(n int) []byte {
	if p != nil {
		if c := bodyClass(n); c < bodyClasses {
			if b, ok := p.classes[c].Get().(*[]byte); ok {
				return (*b)[:0]
			}
			return make([]byte, 0, 1<<(bodyMinShift+c))
		}
	}
	return make([]byte, 0, n)
}

// Put recycles b, which nothing may use afterwards. Buffers not from Get
// (a capacity that is not a size class) are dropped.
func (p *BodyPool) Put(b []byte) {
	if p == nil {
		return
	}
	c := bodyClass(cap(b))
	if c < bodyClasses && cap(b) == 1<<(bodyMinShift+c) {
		b = b[:0]
		p.classes[c].Put(&b)
	}
}

// RecvBody is RecvBodyGrow with buffers from p: the returned buffer goes
// back with Put once its holders are done with it.
func (p *BodyPool) RecvBody(r MsgReceiver, total, initial int) ([]byte, error) {
	return p.RecvBodyEach(r, total, initial, nil)
}

// RecvBodyEach is RecvBody that also hands each data frame to each (unless
// nil) as it arrives, with the body received so far (the frame is its
// tail): each may take references to the frame's buffers (Ref) to pass
// them on; the receive drops its own after each returns.
func (p *BodyPool) RecvBodyEach(r MsgReceiver, total, initial int, each func(frame mem.BufferSlice, sofar []byte)) ([]byte, error) {
	buf := p.Get(min(total, max(initial, 0)))
	for len(buf) < total {
		var f Frame
		if err := r.RecvMsg(&f); err != nil {
			p.Put(buf)
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("%w: %d of %d bytes", ErrShortBody, len(buf), total)
			}
			return nil, err
		}
		if f.IsHeader {
			p.Put(buf)
			return nil, fmt.Errorf("%w: header frame inside a body", ErrFrame)
		}
		n := f.Data.Len()
		if n > total-len(buf) {
			f.Data.Free()
			p.Put(buf)
			return nil, fmt.Errorf("%w: %d bytes past %d", ErrLongBody, n-(total-len(buf)), total)
		}
		if cap(buf)-len(buf) < n {
			nb := p.Get(min(total, max(2*cap(buf), len(buf)+n)))[:len(buf)]
			copy(nb, buf)
			p.Put(buf)
			buf = nb
		}
		buf = buf[:len(buf)+n]
		f.Data.CopyTo(buf[len(buf)-n:])
		if each != nil {
			each(f.Data, buf)
		}
		f.Data.Free()
	}
	return buf, nil
}

// PinnedBuffer hands lent bytes to gRPC as a mem.Buffer that releases them
// once gRPC and every holder of a slice of it are done. That lets a store
// hand a pinned, zero-copy view of a blob to the transport and unpin it
// exactly when the last frame was written. Owned bytes (nothing to
// release) are sent as they are.
func PinnedBuffer(p pinned.Bytes) mem.Buffer {
	if !p.Held() {
		return mem.SliceBuffer(p.Bytes())
	}
	return LentBuffer(p.Bytes(), p.Release)
}

// LentBuffer hands data, which its owner recycles, to gRPC as a
// mem.Buffer: free runs once, when gRPC and every holder of a slice of the
// buffer dropped their references. Tiny data (at most 1 KiB, below gRPC's
// pooling threshold, where it would not count references) is copied and
// free runs at once.
func LentBuffer(data []byte, free func()) mem.Buffer {
	if mem.IsBelowBufferPoolingThreshold(cap(data)) {
		cp := append([]byte(nil), data...)
		free()
		return mem.SliceBuffer(cp)
	}
	return mem.NewBuffer(&data, &releaser{free: free})
}

// releaser is a one-shot mem.BufferPool whose Put runs free.
type releaser struct {
	once sync.Once
	free func()
}

func (r *releaser) Get(length int) *[]byte {
	b := make([]byte, length)
	return &b
}

func (r *releaser) Put(*[]byte) { r.once.Do(r.free) }

// Transport tuning for tensor streams, for both ends of a connection: large
// fixed HTTP/2 windows (which turn off gRPC's BDP estimation, so a
// megabyte frame is not held behind window updates while the estimate
// grows), 1 MiB read and write buffers (a megabyte frame in one read and
// one write: 5 to 8% less CPU per byte on both ends than 256 KiB), held only
// while the connection reads or writes (gRPC takes the read buffer when
// the socket is readable; the write buffer is shared), and a buffer pool
// that does not clear what it hands out (framePool).
const (
	WindowBytes      = 16 << 20
	ReadBufferBytes  = 1 << 20
	WriteBufferBytes = 1 << 20
)

// ServerOptions returns the server options of that tuning.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(WindowBytes), grpc.InitialConnWindowSize(WindowBytes),
		grpc.ReadBufferSize(ReadBufferBytes), grpc.WriteBufferSize(WriteBufferBytes), grpc.SharedWriteBuffer(true),
		experimental.BufferPool(newFramePool())}
}

// DialOptions returns the dial options of that tuning.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(WindowBytes), grpc.WithInitialConnWindowSize(WindowBytes),
		grpc.WithReadBufferSize(ReadBufferBytes), grpc.WithWriteBufferSize(WriteBufferBytes), grpc.WithSharedWriteBuffer(true),
		experimental.WithBufferPool(newFramePool())}
}

// PutDirect stores blob on the node behind cc only, as a replica write
// (Peer.Replicate, so the caller must be a member): the node neither
// forwards it nor looks for other owners. Benchmarks and tests use it to
// place an entry on one node so that the others must fetch it from there.
func PutDirect(ctx context.Context, cc grpc.ClientConnInterface, blob []byte, key chunk.Key) error {
	st, err := NewPeerClient(cc).Replicate(ctx)
	if err != nil {
		return err
	}
	if err := SendHeader(st, &PutHeader{Key: ProtoKey(key), BlobBytes: uint64(len(blob)), Direct: true}); err != nil {
		return PutSendErr(st, err)
	}
	if err := SendBody(st, mem.SliceBuffer(blob), DefaultFrameBytes); err != nil {
		return PutSendErr(st, err)
	}
	_, err = st.CloseAndRecv()
	return err
}

// PutSendErr is the error of a failed send on a Put stream: the server's
// status when the server already answered (gRPC then reports io.EOF to
// the sender and keeps the status for the receive), else err.
func PutSendErr(st grpc.ClientStreamingClient[PutFrame, PutResponse], err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := st.CloseAndRecv(); rerr != nil {
			return rerr
		}
	}
	return err
}
