package api

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/ring"
)

func TestConvertRoundTrip(t *testing.T) {
	spec := chunk.ModelSpec{Family: "llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: chunk.BF16, RopeStyle: chunk.RopeNeoX,
		RopeTheta: 500000, Scaling: chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192},
		WeightsRevision: "r1", TokenizerID: "tok", Salt: "s"}
	got, err := SpecFromProto(ProtoSpec(spec))
	if err != nil || got != spec {
		t.Fatalf("spec round trip: %+v, %v", got, err)
	}
	fp := spec.Fingerprint()
	for _, k := range []chunk.Key{
		{Fingerprint: fp, Content: chunk.ID{Lo: 1, Hi: 2}, Context: chunk.StandaloneContext()},
		{Fingerprint: fp, Content: chunk.ID{Lo: 3}, Context: chunk.WindowContext(fp, 16, []uint32{1, 2})},
		{Fingerprint: fp, Content: chunk.ID{Hi: 3}, Context: chunk.PrefixContext(chunk.ID{Lo: 5})},
	} {
		// Through the wire, too.
		b, err := proto.Marshal(ProtoKey(k))
		if err != nil {
			t.Fatal(err)
		}
		var pk Key
		if err := proto.Unmarshal(b, &pk); err != nil {
			t.Fatal(err)
		}
		got, err := KeyFromProto(&pk)
		if err != nil || got != k {
			t.Fatalf("key round trip: %v, %v; want %v", got, err, k)
		}
	}
	m := ring.Member{ID: "a", GRPCAddr: "h:1", RaftAddr: "h:2", GossipAddr: "h:3", Weight: 2}
	if MemberFromProto(ProtoMember(m)) != m {
		t.Fatal("member round trip")
	}
}

func FuzzKeyFromProto(f *testing.F) {
	seed, _ := proto.Marshal(ProtoKey(chunk.Key{Fingerprint: chunk.Fingerprint{Lo: 1}, Content: chunk.ID{Lo: 2}, Context: chunk.StandaloneContext()}))
	f.Add(seed)
	f.Add([]byte{})
	f.Add([]byte{0x1a, 0x02, 0x08, 0x09})
	f.Fuzz(func(t *testing.T, b []byte) {
		var pk Key
		if proto.Unmarshal(b, &pk) != nil {
			return
		}
		k, err := KeyFromProto(&pk)
		if err != nil {
			return
		}
		if !k.Context.Kind.Valid() {
			t.Fatalf("accepted context kind %v", k.Context.Kind)
		}
		k2, err := KeyFromProto(ProtoKey(k))
		if err != nil || k2 != k {
			t.Fatalf("round trip of %v: %v, %v", k, k2, err)
		}
	})
}

func FuzzSpecFromProto(f *testing.F) {
	seed, _ := proto.Marshal(ProtoSpec(chunk.ModelSpec{Family: "llama", Layers: 2, KVHeads: 1, HeadDim: 8, DType: chunk.F16, RopeStyle: chunk.RopeGPTJ, RopeTheta: 10000}))
	f.Add(seed)
	f.Add([]byte{0x28, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		var ps ModelSpec
		if proto.Unmarshal(b, &ps) != nil {
			return
		}
		s, err := SpecFromProto(&ps)
		if err != nil {
			return
		}
		if s.Validate() != nil {
			t.Fatal("accepted an invalid spec")
		}
		s2, err := SpecFromProto(ProtoSpec(s))
		if err != nil || s2.Fingerprint() != s.Fingerprint() {
			t.Fatalf("round trip changed the spec: %v", err)
		}
	})
}

// FuzzLayoutFromProto: a wire layout either is refused or converts to a
// layout that converts back to the same message.
func FuzzLayoutFromProto(f *testing.F) {
	seed := func(l *CacheLayout) {
		b, err := proto.Marshal(l)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, o := range pagedkv.Orders() {
		seed(ProtoLayout(pagedkv.CacheLayout{Order: o, NumBlocks: 8, BlockSize: 16, KVHeads: 2, HeadDim: 64, DType: chunk.BF16}))
	}
	seed(&CacheLayout{Order: 300, NumBlocks: -1, Dtype: 1 << 20})
	seed(&CacheLayout{NumBlocks: 1 << 40, BlockSize: 1, KScale: 0.5})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p CacheLayout
		if err := proto.Unmarshal(b, &p); err != nil {
			return
		}
		l, err := LayoutFromProto(&p)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		_ = l.Validate() // must not panic whatever the values
		back := ProtoLayout(l)
		if back.Order != p.Order || back.Dtype != p.Dtype || back.NumBlocks != p.NumBlocks || back.BlockSize != p.BlockSize ||
			back.KvHeads != p.KvHeads || back.HeadDim != p.HeadDim {
			t.Fatalf("round trip %v -> %v", &p, back)
		}
	})
}

// TestMatchRoundTrip: every lookup outcome survives the wire, and a status
// this version does not know reads as a miss.
func TestMatchRoundTrip(t *testing.T) {
	for _, m := range []chunk.Match{chunk.MatchMiss, chunk.MatchApproximate, chunk.MatchExact} {
		if got := MatchFromProto(ProtoMatch(m)); got != m {
			t.Errorf("%v came back as %v", m, got)
		}
	}
	if got := MatchFromProto(LookupStatus(7)); got != chunk.MatchMiss {
		t.Errorf("unknown status read as %v", got)
	}
}
