package node

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/replication"
)

// transport implements replication.Transport over the
// Peer service. Node IDs resolve to gRPC addresses through the ring, then
// gossip.
type transport struct{ n *Node }

func (t transport) addr(id string) (string, error) {
	if m, ok := t.n.meta.Ring().Member(id); ok && m.GRPCAddr != "" {
		return m.GRPCAddr, nil
	}
	for _, m := range t.n.gossip.Members() {
		if m.ID == id && m.GRPCAddr != "" {
			return m.GRPCAddr, nil
		}
	}
	return "", fmt.Errorf("node: no address known for %s", id)
}

// Replicate implements replication.Transport: the stream of
// OpenReplicate, sent the whole blob at once.
func (t transport) Replicate(ctx context.Context, node string, blob []byte, opts replication.ReplicateOptions) (uint64, error) {
	hd, err := chunk.ParseHeader(blob, t.n.cfg.Limits)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", replication.ErrRejected, err)
	}
	s, err := t.openReplicate(ctx, node, hd.Key, len(blob), opts, true)
	if err != nil {
		return 0, err
	}
	// blob is heap memory the caller does not modify: the transport may
	// hold slices of it after the call.
	if err := s.sendBody(mem.SliceBuffer(blob)); err != nil {
		s.Abort()
		return 0, err
	}
	return s.Close()
}

// OpenReplicate implements replication.Transport: a Peer.Replicate
// stream whose body follows as the caller sends it.
func (t transport) OpenReplicate(ctx context.Context, node string, key chunk.Key, size int, opts replication.ReplicateOptions, wait bool) (replication.ReplicaStream, error) {
	s, err := t.openReplicate(ctx, node, key, size, opts, wait)
	if err != nil {
		return nil, err // not a nil *replicaStream in the interface
	}
	return s, nil
}

func (t transport) openReplicate(ctx context.Context, node string, key chunk.Key, size int, opts replication.ReplicateOptions, wait bool) (*replicaStream, error) {
	addr, err := t.addr(node)
	if err != nil {
		return nil, err
	}
	cc, err := t.n.peers.conn(addr)
	if err != nil {
		return nil, err
	}
	if !wait && cc.GetState() != connectivity.Ready {
		// Opening a stream would wait for the connection (a peer gone
		// without a reset holds it for the dial timeout): the write sends
		// this replica its entry once whole, while the connection comes up.
		cc.Connect()
		return nil, fmt.Errorf("%w: %s is %v", replication.ErrNoStreamNow, node, cc.GetState())
	}
	pc := api.NewPeerClient(cc)
	ctx, cancel := t.n.withTimeout(ctx)
	st, err := pc.Replicate(ctx)
	if err != nil {
		cancel()
		return nil, replFromStatus(err)
	}
	if err := api.SendHeader(st, &api.PutHeader{Key: api.ProtoKey(key), BlobBytes: uint64(size),
		Direct: true, Kind: uint32(opts.Kind), At: opts.At}); err != nil {
		cancel()
		return nil, replFromStatus(api.PutSendErr(st, err))
	}
	return &replicaStream{n: t.n, st: st, cancel: cancel}, nil
}

// replicaStream is a replication.ReplicaStream over Peer.Replicate.
type replicaStream struct {
	n      *Node
	st     grpc.ClientStreamingClient[api.PutFrame, api.PutResponse]
	cancel context.CancelFunc
}

// Send implements replication.ReplicaStream. A frame this node received
// (a framePiece) goes out as one frame, as it came, its buffers uncopied;
// other pieces are lent to gRPC, which drops each reference once it wrote
// the bytes.
func (s *replicaStream) Send(p replication.Piece) error {
	if f, ok := p.(framePiece); ok {
		return s.sent(s.st.SendMsg(&api.Frame{Data: f.BufferSlice}), f.Len())
	}
	for _, part := range p.Parts(nil) {
		p.Ref()
		body := api.LentBuffer(part, p.Free)
		err := s.sendBody(body)
		body.Free()
		if err != nil {
			return err
		}
	}
	return nil
}

// sendBody sends body as data frames.
func (s *replicaStream) sendBody(body mem.Buffer) error {
	return s.sent(api.SendBody(s.st, body, s.n.cfg.FrameBytes), body.Len())
}

// sent is the outcome of sending n bytes: the replica's status if the send
// failed, else nil, with the bytes counted as they go out (not when the
// replica answers: a forward that starts before its entry is whole shows).
func (s *replicaStream) sent(err error, n int) error {
	if err != nil {
		return replFromStatus(api.PutSendErr(s.st, err))
	}
	s.n.metrics.bytesOut.WithLabelValues("replicate").Add(float64(n))
	return nil
}

