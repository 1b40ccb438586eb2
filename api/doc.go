// Package api holds kvmesh's wire API: the protobuf messages and gRPC
// services generated from kvmesh.proto (regenerate with api/gen.sh), and the
// CodecV2 that moves tensor frames without copying them (Codec, Frame).
//
// Streams that carry tensor bytes (Client.Put, Client.Get, Peer.Replicate,
// Peer.Fetch) send one header frame and then data frames. On the wire each
// frame is the protobuf PutFrame or GetFrame; in Go a data frame is a Frame
// whose payload is a mem.BufferSlice, so a blob held by the store goes to the
// transport, and a received frame comes out of it, without a marshal copy.
//
// The conversions between kvmesh's Go types (chunk's keys, specs and Match,
// ring members, pagedkv's cache layout) and their messages live here too
// (Proto*, *FromProto), so that the client and the node convert alike; what
// arrives is checked, and a message that does not convert wraps
// ErrBadMessage.
package api

// EpochHeader is the gRPC response header in which a node tells the ring
// epoch it routes with; clients refresh their ring when it grows.
const EpochHeader = "kvmesh-epoch"

// StateHeader is the response header of Stats in which a node says
// whether it is ready: StateReady, or another state, ": " and why not (a
// node that has just started is recovering until its metadata has caught
// up with the leader's and its startup pull has finished). SplitState
// reads it.
const StateHeader = "kvmesh-state"

// ErrorDomain is the domain of the errdetails.ErrorInfo a node attaches
// to a status whose reason a client branches on.
const ErrorDomain = "kvmesh"

// ReasonUnknownModel is the ErrorInfo reason of the FailedPrecondition a
// node answers for a model fingerprint its metadata does not hold. Its
// metadata may lag the leader's (a model registered a moment ago through
// another node), so a client asks another replica before giving up.
const ReasonUnknownModel = "UNKNOWN_MODEL"
