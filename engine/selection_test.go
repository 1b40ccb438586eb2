package engine

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// Every selection recomputes ceil(r·n) approximate tokens, computes the
// token-layers that implies, and at r = 1 gives prefill's logits.
func TestRecomputeSelections(t *testing.T) {
	ctx := t.Context()
	c := tinyConfig()
	as := newApproxSetup(t, c, 6, 4, 8)
	e, L := as.e, c.NumLayers
	differ := 0
	for pi, segs := range as.prompts {
		ref := prefill(t, e, 0, segs)
		nq := len(segs[len(segs)-1].Tokens)
		napprox := ref.Tokens - nq - len(segs[0].Tokens)
		byDev := map[float64][]float32{}
		for _, sel := range []Selection{SelectDeviation, SelectAttention, SelectBoth} {
			for _, r := range []float64{0.3, 1} {
				resp, err := e.Run(ctx, as.standalone, Request{Segments: segs, Recompute: r, Select: sel})
				if err != nil {
					t.Fatal(err)
				}
				keep := int(math.Ceil(r * float64(napprox)))
				if want := nq*L + 2*napprox + keep*(L-2); resp.TokenLayers != want || resp.Recomputed != keep {
					t.Fatalf("prompt %d %v r=%v: %d token-layers, %d recomputed; want %d, %d", pi, sel, r, resp.TokenLayers, resp.Recomputed, want, keep)
				}
				if r == 1 {
					if d := maxAbsDiff(resp.Logits, ref.Logits); d != 0 {
						t.Fatalf("prompt %d %v r=1 differs from prefill by %g", pi, sel, d)
					}
				}
				if sel == SelectDeviation {
					byDev[r] = resp.Logits
				} else if r < 1 && maxAbsDiff(resp.Logits, byDev[r]) != 0 {
					differ++
				}
			}
		}
	}
	// The selections choose different tokens: on some prompt the answer's
	// logits differ from the deviation rule's.
	if differ == 0 {
		t.Fatal("attention and both selections gave the deviation rule's logits on every prompt")
	}
}

