package api

import (
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/chunk"
)

// A FetchMany stream (Peer.FetchMany) carries the stored entries of many
// keys: header frames answering every key in request order
// (FetchManyEntry: found with the entry's head and size, or a status
// code; as many per frame as fit about one data frame), then the found
// entries' encoded layers as one byte sequence cut into data frames of any
// size, ordered by layer, then by key. SendFetchMany and RecvFetchMany are
// its two ends; layerOrder is the one rule of that order.

// FetchManyItem is one key's answer to send: Head (the parsed header of
// Blob) and Blob when the key was found, else Code.
type FetchManyItem struct {
	Head *chunk.Header
	// Blob is the whole stored entry; SendFetchMany takes references on
	// slices of it and the caller keeps (and frees) its own.
	Blob mem.Buffer
	Code codes.Code
}

// layerOrder calls fn(i, l) for layer l of entry i in stream order: every
// entry's layer 0 (in entry order), then every entry's layer 1, and so on;
// layers[i] is entry i's layer count (0 for an entry not found). It stops
// when fn returns false.
func layerOrder(layers []int, fn func(i, l int) bool) {
	most := 0
	for _, n := range layers {
		most = max(most, n)
	}
	for l := range most {
		for i, n := range layers {
			if l < n && !fn(i, l) {
				return
			}
		}
	}
}

// SendFetchMany sends the heads of items, then their layers in
// stream order as data frames of at most frameBytes (0 means
// DefaultFrameBytes). Layer bytes are not copied: frames reference the
// items' blobs.
func SendFetchMany(s MsgSender, items []FetchManyItem, frameBytes int) error {
	if frameBytes <= 0 {
		frameBytes = DefaultFrameBytes
	}
	layers := make([]int, len(items))
	heads := &FetchManyHeads{}
	headBytes := 0
	for i, it := range items {
		e := &FetchManyEntry{Code: uint32(it.Code)}
		if it.Head != nil {
			e.Found, e.Code, e.TotalBytes = true, 0, uint64(it.Blob.Len())
			e.Head = it.Blob.ReadOnlyData()[:it.Head.PayloadStart]
			layers[i] = len(it.Head.Layers)
		}
		heads.Entries = append(heads.Entries, e)
		headBytes += len(e.Head) + 16
		if headBytes >= frameBytes || i == len(items)-1 {
			if err := SendHeader(s, heads); err != nil {
				return err
			}
			heads, headBytes = &FetchManyHeads{}, 0
		}
	}
	var (
		frame mem.BufferSlice
		size  int
		err   error
	)
	flush := func() bool {
		if size == 0 {
			return true
		}
		err = s.SendMsg(&Frame{Data: frame})
		frame.Free()
		frame, size = nil, 0
		return err == nil
	}
	layerOrder(layers, func(i, l int) bool {
		it := &items[i]
		ref := it.Head.Layers[l]
		at := it.Head.PayloadStart + int(ref.Offset)
		end := at + int(ref.Length)
		for at < end {
			n := min(end-at, frameBytes-size)
			frame = append(frame, it.Blob.Slice(at, at+n))
			size += n
			at += n
			if size == frameBytes && !flush() {
				return false
			}
		}
		return true
	})
	if err != nil {
		frame.Free()
		return err
	}
	flush()
	return err
}

// FetchManySink receives a FetchMany stream's entries as RecvFetchMany
// reads them, on its goroutine.
type FetchManySink interface {
	// Found announces entry i: blob is its whole size, with the head in
	// place and parsed as hd (checksummed); its layers follow. blob is
	// the sink's from now on: RecvFetchMany writes each layer into it
	// before calling Layer.
	Found(i int, blob []byte, hd *chunk.Header)
	// Missing says the sender does not hold entry i.
	Missing(i int, code codes.Code)
	// Layer says layer l of entry i is in its blob (not yet checked
	// against its checksum). Layers of an entry come in order.
	Layer(i, l int)
}

