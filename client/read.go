package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
)

// Get reads the whole encoded entry of key and verifies every checksum. A
// replica that sends corrupt bytes is skipped.
func (c *Client) Get(ctx context.Context, key chunk.Key) ([]byte, error) {
	return c.GetInto(ctx, key, nil)
}

// GetInto is Get reading the entry into buf when it has the capacity (else
// into a new buffer): a caller that reads many entries reuses one buffer
// instead of allocating, faulting in and clearing one of the entry's size
// per call. The result aliases buf in that case.
func (c *Client) GetInto(ctx context.Context, key chunk.Key, buf []byte) ([]byte, error) {
	var blob []byte
	err := c.do(ctx, &key.Content, func(ctx context.Context, cc *grpc.ClientConn) error {
		hdr, data, err := c.get(ctx, cc, &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_ENTRY}, buf)
		if err != nil {
			return err
		}
		if uint64(len(data)) != hdr.TotalBytes {
			return status.Error(codes.Unavailable, "short entry")
		}
		vh, err := chunk.Verify(data, c.cfg.Limits)
		if err != nil || vh.Key != key {
			// Wrong bytes from one replica: try another.
			return status.Errorf(codes.Unavailable, "replica sent a bad entry for %v: %v", key, err)
		}
		blob = data
		return nil
	})
	return blob, notFound(err)
}

func notFound(err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// RangeResult is a decoded slice of an entry: K and V of layers
// [LayerLo, LayerHi) and heads [HeadLo, HeadHi) in the layout
// [layer][K|V][token][head][head_dim].
type RangeResult struct {
	Shape  chunk.Shape
	Range  chunk.Range
	Tokens []uint32
	Data   []byte
}

// GetRange reads the decoded K/V of a layer and head range of key (the
// zero Range means all).
func (c *Client) GetRange(ctx context.Context, key chunk.Key, r chunk.Range) (RangeResult, error) {
	var out RangeResult
	req := &api.GetRequest{Key: api.ProtoKey(key), Format: api.Format_FORMAT_RAW,
		LayerLo: uint32(r.LayerLo), LayerHi: uint32(r.LayerHi), HeadLo: uint32(r.HeadLo), HeadHi: uint32(r.HeadHi)}
	err := c.do(ctx, &key.Content, func(ctx context.Context, cc *grpc.ClientConn) error {
		hdr, data, err := c.get(ctx, cc, req, nil)
		if err != nil {
			return err
		}
		out = RangeResult{Shape: api.ShapeFromProto(hdr.Shape), Tokens: hdr.Tokens, Data: data,
			Range: chunk.Range{LayerLo: int(hdr.LayerLo), LayerHi: int(hdr.LayerHi), HeadLo: int(hdr.HeadLo), HeadHi: int(hdr.HeadHi)}}
		if len(data) != out.Range.RangeBytes(out.Shape) {
			return status.Error(codes.Unavailable, "range of the wrong size")
		}
		return nil
	})
	return out, notFound(err)
}

// get reads an answer into buf when it has the capacity, else into a new
// buffer.
func (c *Client) get(ctx context.Context, cc *grpc.ClientConn, req *api.GetRequest, buf []byte) (*api.GetHeader, []byte, error) {
	st, err := api.NewClientClient(cc).Get(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	var hdr api.GetHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		return nil, nil, err
	}
	if md, err := st.Header(); err == nil {
		c.noteEpoch(md)
	}
	if hdr.TotalBytes > uint64(c.cfg.Limits.MaxBlobBytes) {
		return nil, nil, status.Errorf(codes.ResourceExhausted, "answer of %d bytes exceeds limits", hdr.TotalBytes)
	}
	data := buf[:0]
	if uint64(cap(buf)) >= hdr.TotalBytes {
		data = buf[:hdr.TotalBytes]
	} else {
		data = make([]byte, hdr.TotalBytes)
	}
	if err := api.RecvBody(st, data); err != nil {
		return nil, nil, err
	}
	return &hdr, data, nil
}
