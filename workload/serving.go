package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"gonum.org/v1/plot/plotter"
)

// ServingSample is one served request: its time to first token, its time
// to the last generated token and how many tokens it generated.
type ServingSample struct {
	TTFT, Total time.Duration
	Generated   int
}

// TPOT is the time per output token after the first.
func (s ServingSample) TPOT() time.Duration {
	if s.Generated < 2 {
		return 0
	}
	return (s.Total - s.TTFT) / time.Duration(s.Generated-1)
}

// ServeFunc serves request n of user (closed loop) or of the arrival
// process (open loop, user 0).
type ServeFunc func(ctx context.Context, user, n int) (ServingSample, error)

// ServingPoint is one load level: the requests finished within it and how
// long it ran.
type ServingPoint struct {
	Users   int     // closed loop: concurrent users
	Rate    float64 // open loop: offered requests per second
	Elapsed time.Duration
	Samples []ServingSample
}

// Throughput is finished requests per second.
func (p *ServingPoint) Throughput() float64 {
	return float64(len(p.Samples)) / max(p.Elapsed.Seconds(), 1e-9)
}

// TTFT is the q-quantile of the samples' TTFT.
func (p *ServingPoint) TTFT(q float64) time.Duration {
	return sampleQuantile(p.Samples, q, func(s ServingSample) time.Duration { return s.TTFT })
}

// TPOT is the q-quantile of the samples' time per output token.
func (p *ServingPoint) TPOT(q float64) time.Duration {
	return sampleQuantile(p.Samples, q, ServingSample.TPOT)
}

// sampleQuantile is quantile over f of every sample.
func sampleQuantile(ss []ServingSample, q float64, f func(ServingSample) time.Duration) time.Duration {
	d := make([]time.Duration, len(ss))
	for i, s := range ss {
		d[i] = f(s)
	}
	return Quantile(d, q)
}

// ClosedLoop runs users concurrent users, each sending its next request
// when the last is answered (the InferScale paper's load), the users'
// first requests spread over warm. The count starts once every user has
// had a request answered and at least warm has passed, and runs for d:
// the point is the requests that finish within it, over d. The first error
// stops every user.
func ClosedLoop(ctx context.Context, users int, warm, d time.Duration, serve ServeFunc) (ServingPoint, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type done struct {
		s  ServingSample
		at time.Time
	}
	var (
		mu      sync.Mutex
		samples []done
		ferr    error
		wg      sync.WaitGroup
		first   sync.WaitGroup // users without an answer yet
		stop    = make(chan struct{})
	)
	start := time.Now()
	first.Add(users)
	for u := range users {
		wg.Go(func() {
			// Users start spread over warm, so their requests do not
			// move in waves that a short count could miss.
			select {
			case <-time.After(warm * time.Duration(u) / time.Duration(users)):
			case <-ctx.Done():
			}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				s, err := serve(ctx, u, n)
				if n == 0 {
					first.Done()
				}
				mu.Lock()
				if err != nil {
					if ferr == nil && ctx.Err() == nil {
						ferr = fmt.Errorf("workload: user %d request %d: %w", u, n, err)
					}
					mu.Unlock()
					cancel()
					return
				}
				samples = append(samples, done{s, time.Now()})
				mu.Unlock()
			}
		})
	}
	// Every user's first answer (a failed user counts as answered: the
	// error ends the run), then warm, then d.
	first.Wait()
	from := time.Now()
	if w := start.Add(warm); w.After(from) {
		from = w
	}
	to := from.Add(d)
	t := time.NewTimer(time.Until(to))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	close(stop)
	wg.Wait()
	pt := ServingPoint{Users: users, Elapsed: d}
	for _, s := range samples {
		if !s.at.Before(from) && !s.at.After(to) {
			pt.Samples = append(pt.Samples, s.s)
		}
	}
	return pt, ferr
}

// OpenLoop sends requests for d with Poisson arrivals at rate per second
// (exponential gaps from seed, whatever the answers; the way llm-d and
// LMCache load a server) and waits for every one sent. Elapsed runs to
// the last answer, so a server past saturation shows its own rate.
func OpenLoop(ctx context.Context, rate float64, d time.Duration, seed uint64, serve ServeFunc) (ServingPoint, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := rand.New(rand.NewPCG(seed, uint64(rate*1000)))
	var (
		mu   sync.Mutex
		pt   = ServingPoint{Rate: rate}
		ferr error
		wg   sync.WaitGroup
	)
	start := time.Now()
	next := start
	timer := time.NewTimer(0)
	defer timer.Stop()
	for n := 0; ; n++ {
		next = next.Add(time.Duration(r.ExpFloat64() / rate * float64(time.Second)))
		if next.Sub(start) >= d {
			break
		}
		timer.Reset(time.Until(next))
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			s, err := serve(ctx, 0, n)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if ferr == nil && ctx.Err() == nil {
					ferr = fmt.Errorf("workload: request %d: %w", n, err)
				}
				cancel()
				return
			}
			pt.Samples = append(pt.Samples, s)
		})
	}
	wg.Wait()
	pt.Elapsed = time.Since(start)
	if ferr == nil {
		ferr = ctx.Err()
	}
	return pt, ferr
}

// PlotSeries is one named line of SavePlot.
type PlotSeries struct {
	Name string
	XY   plotter.XYs
}

// SavePlot writes a line plot of ss to dir/file (PNG).
func SavePlot(dir, file, title, x, y string, ss []PlotSeries) error {
	in := make([]plotSeries, len(ss))
	for i, s := range ss {
		in[i] = plotSeries{s.Name, s.XY}
	}
	return savePlot(dir, file, title, x, y, in)
}
