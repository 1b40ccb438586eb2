package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
	"github.com/kvmesh/kvmesh/replication"
)

// Limits of requests that are not entries.
const (
	// MaxLookupBatch is the most items one Lookup may carry.
	MaxLookupBatch = 4096
	// putUpfrontBytes is how much of an entry's announced size a Put
	// allocates before its data arrives.
	putUpfrontBytes = 16 << 20
	// modelWait is how long a node waits for a model registered through
	// another node a moment ago to reach its own metadata.
	modelWait = 2 * time.Second
)

func invalid(err error) error { return status.Error(codes.InvalidArgument, err.Error()) }

// model returns the spec of fp, waiting briefly for raft to catch up. A
// node whose metadata has not caught up with the leader's since its start
// answers Unavailable instead of "unknown model", so that the client asks
// another replica.
func (n *Node) model(ctx context.Context, fp chunk.Fingerprint) (chunk.ModelSpec, error) {
	if spec, ok := n.meta.Model(fp); ok {
		return spec, nil
	}
	wctx, cancel := context.WithTimeout(ctx, modelWait)
	defer cancel()
	if spec, ok := n.meta.WaitModel(wctx, fp); ok {
		return spec, nil
	}
	if !n.rec.metaCaughtUp.Load() {
		// This node's metadata may lag the leader's: the model may well
		// exist. Unavailable sends the client to another replica.
		return chunk.ModelSpec{}, status.Errorf(codes.Unavailable, "model %s not known here yet: %v", fp, n.recovering())
	}
	return chunk.ModelSpec{}, errUnknownModel(fp)
}

// receivePut serves Client.Put: a client's entry, checked, transcoded
// to the cluster's codec where it must be, and written to its replica set
// (replication.StreamWrite), cut through where it is stored as it comes.
func (n *Node) receivePut(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) error {
	ctx := st.Context()
	hdr, key, err := n.putHeader(st)
	if err != nil {
		return err
	}
	if hdr.Direct || hdr.Kind != 0 || hdr.At != 0 {
		// A single-node store with a chosen time and kind bypasses the
		// replica set and orders against tombstones: members only, and
		// through Peer.Replicate, the one wire form of a replica write.
		if err := n.sec.checkPeer(ctx, "a direct put"); err != nil {
			return err
		}
		return status.Error(codes.InvalidArgument, "a put to one node only (direct, kind, at) is a replica write: send it with Peer.Replicate")
	}
	spec, err := n.putModel(ctx, hdr, key)
	if err != nil {
		return err
	}
	// A client's entry that is stored as it comes (already in the
	// cluster's codec) goes on to the other replicas frame by frame as it
	// arrives (cut-through), so that they hold it by the time its last
	// byte reaches this node. One to transcode is forwarded once whole.
	set := n.meta.Settings()
	var sw *replication.StreamWrite
	defer func() {
		if sw != nil {
			sw.Abort() // a no-op once Finish ran
		}
	}()
	size := int(hdr.BlobBytes)
	credited, arrived := n.putCredit(ctx, size)
	var each func(mem.BufferSlice, []byte)
	if credited {
		decided := false
		each = func(frame mem.BufferSlice, sofar []byte) {
			if !decided {
				decided = true
				if c, ok := chunk.PeekCodec(sofar); ok && chunk.StoredCodec(c, set.Codec) == c {
					// On an error (no replicas) BeginWrite again reports it below.
					sw, _ = n.repl.BeginWrite(key, size)
				}
			}
			if sw != nil {
				sw.Send(framePiece{frame})
			}
		}
	}
	blob, hd, releaseBody, err := n.putBody(ctx, st, hdr, key, spec, credited, arrived, n.lendClientBody(key), each)
	if err != nil {
		return err
	}
	if r := n.meta.Ring(); r.Len() > 0 && !r.IsReplica(key.Content, n.cfg.NodeID, set.ReplicationFactor) {
		n.metrics.forwards.Inc()
	}
	// A client's entry is stored in the cluster's codec: transcoded here,
	// once, so that replicas, hints, rebalancing, pulls and fetches move the
	// stored bytes unchanged (replica writes are such moves). The same
	// entry sent in raw or in lossless becomes the same bytes, so a re-put
	// from a client in another codec finds its bytes already stored.
	stored, hd, transcoded, err := n.transcodeToStored(blob, hd, set.Codec)
	if err != nil {
		releaseBody()
		return err
	}
	// Replica writes may outlive this call: they recycle the body. The
	// transcoded bytes are a new buffer left to the collector, and the
	// client's body is recycled at once.
	release := releaseBody
	if transcoded {
		releaseBody()
		release = nil
	}
	if sw == nil || transcoded {
		// Not cut through: the write opens now, with the stored bytes'
		// key and size from the header parsed above.
		if sw != nil {
			sw.Abort()
		}
		if sw, err = n.repl.BeginWrite(hd.Key, len(stored)); err != nil {
			if release != nil {
				release()
			}
			return err
		}
	}
	res, err := sw.Finish(ctx, stored, hd.Checksum, release)
	if err != nil {
		return err
	}
	return st.SendAndClose(&api.PutResponse{Checksum: hd.Checksum, StoredOn: res.StoredOn,
		AlreadyStored: res.AlreadyStored(), KeptChecksum: res.Kept})
}

