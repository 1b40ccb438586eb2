package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/pinned"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/ring"
)

// Limits of requests that are not entries.
const (
	// MaxLookupBatch is the most items one Lookup may carry.
	MaxLookupBatch = 4096
	// MaxDigestItems is the most items one Digest answer carries.
	MaxDigestItems = 10000
	// putUpfrontBytes is how much of an entry's announced size a Put
	// allocates before its data arrives.
	putUpfrontBytes = 16 << 20
	// modelWait is how long a node waits for a model registered through
	// another node a moment ago to reach its own metadata.
	modelWait = 2 * time.Second
)

type clientService struct {
	api.UnimplementedClientServer
	n *Node
}

type peerService struct {
	api.UnimplementedPeerServer
	n *Node
}

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

func (s *clientService) RegisterModel(ctx context.Context, req *api.RegisterModelRequest) (*api.RegisterModelResponse, error) {
	spec, err := api.SpecFromProto(req.GetSpec())
	if err != nil {
		return nil, invalid(err)
	}
	if err := checkFingerprint(ctx, spec.Fingerprint()); err != nil {
		return nil, err
	}
	fp, err := s.n.meta.RegisterModel(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &api.RegisterModelResponse{Fingerprint: api.ProtoFingerprint(fp)}, nil
}

func (s *clientService) Models(ctx context.Context, _ *api.ModelsRequest) (*api.ModelsResponse, error) {
	resp := &api.ModelsResponse{}
	for _, spec := range s.n.meta.Models() {
		resp.Models = append(resp.Models, &api.ModelInfo{Fingerprint: api.ProtoFingerprint(spec.Fingerprint()), Spec: api.ProtoSpec(spec)})
	}
	return resp, nil
}

func (s *clientService) Put(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) error {
	return s.n.receivePut(st, false)
}

func (s *peerService) Replicate(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse]) error {
	return s.n.receivePut(st, true)
}

