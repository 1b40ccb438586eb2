package replication

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
	"github.com/kvmesh/kvmesh/ring"
)

// ReadResult is a chunk as Read found it.
type ReadResult struct {
	// Blob is the encoded entry, verified, lent to the caller: release it
	// exactly once (it holds a local store's pin and the read's serving
	// call).
	Blob pinned.Bytes
	// From is the node it came from (this node's ID for a local hit).
	From string
}

// Read returns the chunk under key: from this node's store when it holds
// it, else from the replicas in ring order, else from the previous ring's
// replicas (a rebalance may not have moved it yet). Where the previous
// ring is not known here (this node joined with the ring already including
// it), a read that misses shortly after a rebalance sign (RebalanceSettle)
// asks the members ranked right after the replicas instead: with
// rendezvous placement the previous owners of a key rank there. Remote
// blobs are verified; a replica that lacks the key (this node included,
// when it is a replica) or serves a corrupt copy is repaired in the
// background. The error wraps ErrNotFound when no node has it and a
// replica that is not recovering said so (this node, when it is one);
// ErrUnavailable when none could (unreachable, or refilling after a
// restart: an empty replica is not a copy's absence). A read of a
// version of an opaque value that a node has retired gets the newer
// version it holds instead (versions.go): the Blob names the key it is. A
// read counts as serving (incoming rebalance work yields to it) until its
// Blob is released.
func (r *Replicator) Read(ctx context.Context, key chunk.Key) (ReadResult, error) {
	r.serving.begin()
	rr, err := r.read(ctx, key)
	if err != nil {
		r.serving.end()
		return rr, err
	}
	rr.Blob = rr.Blob.Then((*endServing)(r.serving))
	return rr, nil
}

