package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/replication"
)

// background runs the node's event loops: meta changes kick replication
// (rebalancing starts on a new ring epoch instead of at its next poll);
// gossip membership events wake meta's reconcile loop (the leader updates
// raft and the ring at once instead of at its next tick), and a member
// that joins (or comes back) gets the hints held for it at once; and,
// once after the start, recovery catches the metadata up and refills
// this node (recover).
type background struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (n *Node) startBackground() *background {
	ctx, cancel := context.WithCancel(context.Background())
	b := &background{cancel: cancel}
	watch, unwatch := n.meta.Watch()
	b.wg.Add(3)
	go func() {
		defer b.wg.Done()
		defer unwatch()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-watch:
				if !ok {
					return // meta closed
				}
				// Kick is cheap: the replicator compares the ring epoch and R itself.
				n.repl.Kick()
			}
		}
	}()
	events, unsubscribe := n.gossip.Subscribe()
	go func() {
		defer b.wg.Done()
		defer unsubscribe()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-events:
				if !ok {
					return
				}
				n.meta.Reconcile()
				if ev.Kind == gossip.EventJoin && ev.Node.ID != n.cfg.NodeID {
					n.repl.NodeUp(ev.Node.ID)
				}
			}
		}
	}()
	go func() {
		defer b.wg.Done()
		n.recover(ctx)
	}()
	return b
}

// startupPull refills this node from its peers once
// (replication.StartupPull): the DRAM tier comes back empty from a
// restart, and anti-entropy alone would take its interval (5 min by
// default) to notice. recover runs it once the node is back in the ring
// and its metadata has caught up.
func (n *Node) startupPull(ctx context.Context) {
	if n.cfg.NoStartupPull {
		return
	}
	start := time.Now()
	st, err := n.repl.StartupPull(ctx)
	if ctx.Err() != nil {
		return
	}
	log := n.log.Info
	if err != nil {
		log = n.log.Warn
	}
	log("node: startup pull", "keys", st.Pulled, "bytes", st.BytesPulled, "peers", st.Peers,
		"tombstones", st.Deletes, "refused", st.Refused, "took", time.Since(start).Round(time.Millisecond), "err", err)
}

func (b *background) stop() {
	b.cancel()
	b.wg.Wait()
}

// quorum returns the replication factor and write quorum from the cluster
// settings, clamped to the ring: R to the number of members (at least 1),
// W to R.
func (n *Node) quorum() (replicas, writeQuorum int) {
	s := n.meta.Settings()
	replicas, writeQuorum = s.ReplicationFactor, s.WriteQuorum
	if m := n.meta.Ring().Len(); m > 0 && replicas > m {
		replicas = m
	}
	replicas = max(replicas, 1)
	writeQuorum = min(max(writeQuorum, 1), replicas)
	return replicas, writeQuorum
}

// drainState makes drains of one node exclusive.
type drainState struct {
	running atomic.Bool
}

// ErrDraining answers a Drain while another one runs on the node.
var ErrDraining = errors.New("node: a drain is already running")

// ErrNoDrainTarget is why a drain of the cluster's only member fails:
// there is no other member to copy its chunks to. It wraps replication's
// ErrNoReplicas.
var ErrNoDrainTarget = errors.New("node: no other member to drain to")

// ErrCannotLeave is why a drain that copied this node's chunks still
// fails: the node may not leave the cluster, being its last raft voter.
// It wraps meta's ErrLastVoter (itself an ErrInvalidCommand, as a
// forwarded leave of the last voter is refused).
var ErrCannotLeave = errors.New("node: drained, but the last raft voter cannot leave")

// drainProgressEvery is how often a running drain reports progress.
const drainProgressEvery = time.Second

// DrainStats reports a drain.
type DrainStats struct {
	Keys, KeysMoved int
	BytesMoved      int64
	Left            bool
}

