package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/tests/harness"
)

func endpoint(p *harness.Proc) harness.Endpoint {
	return harness.Endpoint{ID: p.ID(), Host: p.Host(), Ports: p.Ports()}
}

func ids(ps []*harness.Proc) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.ID())
	}
	return strings.Join(s, ",")
}

// hold waits faultHold plus up to 2 s (seeded) while a fault lasts.
func hold(ctx context.Context, rng *rand.Rand) {
	d := faultHold + time.Duration(rng.IntN(2000))*time.Millisecond
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// join starts n5, which joins the four bootstrapped nodes under load.
func (r *run) join(ctx context.Context) error {
	p := r.procs[nodes-1]
	r.event("fault", "join "+p.ID())
	if err := p.Start(ctx); err != nil {
		return err
	}
	return nil
}

// rollingRestart restarts every node in turn with SIGTERM, waiting for
// convergence and for the restarted node to be refilled before the next.
func (r *run) rollingRestart(ctx context.Context) error {
	for _, p := range r.procs {
		r.event("fault", "rolling restart: SIGTERM "+p.ID())
		if err := p.Terminate(20 * time.Second); err != nil {
			r.finding("rolling restart: %s: unclean exit after SIGTERM: %v", p.ID(), err)
		}
		r.restart(ctx, p)
		r.settle(ctx, "rolling-restart "+p.ID())
		start := time.Now()
		for {
			under := r.sweep(ctx)
			if under == 0 {
				r.event("refilled", fmt.Sprintf("%s: every acknowledged key on R replicas after %.2fs", p.ID(), time.Since(start).Seconds()))
				break
			}
			if time.Since(start) > refillBound {
				r.note("rolling restart: %s came back empty and %d acknowledged keys were still below R=%d replicas %v later", p.ID(), under, r.rf, refillBound)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	return nil
}

func (r *run) killRestart(ctx context.Context, rng *rand.Rand) error {
	p := r.procs[rng.IntN(nodes)]
	r.event("fault", "SIGKILL "+p.ID())
	p.Kill()
	r.h.Restarted(p.ID())
	hold(ctx, rng)
	r.restart(ctx, p)
	return nil
}

// leader asks the live nodes for the raft leader's proc.
func (r *run) leader(ctx context.Context, among []*harness.Proc) *harness.Proc {
	for _, q := range among {
		v, err := r.obs.view(ctx, q.Addr("grpc"))
		if err != nil || v.leader == "" {
			continue
		}
		for _, p := range r.procs {
			if p.ID() == v.leader {
				return p
			}
		}
	}
	return nil
}

// awaitLeader waits until some node of among names a leader in among
// other than old, and returns how long that took.
func (r *run) awaitLeader(ctx context.Context, among []*harness.Proc, old string) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, electionBound)
	defer cancel()
	for {
		if l := r.leader(ctx, among); l != nil && l.ID() != old && slices.Contains(among, l) {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no leader other than %s among %s within %v", old, ids(among), electionBound)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (r *run) killLeader(ctx context.Context, rng *rand.Rand) error {
	l := r.leader(ctx, r.live())
	if l == nil {
		return fmt.Errorf("no leader to kill")
	}
	r.event("fault", "SIGKILL raft leader "+l.ID())
	l.Kill()
	r.h.Restarted(l.ID())
	var rest []*harness.Proc
	for _, p := range r.procs {
		if p != l {
			rest = append(rest, p)
		}
	}
	took, err := r.awaitLeader(ctx, rest, l.ID())
	if err != nil {
		r.restart(ctx, l)
		return err
	}
	r.event("elected", fmt.Sprintf("new leader after %.2fs", took.Seconds()))
	hold(ctx, rng)
	r.restart(ctx, l)
	return nil
}

func (r *run) stopCont(ctx context.Context, rng *rand.Rand) error {
	p := r.procs[rng.IntN(nodes)]
	r.event("fault", "SIGSTOP "+p.ID())
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	hold(ctx, rng)
	r.event("heal", "SIGCONT "+p.ID())
	return p.Signal(syscall.SIGCONT)
}

// cut partitions a from b both ways.
func (r *run) cut(ctx context.Context, a, b []*harness.Proc) error {
	for _, x := range a {
		for _, y := range b {
			if err := r.fw.Drop(ctx, endpoint(x), endpoint(y)); err != nil {
				return err
			}
			if err := r.fw.Drop(ctx, endpoint(y), endpoint(x)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *run) perm(rng *rand.Rand) []*harness.Proc {
	ps := slices.Clone(r.procs)
	rng.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	return ps
}

func (r *run) partitionMinority(ctx context.Context, rng *rand.Rand) error {
	ps := r.perm(rng)
	minor, major := ps[:2], ps[2:]
	r.event("fault", fmt.Sprintf("partition {%s} | {%s}", ids(minor), ids(major)))
	if err := r.cut(ctx, minor, major); err != nil {
		return err
	}
	hold(ctx, rng)
	r.event("heal", "partition removed")
	return r.fw.Heal(ctx)
}

// partitionLeaderMinority puts the leader in the minority: the majority
// must elect a new one while the partition lasts.
func (r *run) partitionLeaderMinority(ctx context.Context, rng *rand.Rand) error {
	l := r.leader(ctx, r.live())
	if l == nil {
		return fmt.Errorf("no leader")
	}
	var rest []*harness.Proc
	for _, p := range r.perm(rng) {
		if p != l {
			rest = append(rest, p)
		}
	}
	minor, major := []*harness.Proc{l, rest[0]}, rest[1:]
	r.event("fault", fmt.Sprintf("partition leader's side {%s} | {%s}", ids(minor), ids(major)))
	if err := r.cut(ctx, minor, major); err != nil {
		return err
	}
	took, err := r.awaitLeader(ctx, major, l.ID())
	if err != nil {
		_ = r.fw.Heal(ctx)
		return fmt.Errorf("majority side: %w", err)
	}
	r.event("elected", fmt.Sprintf("majority elected a leader after %.2fs", took.Seconds()))
	hold(ctx, rng)
	r.event("heal", "partition removed")
	return r.fw.Heal(ctx)
}

func (r *run) oneWay(ctx context.Context, rng *rand.Rand) error {
	ps := r.perm(rng)
	a, b := ps[0], ps[1]
	r.event("fault", fmt.Sprintf("one-way: %s hears nothing from %s", a.ID(), b.ID()))
	if err := r.fw.Drop(ctx, endpoint(b), endpoint(a)); err != nil {
		return err
	}
	hold(ctx, rng)
	r.event("heal", "one-way drop removed")
	return r.fw.Heal(ctx)
}

func (r *run) bridge(ctx context.Context, rng *rand.Rand) error {
	ps := r.perm(rng)
	left, br, right := ps[:2], ps[2], ps[3:]
	r.event("fault", fmt.Sprintf("bridge: {%s} | {%s}, only %s reaches both", ids(left), ids(right), br.ID()))
	if err := r.cut(ctx, left, right); err != nil {
		return err
	}
	hold(ctx, rng)
	r.event("heal", "bridge partition removed")
	return r.fw.Heal(ctx)
}

// drainBound bounds a drain (its node holds a few hundred small keys).
const drainBound = 60 * time.Second

// drain drains a random node under load: it copies its chunks to their
// other owners and leaves; then its process exits by itself, status 0. Every key it held must
// stay readable.
func (r *run) drain(ctx context.Context, rng *rand.Rand) error {
	p := r.procs[rng.IntN(nodes)]
	r.sweep(ctx) // know what p holds before it goes
	held := r.h.HeldBy(p.ID())
	r.event("fault", fmt.Sprintf("drain %s (holds %d acknowledged keys)", p.ID(), len(held)))
	dctx, cancel := context.WithTimeout(ctx, drainBound)
	last, err := r.cl.Drain(dctx, p.Addr("grpc"), false, nil)
	cancel()
	if err != nil {
		return fmt.Errorf("drain %s: %w (last progress %v)", p.ID(), err, last)
	}
	r.event("drained", fmt.Sprintf("%s: phase %s, %d keys, %d moved, left %v", p.ID(), last.Phase, last.Keys, last.KeysMoved, last.Left))
	if !last.Left {
		return fmt.Errorf("drain %s finished without leaving: %v", p.ID(), last)
	}
	r.gone[p.ID()] = true
	// A drained kvmeshd exits by itself, with status 0.
	select {
	case <-p.Exited():
		if err := p.ExitErr(); err != nil {
			r.finding("drain: %s: exited with %v, want status 0", p.ID(), err)
		}
	case <-time.After(30 * time.Second):
		r.finding("drain: %s still runs 30s after it left the cluster", p.ID())
		if err := p.Terminate(20 * time.Second); err != nil {
			r.finding("drain: %s: unclean exit after SIGTERM: %v", p.ID(), err)
		}
	}
	r.h.Restarted(p.ID())
	if d, ok := r.converge(ctx, r.live()); !ok {
		return fmt.Errorf("after draining %s: %s", p.ID(), d)
	}
	var lost []int
	for _, k := range r.readable(ctx, held) {
		lost = append(lost, k.Index)
	}
	if len(lost) > 0 {
		return fmt.Errorf("after draining %s, %d of the %d keys it held are unreadable: %v", p.ID(), len(lost), len(held), head(lost))
	}
	return nil
}
