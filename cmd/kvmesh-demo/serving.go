package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot/plotter"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/workload"
)

// Ways of serving under load.
const (
	srvPrompt = iota // prompt injection: full prefill
	srvLocal         // KV injection, facts on the engine's node, injected as stored (r=0)
	srvRemote        // KV injection, facts only on other nodes
	srvApprox        // KV injection of the local facts with recompute r
	numSrv
)

func srvName(cfg demoConfig, way int) string {
	switch way {
	case srvPrompt:
		return "prompt injection"
	case srvLocal:
		return "KV inject local"
	case srvRemote:
		return "KV inject remote"
	}
	return fmt.Sprintf("APPROX r=%.0f%%", 100*cfg.Recompute)
}

// servingLoad is what one serving measurement runs.
type servingLoad struct {
	Ks       []int
	Users    []int         // closed loop
	Rates    []float64     // open loop, requests/s (none: no open loop)
	Generate int           // tokens generated per request
	Warm     time.Duration // closed loop: before the count starts
	// MaxInjecting is the scheduler's bound on injections in flight.
	MaxInjecting int
	Duration     time.Duration
}

// servingResult is every way at every k and load level.
type servingResult struct {
	load    servingLoad
	workers int
	closed  map[[3]int]*workload.ServingPoint // (way, k, users)
	open    map[[3]int]*workload.ServingPoint // (way, k, rate index)
}

// measureServing serves the load through an engine.Scheduler on one
// engine (its own cache, sized for the most users at the largest k,
// registered with the local node), each way in turn: closed-loop users,
// then open-loop Poisson arrivals. Every request retrieves k facts (local
// or remote ones) and a fresh question, and generates load.Generate
// tokens.
func measureServing(ctx context.Context, cfg demoConfig, c *client.Client, local *node.Node, weights *engine.Weights, kvd chunk.DType,
	log *slog.Logger, facts [][]uint32, near, far []int, load servingLoad, stderr io.Writer) (*servingResult, error) {
	// Open-loop requests past what the cache holds queue in the scheduler.
	most := max(slices.Max(load.Users), 64)
	perReq := slices.Max(load.Ks)*cfg.FactTokens + cfg.QueryTokens + load.Generate + 32
	se, err := newServingEngine(ctx, c, local, weights, "kvmesh-demo", kvd, most*perReq+256, log)
	if err != nil {
		return nil, err
	}
	defer se.Close()
	res := &servingResult{load: load, workers: se.Workers(), closed: map[[3]int]*workload.ServingPoint{}, open: map[[3]int]*workload.ServingPoint{}}
	vocab := se.Config().VocabSize
	for _, k := range load.Ks {
		if k > len(near) || k > len(far) {
			return nil, fmt.Errorf("demo: k=%d exceeds the facts on one side (%d local, %d remote)", k, len(near), len(far))
		}
		for way := range numSrv {
			var inj engine.CacheInjector
			if way != srvPrompt {
				inj = se.inj
			}
			sched := engine.NewScheduler(se.Engine, engine.SchedulerConfig{Injector: inj, MaxInjecting: load.MaxInjecting})
			serve := func(ctx context.Context, user, n int) (workload.ServingSample, error) {
				r := rand.New(rand.NewPCG(cfg.Seed, uint64(way)<<48|uint64(k)<<32|uint64(user)<<16|uint64(n)))
				from := near
				if way == srvRemote {
					from = far
				}
				req := engine.Request{Segments: promptOf(facts, pick(r, from, k), randTokens(r, cfg.QueryTokens, vocab))}
				if way == srvApprox {
					req.Recompute = cfg.Recompute
				}
				got, err := sched.Serve(ctx, req, load.Generate)
				if err != nil {
					return workload.ServingSample{}, err
				}
				return workload.ServingSample{TTFT: got.TTFT, Total: got.Total, Generated: len(got.Generated)}, nil
			}
			for _, u := range load.Users {
				pt, err := workload.ClosedLoop(ctx, u, load.Warm, load.Duration, serve)
				if err != nil {
					sched.Close()
					return nil, err
				}
				res.closed[[3]int{way, k, u}] = &pt
				fmt.Fprintf(stderr, "serving k=%d %s: %d users %.1f req/s, TTFT p50 %v\n", k, srvName(cfg, way), u, pt.Throughput(), pt.TTFT(0.5).Round(10*time.Microsecond))
			}
			for ri, rate := range load.Rates {
				pt, err := workload.OpenLoop(ctx, rate, load.Duration, cfg.Seed, serve)
				if err != nil {
					sched.Close()
					return nil, err
				}
				res.open[[3]int{way, k, ri}] = &pt
				fmt.Fprintf(stderr, "serving k=%d %s: %.0f/s offered, %.1f req/s, TTFT p50 %v\n", k, srvName(cfg, way), rate, pt.Throughput(), pt.TTFT(0.5).Round(10*time.Microsecond))
			}
			sched.Close()
		}
	}
	return res, nil
}

