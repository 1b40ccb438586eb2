package workload

import "math"

// z95 is the standard normal quantile of a two-sided 95% interval.
const z95 = 1.959963984540054

// Wilson is the Wilson score interval (95%) of a proportion of k successes
// in n trials: unlike the normal approximation it stays inside [0, 1] and
// does not collapse to a point at 0 or n successes. With no trials it is
// [0, 1].
func Wilson(k, n int) (lo, hi float64) {
	if n <= 0 {
		return 0, 1
	}
	p, nn, z2 := float64(k)/float64(n), float64(n), z95*z95
	den := 1 + z2/nn
	mid := (p + z2/(2*nn)) / den
	half := z95 * math.Sqrt(p*(1-p)/nn+z2/(4*nn*nn)) / den
	return max(0, mid-half), min(1, mid+half)
}

// Paired counts two ways' outcomes on the same prompts: Both right, only
// the first (OnlyA), only the second (OnlyB), neither.
type Paired struct{ Both, OnlyA, OnlyB, Neither int }

// N is the number of prompts.
func (p Paired) N() int { return p.Both + p.OnlyA + p.OnlyB + p.Neither }

// Diff is the first way's accuracy minus the second's.
func (p Paired) Diff() float64 {
	if p.N() == 0 {
		return 0
	}
	return float64(p.OnlyA-p.OnlyB) / float64(p.N())
}

// DiffInterval is the 95% interval of Diff for paired outcomes (Newcombe's
// method 10: the Wilson intervals of both accuracies, combined with the
// correlation of the pairs). Two ways that answer alike on most prompts get
// a narrow interval, as they should; two independent samples would not.
func (p Paired) DiffInterval() (lo, hi float64) {
	n := p.N()
	if n == 0 {
		return -1, 1
	}
	a, b, c, d := float64(p.Both), float64(p.OnlyA), float64(p.OnlyB), float64(p.Neither)
	ka, kb := p.Both+p.OnlyA, p.Both+p.OnlyB
	p1, p2 := float64(ka)/float64(n), float64(kb)/float64(n)
	l1, u1 := Wilson(ka, n)
	l2, u2 := Wilson(kb, n)
	var phi float64
	if den := (a + b) * (c + d) * (a + c) * (b + d); den > 0 {
		phi = (a*d - b*c) / math.Sqrt(den)
	}
	dl := (p1-l1)*(p1-l1) - 2*phi*(p1-l1)*(u2-p2) + (u2-p2)*(u2-p2)
	du := (u1-p1)*(u1-p1) - 2*phi*(u1-p1)*(p2-l2) + (p2-l2)*(p2-l2)
	D := p1 - p2
	return max(-1, D-math.Sqrt(max(0, dl))), min(1, D+math.Sqrt(max(0, du)))
}