// selectTokens ranks by the selection's score and honours the fallback
// bound, on scores set by hand.
func TestSelectTokensRanks(t *testing.T) {
	e := newTestEngine(t, tinyConfig(), 5)
	const H = 1
	// Rows 0-5: two approximate chunks (groups 0 and 1, rows 0-2 and 3-5),
	// then a question row.
	dev := []float64{9, 1, 2, 1, 8, 1, 0}
	recv := []float64{0.1, 3, 0.2, 0.3, 0.1, 2, 0}
	knorm := []float64{100, 100, 100, 100, 100, 100, 100}
	approx := []bool{true, true, true, true, true, true, false}
	group := []int{0, 0, 0, 1, 1, 1, -1}
	for _, tc := range []struct {
		sel   Selection
		keep  int
		bound float64
		want  []int
	}{
		{SelectDeviation, 2, 0, []int{0, 4, 6}},
		{SelectAttention, 2, 0, []int{1, 5, 6}},
		// both: dev/9 + recv/3: row 1 1.11, row 0 1.03, row 5 0.78, row 4 0.92.
		{SelectBoth, 2, 0, []int{0, 1, 6}},
		// Chunk 0's deviation sqrt(12/300) = 0.2, chunk 1's sqrt(10/300) = 0.18:
		// a bound of 0.19 recomputes chunk 0 whole, then keep 1 of chunk 1.
		{SelectDeviation, 1, 0.19, []int{0, 1, 2, 4, 6}},
		{SelectAttention, 0, 0.1, []int{0, 1, 2, 3, 4, 5, 6}},
	} {
		t.Run(fmt.Sprintf("%v/keep=%d/bound=%v", tc.sel, tc.keep, tc.bound), func(t *testing.T) {
			sc := &e.sc
			sc.dev, sc.recv, sc.knorm = slices.Clone(dev), slices.Clone(recv), slices.Clone(knorm)
			sc.h = make([]float32, len(dev)*H)
			for r := range sc.h {
				sc.h[r] = float32(r)
			}
			active := []int{10, 11, 12, 13, 14, 15, 16}
			p := &fwdPlan{approx: approx, group: group, groups: 2, keep: tc.keep, sel: tc.sel, bound: tc.bound}
			var st fwdStats
			n := e.selectTokens(active, p, H, &st)
			var got []int
			for r := 0; r < n; r++ {
				got = append(got, active[r]-10)
				if int(sc.h[r]) != active[r]-10 {
					t.Fatalf("row %d holds the hidden state of row %v", r, sc.h[r])
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("kept rows %v, want %v", got, tc.want)
			}
			if st.selected != n-1 {
				t.Fatalf("selected %d, want %d", st.selected, n-1)
			}
			for j, d := range st.deviation {
				var num, den float64
				for r := range dev {
					if group[r] == j {
						num, den = num+dev[r], den+knorm[r]
					}
				}
				if want := math.Sqrt(num / den); math.Abs(d-want) > 1e-12 || st.fallback[j] != (tc.bound > 0 && d > tc.bound) {
					t.Fatalf("chunk %d: deviation %v fallback %v, want %v", j, d, st.fallback[j], want)
				}
			}
		})
	}
}

// attentionReceived is the question's softmax weights on each token,
// summed over heads: checked against a direct computation from the cache.
func TestAttentionReceived(t *testing.T) {
	ctx := t.Context()
	c := tinyConfig()
	as := newApproxSetup(t, c, 1, 3, 8)
	e := as.e
	segs := as.prompts[0]
	// A plain prefill leaves every layer's rotated keys in the cache; the
	// query rows are recomputed from it below.
	s, err := e.NewSequence(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	var all []uint32
	for _, sg := range segs {
		all = append(all, sg.Tokens...)
	}
	if _, err := s.Append(ctx, all); err != nil {
		t.Fatal(err)
	}
	n := len(all)
	nq := len(segs[len(segs)-1].Tokens)
	hd, heads := c.HeadDim, c.NumHeads
	// Random query rows for the question: what matters is that the weights
	// are the softmax over the keys the cache holds.
	q := make([]float32, nq*heads*hd)
	for i := range q {
		q[i] = float32(math.Sin(float64(i)))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	active := make([]int, n)
	approx := make([]bool, n)
	for i := range active {
		active[i] = i
		approx[i] = i >= len(segs[0].Tokens) && i < n-nq
	}
	e.sc.q = grow(e.sc.q, n*heads*hd)
	clear(e.sc.q)
	copy(e.sc.q[(n-nq)*heads*hd:], q)
	layer := e.cache[1].f
	e.attentionReceived(layer, active, approx, s.slots, n)
	want := make([]float64, n)
	for a := n - nq; a < n; a++ {
		for h := 0; h < heads; h++ {
			g := h / (heads / c.NumKVHeads)
			qa := e.sc.q[(a*heads+h)*hd : (a*heads+h+1)*hd]
			logit := make([]float64, a+1)
			for j := range logit {
				off := e.layout.Offset(0, s.slots[j], g) / 4
				for x := 0; x < hd; x++ {
					logit[j] += float64(qa[x]) * float64(layer[off+x])
				}
				logit[j] /= math.Sqrt(float64(hd))
			}
			var sum float64
			for _, l := range logit {
				sum += math.Exp(l)
			}
			for j, l := range logit {
				if approx[j] {
					want[j] += math.Exp(l) / sum
				}
			}
		}
	}
	for r := range want {
		if math.Abs(e.sc.recv[r]-want[r]) > 1e-9 {
			t.Fatalf("row %d: attention received %v, want %v", r, e.sc.recv[r], want[r])
		}
	}
	// The scores rank like the direct computation.
	byGot, byWant := rankRows(e.sc.recv[:n]), rankRows(want)
	if !slices.Equal(byGot, byWant) {
		t.Fatalf("ranking %v, want %v", byGot, byWant)
	}
}

func rankRows(s []float64) []int {
	r := make([]int, len(s))
	for i := range r {
		r[i] = i
	}
	sort.SliceStable(r, func(a, b int) bool { return s[r[a]] > s[r[b]] })
	return r
}

// The fallback bound: a bound below every chunk's deviation recomputes
// every approximate chunk (prefill's logits); one above all of them
// changes nothing but reports the deviations; one in between recomputes
// exactly the chunks above it.
func TestFallbackBound(t *testing.T) {
	ctx := t.Context()
	c := tinyConfig()
	as := newApproxSetup(t, c, 4, 4, 8)
	e, L := as.e, c.NumLayers
	for pi, segs := range as.prompts {
		ref := prefill(t, e, 0, segs)
		nq := len(segs[len(segs)-1].Tokens)
		napprox := ref.Tokens - nq - len(segs[0].Tokens)
		plain, err := e.Run(ctx, as.standalone, Request{Segments: segs, Recompute: 0.15})
		if err != nil {
			t.Fatal(err)
		}
		high, err := e.Run(ctx, as.standalone, Request{Segments: segs, Recompute: 0.15, FallbackBound: 1e9})
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(high.Logits, plain.Logits); d != 0 || high.Fallbacks != 0 || high.TokenLayers != plain.TokenLayers {
			t.Fatalf("prompt %d: a bound nothing exceeds changed the result (%g, %d fallbacks)", pi, d, high.Fallbacks)
		}
		var devs []float64
		for j, cr := range high.Chunks {
			if (cr.Match == chunk.MatchApproximate) != (cr.Deviation > 0) {
				t.Fatalf("prompt %d chunk %d (%v): deviation %v", pi, j, cr.Match, cr.Deviation)
			}
			if cr.Match == chunk.MatchApproximate {
				devs = append(devs, cr.Deviation)
			}
		}
		low, err := e.Run(ctx, as.standalone, Request{Segments: segs, FallbackBound: 1e-12})
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(low.Logits, ref.Logits); d != 0 || low.Fallbacks != len(devs) || low.Recomputed != napprox {
			t.Fatalf("prompt %d: every chunk above the bound: diff %g, %d fallbacks of %d, %d recomputed of %d", pi, d, low.Fallbacks, len(devs), low.Recomputed, napprox)
		}
		// Measuring alone (r = 0, nothing above the bound) computes the
		// approximate tokens up to the check layer and no further.
		meas, err := e.Run(ctx, as.standalone, Request{Segments: segs, FallbackBound: 1e9})
		if err != nil {
			t.Fatal(err)
		}
		if want := nq*L + 2*napprox; meas.TokenLayers != want || meas.Recomputed != 0 {
			t.Fatalf("prompt %d: measuring only: %d token-layers, want %d", pi, meas.TokenLayers, want)
		}
		slices.Sort(devs)
		bound := (devs[0] + devs[len(devs)-1]) / 2
		mid, err := e.Run(ctx, as.standalone, Request{Segments: segs, FallbackBound: bound})
		if err != nil {
			t.Fatal(err)
		}
		fell := 0
		for j, cr := range mid.Chunks {
			if cr.Fallback != (cr.Deviation > bound) {
				t.Fatalf("prompt %d chunk %d: deviation %v, bound %v, fallback %v", pi, j, cr.Deviation, bound, cr.Fallback)
			}
			if cr.Fallback {
				fell += len(segs[cr.Segment].Tokens)
			}
		}
		if mid.Recomputed != fell || mid.Fallbacks == 0 || mid.Fallbacks == len(devs) {
			t.Fatalf("prompt %d: bound between the deviations: %d fallbacks of %d, %d recomputed, want %d", pi, mid.Fallbacks, len(devs), mid.Recomputed, fell)
		}
	}
}

func TestRecomputeOptionsChecked(t *testing.T) {
	ctx := t.Context()
	as := newApproxSetup(t, tinyConfig(), 1, 2, 8)
	for _, req := range []Request{
		{Segments: as.prompts[0], FallbackBound: -1},
		{Segments: as.prompts[0], FallbackBound: math.NaN()},
		{Segments: as.prompts[0], Select: SelectBoth + 1},
	} {
		if _, err := as.e.Run(ctx, as.standalone, req); err == nil {
			t.Errorf("bound %v selection %v: no error", req.FallbackBound, req.Select)
		}
	}
	for s := SelectDeviation; s <= SelectBoth; s++ {
		if got, err := ParseSelection(s.String()); err != nil || got != s {
			t.Errorf("ParseSelection(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseSelection("random"); err == nil {
		t.Error("ParseSelection accepted an unknown name")
	}
}
