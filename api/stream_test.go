package api

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/mem"
)

// frames is a MsgReceiver replaying data frames (nil: a header frame),
// then io.EOF.
type frames [][]byte

func (f *frames) RecvMsg(m any) error {
	if len(*f) == 0 {
		return io.EOF
	}
	next := (*f)[0]
	*f = (*f)[1:]
	fr := m.(*Frame)
	if next == nil {
		fr.IsHeader = true
		return nil
	}
	fr.Data = mem.BufferSlice{mem.SliceBuffer(bytes.Clone(next))}
	return nil
}

func TestRecvBodyGrow(t *testing.T) {
	body := make([]byte, 1000)
	for i := range body {
		body[i] = byte(i * 7)
	}
	split := func(sizes ...int) frames {
		var out frames
		off := 0
		for _, n := range sizes {
			out = append(out, body[off:off+n])
			off += n
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		in      frames
		total   int
		initial int
		err     error
	}{
		{"one frame", split(1000), 1000, 4096, nil},
		{"grows from small", split(3, 300, 1, 696), 1000, 8, nil},
		{"no initial room", split(500, 500), 1000, 0, nil},
		{"frame past the end", split(600, 400), 900, 64, ErrLongBody},
		{"short", split(300), 1000, 64, ErrShortBody},
		{"header inside", append(split(300), nil), 1000, 64, ErrFrame},
		{"empty body", nil, 0, 64, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			got, err := RecvBodyGrow(&in, tc.total, tc.initial)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err == nil && !bytes.Equal(got, body[:tc.total]) {
				t.Fatal("body differs")
			}
			if err == nil && cap(got) > tc.total {
				t.Fatalf("capacity %d beyond the total %d", cap(got), tc.total)
			}
			// The same from a pool: the same bytes and errors, in a
			// buffer of a size class.
			var pool BodyPool
			in = tc.in
			got, perr := pool.RecvBody(&in, tc.total, tc.initial)
			if !errors.Is(perr, tc.err) || (tc.err == nil) != (perr == nil) {
				t.Fatalf("pooled: err %v, want %v", perr, tc.err)
			}
			if perr == nil && !bytes.Equal(got, body[:tc.total]) {
				t.Fatal("pooled: body differs")
			}
		})
	}
}

// TestBodyPoolRecycles: a buffer put back is the next one of its size
// class, and capacities are size classes.
func TestBodyPoolRecycles(t *testing.T) {
	var p BodyPool
	b := p.Get(100 << 10)
	if cap(b) != 128<<10 || len(b) != 0 {
		t.Fatalf("len %d cap %d, want 0 and 128 KiB", len(b), cap(b))
	}
	b = append(b, 1)
	p.Put(b)
	// sync.Pool may drop any item (under the race detector a quarter of
	// them): some buffer put back must come out again, not necessarily b.
	put := map[*byte]bool{&b[0]: true}
	var reused bool
	for range 10 {
		c := p.Get(70 << 10)
		reused = reused || put[&c[:1][0]]
		put[&c[:1][0]] = true
		p.Put(c)
	}
	if !reused {
		t.Fatal("a recycled buffer was never handed out again")
	}
	if got := cap(p.Get(200 << 20)); got != 200<<20 {
		t.Fatalf("over the largest class: cap %d", got)
	}
	p.Put(make([]byte, 0, 100<<10)) // not a size class: dropped
}

// TestRecvBodyGrowHeaderReservesNothing: a header announcing a 1 TiB
// body followed by 100 bytes fails as short instead of allocating the
// announced size (a make of 1 TiB would not return).
func TestRecvBodyGrowHeaderReservesNothing(t *testing.T) {
	in := frames{make([]byte, 100)}
	if _, err := RecvBodyGrow(&in, 1<<40, 1024); !errors.Is(err, ErrShortBody) {
		t.Fatalf("err %v", err)
	}
}
