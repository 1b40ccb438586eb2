package workload

import (
	"fmt"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlots writes the report's PNGs into dir and records their names in
// r.Plots: TTFT against k per way (RAG), hit rate per turn and TTFT per
// turn (chat), TTFT against k (memory facts).
func (r *Report) WritePlots(dir string) error {
	type series = plotSeries
	save := func(file, title, x, y string, ss []series) error {
		if err := savePlot(dir, file, title, x, y, ss); err != nil {
			return err
		}
		r.Plots = append(r.Plots, file)
		return nil
	}
	ms := func(s *Stats) float64 { return float64(s.P(0.5).Microseconds()) / 1000 }
	if rag := r.RAG; rag != nil && len(rag.Points) > 0 {
		var ss []series
		for w := Way(0); w < numWays; w++ {
			s := series{name: w.String()}
			for _, pt := range rag.Points {
				s.xy = append(s.xy, plotter.XY{X: float64(pt.K), Y: ms(&pt.Ways[w])})
			}
			ss = append(ss, s)
		}
		if err := save("rag_ttft_vs_k.png", "RAG: TTFT p50 against passages per request", "k (passages)", "TTFT p50 (ms)", ss); err != nil {
			return err
		}
		// CPU time is the work, whatever else shares the machine.
		var cs []series
		for w := Way(0); w < numWays; w++ {
			s := series{name: w.String()}
			for _, pt := range rag.Points {
				s.xy = append(s.xy, plotter.XY{X: float64(pt.K), Y: float64(pt.Ways[w].CPUP(0.5).Microseconds()) / 1000})
			}
			cs = append(cs, s)
		}
		if err := save("rag_cpu_vs_k.png", "RAG: CPU time p50 per request against passages per request", "k (passages)", "CPU p50 (ms)", cs); err != nil {
			return err
		}
	}
	if ch := r.Chat; ch != nil && len(ch.Turns) > 0 {
		hit := []series{{name: "kvmesh chunk reuse"}, {name: "prefix caching"}}
		var ttft []series
		for w := Way(0); w < numWays; w++ {
			ttft = append(ttft, series{name: w.String()})
		}
		for t := range ch.Turns {
			x := float64(t + 1)
			hit[0].xy = append(hit[0].xy, plotter.XY{X: x, Y: 100 * ch.Turns[t][Chunk].HitRate()})
			hit[1].xy = append(hit[1].xy, plotter.XY{X: x, Y: 100 * ch.Turns[t][Prefix].HitRate()})
			for w := Way(0); w < numWays; w++ {
				ttft[w].xy = append(ttft[w].xy, plotter.XY{X: x, Y: ms(&ch.Turns[t][w])})
			}
		}
		if err := save("chat_hit_rate.png", "Chat: share of prompt tokens served from the store", "turn", "hit rate (%)", hit); err != nil {
			return err
		}
		if err := save("chat_ttft.png", "Chat: TTFT p50 per turn", "turn", "TTFT p50 (ms)", ttft); err != nil {
			return err
		}
	}
	if mem := r.Memory; mem != nil && len(mem.Points) > 0 {
		var ss []series
		for _, w := range mem.Config.Windows {
			pre := series{name: fmt.Sprintf("prompt injection (w=%d)", w)}
			inj := series{name: fmt.Sprintf("KV injection (w=%d)", w)}
			for _, pt := range mem.Points {
				if pt.Window == w {
					pre.xy = append(pre.xy, plotter.XY{X: float64(pt.K), Y: ms(&pt.Prefill)})
					inj.xy = append(inj.xy, plotter.XY{X: float64(pt.K), Y: ms(&pt.Inject)})
				}
			}
			ss = append(ss, pre, inj)
		}
		if err := save("memory_ttft_vs_k.png", "Memory facts: TTFT p50 against k", "k (facts)", "TTFT p50 (ms)", ss); err != nil {
			return err
		}
	}
	return nil
}

// plotSeries is one named line of a plot.
type plotSeries struct {
	name string
	xy   plotter.XYs
}

// savePlot writes a line plot of ss to dir/file (PNG).
func savePlot(dir, file, title, x, y string, ss []plotSeries) error {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Y.Min = 0
	var args []any
	for _, s := range ss {
		args = append(args, s.name, s.xy)
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	p.Legend.Top, p.Legend.Left = true, true
	if err := p.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, file)); err != nil {
		return fmt.Errorf("workload: plot %s: %w", file, err)
	}
	return nil
}
