package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	waltypes "github.com/hashicorp/raft-wal/types"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ring"
)

// Store is one node's view of the cluster metadata and its raft server.
// Reads (Model, Settings, Ring, Leader) are local and lock-light; writes go
// through the leader. All methods are safe for concurrent use.
type Store struct {
	cfg      Config
	log      *slog.Logger
	fsm      *fsm
	raft     *raft.Raft
	wal      *raftwal.WAL
	logs     *checkedLog        // wal's log, checked
	walMeta  *metadb.BoltMetaDB // raft-wal's Close leaves it open
	lock     *os.File           // flock on DataDir/raft/LOCK
	raftAddr string
	trans    *guardedTransport
	admit    *streamLayer // nil without TLS; see admissible
	peers    atomic.Pointer[peersBox]

	watchMu     sync.Mutex
	watchers    map[uint64]chan struct{}
	nextWatch   uint64
	watchClosed bool

	observer *raft.Observer
	obsCh    chan raft.Observation

	wake   chan struct{} // capacity 1: kicks the reconcile loop
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	// Owned by the loop goroutine.
	needBootstrap bool
	bootSet       []string  // the bootstrap set last chosen
	bootSince     time.Time // since when it is unchanged
	bootRefused   string    // the server last refused at bootstrap, "id@addr"
	bootstrapped  atomic.Bool
	bootTooFew    atomic.Int64 // bootstrap attempts that found fewer alive than BootstrapExpect, for tests
	missingSince  map[string]time.Time
	refused       map[string]string // ID -> raft address whose handshake failed
	refusedN      atomic.Int64      // len(refused), for Stats
}

// peersBox lets an interface value live in an atomic.Pointer.
type peersBox struct{ p Peers }

