package replication

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
)

// The in-memory doubles below (a Store, a network of Replicators and its
// Transport) ship as code, as hashicorp/raft ships InmemTransport, so that
// the tests of any package can run Replicators without kvtier or gRPC. They
// live in this package, not a sub-package, because replication's own tests
// use them and a sub-package importing replication would be an import cycle
// for them. Production code never builds them.

// InmemStore is an in-memory Store with an optional byte capacity (as a
// RoomChecker), Stat and Encodings. Its zero value is not usable: call NewInmemStore.
type InmemStore struct {
	mu       sync.Mutex
	m        map[chunk.Key]memEntry
	capacity int // 0: unbounded
	used     int
}

type memEntry struct {
	blob []byte
	sum  uint64
}

// NewInmemStore returns an empty, unbounded InmemStore.
func NewInmemStore() *InmemStore { return &InmemStore{m: make(map[chunk.Key]memEntry)} }

// Put verifies blob and keeps a copy; a key already held with another
// checksum is ErrConflict, with the same one a no-op.
func (s *InmemStore) Put(_ context.Context, blob []byte) (chunk.Header, error) {
	hd, err := chunk.Verify(blob, chunk.Limits{})
	if err != nil {
		return hd, err
	}
	cp := slices.Clone(blob) // outside the lock, as kvtier copies
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[hd.Key]; ok {
		if e.sum != hd.Checksum {
			return hd, fmt.Errorf("%w: %v", ErrConflict, hd.Key)
		}
		return hd, nil
	}
	s.m[hd.Key] = memEntry{cp, hd.Checksum}
	s.used += len(blob)
	return hd, nil
}

// Get lends the stored bytes (owned: no release needed, but callers release
// them as they would a tier's).
func (s *InmemStore) Get(_ context.Context, key chunk.Key) (pinned.Bytes, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return pinned.Bytes{}, fmt.Errorf("%w: %v", ErrNotFound, key)
	}
	return pinned.Owned(e.blob), nil
}

// Delete removes key; ErrNotFound if it is not held.
func (s *InmemStore) Delete(key chunk.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return ErrNotFound
	}
	delete(s.m, key)
	s.used -= len(e.blob)
	return nil
}

// DeleteIf removes key only if it is held with checksum (ErrConflict if
// with another).
func (s *InmemStore) DeleteIf(key chunk.Key, checksum uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return ErrNotFound
	}
	if e.sum != checksum {
		return ErrConflict
	}
	delete(s.m, key)
	s.used -= len(e.blob)
	return nil
}

// Encodings implements Encodings (a walk of every key: a test double).
func (s *InmemStore) Encodings(fp chunk.Fingerprint, content chunk.ID) []chunk.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []chunk.Key
	for k := range s.m {
		if k.Fingerprint == fp && k.Content == content {
			out = append(out, k)
		}
	}
	return out
}

// Scan calls fn for every held key, outside the lock, until fn returns
// false.
func (s *InmemStore) Scan(fn func(chunk.Key, uint64, int) bool) {
	s.mu.Lock()
	type it struct {
		k    chunk.Key
		sum  uint64
		size int
	}
	items := make([]it, 0, len(s.m))
	for k, e := range s.m {
		items = append(items, it{k, e.sum, len(e.blob)})
	}
	s.mu.Unlock()
	for _, i := range items {
		if !fn(i.k, i.sum, i.size) {
			return
		}
	}
}

// Stat returns key's checksum and size, or ErrNotFound.
func (s *InmemStore) Stat(key chunk.Key) (uint64, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if !ok {
		return 0, 0, ErrNotFound
	}
	return e.sum, len(e.blob), nil
}

// HasRoom reports whether n more bytes fit the capacity.
func (s *InmemStore) HasRoom(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capacity == 0 || s.used+n <= s.capacity
}

// SetCapacity bounds the bytes HasRoom admits (0: unbounded).
func (s *InmemStore) SetCapacity(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.capacity = n
}

