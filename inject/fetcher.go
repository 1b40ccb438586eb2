package inject

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/kvtier"
)

// Local is the node's own store; *kvtier.Store implements it.
type Local interface {
	Best(fp chunk.Fingerprint, content chunk.ID, want chunk.Context) (chunk.Key, kvtier.Match, error)
	Get(ctx context.Context, key chunk.Key) (*kvtier.Handle, error)
}

// Remote reaches the other replicas of a content ID; the node implements
// it over gRPC (a direct Lookup to the replica set, then a Fetch stream).
type Remote interface {
	// Best returns the best key the replicas hold for content wanted in
	// context want, as kvtier's Best ranks them, or Miss.
	Best(ctx context.Context, fp chunk.Fingerprint, content chunk.ID, want chunk.Context) (chunk.Key, Match, error)
	// Get reads key from a replica that holds it.
	Get(ctx context.Context, key chunk.Key) ([]byte, error)
}

// TierFetcher is the node's Fetcher: an exact entry wherever it is, local
// first; else an approximate one, local first (no network), then remote.
// Local blobs are pinned in their tier until the Service releases them.
type TierFetcher struct {
	Local Local
	// Remote may be nil (a single node, or tests): local entries only.
	Remote Remote
}

// Fetch implements Fetcher.
func (f TierFetcher) Fetch(ctx context.Context, key chunk.Key) (Fetched, error) {
	lkey, lm, lerr := f.Local.Best(key.Fingerprint, key.Content, key.Context)
	if lerr != nil {
		lm = kvtier.Miss
	}
	if lm == kvtier.Exact {
		if got, err := f.local(ctx, lkey, Exact); err == nil {
			return got, nil
		}
		lm = kvtier.Miss // evicted since Best: ask the replicas
	}
	var rerr error
	if f.Remote != nil {
		rkey, rm, err := f.Remote.Best(ctx, key.Fingerprint, key.Content, key.Context)
		switch {
		case err != nil:
			rerr = err
		case rm == Exact || (rm == Approximate && lm == kvtier.Miss):
			blob, err := f.Remote.Get(ctx, rkey)
			if err == nil {
				return Fetched{Blob: blob, Match: rm}, nil
			}
			rerr = err
		}
	}
	if lm == kvtier.Approximate {
		if got, err := f.local(ctx, lkey, Approximate); err == nil {
			return got, nil
		}
	}
	if rerr != nil {
		return Fetched{}, fmt.Errorf("inject: replicas: %w", rerr)
	}
	return Fetched{Match: Miss}, lerr
}

func (f TierFetcher) local(ctx context.Context, key chunk.Key, m Match) (Fetched, error) {
	h, err := f.Local.Get(ctx, key)
	if err != nil {
		return Fetched{}, err
	}
	return Fetched{Blob: h.Bytes(), Release: h.Release, Match: m}, nil
}