// ErrFetchMany is returned for a FetchMany stream that breaks its format:
// fewer or more headers or bytes than it announced, or a head that does
// not parse.
var ErrFetchMany = errors.New("api: malformed FetchMany stream")

// RecvFetchMany reads a FetchMany stream of n entries into sink: every
// header first (each found entry's blob is allocated at its announced size,
// at most lim.MaxBlobBytes, and its head parsed and checked), then the
// layers in stream order, each announced once its bytes are in place. It
// returns nil once every layer arrived, or the error that ended the
// stream; the sink keeps what it was given either way.
func RecvFetchMany(r MsgReceiver, n int, lim chunk.Limits, sink FetchManySink) error {
	if lim == (chunk.Limits{}) {
		lim = chunk.DefaultLimits
	}
	blobs := make([][]byte, n)
	heads := make([]*chunk.Header, n)
	layers := make([]int, n)
	var got []*FetchManyEntry
	for i := range n {
		if len(got) == 0 {
			var h FetchManyHeads
			if err := RecvHeader(r, &h); err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("%w: %d of %d headers", ErrFetchMany, i, n)
				}
				return err
			}
			if got = h.Entries; len(got) == 0 || len(got) > n-i {
				return fmt.Errorf("%w: %d headers after %d of %d", ErrFetchMany, len(got), i, n)
			}
		}
		e := got[0]
		got = got[1:]
		if !e.Found {
			sink.Missing(i, codes.Code(e.Code))
			continue
		}
		if e.TotalBytes > uint64(lim.MaxBlobBytes) || e.TotalBytes < uint64(len(e.Head)) {
			return fmt.Errorf("%w: entry %d of %d bytes (head %d, limit %d)", ErrFetchMany, i, e.TotalBytes, len(e.Head), lim.MaxBlobBytes)
		}
		blob := make([]byte, e.TotalBytes)
		copy(blob, e.Head)
		hd, err := chunk.ParseHeader(blob, lim)
		if err != nil {
			return fmt.Errorf("%w: entry %d: %w", ErrFetchMany, i, err)
		}
		if hd.PayloadStart != len(e.Head) {
			return fmt.Errorf("%w: entry %d: head of %d bytes, header says %d", ErrFetchMany, i, len(e.Head), hd.PayloadStart)
		}
		blobs[i], heads[i], layers[i] = blob, &hd, len(hd.Layers)
		sink.Found(i, blob, &hd)
	}
	// The layers as one sequence of destination ranges, filled in order
	// from the data frames' bytes.
	type part struct{ i, l, at, end int }
	var parts []part
	layerOrder(layers, func(i, l int) bool {
		ref := heads[i].Layers[l]
		at := heads[i].PayloadStart + int(ref.Offset)
		parts = append(parts, part{i, l, at, at + int(ref.Length)})
		return true
	})
	next := 0
	// Empty layers are complete before any byte arrives.
	skip := func() {
		for next < len(parts) && parts[next].at == parts[next].end {
			sink.Layer(parts[next].i, parts[next].l)
			next++
		}
	}
	skip()
	for next < len(parts) {
		var f Frame
		if err := r.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%w: %w", ErrFetchMany, ErrShortBody)
			}
			return err
		}
		if f.IsHeader {
			return fmt.Errorf("%w: header frame inside the body", ErrFetchMany)
		}
		for _, b := range f.Data {
			src := b.ReadOnlyData()
			for len(src) > 0 {
				if next == len(parts) {
					f.Data.Free()
					return fmt.Errorf("%w: %w", ErrFetchMany, ErrLongBody)
				}
				p := &parts[next]
				c := copy(blobs[p.i][p.at:p.end], src)
				src, p.at = src[c:], p.at+c
				skip()
			}
		}
		f.Data.Free()
	}
	// Nothing may follow the last layer.
	var f Frame
	switch err := r.RecvMsg(&f); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err
	default:
		f.Data.Free()
		return fmt.Errorf("%w: %w", ErrFetchMany, ErrLongBody)
	}
}
