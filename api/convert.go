package api

import "github.com/kvmesh/kvmesh/chunk"

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
