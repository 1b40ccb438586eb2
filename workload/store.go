package workload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
)

// Cluster is the part of the Go client ClusterStore uses.
type Cluster interface {
	Lookup(ctx context.Context, fp chunk.Fingerprint, items []client.LookupItem) ([]client.LookupResult, error)
	Get(ctx context.Context, key chunk.Key) ([]byte, error)
	Put(ctx context.Context, blob []byte) (client.PutResult, error)
	// Codec is the codec the cluster stores entries in.
	Codec() chunk.Codec
}

// StoreConfig configures NewClusterStore.
type StoreConfig struct {
	// Fingerprint is the model's (engine.Fingerprint), registered with the
	// cluster beforehand.
	Fingerprint chunk.Fingerprint
	// Codec entries are encoded with; CodecInvalid means the cluster's
	// (Cluster.Codec), which spares the nodes a transcode.
	Codec chunk.Codec
	// Limits bound decoded entries; zero means chunk.DefaultLimits.
	Limits chunk.Limits
	// Fetchers is how many Gets of one lookup run at once; 0 means 8.
	Fetchers int
}

// ClusterStore adapts the cluster client to engine.ChunkStore: Lookup is
// the client's Lookup (EXACT, else APPROXIMATE) followed by a Get of every
// key found, decoded with chunk.Decode; Put is chunk.Encode and the client's
// Put. It is safe for concurrent use.
type ClusterStore struct {
	c   Cluster
	cfg StoreConfig
}

// NewClusterStore returns a store over c.
func NewClusterStore(c Cluster, cfg StoreConfig) *ClusterStore {
	if cfg.Limits == (chunk.Limits{}) {
		cfg.Limits = chunk.DefaultLimits
	}
	if cfg.Fetchers <= 0 {
		cfg.Fetchers = 8
	}
	return &ClusterStore{c: c, cfg: cfg}
}

// Put encodes e with the store's codec (else the cluster's) and writes it
// to its replicas.
func (s *ClusterStore) Put(ctx context.Context, e *chunk.Entry) error {
	codec := s.cfg.Codec
	if codec == chunk.CodecInvalid {
		codec = s.c.Codec()
	}
	blob, err := chunk.Encode(nil, e, codec)
	if err != nil {
		return fmt.Errorf("workload: encode %v: %w", e.Key, err)
	}
	if _, err := s.c.Put(ctx, blob); err != nil {
		return fmt.Errorf("workload: put %v: %w", e.Key, err)
	}
	return nil
}

// Lookup implements engine.ChunkSource with kvmesh's cascade.
func (s *ClusterStore) Lookup(ctx context.Context, reqs []engine.LookupRequest) ([]*chunk.Entry, error) {
	return s.lookup(ctx, reqs, false)
}

// prefixOnly is the store under prefix caching's rule; the cut happens
// before any Get, so the baseline pays for no bytes it would not use.
func (s *ClusterStore) prefixOnly() engine.ChunkSource { return prefixStore{s} }

type prefixStore struct{ s *ClusterStore }

func (p prefixStore) Lookup(ctx context.Context, reqs []engine.LookupRequest) ([]*chunk.Entry, error) {
	return p.s.lookup(ctx, reqs, true)
}

func (s *ClusterStore) lookup(ctx context.Context, reqs []engine.LookupRequest, prefix bool) ([]*chunk.Entry, error) {
	out := make([]*chunk.Entry, len(reqs))
	if len(reqs) == 0 {
		return out, nil
	}
	items := make([]client.LookupItem, len(reqs))
	for i, r := range reqs {
		if r.Key.Fingerprint != s.cfg.Fingerprint {
			return nil, fmt.Errorf("workload: lookup for fingerprint %v, store serves %v", r.Key.Fingerprint, s.cfg.Fingerprint)
		}
		items[i] = client.LookupItem{Content: r.Key.Content, Want: r.Key.Context}
	}
	res, err := s.c.Lookup(ctx, s.cfg.Fingerprint, items)
	if err != nil {
		return nil, fmt.Errorf("workload: lookup: %w", err)
	}
	if len(res) != len(reqs) {
		return nil, fmt.Errorf("workload: lookup answered %d of %d", len(res), len(reqs))
	}
	n := len(reqs)
	if prefix {
		n = slices.IndexFunc(res, func(r client.LookupResult) bool { return r.Match != chunk.MatchExact })
		if n < 0 {
			n = len(reqs)
		}
	}
	var (
		wg   sync.WaitGroup
		sem  = make(chan struct{}, s.cfg.Fetchers)
		mu   sync.Mutex
		errs []error
	)
	for i := range n {
		if res[i].Match == chunk.MatchMiss {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ent, err := s.fetch(ctx, res[i].Key, reqs[i].Tokens)
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			out[i] = ent
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// fetch reads and decodes key; an entry evicted since the lookup, or whose
// tokens are not the request's (a content ID collision), is a miss.
func (s *ClusterStore) fetch(ctx context.Context, key chunk.Key, tokens []uint32) (*chunk.Entry, error) {
	blob, err := s.c.Get(ctx, key)
	if errors.Is(err, client.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("workload: get %v: %w", key, err)
	}
	ent, err := chunk.Decode(blob, s.cfg.Limits)
	if err != nil {
		return nil, fmt.Errorf("workload: decode %v: %w", key, err)
	}
	if !slices.Equal(ent.Tokens, tokens) {
		return nil, nil
	}
	return ent, nil
}

// PrefixOnly returns src under prefix caching's lookup rule (vLLM's,
// SGLang's): only EXACT prefix-chain hits count, and only for the leading
// chunks of the prompt, up to the first chunk that is not one. The engine
// asks for a prompt's chunk segments in order, and every workload here puts
// its text (question, new message) after the last chunk, so "leading chunks"
// is "leading requests". A ClusterStore applies the rule before fetching.
func PrefixOnly(src engine.ChunkSource) engine.ChunkSource {
	if cs, ok := src.(*ClusterStore); ok {
		return cs.prefixOnly()
	}
	return prefixFilter{src}
}

type prefixFilter struct{ src engine.ChunkSource }

func (p prefixFilter) Lookup(ctx context.Context, reqs []engine.LookupRequest) ([]*chunk.Entry, error) {
	out, err := p.src.Lookup(ctx, reqs)
	if err != nil || len(out) != len(reqs) {
		return out, err
	}
	cut := false
	for i, ent := range out {
		cut = cut || ent == nil || ent.Key.Context != reqs[i].Key.Context
		if cut {
			out[i] = nil
		}
	}
	return out, nil
}
