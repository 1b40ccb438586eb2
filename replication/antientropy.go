package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// NumBuckets is the number of key ranges in a digest table: content IDs
// are bucketed by their top 12 bits, so a table is 32 KiB on the wire.
// A bucket that differs is split into SubBuckets ranges (the next 8 bits),
// and only the ranges that differ list their items: about
// keys/2^20 items per difference, so the cost of a round follows the
// differences, not the data.
const (
	NumBuckets = 1 << bucketBits
	SubBuckets = 1 << subBits
)

const (
	bucketBits = 12
	subBits    = 8
	// maxSplit bounds the buckets one digest call splits (128 KiB).
	maxSplit = 64
	// maxRanges bounds the ranges one digest call lists.
	maxRanges = 1024
)

func bucketOf(k chunk.Key) uint32 { return uint32(k.Content.Hi >> (64 - bucketBits)) }

func rangeOf(k chunk.Key) uint32 { return uint32(k.Content.Hi >> (64 - bucketBits - subBits)) }

// itemHash hashes what replicas must agree on about one key: its identity
// and either its checksum or that it is deleted. A bucket's hash is the
// XOR of its items', so it does not depend on scan order.
func itemHash(it DigestItem) uint64 {
	h := ring.Mix64(0x6b766d6573682e61 ^ it.Key.Content.Lo)
	h = ring.Mix64(h ^ it.Key.Content.Hi)
	h = ring.Mix64(h ^ it.Key.Fingerprint.Lo)
	h = ring.Mix64(h ^ it.Key.Fingerprint.Hi)
	h = ring.Mix64(h ^ uint64(it.Key.Context.Kind) ^ uint64(it.Key.Context.Window)<<8)
	h = ring.Mix64(h ^ it.Key.Context.ID.Lo)
	h = ring.Mix64(h ^ it.Key.Context.ID.Hi)
	if it.Deleted {
		return ring.Mix64(h ^ 0x64656c657465642e)
	}
	return ring.Mix64(h ^ it.Checksum)
}

// pairSet selects, for this node and each of some peers, the keys both
// replicate in a ring.
type pairSet struct {
	rg    *ring.Ring
	self  string
	peers []string
	n     int
}

func newPairSet(rg *ring.Ring, self string, peers []string, n int) *pairSet {
	return &pairSet{rg: rg, self: self, peers: peers, n: n}
}

// each calls fn with the indexes of the peers that share the key with self.
func (ps *pairSet) each(iter func(func(DigestItem) bool), fn func(it DigestItem, peer int)) {
	var buf [8]ring.Member
	reps := buf[:0]
	iter(func(it DigestItem) bool {
		reps = ps.rg.AppendReplicas(reps[:0], it.Key.Content, ps.n)
		if !isMember(reps, ps.self) {
			return true
		}
		for j, p := range ps.peers {
			if isMember(reps, p) {
				fn(it, j)
			}
		}
		return true
	})
}

// tables returns each peer's bucket table.
func (ps *pairSet) tables(iter func(func(DigestItem) bool)) [][]uint64 {
	out := make([][]uint64, len(ps.peers))
	for j := range out {
		out[j] = make([]uint64, NumBuckets)
	}
	ps.each(iter, func(it DigestItem, j int) { out[j][bucketOf(it.Key)] ^= itemHash(it) })
	return out
}

// subTables returns, for peer's pair, the sub-bucket hashes of each
// listed bucket, concatenated.
func (ps *pairSet) subTables(iter func(func(DigestItem) bool), peer int, buckets []uint32) []uint64 {
	at := make(map[uint32]int, len(buckets))
	for i, b := range buckets {
		at[b] = i
	}
	out := make([]uint64, len(buckets)*SubBuckets)
	sub := &pairSet{rg: ps.rg, self: ps.self, peers: ps.peers[peer : peer+1], n: ps.n}
	sub.each(iter, func(it DigestItem, _ int) {
		if i, ok := at[bucketOf(it.Key)]; ok {
			out[i*SubBuckets+int(rangeOf(it.Key)%SubBuckets)] ^= itemHash(it)
		}
	})
	return out
}