// receiveReplica serves Peer.Replicate: another member's replica write
// (a write, hint, repair or rebalance), stored here only and answered
// with the checksum of the version this node keeps.
func (n *Node) receiveReplica(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) error {
	ctx := st.Context()
	hdr, key, err := n.putHeader(st)
	if err != nil {
		return err
	}
	spec, err := n.putModel(ctx, hdr, key)
	if err != nil {
		return err
	}
	kind := replication.Kind(hdr.Kind)
	if kind == 0 {
		kind = replication.KindWrite
	}
	credited, arrived := n.putCredit(ctx, int(hdr.BlobBytes))
	blob, hd, releaseBody, err := n.putBody(ctx, st, hdr, key, spec, credited, arrived, lendReplicaBody(kind), nil)
	if err != nil {
		return err
	}
	defer releaseBody()
	kept, err := n.repl.ServeReplicate(ctx, blob, hd, replication.ReplicateOptions{Kind: kind, At: hdr.At})
	if err != nil {
		return replToStatus(err)
	}
	return st.SendAndClose(&api.PutResponse{Checksum: hd.Checksum, StoredOn: []string{n.cfg.NodeID},
		AlreadyStored: kept != hd.Checksum, KeptChecksum: kept})
}

// putHeader reads a Put or Replicate stream's header and the key it names.
func (n *Node) putHeader(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) (*api.PutHeader, chunk.Key, error) {
	hdr := &api.PutHeader{}
	if err := api.RecvHeader(st, hdr); err != nil {
		return hdr, chunk.Key{}, err
	}
	key, err := api.KeyFromProto(hdr.Key)
	if err != nil {
		return hdr, key, invalid(err)
	}
	if err := checkFingerprint(st.Context(), key.Fingerprint); err != nil {
		return hdr, key, err
	}
	return hdr, key, nil
}

// putModel checks the size a Put's header announces and returns the spec
// of its key's model.
func (n *Node) putModel(ctx context.Context, hdr *api.PutHeader, key chunk.Key) (chunk.ModelSpec, error) {
	switch {
	case hdr.BlobBytes == 0:
		return chunk.ModelSpec{}, status.Error(codes.InvalidArgument, "put of an empty entry")
	case hdr.BlobBytes > uint64(n.cfg.Limits.MaxBlobBytes):
		return chunk.ModelSpec{}, status.Errorf(codes.ResourceExhausted, "entry of %d bytes exceeds the limit of %d", hdr.BlobBytes, n.cfg.Limits.MaxBlobBytes)
	}
	return n.model(ctx, key.Fingerprint)
}

// putBody receives a Put stream's body (into lent DRAM pages if lend and
// the sender is credited, passing each frame to each as it arrives) and
// checks it is the entry the header announced, of spec's shape: its
// header, parsed once here (chunk.Verify), is returned for the rest of
// the write. On success the caller owns the body and calls release once
// no one reads blob.
func (n *Node) putBody(ctx context.Context, st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse], hdr *api.PutHeader, key chunk.Key,
	spec chunk.ModelSpec, credited bool, arrived func(), lend bool, each func(mem.BufferSlice, []byte)) (blob []byte, hd chunk.Header, release func(), err error) {
	upfront := putUpfrontBytes
	if !credited {
		upfront = uncreditedUpfrontBytes
	}
	blob, release, err = n.recvBody(ctx, st, int(hdr.BlobBytes), credited && lend, upfront, each)
	if err != nil {
		return nil, hd, nil, err
	}
	arrived()
	if hd, err = n.checkBody(st, hdr, key, spec, blob); err != nil {
		release()
		return nil, hd, nil, err
	}
	return blob, hd, release, nil
}

