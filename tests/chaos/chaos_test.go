// Package chaos is the chaos suite: five real
// kvmeshd processes on 127.0.0.11-15 under a client workload (puts, gets,
// lookups, model registrations, and injections into an engine cache in
// shared memory registered with each node: see inject_test.go), with faults
// from a seeded schedule (SIGKILL and restart, SIGSTOP/SIGCONT, iptables
// partitions, a rolling restart, a join, killing the raft leader, and last
// a drain, which KVMESH_CHAOS_DRAIN=0 skips) and a checker over the
// recorded history. KVMESH_CHAOS_SEED replays a schedule
// (the faults, victims and durations; the workload's interleaving with
// them depends on timing); KVMESH_CHAOS_KEEP=1 keeps the run folder even
// when the run passes; KVMESH_CHAOS_STRICT=1 also fails a run whose
// restarted nodes are not refilled to R replicas (see run.note).
//
// TestRestartChaos (restart_test.go) is the same idea at volume: a few
// hundred MB a node, faults paced only by readiness (rolling restart,
// back-to-back kill -9s, two-node failures), lost and wrong writes counted,
// times to ready and to full replication reported; `make soak` runs it
// larger.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// Bounds of a run. The whole test stays well under the 8 minutes the
// issue allows on 2 cores (3.5 to 5 minutes, build included, on 2 cores
// shared with other tests). runBound is a failure bound, not a speed
// target: it covers the kvmeshd build too, which takes from seconds (warm
// cache) to 2 minutes (cold, on busy cores), and stays under the 10
// minutes of `go test -timeout` (the Makefile's and the default) with room
// for the teardown.
const (
	nodes          = 5
	maxKeys        = 500   // puts stop after this many keys
	maxOps         = 12000 // the workload stops after this many operations
	maxModels      = 24    // model registrations
	opPause        = 15 * time.Millisecond
	opTimeout      = 5 * time.Second  // one client operation
	convergeBound  = 45 * time.Second // healing to agreement and readability
	refillBound    = 8 * time.Second  // rolling restart: waiting for a node to be refilled
	electionBound  = 20 * time.Second
	runBound       = 9 * time.Minute // build and run
	faultHold      = 3 * time.Second // how long a partition or stop lasts (plus up to 2 s)
	goroutineSlack = 200
	heapSlack      = 96 << 20
)

func hosts() []string {
	out := make([]string, nodes)
	for i := range out {
		out[i] = fmt.Sprintf("127.0.0.%d", 11+i)
	}
	return out
}

// seed returns KVMESH_CHAOS_SEED or a fresh one.
func seed(t *testing.T) uint64 {
	if s := os.Getenv("KVMESH_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KVMESH_CHAOS_SEED=%q: %v", s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: starts 5 kvmeshd processes for minutes")
	}
	if err := harness.Bindable(hosts()...); err != nil {
		t.Skipf("chaos: %v (loopback aliases 127.0.0.11-15 needed)", err)
	}
	sd := seed(t)
	t.Logf("chaos: seed %d (replay with KVMESH_CHAOS_SEED=%d)", sd, sd)

	ctx, cancel := context.WithTimeout(t.Context(), runBound)
	defer cancel()
	dir, err := os.MkdirTemp("", fmt.Sprintf("kvmesh-chaos-%d-", sd))
	if err != nil {
		t.Fatal(err)
	}
	bin, err := harness.Build(ctx, dir)
	if errors.Is(err, harness.ErrNoGo) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}

	r := &run{t: t, seed: sd, dir: dir, bin: bin, h: NewHistory(time.Now()), gone: make(map[string]bool)}
	// Firewall: pick a backend, sweep rules of dead runs, and heal on every
	// way out (cleanup, defer, SIGINT/SIGTERM).
	fw, err := harness.NewFirewall(ctx, strconv.FormatUint(sd, 36))
	if err != nil {
		r.fwWhy = err.Error()
		t.Logf("chaos: partitions will SKIP: %v", err)
	} else if err := probeCgroup(fw); err != nil {
		r.fwWhy = err.Error()
		t.Logf("chaos: partitions will SKIP: %v", err)
		_ = fw.Close(ctx)
	} else {
		r.fw = fw
		if n, err := fw.Sweep(ctx); err != nil {
			t.Logf("chaos: sweeping stale rules: %v", err)
		} else if n > 0 {
			t.Logf("chaos: removed %d stale %s* rules of dead runs", n, harness.TagPrefix)
		}
		t.Logf("chaos: iptables backend %s, rule tag %s", fw.Backend(), fw.Tag())
	}
	var once sync.Once
	teardown := func() {
		once.Do(func() {
			for _, p := range r.procs {
				p.Kill()
			}
			if r.fw != nil {
				if err := r.fw.Close(t.Context()); err != nil {
					t.Errorf("chaos: removing iptables rules and cgroups (tag %s): %v", r.fw.Tag(), err)
				}
			}
		})
	}
	t.Cleanup(teardown)
	defer teardown()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stopSig := make(chan struct{})
	var sigWG sync.WaitGroup
	sigWG.Add(1)
	go func() {
		defer sigWG.Done()
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "chaos: %v: removing iptables rules and nodes; logs and history kept in %s (seed %d)\n", s, dir, sd)
			teardown()
			if f, err := os.Create(filepath.Join(dir, "history.jsonl")); err == nil {
				_ = r.h.WriteJSON(f)
				f.Close()
			}
			os.Exit(1)
		case <-stopSig:
		}
	}()
	defer func() {
		signal.Stop(sigs)
		close(stopSig)
		sigWG.Wait()
	}()

	r.main(ctx)
}

// probeCgroup checks that a node can be started in a cgroup of fw.
func probeCgroup(fw *harness.Firewall) error {
	dir, err := fw.Cgroup("probe")
	if err != nil {
		return err
	}
	return harness.CanSpawnIn(dir)
}

// run is one chaos run.
type run struct {
	t     *testing.T
	seed  uint64
	dir   string
	bin   string
	h     *History
	fw    *harness.Firewall
	fwWhy string
	procs []*harness.Proc
	gone  map[string]bool // drained out of the cluster; not restarted
	cl    *client.Client
	obs   *observer

	inj    *injectRig // nil: injections skipped (injWhy says why)
	injWhy string

	findings    []string
	notes       []string
	under       int // acknowledged keys below R replicas at the end
	lost        []int
	unprotected int
	convergence []time.Duration
	scenarios   int
	skipped     []string
	w, rf       int
}

func (r *run) finding(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.findings = append(r.findings, msg)
	r.h.Record(Op{Start: r.h.Since(), End: r.h.Since(), Worker: -1, Kind: "finding", Key: -1, Detail: msg})
	r.t.Errorf("chaos finding: %s", msg)
}

// note records a weakness that kvmesh's promises allow (a replica that
// a restart emptied and nothing refilled): logged, kept in the summary,
// and a failure only with KVMESH_CHAOS_STRICT=1.
func (r *run) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("KVMESH_CHAOS_STRICT") != "" {
		r.finding("%s", msg)
		return
	}
	r.notes = append(r.notes, msg)
	r.h.Record(Op{Start: r.h.Since(), End: r.h.Since(), Worker: -1, Kind: "note", Key: -1, Detail: msg})
	r.t.Logf("chaos NOTE: %s", msg)
}

func (r *run) event(kind, detail string) {
	now := r.h.Since()
	r.h.Record(Op{Start: now, End: now, Worker: -1, Kind: kind, Key: -1, OK: true, Detail: detail})
	r.t.Logf("chaos %7.2fs %s: %s", now.Seconds(), kind, detail)
}