// Drain copies every chunk this node holds to its owners on the ring
// without this node and, unless keepMembership, then leaves the cluster
// (Leave) and sweeps once more for chunks written meanwhile, once the ring
// no longer holds the node. progress, if not nil, is called about once a
// second and at each phase change, from this goroutine. The node keeps
// serving reads from its copies until it is closed.
func (n *Node) Drain(ctx context.Context, keepMembership bool, progress func(*api.DrainProgress)) (DrainStats, error) {
	if !n.drain.running.CompareAndSwap(false, true) {
		return DrainStats{}, ErrDraining
	}
	defer n.drain.running.Store(false)
	var out DrainStats
	defer func() {
		// Once the leave committed the node is out for good, whether or
		// not the last sweep succeeded: nothing is gained by keeping it.
		if out.Left {
			n.markLeft()
		}
	}()
	if progress == nil {
		progress = func(*api.DrainProgress) {}
	}
	base := n.repl.Metrics()
	report := func(phase string, st *replication.RebalanceStats) {
		m := n.repl.Metrics()
		p := &api.DrainProgress{NodeId: n.cfg.NodeID, Phase: phase, Left: out.Left,
			KeysMoved: uint64(m.DrainKeys - base.DrainKeys), BytesMoved: uint64(m.DrainBytes - base.DrainBytes),
			Pending: uint64(max(m.DrainPending, 0))}
		if st != nil {
			p.Keys, p.Pending = uint64(st.Keys), uint64(st.Pending)
		}
		progress(p)
	}
	// pass runs one replication drain, reporting while it runs.
	pass := func(phase string) (replication.RebalanceStats, error) {
		report(phase, nil)
		type result struct {
			st  replication.RebalanceStats
			err error
		}
		done := make(chan result, 1)
		go func() {
			st, err := n.repl.Drain(ctx)
			done <- result{st, err}
		}()
		t := time.NewTicker(drainProgressEvery)
		defer t.Stop()
		for {
			select {
			case r := <-done:
				out.Keys = max(out.Keys, r.st.Keys)
				out.KeysMoved += r.st.KeysMoved
				out.BytesMoved += r.st.BytesMoved
				return r.st, r.err
			case <-t.C:
				report(phase, nil)
			}
		}
	}
	n.log.Info("node: drain started", "keep_membership", keepMembership)
	st, err := pass("draining")
	if errors.Is(err, replication.ErrNoReplicas) {
		return out, fmt.Errorf("%w: %w", ErrNoDrainTarget, err)
	}
	if err != nil {
		return out, err
	}
	if keepMembership {
		report("done", &st)
		n.log.Info("node: drained", "keys", out.Keys, "moved", out.KeysMoved, "bytes", out.BytesMoved)
		return out, nil
	}
	report("leaving", &st)
	// Committed through raft when it returns nil; an error (no leader
	// reachable, ctx over) leaves the node a member, and the drain fails.
	if err := n.Leave(ctx); errors.Is(err, meta.ErrLastVoter) {
		return out, fmt.Errorf("%w: %w", ErrCannotLeave, err)
	} else if err != nil {
		return out, err
	}
	out.Left = true
	// The leader's ring lacks this node now. Wait until the others serve
	// that ring too, so that no new write names this node, then copy
	// whatever was written to it meanwhile. The leader removed this node
	// from raft as well, so its own ring may never show the removal: ask
	// the others.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	in := n.inRingElsewhere(wctx)
	for in && wctx.Err() == nil {
		select {
		case <-time.After(200 * time.Millisecond):
		case <-wctx.Done():
		}
		in = n.inRingElsewhere(wctx)
	}
	cancel()
	if in {
		n.log.Warn("node: the others still serve a ring with this node after its leave committed; sweeping anyway")
	}
	st, err = pass("leaving")
	if err != nil && !errors.Is(err, replication.ErrNoReplicas) {
		return out, err
	}
	report("done", &st)
	n.log.Info("node: drained and left", "keys", out.Keys, "moved", out.KeysMoved, "bytes", out.BytesMoved)
	return out, nil
}

// inRingElsewhere reports whether the ring that another member (the
// leader first) serves still contains this node; true when none answers.
func (n *Node) inRingElsewhere(ctx context.Context) bool {
	lid, laddr := n.meta.Leader()
	var addrs []string
	if lid != "" && lid != n.cfg.NodeID && laddr != "" {
		addrs = append(addrs, laddr)
	}
	for _, m := range n.meta.Ring().Members() {
		if m.ID != n.cfg.NodeID && m.ID != lid && m.GRPCAddr != "" {
			addrs = append(addrs, m.GRPCAddr)
		}
	}
	for _, addr := range addrs {
		c, err := n.peers.client(addr)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := c.ClusterInfo(cctx, &api.ClusterInfoRequest{})
		cancel()
		if err != nil || info.LeaderId == "" {
			continue
		}
		for _, m := range info.Members {
			if m.Id == n.cfg.NodeID {
				return true
			}
		}
		return false
	}
	return true
}