// framePiece is a data frame a node received, as a replication.Piece: the
// buffers gRPC read it into (one per HTTP/2 data frame).
type framePiece struct{ mem.BufferSlice }

func (f framePiece) Parts(dst [][]byte) [][]byte {
	for _, b := range f.BufferSlice {
		dst = append(dst, b.ReadOnlyData())
	}
	return dst
}

// Close implements replication.ReplicaStream.
func (s *replicaStream) Close() (uint64, error) {
	defer s.cancel()
	resp, err := s.st.CloseAndRecv()
	if err != nil {
		return 0, replFromStatus(err)
	}
	return keptChecksum(resp), nil
}

// Abort implements replication.ReplicaStream: cancelling the call resets
// the stream, and the replica drops what it received.
func (s *replicaStream) Abort() { s.cancel() }

// keptChecksum is the checksum of the version a Put's receiver keeps; a
// node that does not say (kept_checksum 0) kept the entry it was sent.
func keptChecksum(resp *api.PutResponse) uint64 {
	if k := resp.GetKeptChecksum(); k != 0 {
		return k
	}
	return resp.GetChecksum()
}

func (t transport) Fetch(ctx context.Context, node string, key chunk.Key) ([]byte, error) {
	addr, err := t.addr(node)
	if err != nil {
		return nil, err
	}
	blob, err := t.n.fetchEntry(ctx, addr, key)
	return blob, replFromStatus(err)
}

func (t transport) Digest(ctx context.Context, node string, req replication.DigestRequest) (replication.DigestResponse, error) {
	addr, err := t.addr(node)
	if err != nil {
		return replication.DigestResponse{}, err
	}
	pc, err := t.n.peers.peer(addr)
	if err != nil {
		return replication.DigestResponse{}, err
	}
	preq := &api.DigestRequest{From: req.From, Epoch: req.Epoch, Replicas: uint32(req.Replicas), Split: req.Split, Ranges: req.Ranges}
	for _, k := range req.Keys {
		preq.Keys = append(preq.Keys, api.ProtoKey(k))
	}
	ctx, cancel := t.n.withTimeout(ctx)
	defer cancel()
	resp, err := pc.Digest(ctx, preq)
	if err != nil {
		return replication.DigestResponse{}, replFromStatus(err)
	}
	out := replication.DigestResponse{Epoch: resp.Epoch, Table: resp.Table}
	for _, it := range resp.Items {
		k, err := api.KeyFromProto(it.Key)
		if err != nil {
			return replication.DigestResponse{}, fmt.Errorf("node: digest from %s: %w", node, err)
		}
		out.Items = append(out.Items, replication.DigestItem{Key: k, Checksum: it.Checksum, Size: int(it.BlobBytes), Deleted: it.Deleted, At: it.At})
	}
	return out, nil
}

func (t transport) Delete(ctx context.Context, node string, key chunk.Key, at int64) error {
	addr, err := t.addr(node)
	if err != nil {
		return err
	}
	pc, err := t.n.peers.peer(addr)
	if err != nil {
		return err
	}
	ctx, cancel := t.n.withTimeout(ctx)
	defer cancel()
	_, err = pc.Delete(ctx, &api.DeleteRequest{Key: api.ProtoKey(key), Direct: true, At: at})
	return replFromStatus(err)
}

// serveDigest answers a replication digest request.
func (n *Node) serveDigest(ctx context.Context, req *api.DigestRequest) (*api.DigestResponse, error) {
	rreq := replication.DigestRequest{From: req.From, Epoch: req.Epoch, Replicas: int(req.Replicas), Split: req.Split, Ranges: req.Ranges}
	for _, pk := range req.Keys {
		k, err := api.KeyFromProto(pk)
		if err != nil {
			return nil, invalid(err)
		}
		rreq.Keys = append(rreq.Keys, k)
	}
	resp, err := n.repl.ServeDigest(ctx, rreq)
	if err != nil {
		return nil, replToStatus(err)
	}
	out := &api.DigestResponse{Epoch: resp.Epoch, Table: resp.Table}
	for _, it := range resp.Items {
		out.Items = append(out.Items, &api.DigestItem{Key: api.ProtoKey(it.Key), Checksum: it.Checksum, BlobBytes: uint64(it.Size),
			Deleted: it.Deleted, At: it.At})
	}
	return out, nil
}
