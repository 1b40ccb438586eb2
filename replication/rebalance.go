package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// RebalanceStats reports a rebalance or drain pass.
type RebalanceStats struct {
	Epoch       uint64
	Keys        int   // local keys examined
	KeysMoved   int   // keys streamed to a new owner
	BytesMoved  int64 // their bytes
	KeysDropped int   // local keys deleted once their new owners held them
	// Replicas is the replication factor R the pass placed keys with.
	Replicas int
	// Pending counts keys that still need a transfer or an
	// acknowledgement (a new owner unreachable, the ring moved on); the
	// pass is retried while it is non-zero.
	Pending int
}

// rebalanceBatch is the number of keys whose placement one digest call
// checks on a target.
const rebalanceBatch = 256

// Rebalance runs one pass for the current placement (the ring and the
// replication factor R): every local key this node no longer replicates
// goes to each new owner that lacks it and is deleted here once all of
// them hold it; keys it still replicates go to owners that are new since
// the last completed pass, when this node is the one designated to send
// them (the old replica that leaves the set, else the best-ranked old
// replica that stays), so each key crosses the network once. A change of R
// is a change of placement like a ring change: raising it sends every key
// to its new replicas, lowering it hands the copies beyond R off. A node
// that is not in the ring at all pushes but deletes nothing. Transfers are
// rate-limited (RebalanceBytesPerSec). The background loop runs it on
// every epoch change and every change of R; callers may run it directly.
func (r *Replicator) Rebalance(ctx context.Context) (RebalanceStats, error) {
	r.rebalanceMu.Lock()
	defer r.rebalanceMu.Unlock()
	rg := r.ring()
	n, _ := r.quorum()
	r.noteEpoch(rg)
	old, oldN := r.done, r.doneN
	if old == nil && r.saved.epoch == rg.Epoch() && r.saved.replicas > 0 && r.saved.replicas != n {
		// Restarted with the ring it last placed keys on, and R changed
		// since: that ring and the saved R are the old placement.
		old, oldN = rg, r.saved.replicas
	}
	if old != nil && old.Len() > 0 && old.Epoch() != rg.Epoch() {
		// An empty ring (a node's view before it joined) says nothing
		// about where chunks were; reads then look past the replicas
		// instead (Read).
		r.prev.Store(old)
	}
	if old != nil && oldN != n {
		r.log.Info("replication factor changed, rebalancing", "from", oldN, "to", n, "epoch", rg.Epoch())
	}
	st, err := r.pass(ctx, rg, n, old, oldN, false)
	if err == nil && st.Pending == 0 {
		r.done, r.doneN = rg, n
		r.savePlacement(rg.Epoch(), n)
	}
	return st, err
}

// Drain streams every local chunk to its owners on the ring without this
// node, so the node can leave without losing a replica. It deletes nothing
// here (reads keep being served until the node is gone) and returns once
// every chunk is held by all its new owners or ctx ends; progress is in the
// metrics (kvmesh_replication_drain_*) while it runs.
func (r *Replicator) Drain(ctx context.Context) (RebalanceStats, error) {
	r.rebalanceMu.Lock()
	defer r.rebalanceMu.Unlock()
	cur := r.ring()
	var ms []ring.Member
	for _, m := range cur.Members() {
		if m.ID != r.cfg.NodeID {
			ms = append(ms, m)
		}
	}
	without := ring.New(cur.Epoch(), ms)
	if without.Len() == 0 {
		return RebalanceStats{}, ErrNoReplicas
	}
	for {
		n, _ := r.quorum()
		st, err := r.pass(ctx, without, n, nil, 0, true)
		if err == nil && st.Pending == 0 {
			return st, nil
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		r.log.Info("drain incomplete, retrying", "pending", st.Pending, "err", err)
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(r.cfg.RebalanceRetry):
		}
	}
}

type localKey struct {
	key  chunk.Key
	sum  uint64
	size int
}

// job is one local key's transfers in a pass.
type job struct {
	localKey
	targets []string
	handoff bool // delete here once every target holds it
	acked   int  // guarded by runBatch's mutex while pushes run
}

