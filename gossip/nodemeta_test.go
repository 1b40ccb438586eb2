package gossip

import (
	"errors"
	"strings"
	"testing"
)

func TestNodeMetaRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		m    NodeMeta
	}{
		{"id only", NodeMeta{ID: "n1"}},
		{"full", NodeMeta{
			ID: "node-a", GRPCAddr: "127.0.0.1:7001", RaftAddr: "127.0.0.1:7002", HTTPAddr: "127.0.0.1:7003",
			Capacity: Capacity{GPUBytes: 80 << 30, DRAMBytes: 512 << 30, DiskBytes: 4 << 40},
		}},
		{"leaving", NodeMeta{ID: "x", Leaving: true}},
		{"incarnation", NodeMeta{ID: "z", GRPCAddr: "a:1", Incarnation: 1795958201129857502}},
		{"max capacities", NodeMeta{ID: "y", Capacity: Capacity{^uint64(0), ^uint64(0), ^uint64(0)}}},
		{"ipv6 and unicode", NodeMeta{ID: "nœud-é", GRPCAddr: "[::1]:7001"}},
		{"long but fits", NodeMeta{ID: strings.Repeat("a", 200), GRPCAddr: strings.Repeat("b", 200), RaftAddr: strings.Repeat("c", 60)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.m.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if len(b) > MetaMaxSize {
				t.Fatalf("%d bytes", len(b))
			}
			var got NodeMeta
			if err := got.UnmarshalBinary(b); err != nil {
				t.Fatal(err)
			}
			if got != tc.m {
				t.Fatalf("got %+v, want %+v", got, tc.m)
			}
			// Later versions append fields; this one must skip them.
			var ext NodeMeta
			if err := ext.UnmarshalBinary(append(b, 0x7f, 1, 2)); err != nil || ext != tc.m {
				t.Fatalf("with trailing fields: %+v, %v", ext, err)
			}
		})
	}
	// A typical node's metadata is small.
	b, _ := tests[1].m.MarshalBinary()
	if len(b) > 80 {
		t.Errorf("typical meta takes %d bytes", len(b))
	}
}

// TestNodeMetaWithoutIncarnation: metadata of a version that did not
// encode the incarnation decodes with Incarnation 0.
func TestNodeMetaWithoutIncarnation(t *testing.T) {
	m := NodeMeta{ID: "n", GRPCAddr: "a:1", Capacity: Capacity{DRAMBytes: 5}, Incarnation: 7}
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var old NodeMeta
	if err := old.UnmarshalBinary(b[:len(b)-1]); err != nil {
		t.Fatal(err)
	}
	m.Incarnation = 0
	if old != m {
		t.Fatalf("got %+v, want %+v", old, m)
	}
}

func TestNodeMetaGossipAddrNotEncoded(t *testing.T) {
	b, err := NodeMeta{ID: "a", GossipAddr: "1.2.3.4:5"}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var m NodeMeta
	if err := m.UnmarshalBinary(b); err != nil || m.GossipAddr != "" {
		t.Fatalf("%+v %v", m, err)
	}
}

func TestNodeMetaErrors(t *testing.T) {
	if _, err := (NodeMeta{}).MarshalBinary(); !errors.Is(err, ErrMetaInvalid) {
		t.Errorf("empty ID: %v", err)
	}
	if _, err := (NodeMeta{ID: strings.Repeat("x", 600)}).MarshalBinary(); !errors.Is(err, ErrMetaTooLarge) {
		t.Errorf("too large: %v", err)
	}
	good, _ := NodeMeta{ID: "n", GRPCAddr: "a:1"}.MarshalBinary()
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrMetaInvalid},
		{"one byte", []byte{1}, ErrMetaInvalid},
		{"bad version", append([]byte{9}, good[1:]...), ErrMetaInvalid},
		{"truncated string", good[:4], ErrMetaInvalid},
		{"truncated capacity", good[:len(good)-2], ErrMetaInvalid},
		{"truncated incarnation", append(good[:len(good)-1], 0x80), ErrMetaInvalid},
		{"huge length", []byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, ErrMetaInvalid},
		{"empty id", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0}, ErrMetaInvalid},
		{"not utf8", []byte{1, 0, 2, 0xff, 0xfe, 0, 0, 0, 0, 0, 0}, ErrMetaInvalid},
		{"oversized", make([]byte, MetaMaxSize+1), ErrMetaTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m NodeMeta
			if err := m.UnmarshalBinary(tc.b); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestCapacityTotalSaturates(t *testing.T) {
	if tot := (Capacity{^uint64(0), 5, 0}).Total(); tot != ^uint64(0) {
		t.Fatalf("Total does not saturate: %d", tot)
	}
}

func FuzzNodeMeta(f *testing.F) {
	for _, m := range []NodeMeta{
		{ID: "n1"},
		{ID: "node-a", GRPCAddr: "127.0.0.1:7001", RaftAddr: "127.0.0.1:7002", Capacity: Capacity{1, 2, 3}, Leaving: true, Incarnation: 42},
	} {
		b, _ := m.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m NodeMeta
		if err := m.UnmarshalBinary(b); err != nil {
			return
		}
		// Whatever decodes re-encodes within the limit to the same value.
		b2, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", m, err)
		}
		var m2 NodeMeta
		if err := m2.UnmarshalBinary(b2); err != nil || m2 != m {
			t.Fatalf("re-decode %+v, %v; want %+v", m2, err, m)
		}
	})
}
