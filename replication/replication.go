package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/pinned"
	"github.com/kvmesh/kvmesh/ring"
)

// Errors callers branch on.
var (
	// ErrNotFound: no replica (or store) holds the key.
	ErrNotFound = errors.New("replication: not found")
	// ErrConflict: the key is stored with other bytes. Store
	// implementations wrap it.
	ErrConflict = errors.New("replication: key stored with different bytes")
	// ErrRejected: the replica refused the call for good (bad blob,
	// conflict, tombstone, no room); retrying or hinting will not help.
	// Transports wrap it for refusals, and leave it out for failures to
	// reach the node, which become hints.
	ErrRejected = errors.New("replication: rejected by replica")
	// ErrTombstoned: the key was deleted after the write was made.
	ErrTombstoned = errors.New("replication: key deleted")
	// ErrNoRoom: the replica's store has no free room for a repair.
	ErrNoRoom = errors.New("replication: no room for repair")
	// ErrQuorum: fewer than W replicas stored the write.
	ErrQuorum = errors.New("replication: write quorum not reached")
	// ErrNoReplicas: the ring is empty.
	ErrNoReplicas = errors.New("replication: ring has no members")
	// ErrEpochMismatch: a digest was asked for with another ring epoch.
	ErrEpochMismatch = errors.New("replication: ring epoch mismatch")
	// ErrClosed: the Replicator is closed.
	ErrClosed = errors.New("replication: closed")
	// ErrRecovering: the node is refilling after a restart (Config.Recovering)
	// and lacks the key, which it may still receive: its miss is not an
	// answer. ServeFetch returns it (wrapping ErrNotFound too, so paths
	// that only skip absent keys keep doing so); Read asks the other
	// replicas and never counts such a miss as "no copy".
	ErrRecovering = errors.New("replication: replica recovering")
	// ErrUnavailable: a read found no copy, but no replica that could
	// say the key is absent answered (they were unreachable or
	// recovering); another try, or another node, may find it.
	ErrUnavailable = errors.New("replication: no replica could answer")
)

// Store is the part of the node's store the Replicator needs (package
// node adapts its kvtier store to it).
type Store interface {
	// Put stores an encoded chunk entry (verifying it) and returns its
	// header; the blob is copied. Putting the same bytes again is a
	// no-op; other bytes under a stored key fail with an error wrapping
	// ErrConflict.
	Put(ctx context.Context, blob []byte) (chunk.Header, error)
	// Get lends the stored blob (the Replicator releases it exactly
	// once); errors wrap ErrNotFound when the key is absent.
	Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error)
	// Delete removes the key; an absent key wraps ErrNotFound.
	Delete(key chunk.Key) error
	// DeleteIf removes the key only while its stored blob's checksum is
	// checksum (checked and removed atomically); other bytes wrap
	// ErrConflict, an absent key ErrNotFound. A handoff drops its copy
	// with it, so that bytes stored after the send are kept.
	DeleteIf(key chunk.Key, checksum uint64) error
	// Scan calls fn for every stored entry until fn returns false. fn may
	// call the Store.
	Scan(fn func(key chunk.Key, checksum uint64, size int) bool)
}

// RoomChecker is implemented by a Store that can tell whether it has free
// room for size more bytes without evicting anything. Repairs and
// anti-entropy pushes are refused with ErrNoRoom where it says no, so that
// refilling a replica never evicts (an evicted copy is not refilled into a
// full store). Stores without it accept every repair.
type RoomChecker interface {
	HasRoom(size int) bool
}

// Placement gives the current ring. *meta.Store implements it. Ring may
// return nil before the cluster has one.
type Placement interface {
	Ring() *ring.Ring
}

// PlacementFunc adapts a function to Placement.
type PlacementFunc func() *ring.Ring

// Ring calls f.
func (f PlacementFunc) Ring() *ring.Ring { return f() }

// Kind says why a blob is sent to a replica; the receiver treats each
// differently (ServeReplicate).
type Kind uint8

const (
	// KindWrite is a client write through a coordinator.
	KindWrite Kind = 1
	// KindHint is a delayed write delivered from a hint.
	KindHint Kind = 2
	// KindRepair comes from read repair or anti-entropy: the sender's copy
	// is canonical and replaces different bytes on the receiver.
	KindRepair Kind = 3
	// KindRebalance moves a chunk to a new owner; a receiver that holds
	// other bytes keeps them.
	KindRebalance Kind = 4
)

