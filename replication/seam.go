package replication

import (
	"context"
	"errors"
	"sync"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// Replicate stores blob, an encoded and verified entry of key, on each of
// replicas (none of which is this node) as a write, and returns the IDs
// that acknowledged once every replica answered or ctx ended; replicas
// that could not be reached get a hint here. It has the shape of the
// node package's Replicator seam, for a node that stores the local copy
// and counts the quorum itself; Write does all of it.
func (r *Replicator) Replicate(ctx context.Context, key chunk.Key, blob []byte, replicas []ring.Member) []string {
	opts := ReplicateOptions{Kind: KindWrite, At: r.now()}
	acks := make([]bool, len(replicas))
	var wg sync.WaitGroup
	for i, m := range replicas {
		if m.ID == r.cfg.NodeID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.cfg.Transport.Replicate(ctx, m.ID, blob, opts)
			switch {
			case err == nil:
				acks[i] = true
				r.metrics.replicaWrites.Add(1)
			case !errors.Is(err, ErrRejected):
				r.metrics.replicaWriteErrors.Add(1)
				r.addHint(m.ID, key, blob, opts.At)
			default:
				r.metrics.replicaWriteErrors.Add(1)
			}
		}()
	}
	wg.Wait()
	var ids []string
	for i, ok := range acks {
		if ok {
			ids = append(ids, replicas[i].ID)
		}
	}
	return ids
}
