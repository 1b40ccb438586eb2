package client

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
)

// PutResult says where a Put landed and which version of the key the
// cluster keeps.
type PutResult struct {
	// Checksum is that of the entry this Put stored (after the node put it
	// in the cluster codec).
	Checksum uint64
	StoredOn []string
	// AlreadyStored: the key was already held with other bytes and the
	// cluster keeps those (they Win: the smaller checksum); this Put's
	// bytes were dropped. Not an error: two honest producers of a chunk
	// may encode slightly different bytes.
	AlreadyStored bool
	// Kept is the checksum of the version the cluster keeps: Checksum
	// unless AlreadyStored.
	Kept uint64
}

// Put stores an encoded entry (chunk.Encode's output) on its replica set.
// The blob is sent without copies and must not change until Put returns.
// The cluster stores it in its codec (Codec): a raw or lossless entry in
// another codec is transcoded once by the node that receives it, and the
// result's Checksum is then that of the stored bytes; a lossy entry is
// stored as it is.
func (c *Client) Put(ctx context.Context, blob []byte) (PutResult, error) {
	hd, err := chunk.ParseHeader(blob, c.cfg.Limits)
	if err != nil {
		return PutResult{}, err
	}
	var resp *api.PutResponse
	err = c.do(ctx, &hd.Key.Content, func(ctx context.Context, cc *grpc.ClientConn) error {
		var md metadata.MD
		st, err := api.NewClientClient(cc).Put(ctx, grpc.Header(&md))
		if err != nil {
			return err
		}
		defer func() { c.noteEpoch(md) }()
		if err := api.SendHeader(st, &api.PutHeader{Key: api.ProtoKey(hd.Key), BlobBytes: uint64(len(blob))}); err != nil {
			return api.PutSendErr(st, err)
		}
		if err := api.SendBody(st, mem.SliceBuffer(blob), c.cfg.FrameBytes); err != nil {
			return api.PutSendErr(st, err)
		}
		resp, err = st.CloseAndRecv()
		return err
	})
	if err != nil {
		return PutResult{}, err
	}
	res := PutResult{Checksum: resp.Checksum, StoredOn: resp.StoredOn, AlreadyStored: resp.AlreadyStored, Kept: resp.KeptChecksum}
	if res.Kept == 0 {
		res.Kept = res.Checksum // a node that does not say kept this Put's entry
	}
	return res, nil
}

// PutEntry encodes e in the cluster's codec (Codec) and stores it as Put
// does.
func (c *Client) PutEntry(ctx context.Context, e *chunk.Entry) (PutResult, error) {
	blob, err := chunk.Encode(nil, e, c.Codec())
	if err != nil {
		return PutResult{}, err
	}
	return c.Put(ctx, blob)
}

// Delete removes key from its replicas and returns how many held it.
func (c *Client) Delete(ctx context.Context, key chunk.Key) (int, error) {
	var resp *api.DeleteResponse
	err := c.do(ctx, &key.Content, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = api.NewClientClient(cc).Delete(ctx, &api.DeleteRequest{Key: api.ProtoKey(key)})
		return err
	})
	if err != nil {
		return 0, notFound(err)
	}
	return int(resp.Deleted), nil
}
