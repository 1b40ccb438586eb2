package api

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/ring"
)

// ErrBadMessage is returned for a protobuf message that does not describe a
// valid value: a key, context, cache layout or result that does not convert,
// or a stream that breaks its protocol.
var ErrBadMessage = errors.New("api: malformed message")

// ProtoID converts a chunk ID.
func ProtoID(id chunk.ID) *ID { return &ID{Lo: id.Lo, Hi: id.Hi} }

// ProtoFingerprint converts a model fingerprint.
func ProtoFingerprint(fp chunk.Fingerprint) *ID { return &ID{Lo: fp.Lo, Hi: fp.Hi} }

// IDFromProto converts an ID; nil is the zero ID.
func IDFromProto(p *ID) chunk.ID { return chunk.ID{Lo: p.GetLo(), Hi: p.GetHi()} }

// FingerprintFromProto converts a fingerprint; nil is the zero fingerprint.
func FingerprintFromProto(p *ID) chunk.Fingerprint {
	return chunk.Fingerprint{Lo: p.GetLo(), Hi: p.GetHi()}
}

// ProtoContext converts a context.
func ProtoContext(c chunk.Context) *Context {
	return &Context{Kind: ContextKind(c.Kind), Window: c.Window, Id: ProtoID(c.ID)}
}

// ContextFromProto converts and checks a context.
func ContextFromProto(p *Context) (chunk.Context, error) {
	c := chunk.Context{Kind: chunk.ContextKind(p.GetKind()), Window: p.GetWindow(), ID: IDFromProto(p.GetId())}
	if p == nil || !c.Kind.Valid() || p.GetKind() > ContextKind_CONTEXT_KIND_OPAQUE {
		return c, fmt.Errorf("%w: context kind %v", ErrBadMessage, p.GetKind())
	}
	return c, nil
}

// ProtoKey converts a key.
func ProtoKey(k chunk.Key) *Key {
	return &Key{Fingerprint: ProtoFingerprint(k.Fingerprint), Content: ProtoID(k.Content), Context: ProtoContext(k.Context)}
}

// KeyFromProto converts and checks a key: it needs a fingerprint, a content
// ID and a valid context.
func KeyFromProto(p *Key) (chunk.Key, error) {
	if p == nil || p.Fingerprint == nil || p.Content == nil {
		return chunk.Key{}, fmt.Errorf("%w: key needs a fingerprint and a content ID", ErrBadMessage)
	}
	c, err := ContextFromProto(p.Context)
	if err != nil {
		return chunk.Key{}, err
	}
	return chunk.Key{Fingerprint: FingerprintFromProto(p.Fingerprint), Content: IDFromProto(p.Content), Context: c}, nil
}

// ProtoSpec converts a model spec.
func ProtoSpec(s chunk.ModelSpec) *ModelSpec {
	sc := s.Scaling
	return &ModelSpec{
		Family: s.Family, Layers: int32(s.Layers), KvHeads: int32(s.KVHeads), HeadDim: int32(s.HeadDim),
		Dtype: uint32(s.DType), RopeStyle: uint32(s.RopeStyle), RopeTheta: s.RopeTheta, RotaryDim: int32(s.RotaryDim),
		Scaling: &RopeScaling{
			Type: sc.Type, Factor: sc.Factor, LowFreqFactor: sc.LowFreqFactor, HighFreqFactor: sc.HighFreqFactor,
			OriginalMaxPositions: int32(sc.OriginalMaxPositions), BetaFast: sc.BetaFast, BetaSlow: sc.BetaSlow,
			AttentionFactor: sc.AttentionFactor, MaxPositions: int32(sc.MaxPositions),
		},
		WeightsRevision: s.WeightsRevision, TokenizerId: s.TokenizerID, Salt: s.Salt,
	}
}

// SpecFromProto converts a model spec and validates it (the error wraps
// chunk.ErrInvalidSpec).
func SpecFromProto(p *ModelSpec) (chunk.ModelSpec, error) {
	if p == nil {
		return chunk.ModelSpec{}, fmt.Errorf("%w: no spec", chunk.ErrInvalidSpec)
	}
	if p.Dtype > 255 || p.RopeStyle > 255 {
		return chunk.ModelSpec{}, fmt.Errorf("%w: dtype %d, rope style %d", chunk.ErrInvalidSpec, p.Dtype, p.RopeStyle)
	}
	sc := p.GetScaling()
	s := chunk.ModelSpec{
		Family: p.Family, Layers: int(p.Layers), KVHeads: int(p.KvHeads), HeadDim: int(p.HeadDim),
		DType: chunk.DType(p.Dtype), RopeStyle: chunk.RopeStyle(p.RopeStyle), RopeTheta: p.RopeTheta, RotaryDim: int(p.RotaryDim),
		Scaling: chunk.RopeScaling{
			Type: sc.GetType(), Factor: sc.GetFactor(), LowFreqFactor: sc.GetLowFreqFactor(), HighFreqFactor: sc.GetHighFreqFactor(),
			OriginalMaxPositions: int(sc.GetOriginalMaxPositions()), BetaFast: sc.GetBetaFast(), BetaSlow: sc.GetBetaSlow(),
			AttentionFactor: sc.GetAttentionFactor(), MaxPositions: int(sc.GetMaxPositions()),
		},
		WeightsRevision: p.WeightsRevision, TokenizerID: p.TokenizerId, Salt: p.Salt,
	}
	return s, s.Validate()
}