// pass moves local keys to their n owners in rg; old and oldN are the
// placement of the last completed pass (nil: unknown). drain: rg excludes
// this node and nothing is deleted.
func (r *Replicator) pass(ctx context.Context, rg *ring.Ring, n int, old *ring.Ring, oldN int, drain bool) (RebalanceStats, error) {
	st := RebalanceStats{Epoch: rg.Epoch(), Replicas: n}
	if rg.Len() == 0 {
		return st, nil
	}
	var keys []localKey
	r.cfg.Store.Scan(func(k chunk.Key, sum uint64, size int) bool {
		keys = append(keys, localKey{k, sum, size})
		return true
	})
	slices.SortFunc(keys, func(a, b localKey) int { return chunk.CompareKeys(a.key, b.key) })
	st.Keys = len(keys)
	self := r.cfg.NodeID
	member := rg.Contains(self)

	var jobs []*job
	var buf, obuf [8]ring.Member
	for _, lk := range keys {
		reps := rg.AppendReplicas(buf[:0], lk.key.Content, n)
		j := &job{localKey: lk}
		if !drain && isMember(reps, self) {
			if old == nil {
				continue
			}
			oreps := old.AppendReplicas(obuf[:0], lk.key.Content, oldN)
			if !r.designated(rg, reps, oreps) {
				continue
			}
			for _, m := range reps {
				if m.ID != self && !isMember(oreps, m.ID) {
					j.targets = append(j.targets, m.ID)
				}
			}
		} else {
			// A node that is not in the ring at all (not yet re-added
			// after an absence) pushes but keeps its copies: it is
			// likely to own them again soon.
			j.handoff = !drain && member
			for _, m := range reps {
				if m.ID != self {
					j.targets = append(j.targets, m.ID)
				}
			}
		}
		if len(j.targets) > 0 {
			jobs = append(jobs, j)
		}
	}
	if !drain && old != nil {
		// Deletes first: a stale copy pushed later finds the tombstone.
		st.Pending += r.forwardTombstones(ctx, rg, n, old, oldN)
	}
	gauge := &r.metrics.rebalancePending
	if drain {
		gauge = &r.metrics.drainPending
	}
	gauge.Store(int64(len(jobs)))
	defer gauge.Store(0)

	var errs []error
	for len(jobs) > 0 {
		batch := jobs[:min(len(jobs), rebalanceBatch)]
		jobs = jobs[len(batch):]
		if err := r.runBatch(ctx, batch, &st, drain); err != nil {
			errs = append(errs, err)
		}
		for _, j := range batch {
			if j.acked < len(j.targets) {
				st.Pending++
				continue
			}
			if j.handoff && r.stillForeign(rg, j.key, n) {
				// Only the bytes sent (the scan's, which every attempt
				// checked): bytes stored here since are not on the
				// targets, and are kept for the next pass.
				if err := r.cfg.Store.DeleteIf(j.key, j.sum); err == nil {
					st.KeysDropped++
					r.metrics.rebalanceDropped.Add(1)
				}
			}
		}
		gauge.Store(int64(len(jobs) + st.Pending))
		if ctx.Err() != nil {
			st.Pending += len(jobs)
			return st, ctx.Err()
		}
	}
	return st, errors.Join(errs...)
}

