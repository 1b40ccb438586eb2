package api

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/pinned"
)

// split cuts b into a BufferSlice of pieces no longer than piece, as the
// transport hands received bytes over.
func split(b []byte, piece int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(piece, len(b))
		s = append(s, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return s
}

func TestFrameWireIsProtobuf(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	hdr := &PutHeader{Key: &Key{Content: &ID{Lo: 7, Hi: 9}}, BlobBytes: 12345, Direct: true}
	tests := []struct {
		name  string
		frame *Frame
		want  proto.Message
	}{
		{"header", &Frame{Header: hdr}, &PutFrame{Kind: &PutFrame_Header{Header: hdr}}},
		{"empty data", &Frame{Data: nil}, &PutFrame{Kind: &PutFrame_Data{Data: []byte{}}}},
		{"small data", &Frame{Data: mem.BufferSlice{mem.SliceBuffer("hello")}}, &PutFrame{Kind: &PutFrame_Data{Data: []byte("hello")}}},
	}
	big := make([]byte, 300_000)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	tests = append(tests, struct {
		name  string
		frame *Frame
		want  proto.Message
	}{"multi-buffer data", &Frame{Data: split(big, 16384)}, &PutFrame{Kind: &PutFrame_Data{Data: big}}})

	c := Codec()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Marshal(tt.frame)
			if err != nil {
				t.Fatal(err)
			}
			wire := got.Materialize()
			got.Free()
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(tt.want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(wire, want) {
				t.Fatalf("wire differs from protobuf: %d vs %d bytes", len(wire), len(want))
			}
			// And back, from pieces of every size.
			pieces := []int{1, 3, 1000, len(wire) + 1}
			if len(wire) > 10000 {
				pieces = []int{1000, 16384, len(wire) + 1}
			}
			for _, piece := range pieces {
				f := Frame{Header: &PutHeader{}}
				if err := c.Unmarshal(split(wire, piece), &f); err != nil {
					t.Fatalf("piece %d: %v", piece, err)
				}
				if tt.frame.Header != nil {
					if !f.IsHeader || !proto.Equal(f.Header, tt.frame.Header) {
						t.Fatalf("piece %d: header %v, want %v", piece, f.Header, tt.frame.Header)
					}
					continue
				}
				if f.IsHeader || !bytes.Equal(f.Data.Materialize(), tt.frame.Data.Materialize()) {
					t.Fatalf("piece %d: data differs", piece)
				}
				f.Data.Free()
			}
		})
	}
}

func TestFrameUnmarshalRejects(t *testing.T) {
	c := Codec()
	tests := []struct {
		name   string
		wire   []byte
		header bool
	}{
		{"empty", nil, true},
		{"one byte", []byte{tagData}, true},
		{"unknown field", []byte{3<<3 | 2, 1, 0}, true},
		{"truncated", []byte{tagData, 5, 1, 2}, true},
		{"trailing", []byte{tagData, 1, 1, 2}, true},
		{"header without target", []byte{tagHeader, 0}, false},
		{"bad header", []byte{tagHeader, 2, 0xff, 0xff}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Frame{}
			if tt.header {
				f.Header = &PutHeader{}
			}
			err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tt.wire)}, &f)
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("err = %v, want ErrFrame", err)
			}
		})
	}
}

func TestCodecDelegatesProto(t *testing.T) {
	c := Codec()
	in := &ClusterInfoResponse{NodeId: "n1", Epoch: 4, Members: []*Member{{Id: "n2", GrpcAddr: "127.0.0.1:1"}}}
	b, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out := &ClusterInfoResponse{}
	if err := c.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("got %v, want %v", out, in)
	}
}

func TestPinnedBufferReleasesOnce(t *testing.T) {
	for _, size := range []int{10, 1 << 20} {
		released := 0
		data := make([]byte, size)
		b := PinnedBuffer(pinned.NewFunc(data, func() { released++ }))
		parts := []mem.Buffer{b.Slice(0, size/2), b.Slice(size/2, size)}
		b.Free()
		if size > 1024 && released != 0 {
			t.Fatalf("size %d: released while slices live", size)
		}
		for _, p := range parts {
			p.Free()
		}
		if released != 1 {
			t.Fatalf("size %d: released %d times, want 1", size, released)
		}
	}
}

func FuzzFrameUnmarshal(f *testing.F) {
	f.Add([]byte{tagData, 3, 1, 2, 3}, 2)
	f.Add([]byte{tagHeader, 2, 0x10, 0x05}, 1)
	f.Add([]byte{tagData, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 4)
	f.Add([]byte{}, 1)
	c := Codec()
	f.Fuzz(func(t *testing.T, wire []byte, piece int) {
		if piece <= 0 || piece > 1<<16 {
			piece = 1 + (piece&0xff)%64
		}
		fr := Frame{Header: &PutHeader{}}
		err := c.Unmarshal(split(wire, piece), &fr)
		if err != nil {
			return
		}
		// Anything accepted must be valid protobuf for PutFrame, and say the same.
		var pf PutFrame
		if perr := proto.Unmarshal(wire, &pf); perr != nil {
			t.Fatalf("codec accepted what protobuf rejects: %v", perr)
		}
		if fr.IsHeader {
			if pf.GetHeader() == nil || !proto.Equal(pf.GetHeader(), fr.Header) {
				t.Fatalf("header differs from protobuf's reading")
			}
			return
		}
		if !bytes.Equal(pf.GetData(), fr.Data.Materialize()) {
			t.Fatalf("data differs from protobuf's reading")
		}
		fr.Data.Free()
	})
}