// items returns the items of peer's pair in the wanted ranges, sorted.
func (ps *pairSet) items(iter func(func(DigestItem) bool), peer int, want map[uint32]bool) []DigestItem {
	var out []DigestItem
	sub := &pairSet{rg: ps.rg, self: ps.self, peers: ps.peers[peer : peer+1], n: ps.n}
	sub.each(iter, func(it DigestItem, _ int) {
		if want[rangeOf(it.Key)] {
			out = append(out, it)
		}
	})
	slices.SortFunc(out, func(a, b DigestItem) int { return chunk.CompareKeys(a.Key, b.Key) })
	return out
}

// AntiEntropyStats reports one anti-entropy round.
type AntiEntropyStats struct {
	Peers         int // peers compared
	BucketsDiffer int // buckets whose hashes differed
	RangesDiffer  int // sub-bucket ranges whose hashes differed
	ItemsListed   int // items the peers listed for those ranges
	Pushed        int // keys copied to a peer
	BytesPushed   int64
	Fetched       int // keys copied here (a write newer than our delete)
	Deletes       int // tombstones applied (here or on a peer)
	Refused       int // pushes the peer refused (no room, tombstone)
	// Pulled and BytesPulled count the keys a Pull round copied here
	// from a peer because this node lacked them.
	Pulled      int
	BytesPulled int64
	// UnderW and UnderR count the keys this node holds (and replicates)
	// that have fewer than W, or fewer than R, copies on their replicas
	// after the round's repairs (a plain round only; see copies.count).
	UnderW, UnderR int
}

// copies records, during an anti-entropy round, which peers are known
// to hold the keys this node holds: a peer holds a shared key unless its
// digest failed or it was found lacking the key and not sent it. A peer
// that is refilling after a restart lists only what it has, so an empty
// replica never counts as a copy.
type copies struct {
	peers  map[string]int
	failed []bool
	lacks  []map[chunk.Key]bool
}

func newCopies(peers []string) *copies {
	c := &copies{peers: make(map[string]int, len(peers)), failed: make([]bool, len(peers)), lacks: make([]map[chunk.Key]bool, len(peers))}
	for j, p := range peers {
		c.peers[p] = j
		c.lacks[j] = make(map[chunk.Key]bool)
	}
	return c
}

// count returns how many live keys held here have fewer than w and
// fewer than n copies on their replicas. A key is counted by its first
// holder in ring order only (this node, when no replica ranked above it
// holds the key), so the sum over the nodes' last rounds counts each key
// once when their views agree.
func (c *copies) count(rg *ring.Ring, self string, n, w int, iter func(func(DigestItem) bool)) (underW, underR int) {
	var buf [8]ring.Member
	reps := buf[:0]
	iter(func(it DigestItem) bool {
		if it.Deleted {
			return true
		}
		reps = rg.AppendReplicas(reps[:0], it.Key.Content, n)
		if !isMember(reps, self) {
			return true
		}
		holders, first, seenSelf := 0, true, false
		for _, m := range reps {
			if m.ID == self {
				holders++
				seenSelf = true
				continue
			}
			j, ok := c.peers[m.ID]
			if !ok || c.failed[j] || c.lacks[j][it.Key] {
				continue
			}
			holders++
			if !seenSelf {
				first = false
			}
		}
		if !first {
			return true
		}
		if holders < w {
			underW++
		}
		if holders < min(n, len(reps)) {
			underR++
		}
		return true
	})
	return underW, underR
}

// AntiEntropy runs one round: with every other member of the ring it
// compares bucket tables of the keys both replicate, lists the differing
// buckets, and fixes what differs. Each side fixes what it is the source
// of (keys it holds and the peer lacks, checksum conflicts where its
// version Wins, deletes it knows of), so a round on every
// node converges the replicas. A peer with another ring epoch is skipped.
func (r *Replicator) AntiEntropy(ctx context.Context) (AntiEntropyStats, error) {
	return r.antiEntropy(ctx, false)
}