// Has reports whether key is held.
func (s *InmemStore) Has(key chunk.Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[key]
	return ok
}

// Checksum returns the checksum key is held with.
func (s *InmemStore) Checksum(key chunk.Key) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	return e.sum, ok
}

// Len is the number of keys held.
func (s *InmemStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Bytes is the number of bytes held.
func (s *InmemStore) Bytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// Wipe forgets everything, as a lost data directory.
func (s *InmemStore) Wipe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m = make(map[chunk.Key]memEntry)
	s.used = 0
}

// Overwrite holds blob, with checksum, under key in one step, without the
// checks Put makes: a test races it against a reader, as a re-put after a
// delete would.
func (s *InmemStore) Overwrite(key chunk.Key, blob []byte, checksum uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[key]; ok {
		s.used -= len(e.blob)
	}
	s.m[key] = memEntry{blob, checksum}
	s.used += len(blob)
}

// Damage calls fn on key's stored bytes in place, as a write into the
// store's memory would; false if key is not held.
func (s *InmemStore) Damage(key chunk.Key, fn func(blob []byte)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[key]
	if ok {
		fn(e.blob)
	}
	return ok
}

var errUnreachable = errors.New("in-memory network: node unreachable")

// InmemNetwork connects Replicators in-process, with fault hooks: nodes
// down, links cut, calls dropped at random, calls delayed.
type InmemNetwork struct {
	mu    sync.Mutex
	nodes map[string]*Replicator
	down  map[string]bool
	cut   map[[2]string]bool
	drop  float64
	rng   *rand.Rand
	delay time.Duration

	replicates, fetches, digests, deletes atomic.Int64
	bytes                                 atomic.Int64
}

// InmemStats counts an InmemNetwork's calls (reached or not) and the
// entry bytes it carried.
type InmemStats struct {
	Replicates, Fetches, Digests, Deletes int64
	Bytes                                 int64
}

// NewInmemNetwork returns a network with no nodes; seed drives its random
// drops.
func NewInmemNetwork(seed uint64) *InmemNetwork {
	return &InmemNetwork{nodes: map[string]*Replicator{}, down: map[string]bool{}, cut: map[[2]string]bool{},
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Register makes r the node id calls reach (replacing an earlier one, as
// a restart does).
func (n *InmemNetwork) Register(id string, r *Replicator) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[id] = r
}

// SetDown makes id unreachable (or reachable again), from and to.
func (n *InmemNetwork) SetDown(id string, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down[id] = down
}

// Partition cuts (or heals) every link between group a and group b.
func (n *InmemNetwork) Partition(a, b []string, cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			n.cut[[2]string{x, y}] = cut
			n.cut[[2]string{y, x}] = cut
		}
	}
}

// SetDrop makes each call fail with probability p.
func (n *InmemNetwork) SetDrop(p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drop = p
}

// SetDelay makes each call wait d (or its context) before it is routed.
func (n *InmemNetwork) SetDelay(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delay = d
}

// Stats returns the counts so far.
func (n *InmemNetwork) Stats() InmemStats {
	return InmemStats{Replicates: n.replicates.Load(), Fetches: n.fetches.Load(), Digests: n.digests.Load(),
		Deletes: n.deletes.Load(), Bytes: n.bytes.Load()}
}

// Route returns the Replicator a call from from to to reaches, or an
// unreachable error (down, cut, dropped, not registered).
func (n *InmemNetwork) Route(ctx context.Context, from, to string) (*Replicator, error) {
	n.mu.Lock()
	r := n.nodes[to]
	bad := n.down[from] || n.down[to] || n.cut[[2]string{from, to}] || r == nil
	if !bad && n.drop > 0 && n.rng.Float64() < n.drop {
		bad = true
	}
	delay := n.delay
	n.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if bad {
		return nil, fmt.Errorf("%s -> %s: %w", from, to, errUnreachable)
	}
	return r, nil
}

// Transport returns node from's view of the network.
func (n *InmemNetwork) Transport(from string) *InmemTransport {
	return &InmemTransport{n: n, from: from}
}

