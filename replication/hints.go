package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// A hint is a write this node keeps for a replica it could not reach. In
// a directory each hint is one file, <seq>.hint, holding:
//
//	"KVHT" | version u8 | target len u16 | target | at i64 | created i64 |
//	blob len u32 | blob | CRC-32C of all the preceding bytes (u32)
//
// written to a temporary name, synced and renamed, so a crash leaves
// either the whole hint or none.
type hintMeta struct {
	seq     uint64
	target  string
	key     chunk.Key
	at      int64 // the write's time
	created int64 // when the hint was made
	size    int64
	blob    []byte // memory mode only
}

const (
	hintMagic   = "KVHT"
	hintVersion = 1
	hintFixed   = 4 + 1 + 2 + 8 + 8 + 4 + 4
	maxTarget   = 1024
)

func encodeHint(h *hintMeta, blob []byte) []byte {
	b := make([]byte, 0, hintFixed+len(h.target)+len(blob))
	b = append(b, hintMagic...)
	b = append(b, hintVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.target)))
	b = append(b, h.target...)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.at))
	b = binary.LittleEndian.AppendUint64(b, uint64(h.created))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(blob)))
	b = append(b, blob...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

// decodeHint parses a hint file. The blob aliases b; its header must parse
// and name the key the hint is for.
func decodeHint(b []byte, lim chunk.Limits) (hintMeta, []byte, error) {
	var h hintMeta
	if len(b) < hintFixed || string(b[:4]) != hintMagic {
		return h, nil, fmt.Errorf("%w: not a hint", errBadRecord)
	}
	if b[4] != hintVersion {
		return h, nil, fmt.Errorf("%w: hint version %d", errBadRecord, b[4])
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return h, nil, fmt.Errorf("%w: hint checksum", errBadRecord)
	}
	tl := int(binary.LittleEndian.Uint16(b[5:]))
	if tl == 0 || tl > maxTarget || len(body) < 7+tl+20 {
		return h, nil, fmt.Errorf("%w: hint target of %d bytes", errBadRecord, tl)
	}
	h.target = string(b[7 : 7+tl])
	p := b[7+tl:]
	h.at = int64(binary.LittleEndian.Uint64(p))
	h.created = int64(binary.LittleEndian.Uint64(p[8:]))
	bl := int(binary.LittleEndian.Uint32(p[16:]))
	blob := body[7+tl+20:]
	if bl != len(blob) {
		return h, nil, fmt.Errorf("%w: hint blob of %d bytes, %d present", errBadRecord, bl, len(blob))
	}
	hd, err := chunk.ParseHeader(blob, lim)
	if err != nil {
		return h, nil, fmt.Errorf("%w: hint blob: %w", errBadRecord, err)
	}
	h.key, h.size = hd.Key, int64(len(blob))
	return h, blob, nil
}

// hintStore holds hints per target, oldest first, within byte and count
// bounds; on disk when dir is set.
type hintStore struct {
	dir      string
	maxBytes int64
	maxCount int
	lim      chunk.Limits

	mu     sync.Mutex
	seq    uint64
	queues map[string][]*hintMeta
	bytes  int64 // of the hints in queues
	n      int
	// resBytes and resN are reserved by adds still writing their file;
	// the bounds count them, count and size do not.
	resBytes int64
	resN     int
	backoff  map[string]hintBackoff
}

type hintBackoff struct {
	next  time.Time
	delay time.Duration
}

func openHints(dir string, maxBytes int64, maxCount int, lim chunk.Limits) (*hintStore, error) {
	hs := &hintStore{dir: dir, maxBytes: maxBytes, maxCount: maxCount, lim: lim,
		queues: make(map[string][]*hintMeta), backoff: make(map[string]hintBackoff)}
	if dir == "" {
		return hs, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("replication: hints: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("replication: hints: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(dir, name)
		seqStr, ok := strings.CutSuffix(name, ".hint")
		seq, perr := strconv.ParseUint(seqStr, 16, 64)
		if !ok || perr != nil {
			os.Remove(path) // a torn temporary file
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("replication: hints: %w", err)
		}
		h, _, err := decodeHint(b, lim)
		if err != nil {
			os.Remove(path)
			continue
		}
		h.seq = seq
		hs.seq = max(hs.seq, seq)
		hs.queues[h.target] = append(hs.queues[h.target], &h)
		hs.bytes += h.size
		hs.n++
	}
	for _, q := range hs.queues {
		slices.SortFunc(q, func(a, b *hintMeta) int { return int64Cmp(int64(a.seq), int64(b.seq)) })
	}
	return hs, nil
}

func int64Cmp(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (hs *hintStore) path(seq uint64) string {
	return filepath.Join(hs.dir, fmt.Sprintf("%016x.hint", seq))
}

// add stores a hint; false when the bounds (or the disk) refuse it.
func (hs *hintStore) add(target string, key chunk.Key, blob []byte, at, created int64) (bool, error) {
	if len(target) == 0 || len(target) > maxTarget {
		return false, nil
	}
	hs.mu.Lock()
	if hs.n+hs.resN+1 > hs.maxCount || hs.bytes+hs.resBytes+int64(len(blob)) > hs.maxBytes {
		hs.mu.Unlock()
		return false, nil
	}
	hs.seq++
	h := &hintMeta{seq: hs.seq, target: target, key: key, at: at, created: created, size: int64(len(blob))}
	// Reserve the room before the I/O so that concurrent adds stay in
	// bounds.
	hs.resBytes += h.size
	hs.resN++
	hs.mu.Unlock()

	var err error
	if hs.dir == "" {
		h.blob = slices.Clone(blob)
	} else {
		tmp := hs.path(h.seq) + ".tmp"
		if err = writeFileSync(tmp, encodeHint(h, blob)); err == nil {
			err = os.Rename(tmp, hs.path(h.seq))
		}
		if err != nil {
			os.Remove(tmp)
		}
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.resBytes -= h.size
	hs.resN--
	if err != nil {
		return false, fmt.Errorf("replication: writing hint: %w", err)
	}
	hs.bytes += h.size
	hs.n++
	q := hs.queues[target]
	// Keep seq order even when adds finish out of order.
	i, _ := slices.BinarySearchFunc(q, h.seq, func(x *hintMeta, s uint64) int { return int64Cmp(int64(x.seq), int64(s)) })
	hs.queues[target] = slices.Insert(q, i, h)
	return true, nil
}

// load returns the blob of h.
func (hs *hintStore) load(h *hintMeta) ([]byte, error) {
	if hs.dir == "" {
		return h.blob, nil
	}
	b, err := os.ReadFile(hs.path(h.seq))
	if err != nil {
		return nil, err
	}
	_, blob, err := decodeHint(b, hs.lim)
	return blob, err
}

// remove forgets h and deletes its file.
func (hs *hintStore) remove(h *hintMeta) {
	hs.mu.Lock()
	q := hs.queues[h.target]
	i := slices.Index(q, h)
	if i < 0 {
		hs.mu.Unlock()
		return
	}
	hs.queues[h.target] = slices.Delete(q, i, i+1)
	if len(hs.queues[h.target]) == 0 {
		delete(hs.queues, h.target)
	}
	hs.bytes -= h.size
	hs.n--
	hs.mu.Unlock()
	if hs.dir != "" {
		os.Remove(hs.path(h.seq))
	}
}

// dropKey removes the hints of key written before at (a delete).
func (hs *hintStore) dropKey(key chunk.Key, at int64) {
	var drop []*hintMeta
	hs.mu.Lock()
	for _, q := range hs.queues {
		for _, h := range q {
			if h.key == key && h.at < at {
				drop = append(drop, h)
			}
		}
	}
	hs.mu.Unlock()
	for _, h := range drop {
		hs.remove(h)
	}
}

func (hs *hintStore) count() int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.n
}

func (hs *hintStore) size() int64 {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.bytes
}

// targets returns the targets with hints, sorted.
func (hs *hintStore) targets() []string {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	out := make([]string, 0, len(hs.queues))
	for t := range hs.queues {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// pending returns a snapshot of target's hints, oldest first.
func (hs *hintStore) pending(target string) []*hintMeta {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return slices.Clone(hs.queues[target])
}

func (hs *hintStore) close() error { return nil }

// addHint keeps a write for target; false when no hint could be kept.
func (r *Replicator) addHint(target string, key chunk.Key, blob []byte, at int64) bool {
	ok, err := r.hints.add(target, key, blob, at, r.now())
	if err != nil {
		r.log.Warn("hint not stored", "target", target, "key", key, "err", err)
	}
	if ok {
		r.metrics.hintsStored.Add(1)
		r.metrics.hintsPending.Store(int64(r.hints.count()))
	} else {
		r.metrics.hintsRefused.Add(1)
	}
	return ok
}

// HintsPending returns the number and bytes of hints held here.
func (r *Replicator) HintsPending() (n int, bytes int64) { return r.hints.count(), r.hints.size() }

// NodeUp tells the Replicator that node is reachable again (gossip saw it
// join): hints held for it are retried now instead of after the backoff
// that its absence built up, so a restarted replica gets them within a
// moment of its return.
func (r *Replicator) NodeUp(node string) {
	r.hints.mu.Lock()
	_, had := r.hints.backoff[node]
	delete(r.hints.backoff, node)
	r.hints.mu.Unlock()
	if had {
		select {
		case r.hintKick <- struct{}{}:
		default:
		}
	}
}

// DeliverHints tries now to deliver every hint held here, ignoring
// backoff, and returns how many were delivered. Hints for a target stop at
// its first failure.
func (r *Replicator) DeliverHints(ctx context.Context) (int, error) {
	return r.deliverHints(ctx, true)
}

func (r *Replicator) deliverHints(ctx context.Context, force bool) (int, error) {
	delivered := 0
	var errs []error
	rg := r.ring()
	if rg.Len() == 0 {
		return 0, nil // no ring yet: nothing to tell who is still a member
	}
	for _, target := range r.hints.targets() {
		if !force {
			r.hints.mu.Lock()
			b := r.hints.backoff[target]
			r.hints.mu.Unlock()
			if r.cfg.Now().Before(b.next) {
				continue
			}
		}
		n, err := r.deliverTo(ctx, rg, target)
		delivered += n
		r.hints.mu.Lock()
		if err != nil {
			b := r.hints.backoff[target]
			b.delay = min(max(2*b.delay, r.cfg.HintInterval, time.Millisecond), r.cfg.MaxHintBackoff)
			b.next = r.cfg.Now().Add(b.delay)
			r.hints.backoff[target] = b
			errs = append(errs, err)
		} else {
			delete(r.hints.backoff, target)
		}
		r.hints.mu.Unlock()
		if ctx.Err() != nil {
			break
		}
	}
	r.metrics.hintsPending.Store(int64(r.hints.count()))
	return delivered, errors.Join(errs...)
}

// deliverTo sends target's hints in order until one fails. A hint whose
// key target no longer replicates under the current placement (ring and
// R: the replication factor was lowered, or the ring moved while target
// was away) goes to the key's current replicas instead, so that delivering
// it leaves no copy that nothing would trim.
func (r *Replicator) deliverTo(ctx context.Context, rg *ring.Ring, target string) (int, error) {
	delivered := 0
	now := r.now()
	inRing := rg.Contains(target)
	n, _ := r.quorum()
	for _, h := range r.hints.pending(target) {
		if !inRing || h.created+int64(r.cfg.HintTTL) < now {
			// The node left the ring (its ranges moved to others, which
			// rebalancing and anti-entropy fill) or the hint is too old.
			r.hints.remove(h)
			r.metrics.hintsDropped.Add(1)
			continue
		}
		if t, ok := r.tombs.get(h.key); ok && t.deleted && t.at >= h.at {
			r.hints.remove(h) // deleted after the write
			r.metrics.hintsDropped.Add(1)
			continue
		}
		blob, err := r.hints.load(h)
		if err != nil {
			r.log.Warn("dropping unreadable hint", "target", target, "key", h.key, "err", err)
			r.hints.remove(h)
			r.metrics.hintsDropped.Add(1)
			continue
		}
		opts := ReplicateOptions{Kind: KindHint, At: h.at}
		if !rg.IsReplica(h.key.Content, target, n) {
			if err := r.redirectHint(ctx, rg, n, h.key, blob, opts); err != nil {
				return delivered, fmt.Errorf("replication: hint for %s redirected: %w", target, err)
			}
			r.metrics.hintsDelivered.Add(1)
			delivered++
			r.hints.remove(h)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		_, err = r.cfg.Transport.Replicate(cctx, target, blob, opts)
		cancel()
		if err != nil && !errors.Is(err, ErrRejected) {
			return delivered, fmt.Errorf("replication: hint for %s: %w", target, err)
		}
		if err != nil {
			r.metrics.hintsDropped.Add(1)
		} else {
			delivered++
			r.metrics.hintsDelivered.Add(1)
		}
		r.hints.remove(h)
	}
	return delivered, nil
}

func (r *Replicator) hintLoop() {
	t := time.NewTicker(r.cfg.HintInterval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		case <-r.hintKick:
		}
		if r.hints.count() == 0 {
			continue
		}
		if _, err := r.deliverHints(r.ctx, false); err != nil && r.ctx.Err() == nil {
			r.log.Debug("hint delivery", "err", err)
		}
	}
}

// redirectHint stores a hinted write on key's current n replicas in rg; it
// fails while one of them cannot be reached (the hint is kept and retried).
// A replica's refusal (it holds a tombstone, other bytes) ends the
// delivery there, as for the target itself.
func (r *Replicator) redirectHint(ctx context.Context, rg *ring.Ring, n int, key chunk.Key, blob []byte, opts ReplicateOptions) error {
	var errs []error
	for _, m := range rg.Replicas(key.Content, n) {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		err := r.push(cctx, m.ID, key, blob, opts)
		cancel()
		if err != nil && !errors.Is(err, ErrRejected) {
			errs = append(errs, fmt.Errorf("%s: %w", m.ID, err))
		}
	}
	return errors.Join(errs...)
}
