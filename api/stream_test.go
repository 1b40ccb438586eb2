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
		})
	}
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