// Pull is an AntiEntropy round in which this node also takes, from each
// peer, the keys it should replicate and lacks (and their tombstones),
// instead of waiting for each peer's own round to push them: it is what a
// node that restarted with an empty tier runs (StartupPull). Transfers
// share the rebalance rate limit, and each store takes the receiver's
// budget (storeThroughInbox), so a refill yields to this node's serving;
// progress shows in the pull metrics.
func (r *Replicator) Pull(ctx context.Context) (AntiEntropyStats, error) {
	return r.antiEntropy(ctx, true)
}

func (r *Replicator) antiEntropy(ctx context.Context, pull bool) (AntiEntropyStats, error) {
	var st AntiEntropyStats
	rg := r.ring()
	self := r.cfg.NodeID
	if !rg.Contains(self) {
		return st, nil
	}
	n, _ := r.quorum()
	var peers []string
	for _, m := range rg.Members() {
		if m.ID != self {
			peers = append(peers, m.ID)
		}
	}
	ps := newPairSet(rg, self, peers, n)
	tables := ps.tables(r.localItems)
	cp := newCopies(peers)
	var errs []error
	for j, p := range peers {
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if err := r.syncPeer(ctx, ps, j, tables[j], pull, &st, cp); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			cp.failed[j] = true
			continue
		}
		st.Peers++
	}
	if !pull {
		// A pull round adds keys here that the tables did not cover, so
		// only a plain round counts copies.
		_, w := r.quorum()
		st.UnderW, st.UnderR = cp.count(rg, self, n, w, r.localItems)
		r.metrics.keysUnderW.Store(int64(st.UnderW))
		r.metrics.keysUnderR.Store(int64(st.UnderR))
	}
	r.metrics.aeRounds.Add(1)
	if pull {
		r.metrics.pullRounds.Add(1)
	}
	r.metrics.aeBucketsDiffer.Add(int64(st.BucketsDiffer))
	r.metrics.aePushed.Add(int64(st.Pushed))
	return st, errors.Join(errs...)
}

func (r *Replicator) syncPeer(ctx context.Context, ps *pairSet, j int, local []uint64, pull bool, st *AntiEntropyStats, cp *copies) error {
	p := ps.peers[j]
	base := DigestRequest{From: r.cfg.NodeID, Epoch: ps.rg.Epoch(), Replicas: ps.n}
	resp, err := r.cfg.Transport.Digest(ctx, p, base)
	if err != nil {
		return err
	}
	if len(resp.Table) != NumBuckets {
		return fmt.Errorf("%w: digest table of %d buckets", ErrRejected, len(resp.Table))
	}
	var diff []uint32
	for b := range uint32(NumBuckets) {
		if local[b] != resp.Table[b] {
			diff = append(diff, b)
		}
	}
	st.BucketsDiffer += len(diff)
	// Split the differing buckets, then list the differing ranges.
	var ranges []uint32
	for len(diff) > 0 {
		batch := diff[:min(len(diff), maxSplit)]
		diff = diff[len(batch):]
		req := base
		req.Split = batch
		remote, err := r.cfg.Transport.Digest(ctx, p, req)
		if err != nil {
			return err
		}
		if len(remote.Table) != len(batch)*SubBuckets {
			return fmt.Errorf("%w: %d sub-bucket hashes for %d buckets", ErrRejected, len(remote.Table), len(batch))
		}
		mine := ps.subTables(r.localItems, j, batch)
		for i, b := range batch {
			for s := range SubBuckets {
				if mine[i*SubBuckets+s] != remote.Table[i*SubBuckets+s] {
					ranges = append(ranges, b<<subBits|uint32(s))
				}
			}
		}
	}
	st.RangesDiffer += len(ranges)
	for len(ranges) > 0 {
		batch := ranges[:min(len(ranges), maxRanges)]
		ranges = ranges[len(batch):]
		req := base
		req.Ranges = batch
		remote, err := r.cfg.Transport.Digest(ctx, p, req)
		if err != nil {
			return err
		}
		st.ItemsListed += len(remote.Items)
		want := make(map[uint32]bool, len(batch))
		for _, b := range batch {
			want[b] = true
		}
		mine := ps.items(r.localItems, j, want)
		if err := r.reconcile(ctx, ps.rg, ps.n, p, mine, remote.Items, pull, st, cp.lacks[j]); err != nil {
			return err
		}
	}
	return nil
}

