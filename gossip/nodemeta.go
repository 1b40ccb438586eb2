package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// MetaMaxSize is the most bytes an encoded NodeMeta may take: memberlist's
// limit for a node's metadata.
const MetaMaxSize = 512

// metaVersion is the first byte of an encoded NodeMeta.
const metaVersion = 1

// Flags of the encoded NodeMeta.
const flagLeaving = 1 << 0

// Sentinel errors of NodeMeta encoding.
var (
	ErrMetaTooLarge = errors.New("gossip: node meta exceeds 512 bytes")
	ErrMetaInvalid  = errors.New("gossip: invalid node meta")
)

// Capacity is a node's storage budget per tier, in bytes.
type Capacity struct {
	GPUBytes  uint64 `json:"gpu_bytes,omitempty"`
	DRAMBytes uint64 `json:"dram_bytes,omitempty"`
	DiskBytes uint64 `json:"disk_bytes,omitempty"`
}

// Total is the sum of the tiers' budgets, saturating at the maximum uint64.
func (c Capacity) Total() uint64 {
	t := c.GPUBytes
	for _, b := range []uint64{c.DRAMBytes, c.DiskBytes} {
		if t+b < t {
			return ^uint64(0)
		}
		t += b
	}
	return t
}

// NodeMeta is what a node tells the cluster about itself through gossip.
type NodeMeta struct {
	// ID is the node's name, unique in the cluster; it must equal
	// Config.NodeID.
	ID       string `json:"id"`
	GRPCAddr string `json:"grpc_addr,omitempty"`
	RaftAddr string `json:"raft_addr,omitempty"`
	// HTTPAddr serves /metrics, /healthz and /debug/pprof.
	HTTPAddr string   `json:"http_addr,omitempty"`
	Capacity Capacity `json:"capacity"`
	// Leaving is set by Gossip.Leave just before it leaves, so that the
	// others can tell a graceful leave (EventLeave) from a failure
	// (EventFail). Callers need not set it.
	Leaving bool `json:"leaving,omitempty"`
	// GossipAddr is the node's gossip host:port as memberlist saw it. It is
	// filled in on receipt and not encoded.
	GossipAddr string `json:"gossip_addr,omitempty"`
	// Incarnation tells one run of the node from the next (node sets it
	// once per process start). The metadata leader keeps a node that left
	// explicitly out of raft and the ring until it comes back with another
	// incarnation. 0 means unknown (metadata of an older version).
	Incarnation uint64 `json:"incarnation,omitempty"`
}

// MarshalBinary encodes m compactly: a version byte, a flags byte, the
// strings ID, GRPCAddr, RaftAddr, HTTPAddr (uvarint length + bytes), then the
// capacities as uvarints. Decoders of this version ignore bytes after them,
// which is where later versions add fields. GossipAddr is not encoded.
func (m NodeMeta) MarshalBinary() ([]byte, error) {
	return m.AppendBinary(make([]byte, 0, 64+len(m.ID)+len(m.GRPCAddr)+len(m.RaftAddr)+len(m.HTTPAddr)))
}

// AppendBinary appends the encoding of m (see MarshalBinary) to b.
func (m NodeMeta) AppendBinary(b []byte) ([]byte, error) {
	if m.ID == "" {
		return b, fmt.Errorf("%w: empty ID", ErrMetaInvalid)
	}
	start := len(b)
	var flags byte
	if m.Leaving {
		flags |= flagLeaving
	}
	b = append(b, metaVersion, flags)
	for _, s := range [...]string{m.ID, m.GRPCAddr, m.RaftAddr, m.HTTPAddr} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, m.Capacity.GPUBytes)
	b = binary.AppendUvarint(b, m.Capacity.DRAMBytes)
	b = binary.AppendUvarint(b, m.Capacity.DiskBytes)
	b = binary.AppendUvarint(b, m.Incarnation)
	if n := len(b) - start; n > MetaMaxSize {
		return b[:start], fmt.Errorf("%w: %d bytes", ErrMetaTooLarge, n)
	}
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary encoded. It rejects unknown
// versions, truncated or oversized input, an empty ID and strings that are
// not UTF-8; GossipAddr is left empty.
func (m *NodeMeta) UnmarshalBinary(b []byte) error {
	if len(b) > MetaMaxSize {
		return fmt.Errorf("%w: %d bytes", ErrMetaTooLarge, len(b))
	}
	if len(b) < 2 {
		return fmt.Errorf("%w: %d bytes", ErrMetaInvalid, len(b))
	}
	if b[0] != metaVersion {
		return fmt.Errorf("%w: version %d", ErrMetaInvalid, b[0])
	}
	var out NodeMeta
	out.Leaving = b[1]&flagLeaving != 0
	rest := b[2:]
	for _, dst := range [...]*string{&out.ID, &out.GRPCAddr, &out.RaftAddr, &out.HTTPAddr} {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return fmt.Errorf("%w: truncated string", ErrMetaInvalid)
		}
		s := rest[k : k+int(n)]
		if !utf8.Valid(s) {
			return fmt.Errorf("%w: string not UTF-8", ErrMetaInvalid)
		}
		*dst = string(s)
		rest = rest[k+int(n):]
	}
	for _, dst := range [...]*uint64{&out.Capacity.GPUBytes, &out.Capacity.DRAMBytes, &out.Capacity.DiskBytes} {
		v, k := binary.Uvarint(rest)
		if k <= 0 {
			return fmt.Errorf("%w: truncated capacity", ErrMetaInvalid)
		}
		*dst = v
		rest = rest[k:]
	}
	if len(rest) > 0 {
		v, k := binary.Uvarint(rest)
		if k <= 0 {
			return fmt.Errorf("%w: truncated incarnation", ErrMetaInvalid)
		}
		out.Incarnation = v
	}
	if out.ID == "" {
		return fmt.Errorf("%w: empty ID", ErrMetaInvalid)
	}
	*m = out
	return nil
}