func (k Kind) String() string {
	switch k {
	case KindWrite:
		return "write"
	case KindHint:
		return "hint"
	case KindRepair:
		return "repair"
	case KindRebalance:
		return "rebalance"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ReplicateOptions go with a blob to a replica.
type ReplicateOptions struct {
	Kind Kind
	// At is the write's time (unix nanoseconds, coordinator clock), for
	// ordering against deletes; 0 when unknown (repair, rebalance).
	At int64
}

// DigestItem is one key a node holds, or a tombstone.
type DigestItem struct {
	Key      chunk.Key
	Checksum uint64 // 0 for a tombstone
	Size     int
	// Deleted marks a tombstone; At is then the delete's time. For a live
	// entry At is the time of the write that followed a delete, if any.
	Deleted bool
	At      int64
}

// DigestRequest asks a node about the keys that it and From both replicate
// in ring Epoch with Replicas copies (anti-entropy), or about given keys.
// Exactly one of these shapes:
//
//   - Keys set: the items of exactly those keys, whatever their placement.
//   - Split set: for each listed bucket (a 12-bit prefix of the content
//     ID), its SubBuckets sub-bucket hashes (the next 8 bits), in order.
//   - Ranges set: the items in the listed ranges (20-bit prefixes:
//     bucket<<8 | sub-bucket).
//   - none: the table of NumBuckets bucket hashes.
type DigestRequest struct {
	From     string
	Epoch    uint64
	Replicas int
	Split    []uint32
	Ranges   []uint32
	Keys     []chunk.Key
}

// DigestResponse answers a DigestRequest: Table (bucket or sub-bucket
// hashes) or Items (sorted by key).
type DigestResponse struct {
	Epoch uint64
	Table []uint64
	Items []DigestItem
}

// Transport calls other nodes. node implements it with the Peer gRPC
// service; errors that mean the node refused for good wrap ErrRejected,
// any other error counts as "unreachable" (a write becomes a hint).
type Transport interface {
	// Replicate stores blob on node (Peer.Replicate with direct=true; the
	// receiver calls ServeReplicate) and returns the checksum of the
	// version node keeps: blob's, or the other version of the key it
	// already held when that one Wins.
	Replicate(ctx context.Context, node string, blob []byte, opts ReplicateOptions) (kept uint64, err error)
	// Fetch returns node's blob for key (Peer.Fetch, FORMAT_ENTRY,
	// direct=true; the receiver calls ServeFetch). Absent: wraps
	// ErrNotFound.
	Fetch(ctx context.Context, node string, key chunk.Key) ([]byte, error)
	// Digest asks node for key hashes (Peer.Digest; ServeDigest).
	Digest(ctx context.Context, node string, req DigestRequest) (DigestResponse, error)
	// Delete deletes key on node and leaves a tombstone of time at
	// (Client.Delete with direct=true; ServeDelete).
	Delete(ctx context.Context, node string, key chunk.Key, at int64) error
	// OpenReplicate opens a replica write to node before the entry has
	// arrived whole (Peer.Replicate), so that a node forwards each piece
	// of a client's entry to the other replicas as it arrives
	// (cut-through) instead of after the last byte. Unless wait, it must
	// not wait for a connection that is not up: it returns an error
	// wrapping ErrNoStreamNow instead, and that replica gets the whole
	// entry at Finish (opened then with wait), so that a replica slow to
	// answer delays nothing but its own copy.
	OpenReplicate(ctx context.Context, node string, key chunk.Key, size int, opts ReplicateOptions, wait bool) (ReplicaStream, error)
}

// Config configures New. Zero fields take DefaultConfig's values.
type Config struct {
	// NodeID is this node's ring member ID (required).
	NodeID    string
	Store     Store     // required
	Transport Transport // required
	Placement Placement // required
	// Quorum returns the replication factor R and write quorum W, from the
	// cluster settings. Default 3 and 2.
	Quorum func() (replicas, writeQuorum int)
	// DataDir holds hints (DataDir/hints) and tombstones
	// (DataDir/tombstones.log). "" keeps both in memory only: they do not
	// survive a restart.
	DataDir string
	// MaxHintBytes and MaxHints bound the hints held for other nodes;
	// writes past them get no hint (anti-entropy repairs them later).
	// Defaults 1 GiB and 100000.
	MaxHintBytes int64
	MaxHints     int
	// HintTTL drops hints older than this. Default 3h.
	HintTTL time.Duration
	// HintInterval is how often hints are retried; a node that fails a
	// delivery is retried with exponential backoff up to MaxHintBackoff.
	// Defaults 1s and 1m. A negative HintInterval stops the background
	// delivery (DeliverHints still works).
	HintInterval   time.Duration
	MaxHintBackoff time.Duration
	// TombstoneTTL is how long a delete is remembered. A replica that is
	// away longer than this may bring a deleted chunk back. Default 24h.
	TombstoneTTL time.Duration
	// CallTimeout bounds each call to another node made in the
	// background (write stragglers, repairs, hints). Default 10s.
	CallTimeout time.Duration
	// RepairQueue bounds the pending read repairs (more are dropped and
	// counted); RepairWorkers run them. Defaults 1024 and 2.
	RepairQueue   int
	RepairWorkers int
	// ReadRepairChance is the chance that a read also checks the replicas
	// it did not need (by checksum) and repairs them. Default 0.1; negative
	// means never.
	ReadRepairChance float64
	// RebalanceBytesPerSec limits rebalance and drain transfers. Default
	// 64 MiB/s; negative means unlimited.
	RebalanceBytesPerSec int64
	// RebalanceConcurrency is the number of parallel transfers. Default 4.
	RebalanceConcurrency int
	// The receiver's rebalance budget (inbox.go): at most
	// IncomingRebalanceStreams rebalance blobs are stored here at once
	// (default 1: on a 2-core newcomer a second concurrent store did not
	// shorten the rebalance and doubled the Get tail); a blob waits for a slot up to IncomingRebalanceWait
	// (default 5s, and never past its call's deadline) and is refused with
	// ErrBusy after that, or at once when IncomingRebalanceQueueBytes
	// (default 256 MiB) of blobs already wait; the sender backs off and
	// sends it again. IncomingRebalanceBytesPerSec caps the rebalance
	// bytes stored here per second over all senders (default 0:
	// uncapped).
	IncomingRebalanceStreams     int
	IncomingRebalanceWait        time.Duration
	IncomingRebalanceQueueBytes  int64
	IncomingRebalanceBytesPerSec int64
	// ServingYield is how long incoming rebalance work (and a read
	// repair's local store) waits for the serving calls in flight here
	// (reads, writes, fetches by peers) to finish before it goes on
	// anyway. Default 100ms; negative: no waiting.
	ServingYield time.Duration
	// RebalanceSettle is how long after the last sign of a rebalance here
	// (a new ring epoch seen, a rebalance blob received) a read that
	// misses on the replicas also asks the next-ranked members of the
	// ring, when the previous ring is not known here (a node that joined
	// with the ring already including it): the previous owners of a key
	// rank right after its replicas. Default 2m; negative: never.
	RebalanceSettle time.Duration
	// RingCheckInterval is how often the ring is checked for a new epoch,
	// and Quorum for a new R (Kick checks at once); RebalanceRetry is the wait before an
	// incomplete pass runs again. Defaults 1s and 10s. A negative
	// RingCheckInterval stops background rebalancing (Rebalance still
	// works).
	RingCheckInterval time.Duration
	RebalanceRetry    time.Duration
	// AntiEntropyInterval is the period of anti-entropy rounds. Default
	// 5m; negative disables them (AntiEntropy still works).
	AntiEntropyInterval time.Duration
	// SuspectFor is how long a node that failed a read is tried after the
	// healthy replicas. Default 5s.
	SuspectFor time.Duration
	// Recovering reports whether this node is refilling after a restart
	// (its startup pull has not finished): what it lacks it may still
	// receive, so its misses are not answers (ErrRecovering) and the
	// under-replication count does not treat them as copies. Default:
	// never.
	Recovering func() bool
	// Limits bound the blobs accepted. Zero means chunk.DefaultLimits.
	Limits chunk.Limits
	// Now is the clock of writes, deletes and hints. Default time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default(). Records carry no node ID of
	// their own: the caller's logger names the node (node.New's does).
	Logger *slog.Logger
}

// DefaultConfig is the configuration of every field New defaults: the
// values a zero field takes. The caller sets NodeID, Store, Transport and
// Placement (and may change the rest) before New.
func DefaultConfig() Config {
	return Config{
		Quorum:                      func() (int, int) { return 3, 2 },
		MaxHintBytes:                1 << 30,
		MaxHints:                    100000,
		HintTTL:                     3 * time.Hour,
		HintInterval:                time.Second,
		MaxHintBackoff:              time.Minute,
		TombstoneTTL:                24 * time.Hour,
		CallTimeout:                 10 * time.Second,
		RepairQueue:                 1024,
		RepairWorkers:               2,
		ReadRepairChance:            0.1,
		RebalanceBytesPerSec:        64 << 20,
		RebalanceConcurrency:        4,
		IncomingRebalanceStreams:    1,
		IncomingRebalanceWait:       5 * time.Second,
		IncomingRebalanceQueueBytes: 256 << 20,
		ServingYield:                100 * time.Millisecond,
		RebalanceSettle:             2 * time.Minute,
		RingCheckInterval:           time.Second,
		RebalanceRetry:              10 * time.Second,
		AntiEntropyInterval:         5 * time.Minute,
		SuspectFor:                  5 * time.Second,
		Now:                         time.Now,
		Recovering:                  func() bool { return false },
	}
}

// Validate reports what New would refuse: a missing NodeID, Store,
// Transport or Placement.
func (c Config) Validate() error {
	if c.NodeID == "" || c.Store == nil || c.Transport == nil || c.Placement == nil {
		return errors.New("replication: NodeID, Store, Transport and Placement are required")
	}
	return nil
}

// setDefaults validates c and gives its zero fields DefaultConfig's values
// (non-positive ones, for the counts that cannot be negative).
func (c *Config) setDefaults() error {
	if err := c.Validate(); err != nil {
		return err
	}
	d := DefaultConfig()
	zero := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	if c.Quorum == nil {
		c.Quorum = d.Quorum
	}
	if c.MaxHintBytes == 0 {
		c.MaxHintBytes = d.MaxHintBytes
	}
	if c.MaxHints == 0 {
		c.MaxHints = d.MaxHints
	}
	zero(&c.HintTTL, d.HintTTL)
	zero(&c.HintInterval, d.HintInterval)
	zero(&c.MaxHintBackoff, d.MaxHintBackoff)
	zero(&c.TombstoneTTL, d.TombstoneTTL)
	zero(&c.CallTimeout, d.CallTimeout)
	if c.RepairQueue == 0 {
		c.RepairQueue = d.RepairQueue
	}
	if c.RepairWorkers == 0 {
		c.RepairWorkers = d.RepairWorkers
	}
	if c.ReadRepairChance == 0 {
		c.ReadRepairChance = d.ReadRepairChance
	}
	if c.RebalanceBytesPerSec == 0 {
		c.RebalanceBytesPerSec = d.RebalanceBytesPerSec
	}
	if c.RebalanceConcurrency <= 0 {
		c.RebalanceConcurrency = d.RebalanceConcurrency
	}
	if c.IncomingRebalanceStreams <= 0 {
		c.IncomingRebalanceStreams = d.IncomingRebalanceStreams
	}
	c.IncomingRebalanceStreams = min(c.IncomingRebalanceStreams, 1<<12)
	if c.IncomingRebalanceWait <= 0 {
		c.IncomingRebalanceWait = d.IncomingRebalanceWait
	}
	if c.IncomingRebalanceQueueBytes <= 0 {
		c.IncomingRebalanceQueueBytes = d.IncomingRebalanceQueueBytes
	}
	zero(&c.ServingYield, d.ServingYield)
	zero(&c.RebalanceSettle, d.RebalanceSettle)
	zero(&c.RingCheckInterval, d.RingCheckInterval)
	zero(&c.RebalanceRetry, d.RebalanceRetry)
	zero(&c.AntiEntropyInterval, d.AntiEntropyInterval)
	zero(&c.SuspectFor, d.SuspectFor)
	if c.Now == nil {
		c.Now = d.Now
	}
	if c.Recovering == nil {
		c.Recovering = d.Recovering
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Replicator replicates one node's chunks. Its methods are safe for
// concurrent use.
type Replicator struct {
	cfg     Config
	log     *slog.Logger
	hints   *hintStore
	tombs   *tombstones
	repairs chan repairTask
	limiter *rate.Limiter
	inbox   *inbox
	serving *servingGate
	metrics metrics

	// epochSeen is the newest ring epoch seen here and rebalanceSeen the
	// last sign of a rebalance (unix nanoseconds): reads that miss look
	// past the replicas until RebalanceSettle after it.
	epochSeen     atomic.Uint64
	rebalanceSeen atomic.Int64
	// repairBlobBytes are the bytes of fetched blobs held by queued
	// repairs of this node (bounded by maxRepairBlobBytes).
	repairBlobBytes atomic.Int64

	// rebalance state, owned by rebalanceMu's holder.
	rebalanceMu sync.Mutex
	done        *ring.Ring // the last ring whose pass completed
	doneN       int        // and the R it placed keys with
	// saved is the placement (epoch, R) of the last completed pass as
	// recorded in DataDir/placement, so that a restarted node still knows
	// what R its chunks were placed with (see Rebalance).
	saved    savedPlacement
	prev     atomic.Pointer[ring.Ring]
	kick     chan struct{}
	hintKick chan struct{}
	aeKick   chan struct{} // CopiesDropped: an anti-entropy round soon

	suspectMu sync.Mutex
	suspects  map[string]time.Time // node -> until when reads try it last

	// keyLocks order a local store against a local delete of the same
	// key, so a write older than a delete cannot slip in after it.
	keyLocks [64]sync.Mutex

	ctx     context.Context
	cancel  context.CancelFunc
	closeMu sync.RWMutex // guards closed against wg.Add
	closed  bool
	wg      sync.WaitGroup // background loops and write stragglers
}

// New opens the hint and tombstone state in cfg.DataDir and starts the
// background loops (hint delivery, repairs, rebalancing, anti-entropy).
// Close stops them.
func New(cfg Config) (*Replicator, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &Replicator{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "replication"),
		repairs:  make(chan repairTask, cfg.RepairQueue),
		kick:     make(chan struct{}, 1),
		hintKick: make(chan struct{}, 1),
		aeKick:   make(chan struct{}, 1),
		suspects: make(map[string]time.Time),
		serving:  newServingGate(),
	}
	r.inbox = newInbox(&r.cfg)
	if cfg.RebalanceBytesPerSec > 0 {
		burst := int(min(cfg.RebalanceBytesPerSec, 1<<30))
		r.limiter = rate.NewLimiter(rate.Limit(cfg.RebalanceBytesPerSec), burst)
	}
	hintDir, tombFile := "", ""
	if cfg.DataDir != "" {
		hintDir = filepath.Join(cfg.DataDir, "hints")
		tombFile = filepath.Join(cfg.DataDir, "tombstones.log")
	}
	var err error
	r.hints, err = openHints(hintDir, cfg.MaxHintBytes, cfg.MaxHints, cfg.Limits)
	if err != nil {
		return nil, err
	}
	r.metrics.hintsPending.Store(int64(r.hints.count()))
	r.tombs, err = openTombstones(tombFile, cfg.TombstoneTTL, cfg.Now)
	if err != nil {
		return nil, err
	}
	r.saved = loadPlacement(cfg.DataDir)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for range cfg.RepairWorkers {
		r.goLoop(r.repairLoop)
	}
	if cfg.HintInterval > 0 {
		r.goLoop(r.hintLoop)
	}
	if cfg.RingCheckInterval > 0 {
		r.goLoop(r.ringLoop)
	}
	if cfg.AntiEntropyInterval > 0 {
		r.goLoop(r.antiEntropyLoop)
	}
	return r, nil
}

func (r *Replicator) goLoop(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// track reserves n background goroutines; false once closed.
func (r *Replicator) track(n int) bool {
	r.closeMu.RLock()
	defer r.closeMu.RUnlock()
	if r.closed {
		return false
	}
	r.wg.Add(n)
	return true
}

// lockKey locks k; every version of an opaque value shares one lock
// (versions.go).
func (r *Replicator) lockKey(k chunk.Key) *sync.Mutex {
	ctx := k.Context.ID.Lo
	if versioned(k) {
		ctx = 0
	}
	mu := &r.keyLocks[(k.Content.Lo^ctx)%uint64(len(r.keyLocks))]
	mu.Lock()
	return mu
}

// Close stops the background work, waits for it (including writes still
// reaching replicas after their quorum) and closes the tombstone log.
// Pending hints stay in DataDir for the next New.
func (r *Replicator) Close() error {
	r.closeMu.Lock()
	if r.closed {
		r.closeMu.Unlock()
		return nil
	}
	r.closed = true
	r.closeMu.Unlock()
	r.cancel()
	r.wg.Wait()
	return errors.Join(r.tombs.close(), r.hints.close())
}

// NodeID is this node's ID.
func (r *Replicator) NodeID() string { return r.cfg.NodeID }

func (r *Replicator) quorum() (n, w int) {
	n, w = r.cfg.Quorum()
	n = max(n, 1)
	w = min(max(w, 1), n)
	return n, w
}

func (r *Replicator) ring() *ring.Ring {
	if rg := r.cfg.Placement.Ring(); rg != nil {
		return rg
	}
	return ring.New(0, nil)
}

func (r *Replicator) now() int64 { return r.cfg.Now().UnixNano() }

// background returns a context for work that outlives the caller's call:
// cancelled by Close and bounded by CallTimeout.
func (r *Replicator) background() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, r.cfg.CallTimeout)
}

// Kick makes the background loop check the ring and R now (node calls it
// when meta's Watch fires, which a ring change and a settings change both
// do) and retries hint deliveries at once.
func (r *Replicator) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
	select {
	case r.hintKick <- struct{}{}:
	default:
	}
}