// Open opens (or creates) the node's raft state in cfg.DataDir, binds the
// raft transport and starts the raft server and the reconcile loop. It does
// not wait for a leader; see WaitLeader. ctx bounds only the opening.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	walDir := filepath.Join(cfg.DataDir, "raft", "wal")
	snapDir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return nil, fmt.Errorf("meta: create data dir: %w", err)
	}
	lock, err := lockDir(snapDir)
	if err != nil {
		return nil, err
	}
	// raft-wal v0.4.0's WAL.Close does not close its bolt meta store, whose
	// file lock would then block the next Open of this directory forever;
	// owning the meta store lets Close release it.
	if err := verifyWALMeta(cfg.DataDir, walDir); err != nil {
		_ = lock.Close()
		return nil, err
	}
	walMeta := &metadb.BoltMetaDB{}
	wal, err := raftwal.Open(walDir, raftwal.WithLogger(newHCLog(log, "raft-wal")),
		raftwal.WithSegmentSize(cfg.WALSegmentSize), raftwal.WithMetaStore(walMeta))
	if err != nil {
		_ = walMeta.Close()
		_ = lock.Close()
		if errors.Is(err, waltypes.ErrCorrupt) {
			return nil, corruptError(cfg.DataDir, walDir, err)
		}
		return nil, fmt.Errorf("meta: open raft log: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = wal.Close()
			_ = walMeta.Close()
			_ = lock.Close()
		}
	}()
	logs, err := newCheckedLog(wal, wal)
	if err != nil {
		return nil, err
	}
	if err := verifyLog(cfg.DataDir, logs); err != nil {
		return nil, err
	}
	if err := logs.checkEnd(wal); err != nil {
		return nil, corruptError(cfg.DataDir, "raft log "+walDir, err)
	}
	// raft would create its directory open to other users.
	if err := os.MkdirAll(filepath.Join(snapDir, "snapshots"), 0o700); err != nil {
		return nil, fmt.Errorf("meta: snapshot dir: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(snapDir, cfg.SnapshotRetain, newHCLog(log, "raft-snap"))
	if err != nil {
		return nil, fmt.Errorf("meta: open snapshots: %w", err)
	}
	if err := verifySnapshots(cfg.DataDir, snaps, cfg.SnapshotRetain); err != nil {
		return nil, err
	}
	snapList, err := snaps.List()
	if err != nil {
		return nil, fmt.Errorf("meta: list snapshots: %w", err)
	}
	if err := verifyStable(cfg.DataDir, walDir, wal, logs, snapList); err != nil {
		return nil, err
	}
	var advertise net.Addr
	if cfg.RaftAdvertise != "" {
		if advertise, err = net.ResolveTCPAddr("tcp", cfg.RaftAdvertise); err != nil {
			return nil, fmt.Errorf("meta: raft advertise address: %w", err)
		}
	}
	trans, admit, err := newTransport(cfg, advertise, newHCLog(log, "raft-net"))
	if err != nil {
		return nil, fmt.Errorf("meta: raft transport on %s: %w", cfg.RaftBind, err)
	}
	hasState, err := raft.HasExistingState(logs, wal, snaps)
	if err != nil {
		_ = trans.Close()
		return nil, fmt.Errorf("meta: inspect raft state: %w", err)
	}

	gt := &guardedTransport{NetworkTransport: trans}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = newHCLog(log, "raft")
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.NoLegacyTelemetry = true
	if err := raft.ValidateConfig(rc); err != nil {
		_ = trans.Close()
		return nil, fmt.Errorf("meta: raft config: %w", err)
	}

	s := &Store{
		cfg:           cfg,
		log:           log,
		wal:           wal,
		logs:          logs,
		walMeta:       walMeta,
		lock:          lock,
		raftAddr:      string(trans.LocalAddr()),
		trans:         gt,
		admit:         admit,
		watchers:      make(map[uint64]chan struct{}),
		obsCh:         make(chan raft.Observation, 16),
		wake:          make(chan struct{}, 1),
		needBootstrap: !hasState,
		missingSince:  make(map[string]time.Time),
		refused:       make(map[string]string),
	}
	s.peers.Store(&peersBox{cfg.Peers})
	s.fsm = newFSM(s.notify)
	r, err := raft.NewRaft(rc, s.fsm, logs, wal, snaps, gt)
	if err != nil {
		_ = trans.Close()
		return nil, fmt.Errorf("meta: start raft: %w", err)
	}
	s.raft = r
	ok = true

	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.observer = raft.NewObserver(s.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState:
			return true
		}
		return false
	})
	r.RegisterObserver(s.observer)
	s.wg.Add(2)
	go s.observe()
	go s.loop()
	log.Info("meta: raft started", "raft_addr", s.raftAddr, "existing_state", hasState, "bootstrap_expect", cfg.BootstrapExpect)
	return s, nil
}

// Close stops the reconcile loop and the raft server and closes the log.
// It does not leave the cluster: a node that comes back with the same
// DataDir and NodeID rejoins with its state. It first snapshots what this
// node has applied, so that a restart serves that state at once instead of
// after it has caught up with the leader.
func (s *Store) Close() error { return s.close(true) }

// close is Close; tests pass snapshot=false to stop like a crash, which
// leaves the log entries after the last snapshot to be replayed.
func (s *Store) close(snapshot bool) error {
	s.closeOnce.Do(func() {
		s.cancel()
		if snapshot {
			if err := s.raft.Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
				s.log.Debug("meta: snapshot on close", "err", err)
			}
		}
		s.raft.DeregisterObserver(s.observer)
		stuck, err := s.shutdownRaft()
		s.trans.fence()
		s.wg.Wait()
		if stuck {
			// Raft goroutines may still run and touch the log store:
			// closing it under them could corrupt it. Leave the WAL,
			// its meta store and the directory lock open (leaked until
			// the process exits); a reopen of this directory in this
			// process then fails on the lock instead of sharing files
			// with a live raft.
			s.log.Error("meta: raft log, snapshot store and data directory lock left open after the stuck raft shutdown", "dir", s.cfg.DataDir)
		} else {
			if rerr := s.logs.recordEnd(s.wal); rerr != nil {
				s.log.Warn("meta: record the end of the raft log; the next start cannot tell a truncated log", "err", rerr)
			}
			if werr := s.wal.Close(); err == nil {
				err = werr
			}
			if merr := s.walMeta.Close(); err == nil {
				err = merr
			}
			_ = s.lock.Close() // releases the flock
		}
		s.watchMu.Lock()
		for id, ch := range s.watchers {
			close(ch)
			delete(s.watchers, id)
		}
		s.watchClosed = true
		s.watchMu.Unlock()
		s.closeErr = err
	})
	return s.closeErr
}

