package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// ErrRecovering is why a node that is up is not ready yet: its metadata
// has not caught up with the leader's, or, on a restart, its startup pull
// (the refill of the chunks it should hold) has not finished. Ready wraps
// it.
var ErrRecovering = errors.New("node: recovering")

// recovery tracks the two steps a started node takes before it is ready:
// catching its metadata up with the leader, then the startup pull. Every
// start waits for both, on an empty data directory too: a node restored
// under its old ID on a new disk holds nothing of its share yet, and one
// that joins for the first time is handed its share by the pull. A ready
// node holds what it should, which is what lets a rolling operation pace
// itself on /readyz. The background loop that runs them is the only
// writer.
type recovery struct {
	metaCaughtUp atomic.Bool
	pullDone     atomic.Bool
	// ringWhy is set while this node's ring differs from the leader's at
	// the same epoch (errRingDisagrees), nil otherwise: found at the start
	// (catchUpMeta) or later (watchRing).
	ringWhy atomic.Pointer[string]
}

// errRingDisagrees: this node's ring differs from the leader's at the
// same epoch. Every replica applies the same log, so the node's raft
// state is damaged; it stays not ready rather than place keys by its
// own ring.
var errRingDisagrees = errors.New("ring differs from the leader's at the same epoch")

// recovering returns why the node is still recovering, or nil.
func (n *Node) recovering() error {
	if why := n.recoveringWhy(); why != "" {
		return fmt.Errorf("%w: %s", ErrRecovering, why)
	}
	return nil
}

// recoveringWhy says which step of recovery runs ("" once both are done),
// or how the ring differs from the leader's, whenever that was found.
func (n *Node) recoveringWhy() string {
	if why := n.rec.ringWhy.Load(); why != nil {
		return *why
	}
	switch {
	case !n.rec.metaCaughtUp.Load():
		return "metadata catching up with the leader"
	case !n.rec.pullDone.Load():
		return "startup pull running"
	}
	return ""
}

// State is what the node tells in Stats' api.StateHeader: api.StateReady,
// or another api state and why (api.SplitState): left once a drain took
// it out of the cluster, joining while it knows no leader or is not in
// the ring, recovering while Ready returns ErrRecovering.
func (n *Node) State() string {
	select {
	case <-n.left:
		return api.StateLeft + ": drained and left the cluster"
	default:
	}
	if err := n.inRing(); err != nil {
		return api.StateJoining + ": " + err.Error()
	}
	if why := n.recoveringWhy(); why != "" {
		return api.StateRecovering + ": " + why
	}
	return api.StateReady
}

// inRing reports why the node cannot take part in the cluster yet, or nil:
// it needs a known leader and a ring that contains it.
func (n *Node) inRing() error {
	if id, _ := n.meta.Leader(); id == "" {
		return errors.New("no raft leader")
	}
	if !n.meta.Ring().Contains(n.cfg.NodeID) {
		return errors.New("not in the ring yet")
	}
	return nil
}

// recover runs the steps of recovery in order, once the node is in the
// ring: the metadata catch-up, then the startup pull. Then it keeps
// checking the ring against the leader's (watchRing) until ctx ends.
func (n *Node) recover(ctx context.Context) {
	watch, unwatch := n.meta.Watch()
	defer unwatch()
	t := time.NewTicker(time.Second) // inRing also depends on the leader's address
	defer t.Stop()
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-watch:
		case <-t.C:
		}
		return true
	}
	for n.inRing() != nil {
		if !wait() {
			return
		}
	}
	start := time.Now()
	for {
		err := n.catchUpMeta(ctx)
		n.noteRing(err)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		n.log.Debug("node: metadata catch-up", "err", err)
		if !wait() {
			return
		}
	}
	n.rec.metaCaughtUp.Store(true)
	n.log.Info("node: metadata caught up with the leader", "took", time.Since(start).Round(time.Millisecond))
	n.startupPull(ctx)
	if ctx.Err() != nil {
		return
	}
	n.rec.pullDone.Store(true)
	n.watchRing(ctx, wait, func() uint64 { return n.meta.Ring().Epoch() }, n.checkRing)
}