// receivePut reads a Put or Replicate stream, checks the entry and stores
// it: here only (direct), or on its replica set.
func (n *Node) receivePut(st grpc.ClientStreamingServer[api.PutFrame, api.PutResponse], direct bool) error {
	ctx := st.Context()
	var hdr api.PutHeader
	if err := api.RecvHeader(st, &hdr); err != nil {
		return err
	}
	key, err := api.KeyFromProto(hdr.Key)
	if err != nil {
		return invalid(err)
	}
	if err := checkFingerprint(ctx, key.Fingerprint); err != nil {
		return err
	}
	if !direct && (hdr.Direct || hdr.Kind != 0 || hdr.At != 0) {
		// A single-node store with a chosen time and kind bypasses the
		// replica set and orders against tombstones: members only.
		if err := n.sec.checkPeer(ctx, "a direct put"); err != nil {
			return err
		}
	}
	switch {
	case hdr.BlobBytes == 0:
		return status.Error(codes.InvalidArgument, "put of an empty entry")
	case hdr.BlobBytes > uint64(n.cfg.Limits.MaxBlobBytes):
		return status.Errorf(codes.ResourceExhausted, "entry of %d bytes exceeds the limit of %d", hdr.BlobBytes, n.cfg.Limits.MaxBlobBytes)
	}
	spec, err := n.model(ctx, key.Fingerprint)
	if err != nil {
		return err
	}
	// Room for the announced size only as data arrives (beyond
	// putUpfrontBytes): a header alone must not reserve MaxBlobBytes.
	blob, err := api.RecvBodyGrow(st, int(hdr.BlobBytes), putUpfrontBytes)
	if err != nil {
		return err
	}
	var extra api.Frame
	if err := st.RecvMsg(&extra); !errors.Is(err, io.EOF) {
		extra.Data.Free()
		if err == nil {
			err = fmt.Errorf("%w: frames after the announced %d bytes", api.ErrLongBody, hdr.BlobBytes)
		}
		return err
	}
	n.metrics.bytesIn.WithLabelValues("put").Add(float64(len(blob)))
	hd, err := chunk.Verify(blob, n.cfg.Limits)
	if err != nil {
		return err
	}
	if hd.Key != key {
		return status.Errorf(codes.InvalidArgument, "entry holds key %v, header says %v", hd.Key, key)
	}
	if sh := hd.Shape; sh.Layers != spec.Layers || sh.KVHeads != spec.KVHeads || sh.HeadDim != spec.HeadDim || sh.DType != spec.DType {
		return status.Errorf(codes.InvalidArgument, "entry shape %d layers x %d heads x %d dims %v does not match model %s (%d x %d x %d %v)",
			sh.Layers, sh.KVHeads, sh.HeadDim, sh.DType, key.Fingerprint, spec.Layers, spec.KVHeads, spec.HeadDim, spec.DType)
	}
	if direct || hdr.Direct {
		kind := replication.Kind(hdr.Kind)
		if kind == 0 {
			kind = replication.KindWrite
		}
		if err := n.repl.ServeReplicate(ctx, blob, replication.ReplicateOptions{Kind: kind, At: hdr.At}); err != nil {
			return replToStatus(err)
		}
		return st.SendAndClose(&api.PutResponse{Checksum: hd.Checksum, StoredOn: []string{n.cfg.NodeID}})
	}
	set := n.meta.Settings()
	if r := n.meta.Ring(); r.Len() > 0 && !r.IsReplica(key.Content, n.cfg.NodeID, set.ReplicationFactor) {
		n.metrics.forwards.Inc()
	}
	// A client's entry is stored in the cluster's codec: transcoded here,
	// once, so that replicas, hints, rebalancing, pulls and fetches move the
	// stored bytes unchanged (direct puts above are such moves). The same
	// entry sent in raw or in lossless becomes the same bytes, so a re-put
	// from a client in another codec finds its bytes already stored.
	if to := chunk.StoredCodec(hd.Codec, set.Codec); to != hd.Codec {
		if blob, err = chunk.Transcode(blob, to, n.cfg.Limits); err != nil {
			return invalid(err)
		}
		if hd, err = chunk.ParseHeader(blob, n.cfg.Limits); err != nil {
			return err
		}
		n.metrics.transcoded.WithLabelValues(to.String()).Inc()
	}
	res, err := n.repl.Write(ctx, blob)
	if err != nil {
		return err
	}
	return st.SendAndClose(&api.PutResponse{Checksum: hd.Checksum, StoredOn: res.StoredOn})
}

func (s *clientService) Get(req *api.GetRequest, st grpc.ServerStreamingServer[api.GetFrame]) error {
	return s.n.serveGet(req, st, req.GetDirect())
}