// reconcile fixes the differences between two sorted item lists. The
// live keys mine holds that the peer still lacks afterwards (it was not
// sent them, or refused them) are added to lacks.
func (r *Replicator) reconcile(ctx context.Context, rg *ring.Ring, n int, p string, mine, theirs []DigestItem, pull bool, st *AntiEntropyStats, lacks map[chunk.Key]bool) error {
	slices.SortFunc(theirs, func(a, b DigestItem) int { return chunk.CompareKeys(a.Key, b.Key) })
	var errs []error
	var pulls []*DigestItem // taken after the walk, several at a time
	i, k := 0, 0
	for i < len(mine) || k < len(theirs) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var a, b *DigestItem
		switch {
		case k >= len(theirs) || i < len(mine) && chunk.CompareKeys(mine[i].Key, theirs[k].Key) < 0:
			a = &mine[i]
			i++
		case i >= len(mine) || chunk.CompareKeys(mine[i].Key, theirs[k].Key) > 0:
			b = &theirs[k]
			k++
		default:
			a, b = &mine[i], &theirs[k]
			i++
			k++
		}
		var err error
		if a == nil && pull {
			pulls = append(pulls, b)
		} else {
			pushed := st.Pushed
			err = r.fixItem(ctx, rg, n, p, a, b, st)
			if a != nil && !a.Deleted && (b == nil || b.Deleted) && st.Pushed == pushed {
				lacks[a.Key] = true
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.pullItems(ctx, p, pulls, st); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// pullItems takes items from peer p with RebalanceConcurrency fetches in
// flight, so that the next blobs cross the network while one is stored
// (the stores themselves keep to the receiver's budget).
func (r *Replicator) pullItems(ctx context.Context, p string, items []*DigestItem, st *AntiEntropyStats) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	if err := eachLimited(ctx, r.cfg.RebalanceConcurrency, len(items), func(i int) {
		var one AntiEntropyStats
		err := r.pullItem(ctx, p, items[i], &one)
		mu.Lock()
		defer mu.Unlock()
		st.Deletes += one.Deletes
		st.Refused += one.Refused
		st.Pulled += one.Pulled
		st.BytesPulled += one.BytesPulled
		if err != nil {
			errs = append(errs, err)
		}
	}); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// eachLimited calls fn(i) for every i in [0, n), at most limit calls at
// once, and waits for the calls it started. It returns ctx's error when
// ctx ends before every call started.
func eachLimited(ctx context.Context, limit, n int, fn func(i int)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, max(limit, 1))
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(i)
		}()
	}
	return nil
}

// fixItem fixes one key given what this node (a) and the peer (b) hold;
// nil means absent. Only the side that is the source acts.
func (r *Replicator) fixItem(ctx context.Context, rg *ring.Ring, n int, p string, a, b *DigestItem, st *AntiEntropyStats) error {
	switch {
	case a == nil:
		return nil // the peer is the source; its round fixes it
	case a.Deleted && (b == nil || !b.Deleted && b.At <= a.At):
		// Our delete is newer than their copy (or they lack the tombstone).
		st.Deletes++
		return r.cfg.Transport.Delete(ctx, p, a.Key, a.At)
	case a.Deleted:
		if b.Deleted {
			return nil
		}
		// They hold a write newer than our delete: take it.
		got, err := r.fetchFrom(ctx, p, a.Key)
		if err != nil {
			return err
		}
		defer got.Release()
		st.Fetched++
		_, err = r.storeThroughInbox(ctx, got.Bytes(), a.Key, ReplicateOptions{Kind: KindRepair, At: b.At}, false)
		return err
	case b != nil && b.Deleted:
		if a.At > b.At {
			return r.pushItem(ctx, p, a, st) // our write is newer than their delete
		}
		st.Deletes++
		return r.applyDelete(a.Key, b.At)
	case b == nil:
		return r.pushItem(ctx, p, a, st)
	case a.Checksum != b.Checksum:
		// Two versions: the one that Wins is pushed by its holder.
		if Wins(a.Checksum, b.Checksum) {
			return r.pushItem(ctx, p, a, st)
		}
	}
	return nil
}

