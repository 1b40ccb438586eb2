package client

import (
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// ErrBadMessage is returned for a protobuf message that does not describe a
// valid key, context or spec.
var ErrBadMessage = errors.New("client: malformed message")

// ProtoID converts a chunk ID.
func ProtoID(id chunk.ID) *api.ID { return &api.ID{Lo: id.Lo, Hi: id.Hi} }

// ProtoFingerprint converts a model fingerprint.
func ProtoFingerprint(fp chunk.Fingerprint) *api.ID { return &api.ID{Lo: fp.Lo, Hi: fp.Hi} }

// IDFromProto converts an ID; nil is the zero ID.
func IDFromProto(p *api.ID) chunk.ID { return chunk.ID{Lo: p.GetLo(), Hi: p.GetHi()} }

// FingerprintFromProto converts a fingerprint; nil is the zero fingerprint.
func FingerprintFromProto(p *api.ID) chunk.Fingerprint {
	return chunk.Fingerprint{Lo: p.GetLo(), Hi: p.GetHi()}
}

// ProtoContext converts a context.
func ProtoContext(c chunk.Context) *api.Context {
	return &api.Context{Kind: api.ContextKind(c.Kind), Window: c.Window, Id: ProtoID(c.ID)}
}

// ContextFromProto converts and checks a context.
func ContextFromProto(p *api.Context) (chunk.Context, error) {
	c := chunk.Context{Kind: chunk.ContextKind(p.GetKind()), Window: p.GetWindow(), ID: IDFromProto(p.GetId())}
	if p == nil || !c.Kind.Valid() || p.GetKind() > api.ContextKind_CONTEXT_KIND_PREFIX {
		return c, fmt.Errorf("%w: context kind %v", ErrBadMessage, p.GetKind())
	}
	return c, nil
}

// ProtoKey converts a key.
func ProtoKey(k chunk.Key) *api.Key {
	return &api.Key{Fingerprint: ProtoFingerprint(k.Fingerprint), Content: ProtoID(k.Content), Context: ProtoContext(k.Context)}
}

// KeyFromProto converts and checks a key: it needs a fingerprint, a content
// ID and a valid context.
func KeyFromProto(p *api.Key) (chunk.Key, error) {
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
func ProtoSpec(s chunk.ModelSpec) *api.ModelSpec {
	sc := s.Scaling
	return &api.ModelSpec{
		Family: s.Family, Layers: int32(s.Layers), KvHeads: int32(s.KVHeads), HeadDim: int32(s.HeadDim),
		Dtype: uint32(s.DType), RopeStyle: uint32(s.RopeStyle), RopeTheta: s.RopeTheta, RotaryDim: int32(s.RotaryDim),
		Scaling: &api.RopeScaling{
			Type: sc.Type, Factor: sc.Factor, LowFreqFactor: sc.LowFreqFactor, HighFreqFactor: sc.HighFreqFactor,
			OriginalMaxPositions: int32(sc.OriginalMaxPositions), BetaFast: sc.BetaFast, BetaSlow: sc.BetaSlow,
			AttentionFactor: sc.AttentionFactor, MaxPositions: int32(sc.MaxPositions),
		},
		WeightsRevision: s.WeightsRevision, TokenizerId: s.TokenizerID, Salt: s.Salt,
	}
}

// SpecFromProto converts a model spec and validates it (the error wraps
// chunk.ErrInvalidSpec).
func SpecFromProto(p *api.ModelSpec) (chunk.ModelSpec, error) {
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
func ProtoMember(m ring.Member) *api.Member {
	return &api.Member{Id: m.ID, GrpcAddr: m.GRPCAddr, RaftAddr: m.RaftAddr, GossipAddr: m.GossipAddr, Weight: m.Weight}
}

// MemberFromProto converts a ring member.
func MemberFromProto(p *api.Member) ring.Member {
	return ring.Member{ID: p.GetId(), GRPCAddr: p.GetGrpcAddr(), RaftAddr: p.GetRaftAddr(), GossipAddr: p.GetGossipAddr(), Weight: p.GetWeight()}
}

// ProtoShape converts an entry shape.
func ProtoShape(s chunk.Shape) *api.Shape {
	return &api.Shape{Dtype: uint32(s.DType), Tokens: uint32(s.Tokens), Layers: uint32(s.Layers), KvHeads: uint32(s.KVHeads), HeadDim: uint32(s.HeadDim)}
}

// ShapeFromProto converts an entry shape.
func ShapeFromProto(p *api.Shape) chunk.Shape {
	return chunk.Shape{DType: chunk.DType(p.GetDtype()), Tokens: int(p.GetTokens()), Layers: int(p.GetLayers()), KVHeads: int(p.GetKvHeads()), HeadDim: int(p.GetHeadDim())}
}
