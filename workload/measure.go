package workload

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// Way names a way of serving a prompt.
type Way int

// The ways compared.
const (
	Full   Way = iota // full prefill: no store
	Prefix            // prefix caching: leading EXACT chunks only
	Chunk             // kvmesh: EXACT, else APPROXIMATE with recompute
	numWays
)

func (w Way) String() string {
	switch w {
	case Full:
		return "full prefill"
	case Prefix:
		return "prefix caching"
	case Chunk:
		return "kvmesh chunk reuse"
	}
	return fmt.Sprintf("way(%d)", int(w))
}

// Stats accumulates one way's measurements over requests.
type Stats struct {
	TTFT []time.Duration // wall time of each request, lookup to logits
	CPU  []time.Duration // process CPU time of each request
	// Prompt is the total prompt tokens; Prefilled the tokens computed in
	// every layer (prompt minus injected); Recomputed the injected tokens
	// recomputed after the check layer; TokenLayers the (token, layer)
	// pairs computed.
	Prompt, Prefilled, Recomputed, TokenLayers int
	// Hit kinds over chunk segments.
	Exact, Approx, Miss int
	// Injected is the prompt tokens whose KV came from the store.
	Injected int
	Fid      engine.Fidelity
}

// N is the number of requests measured.
func (s *Stats) N() int { return len(s.TTFT) }

// P returns the q-quantile (nearest rank) of TTFT.
func (s *Stats) P(q float64) time.Duration { return Quantile(s.TTFT, q) }

// CPUP returns the q-quantile of CPU time.
func (s *Stats) CPUP(q float64) time.Duration { return Quantile(s.CPU, q) }

// HitRate is the fraction of prompt tokens served from the store.
func (s *Stats) HitRate() float64 {
	if s.Prompt == 0 {
		return 0
	}
	return float64(s.Injected) / float64(s.Prompt)
}

// ChunkHitRate is the fraction of chunk segments found (EXACT or
// APPROXIMATE).
func (s *Stats) ChunkHitRate() float64 {
	n := s.Exact + s.Approx + s.Miss
	if n == 0 {
		return 0
	}
	return float64(s.Exact+s.Approx) / float64(n)
}

// PrefilledPerRequest is the mean number of tokens computed per request.
func (s *Stats) PrefilledPerRequest() float64 {
	if s.N() == 0 {
		return 0
	}
	return float64(s.Prefilled) / float64(s.N())
}

// Quantile is the q-quantile of d by nearest rank: the smallest value with
// at least a q fraction of d at or below it (the median of an even count
// is the lower middle value); 0 for no values. d is not changed. It is the
// one quantile of every benchmark and of the demo, so their p50 and p99
// figures follow one rule.
func Quantile[T cmp.Ordered](d []T, q float64) T {
	if len(d) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// serve runs one request on e from src (nil: full prefill), records it in
// st and returns the response; ref, when set, is the full prefill's logits
// the response is compared with.
func serve(ctx context.Context, e *engine.Engine, src engine.ChunkSource, req engine.Request, st *Stats, ref []float32) (*engine.Response, error) {
	c0, t0 := processCPU(), time.Now()
	resp, err := e.Run(ctx, src, req)
	d, c := time.Since(t0), processCPU()-c0
	if err != nil {
		return nil, err
	}
	st.TTFT = append(st.TTFT, d)
	st.CPU = append(st.CPU, c)
	st.Prompt += resp.Tokens
	st.Injected += resp.Injected
	st.Prefilled += resp.Tokens - resp.Injected
	st.Recomputed += resp.Recomputed
	st.TokenLayers += resp.TokenLayers
	for _, cr := range resp.Chunks {
		switch cr.Match {
		case chunk.MatchExact:
			st.Exact++
		case chunk.MatchApproximate:
			st.Approx++
		default:
			st.Miss++
		}
	}
	if src == nil {
		// Without a store every chunk is prefilled.
		for _, sg := range req.Segments {
			if sg.Chunk {
				st.Miss++
			}
		}
	}
	if ref != nil {
		st.Fid.Add(ref, resp.Logits)
	} else {
		st.Fid.Add(resp.Logits, resp.Logits)
	}
	return resp, nil
}

// writeBack stores what a serving engine holds after prefilling segs: every
// chunk segment keyed by its true prefix (EXACT for any later prompt that
// starts the same way).
func writeBack(ctx context.Context, e *engine.Engine, store engine.ChunkSink, segs []engine.Segment) error {
	ents, err := e.EncodePrompt(ctx, segs)
	if err != nil {
		return err
	}
	for _, ent := range ents {
		if ent == nil {
			continue
		}
		if err := store.Put(ctx, ent); err != nil {
			return err
		}
	}
	return nil
}