// raftShutdownWait bounds the wait for raft's goroutines on Close; a
// healthy shutdown takes milliseconds.
const raftShutdownWait = 30 * time.Second

// shutdownRaft shuts raft down and waits, at most raftShutdownWait, for
// its goroutines. hashicorp/raft can leave a pipeline replication
// goroutine blocked for good on a stepped-down leader (its decoder gone,
// both pipeline channels full; seen in TestLeaderLeave on a loaded
// machine: Shutdown then waits forever and so would Close). Past the
// bound the node closes anyway, and the transport, which Shutdown would
// have closed last, is closed here. stuck reports that bound: which raft
// goroutines still run is not known then, so the caller must not close
// the log or snapshot store under them.
func (s *Store) shutdownRaft() (stuck bool, err error) {
	f := s.raft.Shutdown()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	t := time.NewTimer(raftShutdownWait)
	defer t.Stop()
	select {
	case err := <-done:
		return false, err
	case <-t.C:
		s.log.Error("meta: raft shutdown did not finish; closing without its stuck replication goroutines", "waited", raftShutdownWait)
		_ = s.trans.Close()
		return true, nil
	}
}

// Leave removes this node from the cluster for good (a drain's last step):
// if it leads, it first hands leadership to another voter (the leader
// never removes itself: hashicorp/raft's self-removal can leave a
// replication pipeline that blocks Shutdown); then it asks
// the leader, through raft, to take it out of the ring and tombstone it
// (kindLeave) and to remove it from the raft configuration, retrying while
// leadership moves, until the leader acknowledges both or ctx ends. It
// returns nil only once the removal is committed; it never depends on
// gossip reaching the leader (Gossip.Leave is only the fast path, and a
// leader that holds this node failed in gossip never hears it). The
// leader keeps this incarnation out until the node comes back with
// another one (Config.Incarnation). Without a deadline in ctx it waits
// ApplyTimeout. Call Close afterwards; the node may serve reads until
// then.
func (s *Store) Leave(ctx context.Context) error {
	cmd, err := encodeCommand(leave{ID: s.cfg.NodeID, Incarnation: s.cfg.Incarnation, At: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	// The leader acknowledges only after it also removed this node from
	// raft; when that acknowledgement is lost (a forward that timed out
	// on a loaded leader), this node, no longer in raft, knows no leader
	// to retry with. Its own FSM then tells: the tombstone of this
	// incarnation is there once the leave committed (the leader's
	// reconcile finishes a removal left undone).
	committed := func() bool {
		inc, ok := s.fsm.departed(s.cfg.NodeID)
		return ok && inc == s.cfg.Incarnation
	}
	if err := s.writeUntil(ctx, cmd, committed, nil); err != nil {
		return fmt.Errorf("meta: leave of %s not committed: %w", s.cfg.NodeID, err)
	}
	s.log.Info("meta: left the cluster", "incarnation", s.cfg.Incarnation)
	return nil
}

// TransferLeadership hands raft leadership to another voter when this
// node leads, so that the cluster does not wait for an election timeout
// when it stops; it is a no-op on a follower.
func (s *Store) TransferLeadership(ctx context.Context) error {
	if !s.IsLeader() {
		return nil
	}
	f := s.raft.LeadershipTransfer()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("meta: leadership transfer: %w", err)
		}
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Departed reports whether id left explicitly (Leave) with incarnation
// and has not been admitted back since, as this node has applied it.
func (s *Store) Departed(id string) (incarnation uint64, ok bool) { return s.fsm.departed(id) }

// NodeID is this node's ID.
func (s *Store) NodeID() string { return s.cfg.NodeID }

// RaftAddr is the address raft listens on (as advertised to the others);
// gossip carries it in NodeMeta.RaftAddr.
func (s *Store) RaftAddr() string { return s.raftAddr }

// SetPeers sets the membership source after Open: gossip needs RaftAddr in
// its metadata before it starts, so it usually comes second.
func (s *Store) SetPeers(p Peers) {
	s.peers.Store(&peersBox{p})
	s.Reconcile()
}

// Reconcile asks the loop to bootstrap or reconcile now instead of at the
// next tick; node calls it on gossip events. It does not block.
func (s *Store) Reconcile() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Model returns the registered spec of fp.
func (s *Store) Model(fp chunk.Fingerprint) (chunk.ModelSpec, bool) { return s.fsm.model(fp) }

// Models returns every registered spec, sorted by fingerprint.
func (s *Store) Models() []chunk.ModelSpec { return s.fsm.modelList() }

// Settings returns the cluster settings (DefaultSettings until set).
func (s *Store) Settings() Settings { return s.fsm.currentSettings() }

// Ring returns the current epoch's ring as this node has applied it.
func (s *Store) Ring() *ring.Ring { return s.fsm.currentRing() }

// IsLeader reports whether this node is the raft leader now.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// Leader returns the leader's ID and gRPC address as this node knows them,
// or empty strings when it knows no leader. The gRPC address comes from the
// ring, or from gossip while the leader is not in the ring yet.
func (s *Store) Leader() (id, grpcAddr string) {
	_, lid := s.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	id = string(lid)
	if m, ok := s.fsm.member(id); ok && m.GRPCAddr != "" {
		return id, m.GRPCAddr
	}
	if id == s.cfg.NodeID && s.cfg.GRPCAddr != "" {
		return id, s.cfg.GRPCAddr
	}
	if p := s.peers.Load().p; p != nil {
		for _, nm := range p.Members() {
			if nm.ID == id {
				return id, nm.GRPCAddr
			}
		}
	}
	return id, ""
}

// Watch returns a channel that receives a value after any change of the
// replicated state or of the leader; changes in a burst coalesce into one.
// The channel is closed by cancel or by Close.
func (s *Store) Watch() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.watchClosed {
		close(ch)
		return ch, func() {}
	}
	id := s.nextWatch
	s.nextWatch++
	s.watchers[id] = ch
	return ch, func() {
		s.watchMu.Lock()
		defer s.watchMu.Unlock()
		if c, ok := s.watchers[id]; ok {
			delete(s.watchers, id)
			close(c)
		}
	}
}

func (s *Store) notify() {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for _, ch := range s.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// waitFor blocks until cond holds or ctx ends; it reports whether cond held.
func (s *Store) waitFor(ctx context.Context, cond func() bool) bool {
	ch, cancel := s.Watch()
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return cond()
		case _, ok := <-ch:
			if !ok {
				return cond()
			}
		}
	}
	return true
}