// InmemTransport is one node's Transport over an InmemNetwork. Bytes are
// copied each way, as on a wire.
type InmemTransport struct {
	n    *InmemNetwork
	from string
}

// Network returns the network t calls over.
func (t *InmemTransport) Network() *InmemNetwork { return t.n }

// From returns the node t calls from.
func (t *InmemTransport) From() string { return t.from }

// Replicate implements Transport.
func (t *InmemTransport) Replicate(ctx context.Context, node string, blob []byte, opts ReplicateOptions) (uint64, error) {
	return t.replicateOwned(ctx, node, slices.Clone(blob), opts) // a copy, as on a wire
}

// replicateOwned delivers blob, which the receiver may keep, to node.
func (t *InmemTransport) replicateOwned(ctx context.Context, node string, blob []byte, opts ReplicateOptions) (uint64, error) {
	t.n.replicates.Add(1)
	r, err := t.n.Route(ctx, t.from, node)
	if err != nil {
		return 0, err
	}
	t.n.bytes.Add(int64(len(blob)))
	return serveReceived(ctx, r, blob, opts)
}

// serveReceived is the receiving end of a replica write over the
// in-memory network: blob's header parsed once, as node's receive path
// does, then ServeReplicate. A blob whose header does not parse is
// refused.
func serveReceived(ctx context.Context, r *Replicator, blob []byte, opts ReplicateOptions) (uint64, error) {
	hd, err := chunk.ParseHeader(blob, r.cfg.Limits)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrRejected, err)
	}
	return r.ServeReplicate(ctx, blob, hd, opts)
}

// OpenReplicate implements Transport: the stream copies each piece as it
// is sent (so it holds no reference) and delivers the entry at Close, as
// Replicate does (the network routes it then).
func (t *InmemTransport) OpenReplicate(ctx context.Context, node string, key chunk.Key, size int, opts ReplicateOptions, wait bool) (ReplicaStream, error) {
	return &inmemStream{t: t, ctx: ctx, node: node, opts: opts, buf: make([]byte, 0, size)}, nil
}

// inmemStream is an InmemTransport's ReplicaStream.
type inmemStream struct {
	t    *InmemTransport
	ctx  context.Context
	node string
	opts ReplicateOptions
	buf  []byte
}

func (s *inmemStream) Send(p Piece) error {
	for _, b := range p.Parts(nil) {
		s.buf = append(s.buf, b...)
	}
	return nil
}

func (s *inmemStream) Close() (uint64, error) {
	return s.t.replicateOwned(s.ctx, s.node, s.buf, s.opts)
}

func (s *inmemStream) Abort() { s.buf = nil }

// Fetch implements Transport.
func (t *InmemTransport) Fetch(ctx context.Context, node string, key chunk.Key) ([]byte, error) {
	t.n.fetches.Add(1)
	r, err := t.n.Route(ctx, t.from, node)
	if err != nil {
		return nil, err
	}
	b, err := r.ServeFetch(ctx, key)
	if err != nil {
		return nil, err
	}
	defer b.Release()
	t.n.bytes.Add(int64(b.Len()))
	return slices.Clone(b.Bytes()), nil
}

// Digest implements Transport.
func (t *InmemTransport) Digest(ctx context.Context, node string, req DigestRequest) (DigestResponse, error) {
	t.n.digests.Add(1)
	r, err := t.n.Route(ctx, t.from, node)
	if err != nil {
		return DigestResponse{}, err
	}
	return r.ServeDigest(ctx, req)
}

// Delete implements Transport.
func (t *InmemTransport) Delete(ctx context.Context, node string, key chunk.Key, at int64) error {
	t.n.deletes.Add(1)
	r, err := t.n.Route(ctx, t.from, node)
	if err != nil {
		return err
	}
	return r.ServeDelete(ctx, key, at)
}

var (
	_ Store       = (*InmemStore)(nil)
	_ RoomChecker = (*InmemStore)(nil)
	_ Transport   = (*InmemTransport)(nil)
)
