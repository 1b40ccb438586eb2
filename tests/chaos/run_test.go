package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/tests/harness"
)

// main runs the whole schedule and the final checks.
func (r *run) main(ctx context.Context) {
	t := r.t
	r.obs = newObserver()
	defer r.obs.close()
	defer r.report()

	// n1..n4 bootstrap; n5 joins under load in the first scenario.
	var err error
	for i, h := range hosts() {
		id := fmt.Sprintf("n%d", i+1)
		args := []string{"-local-timing", "-dead-grace", "1h", "-dram", "64M", "-rpc-timeout", "2s"}
		if i == 0 {
			args = append(args, "-bootstrap-expect", "4")
		} else {
			args = append(args, "-bootstrap-expect", "4", "-join", r.procs[0].Addr("gossip"))
		}
		if i == nodes-1 {
			// Joins later: no bootstrap, join every member.
			args = []string{"-local-timing", "-dead-grace", "1h", "-dram", "64M", "-rpc-timeout", "2s", "-join", r.gossipSeeds()}
		}
		cg := ""
		if r.fw != nil {
			if cg, err = r.fw.Cgroup(id); err != nil {
				t.Fatal(err)
			}
		}
		p := harness.NewProc(harness.ProcConfig{Bin: r.bin, ID: id, Host: h, DataDir: filepath.Join(r.dir, id),
			LogPath: filepath.Join(r.dir, id+".log"), Args: args, Cgroup: cg})
		r.procs = append(r.procs, p)
		if i == nodes-1 {
			break
		}
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var seeds []string
	for _, p := range r.procs[:nodes-1] {
		seeds = append(seeds, p.Addr("grpc"))
	}
	cl, err := client.New(ctx, client.Config{Seeds: seeds, RPCTimeout: 2 * time.Second, Attempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r.cl = cl
	if d, ok := r.converge(ctx, r.procs[:nodes-1]); !ok {
		t.Fatalf("the first four nodes never agreed: %s", d)
	}
	info, err := cl.ClusterInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.rf, r.w = int(info.ReplicationFactor), int(info.WriteQuorum)
	fp, err := cl.RegisterModel(ctx, baseSpec())
	if err != nil {
		t.Fatal(err)
	}
	r.h.ModelAcked(fp.String())
	r.event("start", fmt.Sprintf("4 nodes up, R=%d W=%d, leader %s", r.rf, r.w, info.LeaderId))

	wl := r.startWorkload(2)
	defer wl.halt()
	time.Sleep(time.Second)

	sched := rand.New(rand.NewPCG(r.seed, 0xc4a05))
	r.scenario(ctx, "join", r.join)
	r.scenario(ctx, "rolling-restart", r.rollingRestart)
	base := r.sampleUsage(ctx)
	faults := []struct {
		name string
		fn   func(context.Context, *rand.Rand) error
		fw   bool
	}{
		{"kill-restart", r.killRestart, false},
		{"kill-leader", r.killLeader, false},
		{"stop-cont", r.stopCont, false},
		{"partition-minority", r.partitionMinority, true},
		{"partition-leader-minority", r.partitionLeaderMinority, true},
		{"one-way", r.oneWay, true},
		{"bridge", r.bridge, true},
	}
	sched.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	for _, f := range faults {
		if f.fw && r.fw == nil {
			r.skip(f.name, r.fwWhy)
			continue
		}
		r.scenario(ctx, f.name, func(ctx context.Context) error { return f.fn(ctx, sched) })
	}
	// Last: the drained node leaves for good, and the final check runs on
	// the four that remain. KVMESH_CHAOS_DRAIN=0 skips it (to bisect
	// another finding); the drain bug it once found (a leave that only
	// gossip carried, lost when the leader held the node failed) is fixed:
	// seeds 1795958201129857502 and 1795959904722858855 showed it.
	if os.Getenv("KVMESH_CHAOS_DRAIN") == "0" {
		r.skip("drain", "KVMESH_CHAOS_DRAIN=0")
	} else {
		r.scenario(ctx, "drain", func(ctx context.Context) error { return r.drain(ctx, sched) })
	}
	if r.inj == nil {
		r.skip("injection", r.injWhy)
	}

	wl.halt()
	r.final(ctx, base)
}

func (r *run) gossipSeeds() string {
	var s []string
	for _, p := range r.procs {
		if a := p.Addr("gossip"); a != "" {
			s = append(s, a)
		}
	}
	return strings.Join(s, ",")
}

func (r *run) skip(name, why string) {
	r.skipped = append(r.skipped, name)
	r.t.Run(name, func(t *testing.T) { t.Skipf("SKIP %s: %s", name, why) })
}

// scenario runs one fault (which heals itself before returning) and
// measures convergence.
func (r *run) scenario(ctx context.Context, name string, fn func(context.Context) error) {
	r.scenarios++
	r.event("scenario", name)
	if err := fn(ctx); err != nil {
		r.finding("%s: %v", name, err)
	}
	r.healAll(ctx)
	r.settle(ctx, name)
}

// settle waits for convergence after healing, records its time, and
// refreshes the holders of every key.
func (r *run) settle(ctx context.Context, name string) {
	start := time.Now()
	d, ok := r.converge(ctx, r.live())
	took := time.Since(start)
	if !ok {
		r.finding("%s: no convergence within %v after healing: %s", name, convergeBound, d)
		return
	}
	r.convergence = append(r.convergence, took)
	under := r.sweep(ctx)
	r.under = under
	r.event("converged", fmt.Sprintf("%s: %.2fs; %d keys below R replicas", name, took.Seconds(), under))
}

// healAll removes every partition and resumes or restarts every node.
func (r *run) healAll(ctx context.Context) {
	if r.fw != nil {
		if err := r.fw.Heal(ctx); err != nil {
			r.finding("heal: %v", err)
		}
	}
	for _, p := range r.procs {
		switch {
		case p.Incarnation() == 0 || r.gone[p.ID()]:
		case p.Stopped():
			_ = p.Signal(syscall.SIGCONT)
		case !p.Running():
			r.restart(ctx, p)
		}
	}
}

func (r *run) live() []*harness.Proc {
	var out []*harness.Proc
	for _, p := range r.procs {
		if p.Running() && !p.Stopped() {
			out = append(out, p)
		}
	}
	return out
}

func (r *run) restart(ctx context.Context, p *harness.Proc) {
	r.h.Restarted(p.ID())
	// A restart reuses the node's ports; another process may hold one
	// for a moment (a closing socket, a port-0 listener of another
	// suite), so try a few times before calling it a finding.
	var err error
	for try := 0; try < 3; try++ {
		if err = p.Start(ctx); err == nil {
			break
		}
		r.t.Logf("chaos: restart %s (try %d): %v", p.ID(), try+1, err)
		time.Sleep(time.Second)
	}
	if err != nil {
		r.finding("restart %s: %v", p.ID(), err)
		return
	}
	r.event("heal", "restarted "+p.ID())
}

// converge waits until every node of ps answers with the same metadata
// (epoch, leader, members, settings, models including every acknowledged
// one), and every acknowledged key that a surviving node holds reads back
// bit-exact through the client. It returns the last disagreement.
func (r *run) converge(ctx context.Context, ps []*harness.Proc) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, convergeBound)
	defer cancel()
	var pending []KeyCheck
	metaOK := false
	last := ""
	for {
		if !metaOK {
			views := make(map[string]string)
			models := make(map[string][]string)
			var errs []string
			for _, p := range ps {
				v, err := r.obs.view(ctx, p.Addr("grpc"))
				if err != nil {
					errs = append(errs, fmt.Sprintf("%s: %v", p.ID(), err))
					continue
				}
				if v.leader == "" || v.members != r.members() {
					errs = append(errs, fmt.Sprintf("%s: %s", p.ID(), v.summary))
					continue
				}
				views[p.ID()], models[p.ID()] = v.summary, v.models
			}
			if len(errs) == 0 {
				if d := AgreeViews(views, models, r.h.Models()); d != "" {
					errs = append(errs, d)
				}
			}
			if len(errs) == 0 {
				metaOK = true
				for _, k := range r.h.AckedKeys() {
					if k.Holders > 0 {
						pending = append(pending, k)
					}
				}
			} else {
				last = "metadata: " + strings.Join(errs, "; ")
			}
		}
		if metaOK {
			pending = r.readable(ctx, pending)
			if len(pending) == 0 {
				return "", true
			}
			last = fmt.Sprintf("%d acknowledged keys with surviving holders not readable (first: key %d)", len(pending), pending[0].Index)
		}
		select {
		case <-ctx.Done():
			return last, false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (r *run) members() int {
	n := 0
	for _, p := range r.procs {
		if p.Incarnation() > 0 && !r.gone[p.ID()] {
			n++
		}
	}
	return n
}

// readable reads keys through the client and returns those that did not
// read back bit-exact; a read of other bytes is recorded as wrong.
func (r *run) readable(ctx context.Context, keys []KeyCheck) []KeyCheck {
	var mu sync.Mutex
	var left []KeyCheck
	r.parallel(len(keys), func(j int) {
		k := keys[j]
		cctx, cancel := context.WithTimeout(ctx, opTimeout)
		got, err := r.cl.Get(cctx, k.Key)
		cancel()
		if err == nil && !slices.Equal(got, k.Blob) {
			r.h.Record(Op{Start: r.h.Since(), End: r.h.Since(), Worker: -1, Kind: "check-get", Key: k.Index, Wrong: true,
				Detail: fmt.Sprintf("read %d bytes, written %d", len(got), len(k.Blob))})
		}
		if err != nil || !slices.Equal(got, k.Blob) {
			mu.Lock()
			left = append(left, k)
			mu.Unlock()
		}
	})
	slices.SortFunc(left, func(a, b KeyCheck) int { return a.Index - b.Index })
	return left
}

// parallel runs fn(0..n-1) on 8 goroutines.
func (r *run) parallel(n int, fn func(int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				fn(j)
			}
		}()
	}
	for j := range n {
		next <- j
	}
	close(next)
	wg.Wait()
}

// sweep reads every attempted key directly from each of its replicas on
// the client's ring: a replica holding other bytes is a wrong read; one
// holding the written bytes becomes a holder. It returns how many
// acknowledged keys are on fewer than R replicas.
func (r *run) sweep(ctx context.Context) int {
	if err := r.cl.Refresh(ctx); err != nil {
		r.t.Logf("chaos: refresh before sweep: %v", err)
	}
	byID := make(map[string]*harness.Proc)
	for _, p := range r.procs {
		byID[p.ID()] = p
	}
	keys := r.h.AllKeys()
	acked := make(map[int]bool)
	for _, k := range r.h.AckedKeys() {
		acked[k.Index] = true
	}
	rg := r.cl.Ring()
	var under int
	var mu sync.Mutex
	r.parallel(len(keys), func(j int) {
		k := keys[j]
		have := 0
		for _, m := range rg.Replicas(k.Key.Content, r.rf) {
			p := byID[m.ID]
			if p == nil || !p.Running() || p.Stopped() {
				continue
			}
			gen := r.h.Generations()[m.ID]
			got, err := r.obs.direct(ctx, p.Addr("grpc"), k.Key)
			switch {
			case err != nil:
			case slices.Equal(got, k.Blob):
				have++
				r.h.Holds(k.Index, m.ID, gen)
			default:
				r.h.Record(Op{Start: r.h.Since(), End: r.h.Since(), Worker: -1, Kind: "check-direct", Key: k.Index, Wrong: true,
					Detail: fmt.Sprintf("replica %s holds %d bytes, written %d", m.ID, len(got), len(k.Blob))})
			}
		}
		if acked[k.Index] && have < r.rf {
			mu.Lock()
			under++
			mu.Unlock()
		}
	})
	return under
}

// sampleUsage reads goroutines and heap of every node, keyed by node and
// incarnation.
func (r *run) sampleUsage(ctx context.Context) map[string]usage {
	out := make(map[string]usage)
	for _, p := range r.live() {
		u, err := r.obs.usage(ctx, p.Addr("http"))
		if err != nil {
			r.t.Logf("chaos: usage of %s: %v", p.ID(), err)
			continue
		}
		out[fmt.Sprintf("%s#%d", p.ID(), p.Incarnation())] = u
	}
	return out
}