// checkBody checks that blob, a received body, ends the stream and is the
// entry hdr announced, of spec's shape.
func (n *Node) checkBody(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse], hdr *api.PutHeader, key chunk.Key, spec chunk.ModelSpec, blob []byte) (chunk.Header, error) {
	var extra api.Frame
	if err := st.RecvMsg(&extra); !errors.Is(err, io.EOF) {
		extra.Data.Free()
		if err == nil {
			err = fmt.Errorf("%w: frames after the announced %d bytes", api.ErrLongBody, hdr.BlobBytes)
		}
		return chunk.Header{}, err
	}
	n.metrics.bytesIn.WithLabelValues("put").Add(float64(len(blob)))
	hd, err := chunk.Verify(blob, n.cfg.Limits)
	if err != nil {
		return hd, err
	}
	if hd.Key != key {
		return hd, status.Errorf(codes.InvalidArgument, "entry holds key %v, header says %v", hd.Key, key)
	}
	if sh := hd.Shape; sh.Layers != spec.Layers || sh.KVHeads != spec.KVHeads || sh.HeadDim != spec.HeadDim || sh.DType != spec.DType {
		return hd, status.Errorf(codes.InvalidArgument, "entry shape %d layers x %d heads x %d dims %v does not match model %s (%d x %d x %d %v)",
			sh.Layers, sh.KVHeads, sh.HeadDim, sh.DType, key.Fingerprint, spec.Layers, spec.KVHeads, spec.HeadDim, spec.DType)
	}
	return hd, nil
}

// transcodeToStored returns blob (header hd) in the codec it is stored
// in under the cluster's codec: blob itself, or a new buffer (transcoded)
// with its own header.
func (n *Node) transcodeToStored(blob []byte, hd chunk.Header, codec chunk.Codec) (stored []byte, shd chunk.Header, transcoded bool, err error) {
	to := chunk.StoredCodec(hd.Codec, codec)
	if to == hd.Codec {
		return blob, hd, false, nil
	}
	if stored, err = chunk.TranscodeParsed(blob, &hd, to); err != nil {
		return nil, hd, false, invalid(err)
	}
	if shd, err = chunk.ParseHeader(stored, n.cfg.Limits); err != nil {
		return nil, hd, false, err
	}
	n.metrics.transcoded.WithLabelValues(to.String()).Inc()
	return stored, shd, true, nil
}

// serveGet answers a Get or Fetch: from the local store, else (unless
// direct) from another replica.
func (n *Node) serveGet(req *api.GetRequest, st grpc.ServerStreamingServer[api.GetFrame], direct bool) error {
	ctx := st.Context()
	key, err := api.KeyFromProto(req.GetKey())
	if err != nil {
		return invalid(err)
	}
	if err := checkFingerprint(ctx, key.Fingerprint); err != nil {
		return err
	}
	if req.Format != api.Format_FORMAT_ENTRY && req.Format != api.Format_FORMAT_RAW {
		return status.Errorf(codes.InvalidArgument, "unknown format %v", req.Format)
	}
	if _, err := n.model(ctx, key.Fingerprint); err != nil {
		return err
	}
	// Here first (a pinned zero-copy view), then the replicas in ring
	// order, repairing those found lacking (replication.Read).
	var blob pinned.Bytes
	if direct {
		if blob, err = n.repl.ServeFetch(ctx, key); err != nil {
			return replToStatus(err)
		}
	} else {
		rr, err := n.repl.Read(ctx, key)
		if err != nil {
			return err
		}
		blob = rr.Blob
	}
	ok := false
	defer func() {
		if !ok {
			blob.Release()
		}
	}()
	data := blob.Bytes()
	hd, err := chunk.ParseHeader(data, n.cfg.Limits)
	if err != nil {
		return status.Errorf(codes.DataLoss, "stored entry %v: %v", key, err)
	}
	gh := &api.GetHeader{Key: api.ProtoKey(hd.Key), Format: req.Format, Codec: uint32(hd.Codec),
		Shape: api.ProtoShape(hd.Shape), Tokens: hd.Tokens, Checksum: hd.Checksum}
	var body mem.Buffer
	if req.Format == api.Format_FORMAT_ENTRY {
		gh.TotalBytes = uint64(len(data))
		ok = true // the buffer releases blob now
		body = api.PinnedBuffer(blob)
	} else {
		r, err := chunk.Range{LayerLo: int(req.LayerLo), LayerHi: int(req.LayerHi), HeadLo: int(req.HeadLo), HeadHi: int(req.HeadHi)}.Resolve(hd.Shape)
		if err != nil {
			return invalid(err)
		}
		out := make([]byte, r.RangeBytes(hd.Shape))
		if err := chunk.DecodeRange(out, data, &hd, r, nil); err != nil {
			return status.Errorf(codes.DataLoss, "stored entry %v: %v", key, err)
		}
		gh.TotalBytes = uint64(len(out))
		gh.LayerLo, gh.LayerHi, gh.HeadLo, gh.HeadHi = uint32(r.LayerLo), uint32(r.LayerHi), uint32(r.HeadLo), uint32(r.HeadHi)
		body = mem.SliceBuffer(out)
	}
	defer body.Free()
	if err := api.SendHeader(st, gh); err != nil {
		return err
	}
	if err := api.SendBody(st, body, n.cfg.FrameBytes); err != nil {
		return err
	}
	n.metrics.bytesOut.WithLabelValues("get").Add(float64(gh.TotalBytes))
	return nil
}