// WaitLeader blocks until this node knows a leader (with its gRPC address
// when the leader is another node) or ctx ends.
func (s *Store) WaitLeader(ctx context.Context) error {
	if s.waitFor(ctx, func() bool {
		id, addr := s.Leader()
		return id != "" && (addr != "" || id == s.cfg.NodeID)
	}) {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNoLeader, context.Cause(ctx))
}

// WaitModel blocks until fp is registered in this node's state or ctx ends.
// A node that is told about a model registered through another node a
// moment ago uses it before answering "unknown model".
func (s *Store) WaitModel(ctx context.Context, fp chunk.Fingerprint) (chunk.ModelSpec, bool) {
	var spec chunk.ModelSpec
	ok := s.waitFor(ctx, func() bool {
		var found bool
		spec, found = s.fsm.model(fp)
		return found
	})
	return spec, ok
}

// RegisterModel registers spec cluster-wide and returns its fingerprint. An
// invalid spec fails with an error wrapping ErrInvalidCommand and
// chunk.ErrInvalidSpec. Registering a spec again is a no-op. When it
// returns nil the model is known on this node too.
func (s *Store) RegisterModel(ctx context.Context, spec chunk.ModelSpec) (chunk.Fingerprint, error) {
	if err := validateSpec(spec); err != nil {
		return chunk.Fingerprint{}, err
	}
	fp := spec.Fingerprint()
	if _, ok := s.fsm.model(fp); ok {
		return fp, nil
	}
	cmd, err := encodeCommand(registerModel{Spec: spec})
	if err != nil {
		return chunk.Fingerprint{}, err
	}
	if err := s.write(ctx, cmd); err != nil {
		return chunk.Fingerprint{}, err
	}
	// On a follower the leader has committed it; wait for it to be applied
	// here so that a caller can read its write.
	if _, ok := s.WaitModel(ctx, fp); !ok {
		return fp, fmt.Errorf("meta: model %v committed but not yet applied on %s: %w", fp, s.cfg.NodeID, context.Cause(ctx))
	}
	return fp, nil
}

