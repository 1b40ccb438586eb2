package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	in := map[string]Tensor{
		"a.k":    {DType: "BF16", Shape: []int{2, 3}, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
		"tokens": {DType: "I64", Shape: []int{1}, Data: binary.LittleEndian.AppendUint64(nil, 42)},
		"scalar": {DType: "F32", Shape: []int{}, Data: []byte{0, 0, 128, 63}},
		"empty":  {DType: "U8", Shape: []int{0}, Data: []byte{}},
	}
	var buf bytes.Buffer
	if err := Write(&buf, in, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(buf.Bytes()); n%8 != 0 {
		t.Fatalf("header of %d bytes, want a multiple of 8", n)
	}
	out, meta, err := Parse(buf.Bytes())
	if err != nil || meta["format"] != "pt" || len(out) != len(in) {
		t.Fatalf("%v %v %d", err, meta, len(out))
	}
	for name, w := range in {
		g := out[name]
		if g.DType != w.DType || len(g.Shape) != len(w.Shape) || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("%s: %+v, want %+v", name, g, w)
		}
	}
}

func TestRefused(t *testing.T) {
	file := func(hdr string, data []byte) []byte {
		return append(append(binary.LittleEndian.AppendUint64(nil, uint64(len(hdr))), hdr...), data...)
	}
	for name, tc := range map[string]struct {
		b   []byte
		err error
	}{
		"short":           {[]byte{1, 2, 3}, ErrInvalid},
		"header past end": {binary.LittleEndian.AppendUint64(nil, 100), ErrInvalid},
		"huge header":     {binary.LittleEndian.AppendUint64(nil, 1<<62), ErrInvalid},
		"bad json":        {file(`{"a":`, nil), ErrInvalid},
		"unknown dtype":   {file(`{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}}`, make([]byte, 2)), ErrUnsupported},
		"size mismatch":   {file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8)), ErrInvalid},
		"past data":       {file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 8)), ErrInvalid},
		"negative dim":    {file(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, make([]byte, 8)), ErrInvalid},
		"too many":        {file(`{"a":{"dtype":"F32","shape":[65536,65536],"data_offsets":[0,8]}}`, make([]byte, 8)), ErrInvalid},
		"overlap": {file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`,
			make([]byte, 8)), ErrInvalid},
		"bad metadata": {file(`{"__metadata__":{"x":1}}`, nil), ErrInvalid},
	} {
		if _, _, err := Parse(tc.b); !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", name, err, tc.err)
		}
	}
	var buf bytes.Buffer
	if err := Write(&buf, map[string]Tensor{"a": {DType: "F32", Shape: []int{2}, Data: make([]byte, 4)}}, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("write of a short tensor: %v", err)
	}
	if err := Write(&buf, map[string]Tensor{"a": {DType: "F128", Shape: []int{1}, Data: make([]byte, 16)}}, nil); !errors.Is(err, ErrUnsupported) {
		t.Errorf("write of an unknown dtype: %v", err)
	}
}
