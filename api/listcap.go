package api

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ListCap caps one repeated field of a message a server receives.
type ListCap struct {
	// Field is the repeated field (of a top-level request message): a
	// list of messages, strings or bytes, whose every element is one
	// field on the wire. A packed list of scalars is one field per run.
	Field protoreflect.FieldDescriptor
	// Max is the most elements a handler accepts.
	Max int
}

// counts reports whether a field of number num and wire type typ is an
// element of the capped list. An element of a list of messages, strings or
// bytes is length-delimited; the same number with another wire type is not
// an element (the decoder keeps it as an unknown field), so it is neither
// counted nor cut.
func (lc ListCap) counts(num protowire.Number, typ protowire.Type) bool {
	return num == lc.Field.Number() && typ == protowire.BytesType
}

// CapLists returns c with caps on the lists of the messages it decodes. A
// message whose capped field holds more than Max elements is decoded with
// only the first Max+1 (every other field kept), so the handler, which
// refuses a list over Max, sees one too long without the node decoding
// them all: a request's decoded size is bounded by its caps, not by the
// receive limit (a two-byte empty element decodes into a struct of a
// hundred). Messages without caps pass through unchanged.
func CapLists(c encoding.CodecV2, caps ...ListCap) encoding.CodecV2 {
	m := make(map[protoreflect.FullName][]ListCap)
	for _, lc := range caps {
		name := lc.Field.ContainingMessage().FullName()
		m[name] = append(m[name], lc)
	}
	return capCodec{CodecV2: c, caps: m}
}

type capCodec struct {
	encoding.CodecV2
	caps map[protoreflect.FullName][]ListCap
}

func (c capCodec) Unmarshal(data mem.BufferSlice, v any) error {
	pm, ok := v.(proto.Message)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	caps := c.caps[pm.ProtoReflect().Descriptor().FullName()]
	if len(caps) == 0 {
		return c.CodecV2.Unmarshal(data, v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	cut, ok := TruncateLists(b, caps)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	return proto.Unmarshal(cut, pm)
}

// TruncateLists returns b, the wire form of a message, without the
// elements of each capped field beyond its first Max+1, and true; or
// false when no capped field is over its cap (b is then not copied).
// Malformed wire bytes are left for the decoder to refuse (false).
func TruncateLists(b []byte, caps []ListCap) ([]byte, bool) {
	counts := make([]int, len(caps))
	over := false
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return nil, false
		}
		rest = rest[n+m:]
		for i, lc := range caps {
			if lc.counts(num, typ) {
				counts[i]++
				over = over || counts[i] > lc.Max
			}
		}
	}
	if !over {
		return nil, false
	}
	out := make([]byte, 0, len(b))
	clear(counts)
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		field := rest[:n+m]
		rest = rest[n+m:]
		keep := true
		for i, lc := range caps {
			if lc.counts(num, typ) {
				counts[i]++
				keep = counts[i] <= lc.Max+1
			}
		}
		if keep {
			out = append(out, field...)
		}
	}
	return out, true
}
