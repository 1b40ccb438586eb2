package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
)

// final heals everything, waits for convergence, and checks the history:
// lost and wrong reads, lookups, metadata, and growth of goroutines and
// heap against base.
func (r *run) final(ctx context.Context, base map[string]usage) {
	if ctx.Err() != nil {
		// Say so first: every check below then fails on the deadline
		// (reads "lost", nodes "not converged"), not on the cluster.
		r.finding("the run took longer than runBound (%v) before its final checks: the machine is far slower than the bounds assume; the findings below are the deadline's", runBound)
	}
	r.healAll(ctx)
	r.settle(ctx, "final")

	keys := r.h.AckedKeys()
	reads := make(map[int]ReadResult, len(keys))
	var mu sync.Mutex
	r.parallel(len(keys), func(j int) {
		cctx, cancel := context.WithTimeout(ctx, opTimeout)
		got, err := r.cl.Get(cctx, keys[j].Key)
		cancel()
		mu.Lock()
		reads[keys[j].Index] = ReadResult{Got: got, Err: err}
		mu.Unlock()
	})
	v := Check(keys, reads, r.w)
	for _, i := range v.Wrong {
		r.h.Record(Op{Start: r.h.Since(), End: r.h.Since(), Worker: -1, Kind: "final-get", Key: i, Wrong: true, Detail: "final read returned other bytes"})
	}
	r.lost = v.Lost
	if len(v.Lost) > 0 {
		r.finding("%d acknowledged keys lost although >= W=%d of their holders survived: %v (reads: %v)", len(v.Lost), r.w, head(v.Lost), reads[v.Lost[0]].Err)
	}
	r.unprotected = len(v.Unprotected)
	if len(v.Unprotected) > 0 {
		r.note("%d acknowledged keys unreadable at the end: fewer than W=%d of their holders survived (restarts emptied them before anything refilled them): %v",
			len(v.Unprotected), r.w, head(v.Unprotected))
	}
	if r.under > 0 {
		r.note("%d acknowledged keys below R=%d replicas after the final convergence", r.under, r.rf)
	}

	// Every readable key must be found EXACT by a lookup (in its own
	// context: a variant's is a window).
	var items []client.LookupItem
	var want []chunk.Key
	var readable []KeyCheck
	for _, k := range keys {
		if rr := reads[k.Index]; rr.Err == nil {
			items = append(items, client.LookupItem{Content: k.Key.Content, Want: k.Key.Context})
			want = append(want, k.Key)
			readable = append(readable, k)
		}
	}
	misses := 0
	for lo := 0; lo < len(items); lo += 64 {
		hi := min(lo+64, len(items))
		// A batch fans out to every replica; on a loaded machine one slow
		// answer can pass opTimeout, so a timeout is retried before it
		// counts. Wrong answers are never retried away.
		var res []client.LookupResult
		var err error
		for try := 0; try < 3; try++ {
			cctx, cancel := context.WithTimeout(ctx, opTimeout)
			res, err = r.cl.Lookup(cctx, baseSpec().Fingerprint(), items[lo:hi])
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
				break
			}
		}
		if err != nil {
			r.finding("final lookup: %v", err)
			break
		}
		for j, lr := range res {
			if lr.Match != chunk.MatchExact || lr.Key != want[lo+j] {
				misses++
			}
		}
	}
	if misses > 0 {
		r.finding("final lookups: %d readable keys not found EXACT", misses)
	}

	// Every readable key must be injected EXACT, bit-exact, on any node.
	if r.inj != nil {
		if n, d := r.finalInjections(ctx, readable); n > 0 {
			r.finding("final injections: %d chunks not answered as required (EXACT for a readable key, APPROXIMATE for its content in another context, MISS for content never written) after 3 tries: %s", n, d)
		}
	}

	// Growth: compare nodes still in the incarnation the baseline saw.
	end := r.sampleUsage(ctx)
	compared := 0
	for k, b := range base {
		e, ok := end[k]
		if !ok {
			continue
		}
		compared++
		if e.goroutines > 2*b.goroutines+goroutineSlack {
			r.finding("%s: goroutines grew from %.0f to %.0f", k, b.goroutines, e.goroutines)
		}
		if e.heapInuse > 2*b.heapInuse+heapSlack {
			r.finding("%s: heap in use grew from %.1f to %.1f MiB", k, b.heapInuse/(1<<20), e.heapInuse/(1<<20))
		}
		r.t.Logf("chaos: %s goroutines %.0f -> %.0f, heap in use %.1f -> %.1f MiB, rss %.1f -> %.1f MiB", k,
			b.goroutines, e.goroutines, b.heapInuse/(1<<20), e.heapInuse/(1<<20), b.rss/(1<<20), e.rss/(1<<20))
	}
	if compared == 0 {
		r.t.Logf("chaos: growth not measured: every node restarted after the baseline")
	}
}

func head(xs []int) []int {
	if len(xs) > 10 {
		return xs[:10]
	}
	return xs
}

// report prints the summary line and keeps or removes the run folder.
func (r *run) report() {
	for _, p := range r.procs {
		p.Kill()
	}
	c := r.h.Counts()
	p50, pmax := Percentiles(r.convergence)
	in := c.Inject
	line := fmt.Sprintf("chaos: seed=%d scenarios=%d skipped=%d faults=%d ops=%d acked=%d lost=%d wrong=%d unprotected=%d under-replicated=%d failed-ops=%d "+
		"injections=%d exact=%d approx=%d miss=%d approx-over-exact=%d inject-wrong=%d convergence p50=%.2fs max=%.2fs",
		r.seed, r.scenarios, len(r.skipped), c.Faults, c.Ops, c.Acked, len(r.lost), c.Wrong, r.unprotected, r.under, c.Unavailable,
		in.Injections, in.Exact, in.Approx, in.Miss, in.ApproxOverExact, in.Wrong, p50.Seconds(), pmax.Seconds())
	if c.Wrong > 0 {
		r.t.Errorf("chaos: %d reads returned bytes other than written (see history)", c.Wrong)
	}
	r.t.Log(line)
	if r.t.Failed() || os.Getenv("KVMESH_CHAOS_KEEP") != "" {
		summary := line + "\n"
		if len(r.findings) > 0 {
			summary += "findings:\n  " + strings.Join(r.findings, "\n  ") + "\n"
		}
		if len(r.notes) > 0 {
			summary += "notes:\n  " + strings.Join(r.notes, "\n  ") + "\n"
		}
		_ = os.WriteFile(filepath.Join(r.dir, "summary.txt"), []byte(summary), 0o644)
		if f, err := os.Create(filepath.Join(r.dir, "history.jsonl")); err == nil {
			_ = r.h.WriteJSON(f)
			f.Close()
		}
		r.t.Logf("chaos: logs (nX.log), data dirs and history.jsonl kept in %s; replay with KVMESH_CHAOS_SEED=%d", r.dir, r.seed)
		return
	}
	// Give the killed processes' files a moment to close.
	time.Sleep(50 * time.Millisecond)
	_ = os.RemoveAll(r.dir)
}