// watchRing checks this node's ring against the leader's after the
// start, as catchUpMeta does at the start: a ring that differs at the
// same epoch makes the node not ready (recovering, with the difference
// as the reason) until a check finds them equal again. It checks once
// for each ring epoch the node applies (epoch), and, until a check has
// compared that epoch and found no difference, again at each wake (in
// recover: a meta change, or each second). A node that agrees thus calls
// the leader once per epoch. A check that could not compare (no leader,
// the leader unreachable or at another epoch) changes nothing. It
// returns when wait does (false).
func (n *Node) watchRing(ctx context.Context, wait func() bool, epoch func() uint64, check func(context.Context) (compared bool, err error)) {
	var agreed uint64 // the last epoch a check found equal to the leader's; 0: none
	for {
		if ep := epoch(); ep != agreed || n.rec.ringWhy.Load() != nil {
			compared, err := check(ctx)
			switch {
			case errors.Is(err, errRingDisagrees):
				n.noteRing(err)
			case compared && err == nil:
				n.noteRing(nil)
				agreed = ep
			case err != nil:
				n.log.Debug("node: ring check", "err", err)
			}
		}
		if !wait() {
			return
		}
	}
}

// leaderClient is a client of the raft leader, and its ID; self is true
// (and c nil) when this node leads.
func (n *Node) leaderClient() (lid string, c api.ClientClient, self bool, err error) {
	lid, laddr := n.meta.Leader()
	if lid == n.cfg.NodeID {
		return lid, nil, true, nil
	}
	if lid == "" || laddr == "" {
		return lid, nil, false, errors.New("no leader address")
	}
	c, err = n.peers.client(laddr)
	return lid, c, false, err
}

// checkRing compares this node's ring with the leader's (one ClusterInfo
// call; ringAgrees). The leader's own ring is the reference: on the
// leader it compares nothing and agrees.
func (n *Node) checkRing(ctx context.Context) (compared bool, err error) {
	lid, c, self, err := n.leaderClient()
	if self || err != nil {
		return self, err
	}
	rctx, cancel := n.withTimeout(ctx)
	defer cancel()
	info, err := c.ClusterInfo(rctx, &api.ClusterInfoRequest{})
	if err != nil {
		return false, fmt.Errorf("leader %s: cluster info: %w", lid, err)
	}
	return ringAgrees(n.meta.Ring(), info, lid)
}

// ringAgrees compares ring r with the leader lid's (info) when both are
// at the same epoch (compared), failing with errRingDisagrees when they
// differ.
func ringAgrees(r *ring.Ring, info *api.ClusterInfoResponse, lid string) (compared bool, err error) {
	if r.Epoch() != info.Epoch {
		return false, nil
	}
	if diff := ringDiff(r.Members(), info.Members); diff != "" {
		return true, fmt.Errorf("%w: epoch %d, leader %s: %s", errRingDisagrees, info.Epoch, lid, diff)
	}
	return true, nil
}

// catchUpMeta waits until this node's metadata holds what the leader's
// held when asked: its ring epoch (or a later one) and its models. A
// forwarded read instead of a raft barrier, which only the leader can
// run: the node's own commit index is capped by the log it has, so it
// cannot tell how far behind it is. The leader itself is caught up.
func (n *Node) catchUpMeta(ctx context.Context) error {
	lid, c, self, err := n.leaderClient()
	if self || err != nil {
		return err
	}
	rctx, cancel := n.withTimeout(ctx)
	defer cancel()
	info, err := c.ClusterInfo(rctx, &api.ClusterInfoRequest{})
	if err != nil {
		return fmt.Errorf("leader %s: cluster info: %w", lid, err)
	}
	models, err := c.Models(rctx, &api.ModelsRequest{})
	if err != nil {
		return fmt.Errorf("leader %s: models: %w", lid, err)
	}
	want := make([]chunk.Fingerprint, 0, len(models.Models))
	for _, m := range models.Models {
		want = append(want, api.FingerprintFromProto(m.Fingerprint))
	}
	caughtUp := func() bool {
		if n.meta.Ring().Epoch() < info.Epoch {
			return false
		}
		for _, fp := range want {
			if _, ok := n.meta.Model(fp); !ok {
				return false
			}
		}
		return true
	}
	watch, unwatch := n.meta.Watch()
	defer unwatch()
	for !caughtUp() {
		select {
		case <-rctx.Done():
			return fmt.Errorf("waiting for epoch %d and %d models of leader %s: %w", info.Epoch, len(want), lid, context.Cause(rctx))
		case <-watch:
		}
	}
	_, err = ringAgrees(n.meta.Ring(), info, lid)
	return err
}

// noteRing keeps the reason a ring disagreement gives (for State and
// Ready) and logs it when it changes.
func (n *Node) noteRing(err error) {
	if !errors.Is(err, errRingDisagrees) {
		n.rec.ringWhy.Store(nil)
		return
	}
	why := err.Error()
	if old := n.rec.ringWhy.Swap(&why); old == nil || *old != why {
		n.log.Error("node: not ready: this node's ring differs from the leader's at the same epoch, so its raft state is damaged; "+
			"stop it, move DATA/raft aside and start it again (docs/DEPLOY.md, \"Damaged Raft state\")", "err", err)
	}
}