// ApplyForwarded applies a command a follower forwarded. It is what the
// node's gRPC handler calls on the leader; on any other node it fails with
// ErrNotLeader. A malformed or invalid command, or a ring change (only the
// leader makes those), fails with ErrInvalidCommand before it reaches the
// log.
func (s *Store) ApplyForwarded(ctx context.Context, cmd []byte) error {
	c, err := decodeCommand(cmd)
	if err != nil {
		return err
	}
	if _, ok := c.(ringChange); ok {
		// Only the leader's reconcile loop changes the ring; a peer
		// has no business sending one.
		return fmt.Errorf("%w: ring changes are not forwarded", ErrInvalidCommand)
	}
	if !s.IsLeader() {
		return fmt.Errorf("%w: %s", ErrNotLeader, s.cfg.NodeID)
	}
	return s.applyHere(ctx, c, cmd)
}

// applyHere applies a decoded command on the leader: a leave also removes
// the node from the raft configuration before it is acknowledged.
func (s *Store) applyHere(ctx context.Context, c command, cmd []byte) error {
	if lv, ok := c.(leave); ok {
		return s.applyLeave(ctx, lv, cmd)
	}
	return s.applyLocal(ctx, cmd)
}

// applyLeave commits lv (ring removal and tombstone), then removes the
// node from raft. A retry after an ambiguous failure finds the first step
// done (the FSM ignores a repeated leave) and does the second.
func (s *Store) applyLeave(ctx context.Context, lv leave, cmd []byte) error {
	servers, err := s.Servers()
	if err != nil {
		return err
	}
	member, others := false, 0
	for _, sv := range servers {
		switch {
		case sv.ID == lv.ID:
			member = true
		case sv.Voter:
			others++
		}
	}
	if member && others == 0 {
		return fmt.Errorf("%w: %w: %s", ErrInvalidCommand, ErrLastVoter, lv.ID)
	}
	if lv.ID == s.cfg.NodeID {
		// Hand over first; the caller's write loop then forwards the
		// leave to the new leader.
		if err := s.TransferLeadership(ctx); err != nil {
			s.log.Warn("meta: leadership transfer before leaving", "err", err)
		}
		return fmt.Errorf("%w: %s hands leadership over before it leaves", ErrNotLeader, s.cfg.NodeID)
	}
	// A retry of a leave this leader has applied has only the raft
	// removal left: restamping it would rewrite the tombstone for nothing.
	d, tomb := s.fsm.departedAll()[lv.ID]
	if retry := tomb && d.Incarnation == lv.Incarnation && !s.fsm.currentRing().Contains(lv.ID); !retry {
		// The leader stamps the time: DepartedTTL's reasoning is about
		// leader clocks, and the leaver's may be off. Decided here,
		// before the entry is written, so every replica applies the
		// same At.
		if now := time.Now().UnixNano(); now > lv.At {
			st := lv
			st.At = now
			if cmd, err = encodeCommand(st); err != nil {
				return err
			}
		}
		if err := s.applyLocal(ctx, cmd); err != nil {
			return err
		}
	}
	if !member {
		return nil
	}
	timeout, err := s.applyTimeout(ctx)
	if err != nil {
		return err
	}
	f := s.raft.RemoveServer(raft.ServerID(lv.ID), 0, timeout)
	if err := awaitFuture(ctx, f, "remove "+lv.ID+" from raft"); err != nil {
		return err
	}
	s.log.Info("meta: raft membership", "change", "remove (left)", "server", lv.ID, "incarnation", lv.Incarnation)
	s.Reconcile() // a non-voter may take the slot
	return nil
}

