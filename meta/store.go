package meta

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	tlsLayer *streamLayer // raft's TLS stream layer (nil without TLS): admissible dials through it
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
	trans, tlsLayer, err := newTransport(cfg, advertise, newHCLog(log, "raft-net"))
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
		tlsLayer:      tlsLayer,
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
