// Package safetensors reads and writes the safetensors file format (an
// 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the data) for files held in memory. It
// knows the format only: a tensor is its dtype name, shape and raw
// little-endian bytes, a view of the file. The reference engine's weight
// loader and `kvmesh encode` both read through it.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// Errors callers branch on.
var (
	// ErrInvalid: bytes that are not a safetensors file.
	ErrInvalid = errors.New("safetensors: invalid file")
	// ErrUnsupported: a dtype this package does not know.
	ErrUnsupported = errors.New("safetensors: unsupported")
)

// MaxHeader bounds the JSON header a reader accepts, so a hostile length
// field cannot make it allocate (HF's own limit is 100 MB).
const MaxHeader = 100 << 20

// sizes is the element size of each dtype the format names.
var sizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"U16": 2, "I16": 2, "F16": 2, "BF16": 2,
	"U32": 4, "I32": 4, "F32": 4,
	"U64": 8, "I64": 8, "F64": 8,
}

// Size is the element size of dtype in bytes, 0 for a name the format does
// not have.
func Size(dtype string) int { return sizes[dtype] }

// Tensor is one tensor of a file: its dtype name ("F32", "BF16", "I64",
// ...), its shape, and its little-endian bytes (a view of the file Parse
// read).
type Tensor struct {
	DType string
	Shape []int
	Data  []byte
}

// NumElements is the product of the shape.
func (t Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

type entry struct {
	DType   string   `json:"dtype"`
	Shape   []int    `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// Parse reads a whole file held in memory: every tensor (its Data a view of
// b) and the __metadata__ map. It refuses a header past the file, byte
// ranges that do not match their shape or overlap, an unknown dtype
// (ErrUnsupported) and shapes of more than 2^31-1 elements.
func Parse(b []byte) (map[string]Tensor, map[string]string, error) {
	if len(b) < 8 {
		return nil, nil, fmt.Errorf("%w: %d bytes is shorter than the header length", ErrInvalid, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeader || n > uint64(len(b)-8) {
		return nil, nil, fmt.Errorf("%w: header length %d exceeds file (%d bytes)", ErrInvalid, n, len(b))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return nil, nil, fmt.Errorf("%w: header: %v", ErrInvalid, err)
	}
	data := b[8+n:]
	var meta map[string]string
	type span struct {
		lo, hi int64
		name   string
	}
	var spans []span
	out := make(map[string]Tensor, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, fmt.Errorf("%w: metadata: %v", ErrInvalid, err)
			}
			continue
		}
		var e entry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, nil, fmt.Errorf("%w: tensor %q: %v", ErrInvalid, name, err)
		}
		size := sizes[e.DType]
		if size == 0 {
			return nil, nil, fmt.Errorf("%w: tensor %q: dtype %q", ErrUnsupported, name, e.DType)
		}
		elems := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && elems > math.MaxInt32/int64(d)) {
				return nil, nil, fmt.Errorf("%w: tensor %q shape %v", ErrInvalid, name, e.Shape)
			}
			elems *= int64(d)
		}
		lo, hi := e.Offsets[0], e.Offsets[1]
		if lo < 0 || hi < lo || hi > int64(len(data)) || hi-lo != elems*int64(size) {
			return nil, nil, fmt.Errorf("%w: tensor %q offsets [%d,%d) for %d %s elements in %d data bytes", ErrInvalid, name, lo, hi, elems, e.DType, len(data))
		}
		spans = append(spans, span{lo, hi, name})
		shape := e.Shape
		if shape == nil {
			shape = []int{}
		}
		out[name] = Tensor{DType: e.DType, Shape: shape, Data: data[lo:hi:hi]}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return nil, nil, fmt.Errorf("%w: tensors %q and %q overlap", ErrInvalid, spans[i-1].name, spans[i].name)
		}
	}
	return out, meta, nil
}

// Info is a tensor as Header lays it out: its name, dtype and shape.
type Info struct {
	Name  string
	DType string
	Shape []int
}

// Header is the start of a file holding tensors in the order given (their
// data follows it in that order): the header length and the JSON header,
// padded with spaces to a multiple of 8 bytes as HF does.
func Header(tensors []Info, meta map[string]string) ([]byte, error) {
	hdr := make(map[string]any, len(tensors)+1)
	if len(meta) > 0 {
		hdr["__metadata__"] = meta
	}
	var off int64
	for _, t := range tensors {
		size := sizes[t.DType]
		if size == 0 {
			return nil, fmt.Errorf("%w: tensor %q: dtype %q", ErrUnsupported, t.Name, t.DType)
		}
		if _, dup := hdr[t.Name]; dup || t.Name == "" {
			return nil, fmt.Errorf("%w: tensor name %q empty, reserved or given twice", ErrInvalid, t.Name)
		}
		n := int64(size)
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("%w: tensor %q shape %v", ErrInvalid, t.Name, t.Shape)
			}
			n *= int64(d)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[t.Name] = entry{DType: t.DType, Shape: shape, Offsets: [2]int64{off, off + n}}
		off += n
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(js))), js...), nil
}

// Write writes tensors in name order: Header, then each one's Data, which
// must hold exactly its shape's bytes.
func Write(w io.Writer, tensors map[string]Tensor, meta map[string]string) error {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	infos := make([]Info, len(names))
	for i, n := range names {
		t := tensors[n]
		if Size(t.DType) == 0 {
			return fmt.Errorf("%w: tensor %q: dtype %q", ErrUnsupported, n, t.DType)
		}
		if len(t.Data) != t.NumElements()*Size(t.DType) {
			return fmt.Errorf("%w: tensor %q shape %v holds %d bytes of %s", ErrInvalid, n, t.Shape, len(t.Data), t.DType)
		}
		infos[i] = Info{n, t.DType, t.Shape}
	}
	hdr, err := Header(infos, meta)
	if err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	for _, n := range names {
		if _, err := w.Write(tensors[n].Data); err != nil {
			return fmt.Errorf("safetensors: write: %w", err)
		}
	}
	return nil
}