// write applies cmd on the leader, here or through Forward, retrying while
// leadership moves. Every command is idempotent (registering a spec twice,
// setting the same settings, a ring change conditional on its epoch), so a
// retry after an ambiguous failure is safe.
func (s *Store) write(ctx context.Context, cmd []byte) error {
	return s.writeUntil(ctx, cmd, nil, nil)
}

// writeUntil is write that also ends, successfully, before a retry once
// done (if not nil) reports that cmd has taken effect. landed (if not nil)
// settles an ErrSettingsVersion that follows a try without a clear answer
// (a timeout, a lost reply): that try may have committed, and the retry
// is then refused by its own condition; landed reports whether it did
// commit, which makes the write a success.
func (s *Store) writeUntil(ctx context.Context, cmd []byte, done func() bool, landed func(context.Context) bool) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.ApplyTimeout)
		defer cancel()
	}
	backoff := 5 * time.Millisecond
	var last error
	for {
		if s.ctx.Err() != nil {
			return ErrClosed
		}
		var err error
		if s.IsLeader() {
			var c command
			if c, err = decodeCommand(cmd); err == nil {
				err = s.applyHere(ctx, c, cmd)
			}
		} else if id, addr := s.Leader(); id == "" || addr == "" {
			err = fmt.Errorf("%w known to %s", ErrNoLeader, s.cfg.NodeID)
		} else if s.cfg.Forward == nil {
			return fmt.Errorf("%w: %s has no forwarder (leader %s)", ErrNotLeader, s.cfg.NodeID, id)
		} else {
			err = s.cfg.Forward.Apply(ctx, addr, cmd)
		}
		if errors.Is(err, ErrSettingsVersion) && last != nil && landed != nil && landed(ctx) {
			return nil
		}
		if err == nil || errors.Is(err, ErrInvalidCommand) || errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrSettingsVersion) {
			return err
		}
		if done != nil && done() {
			return nil
		}
		last = err
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			if done != nil && done() {
				return nil
			}
			return fmt.Errorf("meta: write not applied before %w: %w", context.Cause(ctx), last)
		case <-s.ctx.Done():
			t.Stop()
			return ErrClosed
		case <-t.C:
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// applyTimeout is how long raft may take for a change: the configured apply
// timeout, or less when ctx ends sooner.
func (s *Store) applyTimeout(ctx context.Context) (time.Duration, error) {
	timeout := s.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return 0, context.Cause(ctx)
		}
	}
	return timeout, nil
}

// awaitFuture waits for a raft future or ctx and maps raft's errors to this
// package's sentinels. The future resolves when the change is applied,
// leadership is lost or raft shuts down, so the waiting goroutine always ends.
func awaitFuture(ctx context.Context, f raft.Future, what string) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	default:
		return fmt.Errorf("meta: %s: %w", what, err)
	}
}

// applyLocal appends cmd to the log on this node, which must be the leader,
// and waits until it is applied.
func (s *Store) applyLocal(ctx context.Context, cmd []byte) error {
	timeout, err := s.applyTimeout(ctx)
	if err != nil {
		return err
	}
	f := s.raft.Apply(cmd, timeout)
	if err := awaitFuture(ctx, f, "raft apply"); err != nil {
		return err
	}
	if rerr, ok := f.Response().(error); ok && rerr != nil {
		return rerr
	}
	return nil
}

// Server is a raft server as the current configuration lists it.
type Server struct {
	ID       string
	RaftAddr string
	Voter    bool
}

// Servers returns the raft configuration this node has (the leader's is
// authoritative).
func (s *Store) Servers() ([]Server, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("meta: raft configuration: %w", err)
	}
	cf := f.Configuration()
	out := make([]Server, 0, len(cf.Servers))
	for _, sv := range cf.Servers {
		out = append(out, Server{ID: string(sv.ID), RaftAddr: string(sv.Address), Voter: sv.Suffrage == raft.Voter})
	}
	return out, nil
}

