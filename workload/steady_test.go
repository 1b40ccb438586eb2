package workload

import (
	"slices"
	"testing"
	"time"
)

// The steady-state corpus is deterministic, every query names K distinct
// passages, popular passages come back often and in varying orders.
func TestSteadyCorpus(t *testing.T) {
	cfg := SteadyConfig{Passages: 50, MinTokens: 4, MaxTokens: 8, K: 4, Queries: 200, ColdAfter: 120, Seed: 5}
	a, b := NewSteadyCorpus(cfg, 256), NewSteadyCorpus(cfg, 256)
	if len(a.Streams[0]) != 200 || len(a.Streams[1]) != 80 {
		t.Fatalf("streams of %d and %d queries, want 200 and 80", len(a.Streams[0]), len(a.Streams[1]))
	}
	count := map[int]int{}
	orders := map[[4]int]bool{}
	for n := range a.Streams {
		for i, q := range a.Streams[n] {
			if !slices.Equal(q.Passages, b.Streams[n][i].Passages) {
				t.Fatalf("node %d query %d differs between two generations", n, i)
			}
			s := slices.Clone(q.Passages)
			slices.Sort(s)
			if len(slices.Compact(s)) != cfg.K {
				t.Fatalf("node %d query %d: passages %v not %d distinct", n, i, q.Passages, cfg.K)
			}
			orders[[4]int(q.Passages)] = true
			for _, p := range q.Passages {
				count[p]++
			}
		}
	}
	most := 0
	for _, c := range count {
		most = max(most, c)
	}
	if most < 280*4/10 { // rank 1 of Zipf(1) over 50 is about 22% of draws
		t.Errorf("most popular passage drawn %d times of %d", most, 280*4)
	}
	if len(orders) < 250 {
		t.Errorf("only %d distinct orders in 280 queries", len(orders))
	}
}

// Windows summarise queries: speedup from the sampled queries, hit shares
// over chunk lookups, bytes per query.
func TestSteadyWindows(t *testing.T) {
	run := &SteadyRun{}
	for i := range 4 {
		q := SteadyQuery{Index: i, TTFT: timeMS(10), CPU: timeMS(10), TokenLayers: 10, FullTokenLayers: 40, Exact: 1, Approx: 2, Miss: 1, Sent: 100, Stored: 50}
		if i%2 == 0 {
			q.Full, q.FullCPU, q.Top1 = timeMS(30), timeMS(40), i == 0
		}
		run.Queries[0] = append(run.Queries[0], q)
	}
	ws := run.Windows(0, 4)
	if len(ws) != 1 {
		t.Fatalf("%d windows, want 1", len(ws))
	}
	w := ws[0]
	want := SteadyWindow{From: 0, To: 4, Speedup: 3, CPUSpeedup: 4, WorkSpeedup: 4, FullP50: 30 * time.Millisecond, TTFTP50: 10 * time.Millisecond,
		Exact: 0.25, Approx: 0.5, Miss: 0.25, Top1: 0.5, Sent: 100, Stored: 50}
	if w != want {
		t.Fatalf("window %+v\nwant %+v", w, want)
	}
}
