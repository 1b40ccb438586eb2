package api

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// wire is a stream through the frame codec: SendMsg marshals a message to
// its wire bytes, RecvMsg unmarshals the next one, then io.EOF.
type wire struct{ msgs [][]byte }

func (w *wire) SendMsg(m any) error {
	bs, err := Codec().Marshal(m)
	if err != nil {
		return err
	}
	w.msgs = append(w.msgs, bs.Materialize())
	bs.Free()
	return nil
}

func (w *wire) RecvMsg(m any) error {
	if len(w.msgs) == 0 {
		return io.EOF
	}
	next := w.msgs[0]
	w.msgs = w.msgs[1:]
	return Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(next)}, m)
}

// sinkLog records what RecvFetchMany announces.
type sinkLog struct {
	events []string
	blobs  map[int][]byte
}

func (s *sinkLog) Found(i int, blob []byte, hd *chunk.Header) {
	s.events = append(s.events, fmt.Sprintf("found %d", i))
	s.blobs[i] = blob
}
func (s *sinkLog) Missing(i int, code codes.Code) {
	s.events = append(s.events, fmt.Sprintf("missing %d %v", i, code))
}
func (s *sinkLog) Layer(i, l int) { s.events = append(s.events, fmt.Sprintf("layer %d %d", i, l)) }

// TestFetchManyStream: a FetchMany stream carries every found entry's
// bytes unchanged, announces headers in request order, then each layer
// once its bytes are in place, ordered by layer then by entry, at any
// frame size; a missing entry keeps its code; a stream cut short or
// carrying extra bytes is an error.
func TestFetchManyStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	spec := testutil.Spec()
	var blobs [][]byte
	var items []FetchManyItem
	for i, codec := range []chunk.Codec{chunk.CodecRaw, 0, chunk.CodecLossless} {
		if i == 1 {
			blobs = append(blobs, nil)
			items = append(items, FetchManyItem{Code: codes.Unavailable})
			continue
		}
		e := testutil.NewEntry(rng, spec, testutil.Tokens(rng, 3+i), chunk.StandaloneContext())
		b := testutil.Encode(t, e, codec)
		hd, err := chunk.ParseHeader(b, chunk.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, b)
		items = append(items, FetchManyItem{Head: &hd, Blob: mem.SliceBuffer(b)})
	}
	var want []string
	want = append(want, "found 0", "missing 1 Unavailable", "found 2")
	for l := range spec.Layers {
		want = append(want, fmt.Sprintf("layer 0 %d", l), fmt.Sprintf("layer 2 %d", l))
	}
	for _, frame := range []int{7, 1000, 0} {
		t.Run(fmt.Sprintf("frame=%d", frame), func(t *testing.T) {
			var w wire
			if err := SendFetchMany(&w, items, frame); err != nil {
				t.Fatal(err)
			}
			full := slices.Clone(w.msgs)
			s := &sinkLog{blobs: map[int][]byte{}}
			if err := RecvFetchMany(&w, len(items), chunk.Limits{}, s); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.events, want) {
				t.Fatalf("events\n%v\nwant\n%v", s.events, want)
			}
			for i, b := range blobs {
				if b != nil && !bytes.Equal(s.blobs[i], b) {
					t.Fatalf("entry %d differs", i)
				}
			}
			// Cut before the last data frame: short.
			w.msgs = full[:len(full)-1]
			if err := RecvFetchMany(&w, len(items), chunk.Limits{}, &sinkLog{blobs: map[int][]byte{}}); !errors.Is(err, ErrShortBody) {
				t.Fatalf("cut stream: %v", err)
			}
			// A frame more: long.
			w.msgs = append(slices.Clone(full), full[len(full)-1])
			if err := RecvFetchMany(&w, len(items), chunk.Limits{}, &sinkLog{blobs: map[int][]byte{}}); !errors.Is(err, ErrLongBody) {
				t.Fatalf("extra frame: %v", err)
			}
			// Only the first header frame (at frame=7, one head per frame).
			w.msgs = full[:1]
			if err := RecvFetchMany(&w, len(items), chunk.Limits{}, &sinkLog{blobs: map[int][]byte{}}); !errors.Is(err, ErrFetchMany) {
				t.Fatalf("missing headers: %v", err)
			}
		})
	}
	// An entry announced beyond the limits is refused before anything is
	// allocated for it.
	var w wire
	if err := SendFetchMany(&w, items[:1], 0); err != nil {
		t.Fatal(err)
	}
	lim := chunk.DefaultLimits
	lim.MaxBlobBytes = len(blobs[0]) - 1
	if err := RecvFetchMany(&w, 1, lim, &sinkLog{blobs: map[int][]byte{}}); !errors.Is(err, ErrFetchMany) {
		t.Fatalf("entry beyond the limits: %v", err)
	}
}