// Stats is a snapshot of this node's raft and metadata counters.
type Stats struct {
	State        string // "Leader", "Follower", "Candidate", "Shutdown"
	Term         uint64
	LastIndex    uint64
	CommitIndex  uint64
	AppliedIndex uint64
	Epoch        uint64
	Members      int
	Models       int
	Tokens       int // API token records
	// Refused counts gossip members the leader does not add to raft or
	// the ring because their raft TLS handshake fails (0 on followers).
	Refused     int
	LastContact time.Time // zero on the leader
}

// Stats returns this node's counters (for status commands and metrics).
func (s *Store) Stats() Stats {
	models, members, tokens := s.fsm.counts()
	st := Stats{
		State:        s.raft.State().String(),
		Term:         s.raft.CurrentTerm(),
		LastIndex:    s.raft.LastIndex(),
		CommitIndex:  s.raft.CommitIndex(),
		AppliedIndex: s.raft.AppliedIndex(),
		Epoch:        s.fsm.currentRing().Epoch(),
		Members:      members,
		Models:       models,
		Tokens:       tokens,
		Refused:      int(s.refusedN.Load()),
	}
	if st.State != raft.Leader.String() {
		st.LastContact = s.raft.LastContact()
	}
	return st
}

// observe drains raft's observations: a leader change is a state change for
// watchers and a reason to reconcile.
func (s *Store) observe() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.obsCh:
			s.notify()
			s.Reconcile()
		}
	}
}

// loop bootstraps when it should and, on the leader, reconciles gossip with
// raft and the ring, every ReconcileInterval and on Reconcile.
func (s *Store) loop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		if s.needBootstrap {
			s.tryBootstrap()
		}
		if s.IsLeader() {
			if err := s.reconcile(); err != nil && s.ctx.Err() == nil {
				s.log.Warn("meta: reconcile", "err", err)
			}
		} else if len(s.missingSince) > 0 {
			// Absences seen in an earlier term say nothing about the
			// next one: a node may have come back meanwhile.
			clear(s.missingSince)
		}
		if !s.IsLeader() && len(s.refused) > 0 {
			clear(s.refused)
			s.refusedN.Store(0)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
		}
	}
}

// alive returns the ring members gossip reports alive and not leaving,
// this node included (from Config when gossip does not list it yet), and
// the IDs that announced a graceful leave, have left, or are tombstoned
// (Leave) and not back with another incarnation.
func (s *Store) alive() (alive map[string]ring.Member, leaving map[string]bool) {
	alive = make(map[string]ring.Member)
	leaving = make(map[string]bool)
	departed := s.fsm.departedAll()
	if p := s.peers.Load().p; p != nil {
		for _, nm := range p.Members() {
			if nm.ID == "" {
				continue
			}
			if d, ok := departed[nm.ID]; nm.Leaving || ok && d.Incarnation == nm.Incarnation {
				leaving[nm.ID] = true
				continue
			}
			m := memberOf(nm)
			if !(m.Weight >= 0) || math.IsInf(m.Weight, 0) {
				m.Weight = 0 // JSON cannot carry it; ring reads 0 as 1
			}
			alive[nm.ID] = m
		}
		if ps, ok := p.(PeerStatus); ok {
			for _, st := range ps.Status() {
				if _, up := alive[st.Meta.ID]; !up && st.State == gossip.StateLeft {
					leaving[st.Meta.ID] = true
				}
			}
		}
	}
	d, selfLeft := departed[s.cfg.NodeID]
	selfLeft = selfLeft && d.Incarnation == s.cfg.Incarnation
	if self, ok := alive[s.cfg.NodeID]; !ok && !leaving[s.cfg.NodeID] && !selfLeft {
		self = ring.Member{ID: s.cfg.NodeID, GRPCAddr: s.cfg.GRPCAddr, RaftAddr: s.raftAddr, Weight: s.cfg.Weight}
		if !(self.Weight >= 0) || math.IsInf(self.Weight, 0) {
			self.Weight = 0
		}
		alive[s.cfg.NodeID] = self
	}
	// A tombstoned node that gossip does not show alive (it stopped, or
	// gossip holds it failed) is gone for good: no DeadGrace.
	for id := range departed {
		if _, ok := alive[id]; !ok {
			leaving[id] = true
		}
	}
	return alive, leaving
}