// forwardTombstones sends the deletes recorded here to the replicas that
// became owners of their keys since the last completed pass (a new member,
// a higher R), so that a stale copy arriving there later (a late hint, a
// replica back from an absence) is refused rather than taken for live
// data. Every old replica holding a tombstone sends it: a few bytes, so no
// single sender is designated. It returns the sends that failed; the pass
// counts them pending and runs again. A target that fails once is skipped
// for the rest of the pass (each of its sends counts failed), so one
// unreachable owner costs one CallTimeout per pass, not one per tombstone.
func (r *Replicator) forwardTombstones(ctx context.Context, rg *ring.Ring, n int, old *ring.Ring, oldN int) int {
	if old.Epoch() == rg.Epoch() && oldN == n {
		return 0
	}
	self := r.cfg.NodeID
	failed := 0
	down := make(map[string]bool)
	var buf, obuf [8]ring.Member
	for _, it := range r.tombs.list() {
		if !it.deleted {
			continue
		}
		oreps := old.AppendReplicas(obuf[:0], it.key.Content, oldN)
		if !isMember(oreps, self) {
			continue
		}
		for _, m := range rg.AppendReplicas(buf[:0], it.key.Content, n) {
			if m.ID == self || isMember(oreps, m.ID) {
				continue
			}
			if down[m.ID] {
				failed++
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
			err := r.cfg.Transport.Delete(cctx, m.ID, it.key, it.at)
			cancel()
			if err != nil {
				failed++
				down[m.ID] = true
				r.log.Debug("forwarding tombstone", "to", m.ID, "key", it.key, "err", err)
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	return failed
}

// designated reports whether this node sends a key it keeps to the new
// owners: no old replica that left the set is still in the ring to do it,
// and this node is the best-ranked old replica that stays.
func (r *Replicator) designated(rg *ring.Ring, reps, oreps []ring.Member) bool {
	for _, m := range oreps {
		if !isMember(reps, m.ID) && rg.Contains(m.ID) {
			return false // a leaving replica hands it off
		}
	}
	for _, m := range oreps {
		if isMember(reps, m.ID) {
			return m.ID == r.cfg.NodeID
		}
	}
	return false
}

// stillForeign reports, against the newest ring and R, that this node does
// not replicate key, so deleting it is still right: a placement that moved
// on since the pass began (R raised again, a new epoch) may have new
// owners that did not acknowledge the key, and the next pass decides.
func (r *Replicator) stillForeign(rg *ring.Ring, key chunk.Key, n int) bool {
	cur := r.ring()
	cn, _ := r.quorum()
	return cur.Epoch() == rg.Epoch() && cn == n && !cur.IsReplica(key.Content, r.cfg.NodeID, n)
}

// runBatch asks each target which of its batch keys it lacks and streams
// those, counting acknowledgements on the jobs.
func (r *Replicator) runBatch(ctx context.Context, batch []*job, st *RebalanceStats, drain bool) error {
	perTarget := map[string][]*job{}
	for _, j := range batch {
		for _, t := range j.targets {
			perTarget[t] = append(perTarget[t], j)
		}
	}
	targets := make([]string, 0, len(perTarget))
	for t := range perTarget {
		targets = append(targets, t)
	}
	slices.Sort(targets)

	type push struct {
		target string
		j      *job
	}
	var pushes []push
	var errs []error
	for _, t := range targets {
		js := perTarget[t]
		ks := make([]chunk.Key, len(js))
		for i, j := range js {
			ks[i] = j.key
		}
		resp, err := r.cfg.Transport.Digest(ctx, t, DigestRequest{From: r.cfg.NodeID, Keys: ks})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t, err))
			continue // unreachable: these keys stay pending
		}
		held := make(map[chunk.Key]bool, len(resp.Items))
		for _, it := range resp.Items {
			held[it.Key] = true // any version, or a tombstone, counts
		}
		for _, j := range js {
			if held[j.key] {
				j.acked++
			} else {
				pushes = append(pushes, push{t, j})
			}
		}
	}

	var mu sync.Mutex
	if err := eachLimited(ctx, r.cfg.RebalanceConcurrency, len(pushes), func(i int) {
		p := pushes[i]
		n, err := r.transfer(ctx, p.target, p.j.localKey)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %v: %w", p.target, p.j.key, err))
			return
		}
		p.j.acked++
		if n > 0 {
			st.KeysMoved++
			st.BytesMoved += int64(n)
			if drain {
				r.metrics.drainKeys.Add(1)
				r.metrics.drainBytes.Add(int64(n))
			} else {
				r.metrics.rebalanceKeys.Add(1)
				r.metrics.rebalanceBytes.Add(int64(n))
			}
		}
	}); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// errChanged: a key's local bytes changed since the pass's scan (between
// the scan and a send, or while the transfer backed off from a busy
// receiver); the key stays pending and the next pass, which digests the
// target again, sends the bytes held then.
var errChanged = errors.New("replication: local copy changed during the busy back-off")

// transfer streams the local copy of lk to target, rate-limited, sending
// it again while the target answers ErrBusy, and returns the bytes sent (0
// when the key is gone here: nothing to move, which counts as done). The
// copy is pinned (read from the store) only for each send: a slow receiver
// that pushes back for up to busyGiveUp must not hold the sender's memory,
// so each attempt reads the key again and stops if it is gone, or keeps it
// pending if its bytes differ from those the scan saw (lk.sum).
func (r *Replicator) transfer(ctx context.Context, target string, lk localKey) (int, error) {
	// The rate limit is taken before the first read, on the size the
	// scan saw, so that no pin is held while waiting for it either.
	if err := r.waitBytes(ctx, lk.size); err != nil {
		return 0, err
	}
	opts := ReplicateOptions{Kind: KindRebalance, At: r.liveAt(lk.key)}
	sent, gone := 0, false
	err := r.sendBusy(ctx, func() error {
		got, err := r.cfg.Store.Get(ctx, lk.key)
		if errors.Is(err, ErrNotFound) {
			gone = true
			return nil
		}
		if err != nil {
			return err
		}
		defer got.Release()
		blob := got.Bytes()
		hd, err := chunk.ParseHeader(blob, r.cfg.Limits)
		if err != nil {
			return fmt.Errorf("local copy of %v: %w", lk.key, err)
		}
		if hd.Checksum != lk.sum {
			return errChanged // changed since the scan: the next pass digests again
		}
		sent = len(blob)
		_, err = r.cfg.Transport.Replicate(ctx, target, blob, opts)
		return err
	})
	switch {
	case gone && err == nil:
		return 0, nil // gone here (evicted, deleted): nothing to hand over
	case errors.Is(err, ErrTombstoned):
		return 0, nil // deleted there: nothing to hand over
	case err != nil:
		return 0, err
	}
	return sent, nil
}

// waitBytes takes n bytes from the transfer rate limit.
func (r *Replicator) waitBytes(ctx context.Context, n int) error {
	if r.limiter == nil {
		return nil
	}
	for n > 0 {
		take := min(n, r.limiter.Burst())
		if err := r.limiter.WaitN(ctx, take); err != nil {
			return err
		}
		n -= take
	}
	return nil
}

func (r *Replicator) ringLoop() {
	t := time.NewTicker(r.cfg.RingCheckInterval)
	defer t.Stop()
	var retryAt time.Time
	var lastEpoch uint64
	var lastN int
	tried := false
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
		}
		rg := r.ring()
		n, _ := r.quorum()
		r.rebalanceMu.Lock()
		done, doneN := r.done, r.doneN
		r.rebalanceMu.Unlock()
		if done != nil && done.Epoch() == rg.Epoch() && doneN == n {
			continue
		}
		if tried && lastEpoch == rg.Epoch() && lastN == n && time.Now().Before(retryAt) {
			continue
		}
		if r.learning(rg) {
			continue
		}
		tried, lastEpoch, lastN = true, rg.Epoch(), n
		st, err := r.Rebalance(r.ctx)
		if r.ctx.Err() != nil {
			return
		}
		if err != nil || st.Pending > 0 {
			retryAt = time.Now().Add(r.cfg.RebalanceRetry)
			r.log.Info("rebalance incomplete", "epoch", st.Epoch, "replicas", st.Replicas, "pending", st.Pending, "err", err)
		} else if st.KeysMoved > 0 || st.KeysDropped > 0 {
			r.log.Info("rebalanced", "epoch", st.Epoch, "replicas", st.Replicas, "keys_moved", st.KeysMoved, "bytes_moved", st.BytesMoved, "dropped", st.KeysDropped)
		}
	}
}