func (s *peerService) Fetch(req *api.GetRequest, st grpc.ServerStreamingServer[api.GetFrame]) error {
	return s.n.serveGet(req, st, true)
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

func (s *clientService) Lookup(ctx context.Context, req *api.LookupRequest) (*api.LookupResponse, error) {
	return s.n.lookup(ctx, req)
}

type lookupItem struct {
	content chunk.ID
	want    chunk.Context
}

func (n *Node) lookup(ctx context.Context, req *api.LookupRequest) (*api.LookupResponse, error) {
	if req.Fingerprint == nil {
		return nil, status.Error(codes.InvalidArgument, "lookup without a model fingerprint")
	}
	if len(req.Items) > MaxLookupBatch {
		return nil, status.Errorf(codes.ResourceExhausted, "lookup of %d items exceeds %d", len(req.Items), MaxLookupBatch)
	}
	if err := n.checkChunks("lookup", len(req.Items)); err != nil {
		return nil, err
	}
	fp := api.FingerprintFromProto(req.Fingerprint)
	if err := checkFingerprint(ctx, fp); err != nil {
		return nil, err
	}
	if _, err := n.model(ctx, fp); err != nil {
		return nil, err
	}
	items := make([]lookupItem, len(req.Items))
	for i, it := range req.Items {
		if it.GetContent() == nil {
			return nil, status.Errorf(codes.InvalidArgument, "lookup item %d has no content ID", i)
		}
		want, err := api.ContextFromProto(it.GetWant())
		if err != nil {
			return nil, invalid(fmt.Errorf("lookup item %d: %w", i, err))
		}
		items[i] = lookupItem{content: api.IDFromProto(it.Content), want: want}
	}
	if req.Direct {
		return &api.LookupResponse{Results: n.lookupLocal(fp, items)}, nil
	}
	return n.lookupCluster(ctx, req.Fingerprint, fp, items)
}

func (n *Node) lookupLocal(fp chunk.Fingerprint, items []lookupItem) []*api.LookupResult {
	out := make([]*api.LookupResult, len(items))
	for i, it := range items {
		key, match, err := n.store.Best(fp, it.content, it.want)
		res := &api.LookupResult{}
		if err == nil && match != chunk.MatchMiss {
			res.Key = api.ProtoKey(key)
			res.Status = api.ProtoMatch(match)
		}
		out[i] = res
	}
	return out
}

// lookupCluster asks every replica of each item, one batch per node, and
// keeps the best answer (betterAnswer: the best encoding by chunk.Better;
// ties go to the replica first in ring order, so every coordinator answers
// alike).
func (n *Node) lookupCluster(ctx context.Context, pfp *api.ID, fp chunk.Fingerprint, items []lookupItem) (*api.LookupResponse, error) {
	r := n.meta.Ring()
	if r.Len() == 0 {
		return nil, status.Error(codes.Unavailable, "the cluster has no ring yet")
	}
	rf := n.meta.Settings().ReplicationFactor
	reps := make([][]ring.Member, len(items))
	byNode := make(map[string][]int) // node ID -> item indexes
	addr := make(map[string]string)
	for i, it := range items {
		reps[i] = r.Replicas(it.content, rf)
		for _, m := range reps[i] {
			byNode[m.ID] = append(byNode[m.ID], i)
			addr[m.ID] = m.GRPCAddr
		}
	}
	answers := make(map[string][]*api.LookupResult, len(byNode)) // aligned with byNode[id]
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, idx := range byNode {
		sub := make([]lookupItem, len(idx))
		for j, i := range idx {
			sub[j] = items[i]
		}
		if id == n.cfg.NodeID {
			res := n.lookupLocal(fp, sub)
			mu.Lock()
			answers[id] = res
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := n.remoteLookup(ctx, addr[id], pfp, sub)
			if err != nil {
				n.log.Debug("node: lookup on replica", "replica", id, "err", err)
				return
			}
			mu.Lock()
			answers[id] = res
			mu.Unlock()
		}()
	}
	wg.Wait()
	// per item: node ID -> answer
	per := make([]map[string]*api.LookupResult, len(items))
	for id, idx := range byNode {
		res := answers[id]
		if res == nil {
			continue
		}
		for j, i := range idx {
			if per[i] == nil {
				per[i] = make(map[string]*api.LookupResult, rf)
			}
			per[i][id] = res[j]
		}
	}
	out := make([]*api.LookupResult, len(items))
	for i := range items {
		var best *api.LookupResult
		for _, m := range reps[i] {
			if a := per[i][m.ID]; betterAnswer(items[i].want, a, best) {
				best = a
			}
		}
		res := &api.LookupResult{}
		if best != nil {
			res.Status, res.Key = best.Status, best.Key
		}
		var rest []*api.Member
		for _, m := range reps[i] {
			a := per[i][m.ID]
			pm := api.ProtoMember(m)
			if a != nil && best != nil && a.Status != api.LookupStatus_LOOKUP_STATUS_MISS && keyEqual(a.Key, best.Key) {
				res.Holders = append(res.Holders, pm)
			} else {
				rest = append(rest, pm)
			}
		}
		res.Holders = append(res.Holders, rest...)
		n.metrics.lookups.WithLabelValues(api.MatchFromProto(res.Status).String()).Inc()
		out[i] = res
	}
	return &api.LookupResponse{Results: out}, nil
}

// hitOf is a replica's lookup answer as the key it found; false for a miss,
// no answer, or a key that does not convert.
func hitOf(a *api.LookupResult) (chunk.Key, bool) {
	if a == nil || api.MatchFromProto(a.Status) == chunk.MatchMiss {
		return chunk.Key{}, false
	}
	k, err := api.KeyFromProto(a.Key)
	return k, err == nil
}

// betterAnswer reports whether replica answer a beats b, the best so far
// (nil: none), for a chunk wanted in context want: a hit beats a miss, and
// of two hits the better encoding by chunk.Better wins. The same key keeps
// b, the replica earlier in ring order.
func betterAnswer(want chunk.Context, a, b *api.LookupResult) bool {
	ka, ok := hitOf(a)
	if !ok {
		return false
	}
	kb, ok := hitOf(b)
	return !ok || chunk.Better(want, ka.Context, kb.Context)
}

func keyEqual(a, b *api.Key) bool {
	ka, err1 := api.KeyFromProto(a)
	kb, err2 := api.KeyFromProto(b)
	return err1 == nil && err2 == nil && ka == kb
}

func (n *Node) remoteLookup(ctx context.Context, addr string, fp *api.ID, items []lookupItem) ([]*api.LookupResult, error) {
	c, err := n.peers.client(addr)
	if err != nil {
		return nil, err
	}
	req := &api.LookupRequest{Fingerprint: fp, Direct: true, Items: make([]*api.LookupItem, len(items))}
	for i, it := range items {
		req.Items[i] = &api.LookupItem{Content: api.ProtoID(it.content), Want: api.ProtoContext(it.want)}
	}
	ctx, cancel := n.withTimeout(ctx)
	defer cancel()
	resp, err := c.Lookup(ctx, req)
	if err != nil {
		return nil, err
	}
	if len(resp.Results) != len(items) {
		return nil, fmt.Errorf("node: replica %s answered %d of %d lookups", addr, len(resp.Results), len(items))
	}
	return resp.Results, nil
}

func (s *clientService) Delete(ctx context.Context, req *api.DeleteRequest) (*api.DeleteResponse, error) {
	n := s.n
	key, err := api.KeyFromProto(req.GetKey())
	if err != nil {
		return nil, invalid(err)
	}
	if err := checkFingerprint(ctx, key.Fingerprint); err != nil {
		return nil, err
	}
	if req.Direct || req.At != 0 {
		// A delete here only, at a chosen time, is replication's
		// (Peer.Delete; older members send it here): a client could
		// otherwise plant tombstones dated in the future.
		if err := n.sec.checkPeer(ctx, "a direct delete"); err != nil {
			return nil, err
		}
	}
	if req.Direct {
		if err := n.repl.ServeDelete(ctx, key, req.At); err != nil {
			return nil, replToStatus(err)
		}
		return &api.DeleteResponse{Deleted: 1}, nil
	}
	res, err := n.repl.Delete(ctx, key)
	if err != nil {
		return nil, err
	}
	return &api.DeleteResponse{Deleted: uint32(len(res.DeletedOn))}, nil
}

func (s *clientService) Stats(ctx context.Context, _ *api.StatsRequest) (*api.StatsResponse, error) {
	st := s.n.store.Stats()
	resp := &api.StatsResponse{NodeId: s.n.cfg.NodeID, Entries: uint64(st.Entries), Panics: uint64(readCounter(s.n.metrics.panics))}
	for _, t := range st.Tiers {
		if !t.Enabled {
			continue
		}
		resp.Bytes += uint64(t.StoredBytes)
		resp.Tiers = append(resp.Tiers, &api.TierStats{Name: t.Tier.String(), Entries: uint64(t.Entries), Bytes: uint64(t.StoredBytes),
			CapacityBytes: uint64(t.Budget), Evictions: t.Evictions})
	}
	resp.Forwarded = uint64(readCounter(s.n.metrics.forwards))
	state := "ready"
	if err := s.n.Ready(); err != nil {
		state = err.Error()
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(api.StateHeader, state))
	return resp, nil
}

func (s *clientService) ClusterInfo(ctx context.Context, _ *api.ClusterInfoRequest) (*api.ClusterInfoResponse, error) {
	n := s.n
	r := n.meta.Ring()
	set := n.meta.Settings()
	lid, laddr := n.meta.Leader()
	resp := &api.ClusterInfoResponse{NodeId: n.cfg.NodeID, Epoch: r.Epoch(), LeaderId: lid, LeaderGrpcAddr: laddr,
		ReplicationFactor: uint32(set.ReplicationFactor), WriteQuorum: uint32(set.WriteQuorum), Codec: set.Codec.String()}
	http := make(map[string]string)
	if n.gossip != nil {
		for _, m := range n.gossip.Members() {
			http[m.ID] = m.HTTPAddr
		}
	}
	for _, m := range r.Members() {
		pm := api.ProtoMember(m)
		pm.HttpAddr = http[m.ID]
		resp.Members = append(resp.Members, pm)
	}
	return resp, nil
}

func (s *peerService) Digest(ctx context.Context, req *api.DigestRequest) (*api.DigestResponse, error) {
	if req.From != "" || len(req.Keys) > 0 {
		return s.n.serveDigest(ctx, req)
	}
	var after *chunk.Key
	if req.After != nil {
		k, err := api.KeyFromProto(req.After)
		if err != nil {
			return nil, invalid(err)
		}
		after = &k
	}
	limit := int(req.Limit)
	if limit <= 0 || limit > MaxDigestItems {
		limit = MaxDigestItems
	}
	var items []*api.DigestItem
	var keys []chunk.Key
	sums := make(map[chunk.Key][2]uint64)
	s.n.store.Scan(func(k chunk.Key, sum uint64, size int) bool {
		if after == nil || compareKeys(k, *after) > 0 {
			keys = append(keys, k)
			sums[k] = [2]uint64{sum, uint64(size)}
		}
		return true
	})
	slices.SortFunc(keys, compareKeys)
	more := len(keys) > limit
	if more {
		keys = keys[:limit]
	}
	for _, k := range keys {
		v := sums[k]
		items = append(items, &api.DigestItem{Key: api.ProtoKey(k), Checksum: v[0], BlobBytes: v[1]})
	}
	return &api.DigestResponse{Items: items, More: more}, nil
}

// compareKeys orders keys by fingerprint, content, context kind, window and
// context ID: the order Digest pages in.
func compareKeys(a, b chunk.Key) int {
	return cmp.Or(
		cmp.Compare(a.Fingerprint.Hi, b.Fingerprint.Hi), cmp.Compare(a.Fingerprint.Lo, b.Fingerprint.Lo),
		cmp.Compare(a.Content.Hi, b.Content.Hi), cmp.Compare(a.Content.Lo, b.Content.Lo),
		cmp.Compare(a.Context.Kind, b.Context.Kind), cmp.Compare(a.Context.Window, b.Context.Window),
		cmp.Compare(a.Context.ID.Hi, b.Context.ID.Hi), cmp.Compare(a.Context.ID.Lo, b.Context.ID.Lo),
	)
}

func (s *peerService) MetaApply(ctx context.Context, req *api.MetaApplyRequest) (*api.MetaApplyResponse, error) {
	if err := s.n.sec.checkForwarded(ctx, req.Command); err != nil {
		return nil, err
	}
	if err := s.n.meta.ApplyForwarded(ctx, req.Command); err != nil {
		return nil, metaApplyStatus(err)
	}
	return &api.MetaApplyResponse{}, nil
}

// metaApplyStatus is the answer to a forwarded command that failed: a
// conditional settings change whose version no longer holds is Aborted
// (as a stale ring epoch is), carrying meta.ErrSettingsVersion's text,
// which the forwarder maps back to the sentinel; anything else goes
// through toStatus. Not FailedPrecondition, which the forwarder reads as
// "not the leader" and retries.
func metaApplyStatus(err error) error {
	if errors.Is(err, meta.ErrSettingsVersion) {
		return status.Error(codes.Aborted, err.Error())
	}
	return err
}