// ringDiff says how the ring members ours differ from the leader's
// (ClusterInfo), "" when they are the same.
func ringDiff(ours []ring.Member, leader []*api.Member) string {
	theirs := make(map[string]ring.Member, len(leader))
	for _, p := range leader {
		theirs[p.Id] = api.MemberFromProto(p)
	}
	var diffs []string
	for _, m := range ours {
		t, ok := theirs[m.ID]
		switch {
		case !ok:
			diffs = append(diffs, m.ID+" is not in the leader's ring")
		case t.Weight != m.Weight:
			diffs = append(diffs, fmt.Sprintf("%s has weight %g here, %g on the leader", m.ID, m.Weight, t.Weight))
		case t != m:
			diffs = append(diffs, fmt.Sprintf("%s is %+v here, %+v on the leader", m.ID, m, t))
		}
		delete(theirs, m.ID)
	}
	for _, id := range slices.Sorted(maps.Keys(theirs)) {
		diffs = append(diffs, id+" is missing here")
	}
	return strings.Join(diffs, "; ")
}

// registerRecoveryMetric exports kvmesh_node_recovering: 1 while the node
// is up but not ready because it is recovering (see Ready), else 0; and
// kvmesh_node_ring_disagrees: 1 while its ring differs from the leader's.
func (n *Node) registerRecoveryMetric() {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvmesh_node_recovering",
		Help: "1 while the node catches its metadata up with the leader, runs its startup pull, or has a ring that differs from the leader's (not ready), else 0.",
	}, func() float64 {
		if n.recovering() != nil {
			return 1
		}
		return 0
	})
	if err := n.registry.Register(g); err != nil {
		n.log.Warn("node: register recovery metric", "err", err)
	}
	d := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvmesh_node_ring_disagrees",
		Help: "1 while this node's ring differs from the leader's at the same epoch (damaged raft state; the node is not ready), else 0.",
	}, func() float64 {
		if n.rec.ringWhy.Load() != nil {
			return 1
		}
		return 0
	})
	if err := n.registry.Register(d); err != nil {
		n.log.Warn("node: register ring check metric", "err", err)
	}
}

// spillTimeout bounds the spill of DRAM to the disk tier at Close.
const spillTimeout = time.Minute

// spill writes the entries only DRAM holds to the disk tier before the
// store closes (kvtier.Store.Spill); without a disk tier a SIGTERM loses
// them like a kill does, and the startup pull refills the node.
func (n *Node) spill() error {
	ctx, cancel := context.WithTimeout(context.Background(), spillTimeout)
	defer cancel()
	start := time.Now()
	st := n.store.Spill(ctx)
	took := time.Since(start).Round(time.Millisecond)
	if st.NoRoom+st.Failed > 0 || ctx.Err() != nil {
		// What was not written is only on the other replicas now.
		n.log.Warn("node: DRAM not all spilled to the disk tier", "written", st.Entries, "bytes", st.Bytes,
			"no_room", st.NoRoom, "no_room_bytes", st.NoRoomBytes, "failed", st.Failed, "failed_bytes", st.FailedBytes,
			"busy", st.Busy, "took", took, "timeout", ctx.Err() != nil)
		return nil
	}
	if st.Entries > 0 {
		n.log.Info("node: DRAM spilled to the disk tier", "entries", st.Entries, "bytes", st.Bytes, "busy", st.Busy, "took", took)
	}
	return nil
}

// handoff runs at Close on a node without a disk tier (Config.
// ShutdownHandoff): one anti-entropy round, which pushes every key this
// node holds to the other owners that lack it (a write that reached only
// W replicas, a replica refilled only partly), within the timeout. What it
// could not hand over is in the log; the node's startup pull takes its
// share back after the restart.
func (n *Node) handoff() error {
	if n.cfg.DiskBytes > 0 || n.cfg.ShutdownHandoff <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownHandoff)
	defer cancel()
	start := time.Now()
	st, err := n.repl.AntiEntropy(ctx)
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		n.log.Warn("node: chunks not all handed to their other owners before leaving", "peers_done", st.Peers,
			"pushed", st.Pushed, "bytes", st.BytesPushed, "took", took, "timeout", n.cfg.ShutdownHandoff, "err", err)
		return nil
	}
	n.log.Info("node: chunks handed to their other owners before leaving", "peers", st.Peers, "pushed", st.Pushed,
		"bytes", st.BytesPushed, "under_w", st.UnderW, "under_r", st.UnderR, "took", took)
	return nil
}
