package meta

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/chunk"
)

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