// learning reports whether rg is a new node's view while it still learns
// the ring: rg leaves this node out, and the node has never completed a
// pass (here or before a restart). What such a node holds was pushed to it
// by members that already see it in a newer ring, so a pass by rg would
// push those chunks back to owners that handed them over and dropped them.
// The node rebalances once its ring includes it.
func (r *Replicator) learning(rg *ring.Ring) bool {
	if _, ok := rg.Member(r.cfg.NodeID); ok {
		return false
	}
	r.rebalanceMu.Lock()
	defer r.rebalanceMu.Unlock()
	return r.done == nil && r.saved.epoch == 0
}

// savedPlacement is the ring epoch and R of the last completed pass.
type savedPlacement struct {
	epoch    uint64
	replicas int
}

const placementFile = "placement"

// loadPlacement reads DataDir/placement; a missing or short file (a new
// node, a torn write) means unknown.
func loadPlacement(dir string) savedPlacement {
	if dir == "" {
		return savedPlacement{}
	}
	b, err := os.ReadFile(filepath.Join(dir, placementFile))
	if err != nil || len(b) != 16 {
		return savedPlacement{}
	}
	n := binary.LittleEndian.Uint64(b[8:])
	if n == 0 || n > 1<<16 {
		return savedPlacement{}
	}
	return savedPlacement{epoch: binary.LittleEndian.Uint64(b), replicas: int(n)}
}

// savePlacement records a completed pass's placement when it changed
// (rebalanceMu held). A failure only costs the restart case: it is logged.
func (r *Replicator) savePlacement(epoch uint64, n int) {
	p := savedPlacement{epoch, n}
	if r.cfg.DataDir == "" || r.saved == p {
		r.saved = p
		return
	}
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], epoch)
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
	path := filepath.Join(r.cfg.DataDir, placementFile)
	tmp := path + ".tmp"
	err := writeFileSync(tmp, b[:])
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		r.log.Warn("recording the rebalanced placement", "err", err)
		return
	}
	r.saved = p
}