// ProtoMember converts a ring member.
func ProtoMember(m ring.Member) *Member {
	return &Member{Id: m.ID, GrpcAddr: m.GRPCAddr, RaftAddr: m.RaftAddr, GossipAddr: m.GossipAddr, Weight: m.Weight}
}

// MemberFromProto converts a ring member.
func MemberFromProto(p *Member) ring.Member {
	return ring.Member{ID: p.GetId(), GRPCAddr: p.GetGrpcAddr(), RaftAddr: p.GetRaftAddr(), GossipAddr: p.GetGossipAddr(), Weight: p.GetWeight()}
}

// ProtoShape converts an entry shape.
func ProtoShape(s chunk.Shape) *Shape {
	return &Shape{Dtype: uint32(s.DType), Tokens: uint32(s.Tokens), Layers: uint32(s.Layers), KvHeads: uint32(s.KVHeads), HeadDim: uint32(s.HeadDim)}
}

// ShapeFromProto converts an entry shape.
func ShapeFromProto(p *Shape) chunk.Shape {
	return chunk.Shape{DType: chunk.DType(p.GetDtype()), Tokens: int(p.GetTokens()), Layers: int(p.GetLayers()), KVHeads: int(p.GetKvHeads()), HeadDim: int(p.GetHeadDim())}
}

// IPCHandleBytes is the length of each RegisterCacheRequest.ipc_handles
// entry: a cudaIpcMemHandle_t (cudakern.IPCHandleBytes on the device side).
const IPCHandleBytes = 64

// ProtoLayout converts a cache layout to its wire form.
func ProtoLayout(l pagedkv.CacheLayout) *CacheLayout {
	return &CacheLayout{Order: uint32(l.Order), NumBlocks: int64(l.NumBlocks), BlockSize: int64(l.BlockSize),
		KvHeads: int32(l.KVHeads), HeadDim: int32(l.HeadDim), Dtype: uint32(l.DType), KScale: l.KScale, VScale: l.VScale}
}

// LayoutFromProto converts a wire cache layout, refusing values that do
// not fit their Go types (the receiver validates the layout itself).
func LayoutFromProto(p *CacheLayout) (pagedkv.CacheLayout, error) {
	if p.GetOrder() > math.MaxUint8 || p.GetDtype() > math.MaxUint8 {
		return pagedkv.CacheLayout{}, fmt.Errorf("%w: layout order %d, dtype %d", ErrBadMessage, p.GetOrder(), p.GetDtype())
	}
	if p.GetNumBlocks() < 0 || p.GetBlockSize() < 0 || p.GetNumBlocks() > math.MaxInt32 || p.GetBlockSize() > math.MaxInt32 {
		return pagedkv.CacheLayout{}, fmt.Errorf("%w: layout of %d blocks of %d", ErrBadMessage, p.GetNumBlocks(), p.GetBlockSize())
	}
	return pagedkv.CacheLayout{Order: pagedkv.Order(p.GetOrder()), NumBlocks: int(p.GetNumBlocks()), BlockSize: int(p.GetBlockSize()),
		KVHeads: int(p.GetKvHeads()), HeadDim: int(p.GetHeadDim()), DType: chunk.DType(p.GetDtype()),
		KScale: p.GetKScale(), VScale: p.GetVScale()}, nil
}

// ProtoMatch converts a lookup outcome to its wire status.
func ProtoMatch(m chunk.Match) LookupStatus {
	switch m {
	case chunk.MatchExact:
		return LookupStatus_LOOKUP_STATUS_EXACT
	case chunk.MatchApproximate:
		return LookupStatus_LOOKUP_STATUS_APPROXIMATE
	}
	return LookupStatus_LOOKUP_STATUS_MISS
}

// MatchFromProto converts a wire lookup status; a status this version does
// not know is a miss.
func MatchFromProto(s LookupStatus) chunk.Match {
	switch s {
	case LookupStatus_LOOKUP_STATUS_EXACT:
		return chunk.MatchExact
	case LookupStatus_LOOKUP_STATUS_APPROXIMATE:
		return chunk.MatchApproximate
	}
	return chunk.MatchMiss
}
