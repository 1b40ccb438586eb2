package replication

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// ReadResult is a chunk as Read found it.
type ReadResult struct {
	// Blob is the encoded entry, verified; valid until Release.
	Blob []byte
	// From is the node it came from (this node's ID for a local hit).
	From    string
	release func()
}

// Release frees Blob (a local store's pin). Calling it again does nothing.
func (rr *ReadResult) Release() {
	if rr.release != nil {
		rr.release()
		rr.release = nil
	}
	rr.Blob = nil
}

// Read returns the chunk under key: from this node's store when it holds
// it, else from the replicas in ring order, else from the previous ring's
// replicas (a rebalance may not have moved it yet). Remote blobs are
// verified; a replica that lacks the key (this node included, when it is a
// replica) or serves a corrupt copy is repaired in the background. The
// error wraps ErrNotFound when no node has it.
func (r *Replicator) Read(ctx context.Context, key chunk.Key) (ReadResult, error) {
	n, _ := r.quorum()
	rg := r.ring()
	reps := rg.Replicas(key.Content, n)
	self := r.cfg.NodeID
	blob, release, err := r.cfg.Store.Get(ctx, key)
	if err == nil {
		r.metrics.readsLocal.Add(1)
		if isMember(reps, self) && r.chance() {
			r.enqueue(repairTask{key: key, check: true})
		}
		return ReadResult{Blob: blob, From: self, release: release}, nil
	}
	if !errors.Is(err, ErrNotFound) {
		r.log.Warn("local read failed", "key", key, "err", err)
	}
	var lacking []string
	if isMember(reps, self) {
		lacking = append(lacking, self)
	}
	order := make([]string, 0, 2*n)
	for _, m := range reps {
		if m.ID != self {
			order = append(order, m.ID)
		}
	}
	// The nearest healthy replica first: nodes that failed a read lately
	// go last (stable, so ring order holds among the rest).
	slices.SortStableFunc(order, func(a, b string) int { return boolCmp(r.suspected(a), r.suspected(b)) })
	nReps := len(order)
	if prev := r.prev.Load(); prev != nil && prev.Epoch() != rg.Epoch() {
		for _, m := range prev.Replicas(key.Content, n) {
			if m.ID != self && !slices.Contains(order, m.ID) {
				order = append(order, m.ID)
			}
		}
	}
	var errs []error
	for i, node := range order {
		b, err := r.cfg.Transport.Fetch(ctx, node, key)
		if err == nil {
			if hd, verr := chunk.Verify(b, r.cfg.Limits); verr != nil || hd.Key != key {
				err = fmt.Errorf("%w: %s served a bad copy of %v: %v", chunk.ErrCorrupt, node, key, verr)
				r.metrics.readsCorrupt.Add(1)
				if i < nReps {
					lacking = append(lacking, node)
				}
			}
		}
		if err == nil {
			r.setSuspect(node, false)
			r.metrics.readsRemote.Add(1)
			for _, t := range lacking {
				r.enqueue(repairTask{key: key, target: t, source: node})
			}
			if r.chance() && i+1 < nReps {
				r.enqueue(repairTask{key: key, check: true})
			}
			return ReadResult{Blob: b, From: node}, nil
		}
		if errors.Is(err, ErrNotFound) {
			if i < nReps {
				lacking = append(lacking, node)
			}
		} else if ctx.Err() != nil {
			return ReadResult{}, fmt.Errorf("replication: read %v: %w", key, ctx.Err())
		} else if !errors.Is(err, chunk.ErrCorrupt) {
			r.setSuspect(node, true)
		}
		errs = append(errs, fmt.Errorf("%s: %w", node, err))
	}
	r.metrics.readsMissed.Add(1)
	return ReadResult{}, fmt.Errorf("%w: %v on %d nodes: %w", ErrNotFound, key, len(order)+1, errors.Join(errs...))
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// suspected reports whether node failed a read within SuspectFor.
func (r *Replicator) suspected(node string) bool {
	r.suspectMu.Lock()
	defer r.suspectMu.Unlock()
	until, ok := r.suspects[node]
	if ok && !r.cfg.Now().Before(until) {
		delete(r.suspects, node)
		return false
	}
	return ok
}

func (r *Replicator) setSuspect(node string, bad bool) {
	r.suspectMu.Lock()
	defer r.suspectMu.Unlock()
	if bad {
		r.suspects[node] = r.cfg.Now().Add(r.cfg.SuspectFor)
	} else {
		delete(r.suspects, node)
	}
}

func isMember(ms []ring.Member, id string) bool {
	return slices.ContainsFunc(ms, func(m ring.Member) bool { return m.ID == id })
}

func (r *Replicator) chance() bool {
	c := r.cfg.ReadRepairChance
	return c >= 1 || (c > 0 && rand.Float64() < c)
}

// repairTask is one background repair: copy key from source to target,
// or (check) compare the checksums of all replicas of key and repair the
// ones that differ from the best-ranked replica's copy.
type repairTask struct {
	key            chunk.Key
	target, source string
	check          bool
}

func (r *Replicator) enqueue(t repairTask) {
	select {
	case r.repairs <- t:
		r.metrics.repairsQueued.Add(1)
	default:
		r.metrics.repairsDropped.Add(1)
	}
}

func (r *Replicator) repairLoop() {
	for {
		select {
		case <-r.ctx.Done():
			return
		case t := <-r.repairs:
			ctx, cancel := r.background()
			var err error
			if t.check {
				err = r.checkReplicas(ctx, t.key)
			} else {
				err = r.repair(ctx, t.key, t.source, t.target)
			}
			cancel()
			if err != nil && r.ctx.Err() == nil {
				r.metrics.repairErrors.Add(1)
				r.log.Debug("repair", "key", t.key, "target", t.target, "err", err)
			}
		}
	}
}

// RepairsPending is the number of queued repairs (not counting those
// running).
func (r *Replicator) RepairsPending() int { return len(r.repairs) }

// repair copies key from source to target (either may be this node) with
// KindRepair: the source's copy replaces other bytes on the target.
func (r *Replicator) repair(ctx context.Context, key chunk.Key, source, target string) error {
	blob, release, err := r.fetchFrom(ctx, source, key)
	if err != nil {
		return err
	}
	defer release()
	if err := r.push(ctx, target, key, blob, ReplicateOptions{Kind: KindRepair, At: r.liveAt(key)}); err != nil {
		return err
	}
	r.metrics.repairsDone.Add(1)
	return nil
}

// liveAt is the time of a recorded write-after-delete of key, else 0.
func (r *Replicator) liveAt(key chunk.Key) int64 {
	if t, ok := r.tombs.get(key); ok && !t.deleted {
		return t.at
	}
	return 0
}

// fetchFrom returns node's copy of key, verified when it is remote.
func (r *Replicator) fetchFrom(ctx context.Context, node string, key chunk.Key) ([]byte, func(), error) {
	if node == r.cfg.NodeID {
		return r.cfg.Store.Get(ctx, key)
	}
	b, err := r.cfg.Transport.Fetch(ctx, node, key)
	if err != nil {
		return nil, nil, err
	}
	if hd, err := chunk.Verify(b, r.cfg.Limits); err != nil || hd.Key != key {
		return nil, nil, fmt.Errorf("%w: %s served a bad copy of %v: %v", chunk.ErrCorrupt, node, key, err)
	}
	return b, func() {}, nil
}

// push stores blob on node (this node included).
func (r *Replicator) push(ctx context.Context, node string, key chunk.Key, blob []byte, opts ReplicateOptions) error {
	if node == r.cfg.NodeID {
		return r.storeLocal(ctx, blob, key, opts)
	}
	return r.cfg.Transport.Replicate(ctx, node, blob, opts)
}

// checkReplicas compares the checksums of key on its replicas; the copy on
// the best-ranked replica that has one is canonical, and the others are
// repaired to it.
func (r *Replicator) checkReplicas(ctx context.Context, key chunk.Key) error {
	n, _ := r.quorum()
	reps := r.ring().Replicas(key.Content, n)
	sums := make([]uint64, len(reps))
	has := make([]bool, len(reps))
	var errs []error
	for i, m := range reps {
		resp, err := r.digestOf(ctx, m.ID, DigestRequest{From: r.cfg.NodeID, Keys: []chunk.Key{key}})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, it := range resp.Items {
			if it.Key == key && !it.Deleted {
				sums[i], has[i] = it.Checksum, true
			}
		}
	}
	src := slices.Index(has, true)
	if src < 0 {
		return errors.Join(errs...)
	}
	for i, m := range reps {
		if i != src && (!has[i] || sums[i] != sums[src]) {
			if err := r.repair(ctx, key, reps[src].ID, m.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// digestOf asks node (this one included) for a digest.
func (r *Replicator) digestOf(ctx context.Context, node string, req DigestRequest) (DigestResponse, error) {
	if node == r.cfg.NodeID {
		return r.ServeDigest(ctx, req)
	}
	return r.cfg.Transport.Digest(ctx, node, req)
}