func (r *Replicator) read(ctx context.Context, key chunk.Key) (ReadResult, error) {
	n, _ := r.quorum()
	rg := r.ring()
	r.noteEpoch(rg)
	reps := rg.Replicas(key.Content, n)
	self := r.cfg.NodeID
	blob, got, err := r.getVersion(ctx, key)
	if err == nil {
		if verr := r.checkLocal(blob.Bytes(), got, true); verr != nil {
			blob.Release()
			err = verr
		}
	}
	if errors.Is(err, chunk.ErrCorrupt) {
		// A damaged copy here (found by the check above, or by the store
		// reading it: a disk file that fails its checksum) is a missing
		// one: the replicas serve the read, and this node is repaired like
		// one that lacks it.
		r.dropCorrupt(got, err, false)
		err = fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err == nil {
		r.metrics.readsLocal.Add(1)
		if isMember(reps, self) && r.chance() {
			r.enqueue(repairTask{key: got, check: true})
		}
		return ReadResult{Blob: blob, From: self}, nil
	}
	if !errors.Is(err, ErrNotFound) {
		r.log.Warn("local read failed", "key", key, "err", err)
	}
	var lacking []string
	selfLacks := isMember(reps, self)
	if selfLacks {
		lacking = append(lacking, self)
	}
	// answered: a replica that is not recovering said it lacks the key,
	// so a miss everywhere means the key is absent. Without one (replicas
	// unreachable, or recovering after a restart) a miss is ErrUnavailable:
	// an empty replica does not count as an answer.
	answered := selfLacks && !r.cfg.Recovering()
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
	for _, m := range r.fallbacks(rg, key.Content, len(reps), n) {
		if m.ID != self && !slices.Contains(order, m.ID) {
			order = append(order, m.ID)
		}
	}
	var errs []error
	for i, node := range order {
		if i == nReps {
			r.metrics.missFallbacks.Add(1)
		}
		b, err := r.cfg.Transport.Fetch(ctx, node, key)
		got := key
		if err == nil {
			hd, verr := chunk.Verify(b, r.cfg.Limits)
			if verr == nil && serves(hd.Key, key) {
				got = hd.Key // key itself, or a newer version
			} else {
				if verr == nil {
					verr = fmt.Errorf("it names %v", hd.Key)
				}
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
				task := repairTask{key: got, target: t, source: node}
				if t == self {
					task.blob = b // stored here without fetching it again
				}
				r.enqueue(task)
			}
			if r.chance() && i+1 < nReps {
				r.enqueue(repairTask{key: got, check: true})
			}
			return ReadResult{Blob: pinned.Owned(b), From: node}, nil
		}
		if errors.Is(err, ErrRecovering) {
			// Refilling after a restart: a repair target, not an answer,
			// and tried after the others for a while.
			if i < nReps {
				lacking = append(lacking, node)
			}
			r.setSuspect(node, true)
		} else if errors.Is(err, ErrNotFound) {
			if i < nReps {
				lacking = append(lacking, node)
				answered = true
			}
		} else if ctx.Err() != nil {
			return ReadResult{}, fmt.Errorf("replication: read %v: %w", key, ctx.Err())
		} else if !errors.Is(err, chunk.ErrCorrupt) {
			r.setSuspect(node, true)
		}
		errs = append(errs, fmt.Errorf("%s: %w", node, err))
	}
	if selfLacks && len(order) > 0 {
		// A rebalance may have handed the key over to this node (and the
		// old owner dropped it) while the fetches ran.
		if blob, _, err := r.getVersion(ctx, key); err == nil {
			r.metrics.readsLocal.Add(1)
			return ReadResult{Blob: blob, From: self}, nil
		}
	}
	r.metrics.readsMissed.Add(1)
	if !answered && len(order) > 0 {
		return ReadResult{}, fmt.Errorf("%w: %v: %d nodes asked, none that could say it is absent answered: %w",
			ErrUnavailable, key, len(order)+1, errors.Join(errs...))
	}
	if len(errs) == 0 {
		// Every node answered "not here": nothing else to report, and a
		// %w of a nil error would print as %!w(<nil>).
		return ReadResult{}, fmt.Errorf("%w: %v on %d nodes", ErrNotFound, key, len(order)+1)
	}
	return ReadResult{}, fmt.Errorf("%w: %v on %d nodes: %w", ErrNotFound, key, len(order)+1, errors.Join(errs...))
}

// Fallbacks are the nodes a read of content asks after its replicas in
// the current ring, while a ring change may still be moving it: the
// previous ring's replicas of content, or, on a node that never saw the
// previous ring, the members ranked right after the replicas for
// RebalanceSettle after a sign of a rebalance. Empty otherwise. Some may
// be replicas too; the caller skips those.
func (r *Replicator) Fallbacks(content chunk.ID) []ring.Member {
	n, _ := r.quorum()
	rg := r.ring()
	r.noteEpoch(rg)
	return r.fallbacks(rg, content, len(rg.Replicas(content, n)), n)
}

func (r *Replicator) fallbacks(rg *ring.Ring, content chunk.ID, reps, n int) []ring.Member {
	if prev := r.prev.Load(); prev != nil && prev.Len() > 0 && prev.Epoch() != rg.Epoch() {
		return prev.Replicas(content, n)
	}
	if r.settling() {
		// No previous ring known here: the previous owners of content
		// rank right after its replicas (a join moves a key only to the
		// newcomer, which ranks above them).
		extra := min(n, rg.Len()-reps)
		return rg.Replicas(content, reps+extra)[reps:]
	}
	return nil
}

// noteEpoch records a ring epoch new to this node as a sign of a
// rebalance (settling).
func (r *Replicator) noteEpoch(rg *ring.Ring) {
	e := rg.Epoch()
	if old := r.epochSeen.Load(); old != e && r.epochSeen.CompareAndSwap(old, e) {
		r.rebalanceSeen.Store(r.cfg.Now().UnixNano())
	}
}

// settling reports whether a rebalance may still be moving chunks here:
// a new epoch or an incoming rebalance blob within RebalanceSettle.
func (r *Replicator) settling() bool {
	d := r.cfg.RebalanceSettle
	return d > 0 && r.cfg.Now().UnixNano()-r.rebalanceSeen.Load() < int64(d)
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
	// blob is source's copy, already fetched and verified, when target is
	// this node; nil means fetch it from source.
	blob []byte
}

// maxRepairBlobBytes bounds the fetched blobs queued repairs hold; past
// it a repair fetches its blob again when it runs.
const maxRepairBlobBytes = 256 << 20

func (r *Replicator) enqueue(t repairTask) {
	if t.blob != nil {
		if r.repairBlobBytes.Add(int64(len(t.blob))) > maxRepairBlobBytes {
			r.repairBlobBytes.Add(-int64(len(t.blob)))
			t.blob = nil
		}
	}
	select {
	case r.repairs <- t:
		r.metrics.repairsQueued.Add(1)
	default:
		r.metrics.repairsDropped.Add(1)
		r.repairBlobBytes.Add(-int64(len(t.blob)))
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
			switch {
			case t.check:
				err = r.checkReplicas(ctx, t.key)
			case t.blob != nil:
				err = r.repairHere(ctx, t.key, t.blob)
				r.repairBlobBytes.Add(-int64(len(t.blob)))
			default:
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
	blob, err := r.fetchFrom(ctx, source, key)
	if err != nil {
		return err
	}
	defer blob.Release()
	if err := r.push(ctx, target, key, blob.Bytes(), ReplicateOptions{Kind: KindRepair, At: r.liveAt(key)}); err != nil {
		return err
	}
	r.metrics.repairsDone.Add(1)
	return nil
}

// repairHere stores blob, a verified copy of key fetched by a read, on
// this node: as costly as a rebalance store, so it takes the receiver's
// budget and yields to serving too.
func (r *Replicator) repairHere(ctx context.Context, key chunk.Key, blob []byte) error {
	if _, err := r.storeThroughInbox(ctx, blob, key, ReplicateOptions{Kind: KindRepair, At: r.liveAt(key)}, false); err != nil {
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
func (r *Replicator) fetchFrom(ctx context.Context, node string, key chunk.Key) (pinned.Bytes, error) {
	if node == r.cfg.NodeID {
		return r.cfg.Store.Get(ctx, key)
	}
	b, err := r.cfg.Transport.Fetch(ctx, node, key)
	if err != nil {
		return pinned.Bytes{}, err
	}
	hd, err := chunk.Verify(b, r.cfg.Limits)
	if err == nil && hd.Key != key && serves(hd.Key, key) {
		// The version is retired there: a newer one came since the list.
		return pinned.Bytes{}, fmt.Errorf("%w: %s holds %v, newer than %v", ErrNotFound, node, hd.Key, key)
	}
	if err != nil || hd.Key != key {
		return pinned.Bytes{}, fmt.Errorf("%w: %s served a bad copy of %v: %v", chunk.ErrCorrupt, node, key, err)
	}
	return pinned.Owned(b), nil
}

// push stores blob on node (this node included).
func (r *Replicator) push(ctx context.Context, node string, key chunk.Key, blob []byte, opts ReplicateOptions) error {
	var err error
	if node == r.cfg.NodeID {
		_, err = r.storeLocal(ctx, blob, key, opts)
	} else {
		_, err = r.cfg.Transport.Replicate(ctx, node, blob, opts)
	}
	return err
}

// checkReplicas compares the checksums of key on its replicas; the version
// that Wins is canonical, and the others are repaired to it.
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
	src := -1
	for i := range reps {
		if has[i] && (src < 0 || Wins(sums[i], sums[src])) {
			src = i
		}
	}
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

// checkLocal checks a copy read from this node's store: the key its
// header names and, when full, every checksum (chunk.Verify; else the
// header alone, chunk.ParseHeader). Copies are verified when stored; this
// catches what changed them since (a write into the store's memory, a
// failing disk), so that the node serves a replica's copy and repairs its
// own instead of serving the damage. Every failure wraps chunk.ErrCorrupt.
// Read checks in full (its callers
// send the bytes on unchecked); ServeFetch checks the header, as every
// reader of a peer's copy verifies it in full and repairs a bad one.
func (r *Replicator) checkLocal(blob []byte, key chunk.Key, full bool) error {
	var hd chunk.Header
	var err error
	if full {
		hd, err = chunk.Verify(blob, r.cfg.Limits)
	} else {
		hd, err = chunk.ParseHeader(blob, r.cfg.Limits)
	}
	if err != nil && !errors.Is(err, chunk.ErrCorrupt) {
		// The copy was valid when stored: whatever fails now (a size past
		// the limits, an unknown codec) is damage too.
		err = fmt.Errorf("%w: %w", chunk.ErrCorrupt, err)
	}
	if err != nil {
		return err
	}
	if hd.Key != key {
		return fmt.Errorf("%w: the copy of %v names %v", chunk.ErrCorrupt, key, hd.Key)
	}
	return nil
}

// DropCorrupt removes this node's copy of key, found corrupt (why), and
// queues a check of its replicas, which repairs the copy here from
// theirs; meanwhile reads of key are served by the replicas. The node's
// readers call it when their own verification of a local copy fails (an
// injection's); Read and ServeFetch do it for what their check finds.
func (r *Replicator) DropCorrupt(key chunk.Key, why error) { r.dropCorrupt(key, why, true) }

// dropCorrupt is DropCorrupt; check queues the replica check (Read
// repairs this node itself, with the copy it fetched).
func (r *Replicator) dropCorrupt(key chunk.Key, why error, check bool) {
	r.metrics.localCorrupt.Add(1)
	err := r.cfg.Store.Delete(key)
	r.log.Error("local copy corrupt: dropped, to be read from a replica and repaired", "key", key, "why", why, "drop_err", err)
	if check {
		r.enqueue(repairTask{key: key, check: true})
	}
	r.CopiesDropped()
}
