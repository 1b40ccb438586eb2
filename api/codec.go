package api

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" CodecV2 that Codec delegates to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Field tags of PutFrame and GetFrame: 1 header (a message), 2 data (bytes),
// both length-delimited (wire type 2).
const (
	tagHeader = 1<<3 | 2
	tagData   = 2<<3 | 2
)

// ErrFrame is returned for a frame that is neither a header nor data.
var ErrFrame = errors.New("api: malformed frame")

// Frame is the Go form of a PutFrame or GetFrame: either a header (Header
// set, IsHeader true after a receive) or data. Send it with SendMsg and
// receive into it with RecvMsg on the streaming methods; the generated
// Send/Recv methods use the protobuf structs and copy.
type Frame struct {
	// Header is the header message to send, or, on receive, the message to
	// decode a header frame into (a *PutHeader or *GetHeader). A header
	// frame received with a nil Header is an error.
	Header proto.Message
	// IsHeader reports, after a receive, that the frame was a header.
	IsHeader bool
	// Data is a data frame's payload. On send the codec takes its own
	// references (the caller keeps its own); on receive the caller owns the
	// references and must Free them.
	Data mem.BufferSlice
}

// Codec returns a CodecV2 that marshals *Frame without copying the data
// payload and every other message as protobuf. Its name is "proto": the
// bytes it writes are valid protobuf for the declared messages, so peers
// that use the stock codec interoperate.
//
// Install it on a server with grpc.ForceServerCodecV2 and on streaming calls
// with grpc.ForceCodecV2.
func Codec() encoding.CodecV2 {
	return frameCodec{proto: encoding.GetCodecV2("proto")}
}

type frameCodec struct{ proto encoding.CodecV2 }

func (frameCodec) Name() string { return "proto" }

func (c frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*Frame)
	if !ok {
		return c.proto.Marshal(v)
	}
	if f.Header != nil {
		hb, err := proto.Marshal(f.Header)
		if err != nil {
			return nil, fmt.Errorf("api: marshal frame header: %w", err)
		}
		b := make([]byte, 0, binary.MaxVarintLen64+1+len(hb))
		b = append(b, tagHeader)
		b = binary.AppendUvarint(b, uint64(len(hb)))
		b = append(b, hb...)
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	prefix := make([]byte, 0, binary.MaxVarintLen64+1)
	prefix = append(prefix, tagData)
	prefix = binary.AppendUvarint(prefix, uint64(f.Data.Len()))
	out := make(mem.BufferSlice, 0, 1+len(f.Data))
	out = append(out, mem.SliceBuffer(prefix))
	for _, b := range f.Data {
		b.Ref()
		out = append(out, b)
	}
	return out, nil
}

func (c frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*Frame)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	var head [binary.MaxVarintLen64 + 1]byte
	n := data.CopyTo(head[:])
	if n < 2 {
		return fmt.Errorf("%w: %d bytes", ErrFrame, n)
	}
	size, vn := binary.Uvarint(head[1:n])
	if vn <= 0 {
		return fmt.Errorf("%w: bad length", ErrFrame)
	}
	skip := 1 + vn
	if total := data.Len(); uint64(total-skip) != size {
		return fmt.Errorf("%w: field of %d bytes in a frame of %d", ErrFrame, size, total)
	}
	switch head[0] {
	case tagHeader:
		if f.Header == nil {
			return fmt.Errorf("%w: unexpected header frame", ErrFrame)
		}
		payload := data.Materialize()[skip:]
		if err := proto.Unmarshal(payload, f.Header); err != nil {
			return fmt.Errorf("%w: header: %v", ErrFrame, err)
		}
		f.IsHeader, f.Data = true, nil
		return nil
	case tagData:
		f.IsHeader = false
		f.Data = sliceFrom(data, skip)
		return nil
	}
	return fmt.Errorf("%w: field tag %#x", ErrFrame, head[0])
}

// sliceFrom returns data without its first skip bytes, holding a new
// reference on each buffer it keeps.
func sliceFrom(data mem.BufferSlice, skip int) mem.BufferSlice {
	out := make(mem.BufferSlice, 0, len(data))
	for _, b := range data {
		l := b.Len()
		if skip >= l {
			skip -= l
			continue
		}
		if skip > 0 {
			out = append(out, b.Slice(skip, l)) // Slice takes a reference
			skip = 0
			continue
		}
		b.Ref()
		out = append(out, b)
	}
	return out
}