// pullItem takes what peer p holds of a key this node lacks: the tombstone
// of a delete, or the entry itself.
func (r *Replicator) pullItem(ctx context.Context, p string, b *DigestItem, st *AntiEntropyStats) error {
	if b.Deleted {
		st.Deletes++
		return r.applyDelete(b.Key, b.At)
	}
	if rc, ok := r.cfg.Store.(RoomChecker); ok && b.Size > 0 && !rc.HasRoom(b.Size) {
		// storeLocal would refuse it: do not fetch it for nothing.
		st.Refused++
		return nil
	}
	got, err := r.fetchFrom(ctx, p, b.Key)
	if errors.Is(err, ErrNotFound) {
		return nil // evicted or deleted there since it listed it
	}
	if err != nil {
		return err
	}
	defer got.Release()
	blob := got.Bytes()
	if err := r.waitBytes(ctx, len(blob)); err != nil {
		return err
	}
	_, err = r.storeThroughInbox(ctx, blob, b.Key, ReplicateOptions{Kind: KindRepair, At: b.At}, false)
	if isRejected(err) {
		st.Refused++
		return nil
	}
	if err != nil {
		return err
	}
	st.Pulled++
	st.BytesPulled += int64(len(blob))
	r.metrics.pullKeys.Add(1)
	r.metrics.pullBytes.Add(int64(len(blob)))
	return nil
}

// storeThroughInbox stores blob within the receiver's budget (inbox.go):
// incoming rebalance blobs, read repairs, and blobs fetched from a peer by
// this node's own anti-entropy or pull: a node refilling itself after a
// restart stores at most IncomingRebalanceStreams blobs at once, yields to
// its serving calls and keeps to the incoming byte rate. refusable: other
// nodes' work, refused with ErrBusy when the budget stays spent; this
// node's own work is not refusable: it waits as long as ctx allows.
func (r *Replicator) storeThroughInbox(ctx context.Context, blob []byte, key chunk.Key, opts ReplicateOptions, refusable bool) (uint64, error) {
	release, err := r.inboxSlot(ctx, len(blob), refusable)
	if err != nil {
		return 0, err
	}
	defer release()
	return r.storeLocal(ctx, blob, key, opts)
}

func (r *Replicator) pushItem(ctx context.Context, p string, a *DigestItem, st *AntiEntropyStats) error {
	got, err := r.cfg.Store.Get(ctx, a.Key)
	if errors.Is(err, ErrNotFound) {
		return nil // evicted since the scan
	}
	if err != nil {
		return err
	}
	defer got.Release()
	blob := got.Bytes()
	if err := r.waitBytes(ctx, len(blob)); err != nil {
		return err
	}
	_, err = r.cfg.Transport.Replicate(ctx, p, blob, ReplicateOptions{Kind: KindRepair, At: a.At})
	if isRejected(err) {
		st.Refused++
		return nil
	}
	if err != nil {
		return err
	}
	st.Pushed++
	st.BytesPushed += int64(len(blob))
	return nil
}

// PeerTable returns this node's bucket table for the keys it shares with
// peer in the current ring; replicas have converged when their tables for
// each other are equal.
func (r *Replicator) PeerTable(peer string) []uint64 {
	n, _ := r.quorum()
	return newPairSet(r.ring(), r.cfg.NodeID, []string{peer}, n).tables(r.localItems)[0]
}

