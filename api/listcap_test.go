package api

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

func lookupCaps(max int) []ListCap {
	return []ListCap{{Field: (&LookupRequest{}).ProtoReflect().Descriptor().Fields().ByName("items"), Max: max}}
}

func lookupOf(items int) *LookupRequest {
	req := &LookupRequest{Fingerprint: &ID{Lo: 1, Hi: 2}, Direct: true}
	for i := range items {
		req.Items = append(req.Items, &LookupItem{Content: &ID{Lo: uint64(i)}})
	}
	return req
}

// TestCapLists: a Lookup within its cap decodes whole; one over it
// decodes with cap+1 items and every other field, whatever their order.
func TestCapLists(t *testing.T) {
	c := CapLists(Codec(), lookupCaps(4)...)
	for _, tc := range []struct{ items, want int }{{0, 0}, {4, 4}, {5, 5}, {6, 5}, {1000, 5}} {
		b, err := proto.Marshal(lookupOf(tc.items))
		if err != nil {
			t.Fatal(err)
		}
		// The fingerprint last: fields after the list survive the cut.
		tail, err := proto.Marshal(&LookupRequest{Fingerprint: &ID{Lo: 9}})
		if err != nil {
			t.Fatal(err)
		}
		var got LookupRequest
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(append(b, tail...))}, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Items) != tc.want || !got.Direct || got.GetFingerprint().GetLo() != 9 {
			t.Errorf("%d items: decoded %d items, direct %v, fingerprint %v; want %d", tc.items, len(got.Items), got.Direct, got.Fingerprint, tc.want)
		}
		for i, it := range got.Items {
			if it.GetContent().GetLo() != uint64(i) {
				t.Fatalf("%d items: item %d is %v", tc.items, i, it)
			}
		}
	}
	// Other messages are not touched.
	var d DeleteRequest
	b, _ := proto.Marshal(&DeleteRequest{Key: &Key{Fingerprint: &ID{Lo: 3}}})
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &d); err != nil || d.GetKey().GetFingerprint().GetLo() != 3 {
		t.Errorf("delete request: %v %v", &d, err)
	}
}

// FuzzCapLists: on any bytes, a capped decode fails exactly when the
// plain one does, holds at most cap+1 items, and equals the plain decode
// when the list is within its cap.
func FuzzCapLists(f *testing.F) {
	for _, n := range []int{0, 3, 4, 9} {
		b, _ := proto.Marshal(lookupOf(n))
		f.Add(b)
	}
	f.Add([]byte{0x12, 100, 1})
	f.Add([]byte{0x12, 0, 0x12, 0, 0x12, 0, 0x12, 0, 0x12, 0, 0x12, 0})
	const max = 3
	c := CapLists(Codec(), lookupCaps(max)...)
	f.Fuzz(func(t *testing.T, b []byte) {
		var plain, capped LookupRequest
		perr := proto.Unmarshal(b, &plain)
		cerr := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &capped)
		if (perr == nil) != (cerr == nil) {
			// A cut list can drop a later element that would not decode:
			// then only the capped decode succeeds, and it is over its cap.
			if perr == nil || len(capped.Items) != max+1 {
				t.Fatalf("plain decode: %v, capped: %v", perr, cerr)
			}
		}
		if cerr != nil {
			return
		}
		if len(capped.Items) > max+1 {
			t.Fatalf("%d items decoded past the cap of %d", len(capped.Items), max)
		}
		if perr == nil && len(plain.Items) <= max && !proto.Equal(&plain, &capped) {
			t.Fatalf("within the cap the decodes differ: %v, %v", &plain, &capped)
		}
	})
}
