package node

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

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
		// A want spelled as another key of the same computation (the root
		// of a prefix chain: standalone) finds that key EXACT.
		items[i] = lookupItem{content: api.IDFromProto(it.Content), want: chunk.Canonical(fp, want)}
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