// printServing writes the closed-loop table (and the open-loop one when
// measured): per k and load level, every way's requests/s, TTFT p50/p99,
// TPOT p50, and its throughput over prompt injection's.
func printServing(w io.Writer, cfg demoConfig, res *servingResult) {
	l := res.load
	fmt.Fprintf(w, "\nconcurrent serving (engine.Scheduler: continuous batching on %d workers; closed loop, the requests finished in %v once every user has an answer and %v passed; k facts retrieved, %d-token question, %d tokens generated):\n",
		res.workers, l.Duration, l.Warm, cfg.QueryTokens, l.Generate)
	table := func(label string, keys func(k int) [][3]int, level func(key [3]int) string, pts map[[3]int]*workload.ServingPoint) {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		hdr := "k\t" + label + "\t"
		for way := range numSrv {
			hdr += srvName(cfg, way) + " req/s\tTTFT p50\tp99\tTPOT\t"
			if way != srvPrompt {
				hdr += "ratio\t"
			}
		}
		fmt.Fprintln(tw, hdr)
		for _, k := range l.Ks {
			for _, key := range keys(k) {
				row := fmt.Sprintf("%d\t%s\t", k, level(key))
				base := pts[[3]int{srvPrompt, key[1], key[2]}]
				for way := range numSrv {
					pt := pts[[3]int{way, key[1], key[2]}]
					row += fmt.Sprintf("%.1f\t%s\t%s\t%s\t", pt.Throughput(), msOf(pt.TTFT(0.5)), msOf(pt.TTFT(0.99)), msOf(pt.TPOT(0.5)))
					if way != srvPrompt {
						if base.Throughput() > 0 {
							row += fmt.Sprintf("%.2fx\t", pt.Throughput()/base.Throughput())
						} else {
							row += "-\t"
						}
					}
				}
				fmt.Fprintln(tw, row)
			}
		}
		tw.Flush()
	}
	table("users", func(k int) [][3]int {
		var out [][3]int
		for _, u := range l.Users {
			out = append(out, [3]int{0, k, u})
		}
		return out
	}, func(key [3]int) string { return fmt.Sprint(key[2]) }, res.closed)
	if len(l.Rates) == 0 {
		return
	}
	fmt.Fprintf(w, "\nopen loop (Poisson arrivals at the offered rate for %v; req/s is what finished, over the time to the last answer):\n", l.Duration)
	table("offered/s", func(k int) [][3]int {
		var out [][3]int
		for ri := range l.Rates {
			out = append(out, [3]int{0, k, ri})
		}
		return out
	}, func(key [3]int) string { return fmt.Sprintf("%.0f", l.Rates[key[2]]) }, res.open)
}

// plotServing writes throughput against users and TTFT p50 against the
// offered rate, one line per way and k.
func plotServing(dir string, cfg demoConfig, res *servingResult) error {
	var thr, ttft []workload.PlotSeries
	for _, k := range res.load.Ks {
		for way := range numSrv {
			name := fmt.Sprintf("%s k=%d", srvName(cfg, way), k)
			var xy plotter.XYs
			for _, u := range res.load.Users {
				xy = append(xy, plotter.XY{X: float64(u), Y: res.closed[[3]int{way, k, u}].Throughput()})
			}
			thr = append(thr, workload.PlotSeries{Name: name, XY: xy})
			xy = nil
			for ri, rate := range res.load.Rates {
				xy = append(xy, plotter.XY{X: rate, Y: float64(res.open[[3]int{way, k, ri}].TTFT(0.5).Microseconds()) / 1000})
			}
			ttft = append(ttft, workload.PlotSeries{Name: name, XY: xy})
		}
	}
	if err := workload.SavePlot(dir, "serving_throughput.png", "kvmesh: throughput against concurrent users (closed loop)", "users", "requests/s", thr); err != nil {
		return err
	}
	if len(res.load.Rates) == 0 {
		return nil
	}
	return workload.SavePlot(dir, "serving_ttft_vs_rate.png", "kvmesh: TTFT p50 against offered rate (Poisson arrivals)", "offered requests/s", "TTFT p50 (ms)", ttft)
}
