package client

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// LookupItem asks for the best encoding of Content for use after Want.
type LookupItem struct {
	Content chunk.ID
	Want    chunk.Context
}

// LookupResult answers one LookupItem: the key found (unless
// chunk.MatchMiss) and the replicas of the content, those that hold the key
// first.
type LookupResult struct {
	Match   chunk.Match
	Key     chunk.Key
	Holders []ring.Member
}

// maxBatch matches node.MaxLookupBatch.
const maxBatch = 4096

// Lookup answers items, in order, with one call per replica set (split in
// batches of at most 4096).
func (c *Client) Lookup(ctx context.Context, fp chunk.Fingerprint, items []LookupItem) ([]LookupResult, error) {
	out := make([]LookupResult, len(items))
	v := c.view.Load()
	groups := make(map[string][]int)
	var order []string
	for i, it := range items {
		g := ""
		if v.ring.Len() > 0 {
			if m, ok := v.ring.Owner(it.Content); ok {
				g = m.ID
			}
		}
		if len(groups[g]) == 0 {
			order = append(order, g)
		}
		groups[g] = append(groups[g], i)
	}
	var batches [][]int
	for _, g := range order {
		idx := groups[g]
		for len(idx) > 0 {
			n := min(len(idx), maxBatch)
			batches = append(batches, idx[:n])
			idx = idx[n:]
		}
	}
	errs := make([]error, len(batches))
	var wg sync.WaitGroup
	for bi, idx := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[bi] = c.lookupBatch(ctx, fp, items, idx, out)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

func (c *Client) lookupBatch(ctx context.Context, fp chunk.Fingerprint, items []LookupItem, idx []int, out []LookupResult) error {
	req := &api.LookupRequest{Fingerprint: api.ProtoFingerprint(fp), Items: make([]*api.LookupItem, len(idx))}
	for j, i := range idx {
		req.Items[j] = &api.LookupItem{Content: api.ProtoID(items[i].Content), Want: api.ProtoContext(items[i].Want)}
	}
	content := items[idx[0]].Content
	var resp *api.LookupResponse
	err := c.do(ctx, &content, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		var md metadata.MD
		resp, err = api.NewClientClient(cc).Lookup(ctx, req, grpc.Header(&md))
		c.noteEpoch(md)
		return err
	})
	if err != nil {
		return err
	}
	if len(resp.Results) != len(idx) {
		return fmt.Errorf("client: lookup answered %d of %d items", len(resp.Results), len(idx))
	}
	for j, i := range idx {
		r := resp.Results[j]
		res := LookupResult{Match: api.MatchFromProto(r.Status)}
		if res.Match != chunk.MatchMiss {
			k, err := api.KeyFromProto(r.Key)
			if err != nil {
				return err
			}
			res.Key = k
		}
		for _, h := range r.Holders {
			res.Holders = append(res.Holders, api.MemberFromProto(h))
		}
		out[i] = res
	}
	return nil
}
