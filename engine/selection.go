package engine

import (
	"fmt"
	"math"
	"sort"
)

// Selection is how deviation-guided recomputation ranks the APPROXIMATE
// tokens at the check layer; the r fraction of highest score is recomputed
// in the layers after it.
type Selection int

const (
	// SelectDeviation ranks tokens by how far their fresh keys at the check
	// layer are from the injected ones (CacheBlend's rule): the tokens whose
	// context changed most.
	SelectDeviation Selection = iota
	// SelectAttention ranks tokens by the attention they receive from the
	// question at the check layer: the softmax weight on the token, summed
	// over every query head of every computed token after the last
	// APPROXIMATE one (the question, in a prompt that ends with one). It
	// recomputes the tokens the answer reads, whatever their deviation.
	SelectAttention
	// SelectBoth ranks by the sum of the two scores, each divided by its
	// largest value among the candidates.
	SelectBoth
)

func (s Selection) String() string {
	switch s {
	case SelectDeviation:
		return "deviation"
	case SelectAttention:
		return "attention"
	case SelectBoth:
		return "both"
	}
	return fmt.Sprintf("selection(%d)", int(s))
}

func (s Selection) valid() bool { return s >= SelectDeviation && s <= SelectBoth }

// ParseSelection is the inverse of Selection.String.
func ParseSelection(name string) (Selection, error) {
	for s := SelectDeviation; s <= SelectBoth; s++ {
		if s.String() == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("engine: unknown selection %q (deviation, attention or both)", name)
}

// checkLayer does the check layer's measurements for the rows of the
// active tokens, once their fresh keys are computed (rotated, in sc.k) and
// before they are scattered over the injected ones in layer: each row's key
// deviation (sc.dev) and fresh key norm (sc.knorm).
func (e *Engine) checkLayer(layer []float32, n int) {
	c := &e.cfg
	hd := c.HeadDim
	sc := &e.sc
	sc.dev = grow(sc.dev, n)
	sc.knorm = grow(sc.knorm, n)
	for r := 0; r < n; r++ {
		var d, k2 float64
		for h := 0; h < c.NumKVHeads; h++ {
			off := e.layout.Offset(0, sc.slots[r], h) / 4
			old := layer[off : off+hd]
			fresh := sc.k[(r*c.NumKVHeads+h)*hd : (r*c.NumKVHeads+h+1)*hd]
			for j, v := range fresh {
				x := float64(v - old[j])
				d += x * x
				k2 += float64(v) * float64(v)
			}
		}
		sc.dev[r], sc.knorm[r] = d, k2
	}
}

// attentionReceived fills sc.recv[r], for every active row r, with the
// attention the question rows (active, not approximate, after the last
// approximate row) pay to row r's token at this layer: softmax weights
// summed over their query heads. It runs after the layer's fresh keys are
// in the cache, in float64, outside the batched kernels: the question is a
// few tokens.
func (e *Engine) attentionReceived(layer []float32, active []int, approx []bool, slots []int, n int) {
	c := &e.cfg
	hd := c.HeadDim
	sc := &e.sc
	sc.recv = grow(sc.recv, n)
	clear(sc.recv)
	lastApprox := -1
	for r := 0; r < n; r++ {
		if approx[r] {
			lastApprox = r
		}
	}
	// rowOf maps a token index to its active row, for the tokens scored.
	rowOf := make(map[int]int, n)
	for r := 0; r < n; r++ {
		if approx[r] {
			rowOf[active[r]] = r
		}
	}
	group := c.NumHeads / c.NumKVHeads
	scale := 1 / math.Sqrt(float64(hd))
	var w []float64
	for a := lastApprox + 1; a < n; a++ {
		if approx[a] {
			continue
		}
		i := active[a]
		w = grow(w, i+1)
		for h := 0; h < c.NumHeads; h++ {
			g := h / group
			q := e.sc.q[(a*c.NumHeads+h)*hd : (a*c.NumHeads+h+1)*hd]
			mx := math.Inf(-1)
			for j := 0; j <= i; j++ {
				off := e.layout.Offset(0, slots[j], g) / 4
				k := layer[off : off+hd]
				var d float64
				for x, v := range q {
					d += float64(v) * float64(k[x])
				}
				w[j] = d * scale
				mx = max(mx, w[j])
			}
			var sum float64
			for j := 0; j <= i; j++ {
				w[j] = math.Exp(w[j] - mx)
				sum += w[j]
			}
			for j := 0; j <= i; j++ {
				if r, ok := rowOf[j]; ok {
					sc.recv[r] += w[j] / sum
				}
			}
		}
	}
}

// selectTokens keeps every non-approximate active row, every row of a
// chunk whose relative deviation exceeds p.bound (when set), and the
// p.keep other approximate rows of highest score under p.sel, compacting
// the active indices and hidden rows in order. It returns the new row
// count and fills st's selection counts and per-chunk deviations.
func (e *Engine) selectTokens(active []int, p *fwdPlan, H int, st *fwdStats) int {
	sc := &e.sc
	approx := p.approx
	// Per chunk: relative key deviation over its rows.
	if p.groups > 0 {
		dev, norm := make([]float64, p.groups), make([]float64, p.groups)
		for r := range active {
			if approx[r] && p.group[r] >= 0 {
				dev[p.group[r]] += sc.dev[r]
				norm[p.group[r]] += sc.knorm[r]
			}
		}
		st.deviation, st.fallback = make([]float64, p.groups), make([]bool, p.groups)
		for j := range dev {
			if norm[j] > 0 {
				st.deviation[j] = math.Sqrt(dev[j] / norm[j])
			}
			st.fallback[j] = p.bound > 0 && st.deviation[j] > p.bound
		}
	}
	chosen := make([]bool, len(active))
	var cand []int
	for r := range active {
		switch {
		case !approx[r]:
			chosen[r] = true
		case p.group[r] >= 0 && st.fallback[p.group[r]]:
			chosen[r] = true
			st.selected++
		default:
			cand = append(cand, r)
		}
	}
	score := e.scores(cand, p.sel)
	sort.SliceStable(cand, func(a, b int) bool { return score[cand[a]] > score[cand[b]] })
	for _, r := range cand[:min(p.keep, len(cand))] {
		chosen[r] = true
		st.selected++
	}
	n := 0
	for r, i := range active {
		if !chosen[r] {
			continue
		}
		active[n] = i
		if n != r {
			copy(sc.h[n*H:(n+1)*H], sc.h[r*H:(r+1)*H])
		}
		n++
	}
	return n
}

// scores is each row's ranking score under sel (indexed by row; only the
// candidates' entries are meaningful).
func (e *Engine) scores(cand []int, sel Selection) []float64 {
	sc := &e.sc
	switch sel {
	case SelectAttention:
		return sc.recv
	case SelectBoth:
		var md, ma float64
		for _, r := range cand {
			md, ma = max(md, sc.dev[r]), max(ma, sc.recv[r])
		}
		out := make([]float64, len(sc.dev))
		for _, r := range cand {
			if md > 0 {
				out[r] += sc.dev[r] / md
			}
			if ma > 0 {
				out[r] += sc.recv[r] / ma
			}
		}
		return out
	}
	return sc.dev
}