// aeKickGap is how long after CopiesDropped its round runs: copies
// dropped in a burst (a damaged disk, a full file system) are taken back
// by one round.
const aeKickGap = 5 * time.Second

// CopiesDropped tells the replicator that this node lost copies outside
// its own paths (its store dropped damaged entries, or entries the tier
// below could not take): a Pull round runs aeKickGap later (one for a
// burst), in which this node takes back from its peers the copies it
// lacks, as far as its store has room for them without evicting (a full
// store fetches nothing), instead of waiting for the peers' periodic
// rounds to push them. A plain round would not: the node that lacks a
// key is not its source. The loss shows in the under-replication gauges
// of the keys' other holders, at their next round (a key is counted by a
// node that holds it). It does not block; with the periodic rounds off
// (a negative AntiEntropyInterval) it does nothing.
func (r *Replicator) CopiesDropped() {
	select {
	case r.aeKick <- struct{}{}:
	default:
	}
}

func (r *Replicator) antiEntropyLoop() {
	t := time.NewTicker(r.cfg.AntiEntropyInterval)
	defer t.Stop()
	for {
		pull := false
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		case <-r.aeKick:
			// Wait out the burst, then take it back in one round.
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(aeKickGap):
			}
			select {
			case <-r.aeKick:
			default:
			}
			pull = true
		}
		st, err := r.antiEntropy(r.ctx, pull)
		if err != nil && r.ctx.Err() == nil {
			r.log.Debug("anti-entropy", "err", err)
		}
		if st.BucketsDiffer > 0 || st.UnderW > 0 {
			r.log.Info("anti-entropy round", "peers", st.Peers, "buckets_differ", st.BucketsDiffer, "pull", pull,
				"pushed", st.Pushed, "pulled", st.Pulled, "deletes", st.Deletes, "refused", st.Refused, "under_w", st.UnderW, "under_r", st.UnderR)
		}
	}
}

// startupPullAttempts bounds the Pull rounds of StartupPull; the waits
// between them double from one second, so it gives up after about half a
// minute of peers that cannot answer (anti-entropy takes over then).
const startupPullAttempts = 5

// StartupPull refills a node that has just started (its DRAM tier comes
// back empty): it runs Pull rounds until one reaches every peer without
// error, or startupPullAttempts rounds have run, or ctx ends. Call it once
// the node is back in the ring. PullRunning is 1 meanwhile; the keys and
// bytes copied add to the pull metrics. It returns the sum of the rounds
// and the last round's error.
func (r *Replicator) StartupPull(ctx context.Context) (AntiEntropyStats, error) {
	r.metrics.pullRunning.Store(1)
	defer r.metrics.pullRunning.Store(0)
	var total AntiEntropyStats
	wait := time.Second
	var err error
	for attempt := range startupPullAttempts {
		var st AntiEntropyStats
		st, err = r.Pull(ctx)
		total.add(st)
		if err == nil || ctx.Err() != nil || attempt == startupPullAttempts-1 {
			break
		}
		r.log.Debug("startup pull round incomplete; retrying", "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return total, ctx.Err()
		case <-t.C:
		}
		wait *= 2
	}
	return total, err
}

func (s *AntiEntropyStats) add(o AntiEntropyStats) {
	s.Peers = max(s.Peers, o.Peers)
	s.BucketsDiffer += o.BucketsDiffer
	s.RangesDiffer += o.RangesDiffer
	s.ItemsListed += o.ItemsListed
	s.Pushed += o.Pushed
	s.BytesPushed += o.BytesPushed
	s.Fetched += o.Fetched
	s.Deletes += o.Deletes
	s.Refused += o.Refused
	s.Pulled += o.Pulled
	s.BytesPulled += o.BytesPulled
	s.UnderW, s.UnderR = o.UnderW, o.UnderR
}
