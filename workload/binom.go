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

// DiffInterval is the 95% interval of Diff for paired outcomes: Tango's
// score interval, the differences d for which the score statistic of the
// discordant counts, (OnlyA - OnlyB - n d) / sqrt(n (2 q + d - d^2)) with q
// the constrained maximum-likelihood share of OnlyB, stays within +-1.96.
// Two ways that answer alike get a narrow interval, as they should; and
// unlike Wald's or Newcombe's intervals it does not collapse when no
// answer differs: with none of n prompts discordant it is about
// +-3.84/(n+3.84).
func (p Paired) DiffInterval() (lo, hi float64) {
	n := float64(p.N())
	if n == 0 {
		return -1, 1
	}
	b, c := float64(p.OnlyA), float64(p.OnlyB)
	score := func(d float64) float64 {
		A := 2 * n
		B := -b - c + (2*n-b+c)*d
		C := -c * d * (1 - d)
		q := (math.Sqrt(max(0, B*B-4*A*C)) - B) / (2 * A)
		num := b - c - n*d
		v := n * (2*q + d - d*d)
		if v <= 0 {
			return math.Copysign(math.Inf(1), num)
		}
		return num / math.Sqrt(v)
	}
	// score falls as d rises: bisect for score = +z below the estimate and
	// score = -z above it.
	solve := func(lo, hi, target float64) float64 {
		for range 100 {
			mid := (lo + hi) / 2
			if score(mid) > target {
				lo = mid
			} else {
				hi = mid
			}
		}
		return (lo + hi) / 2
	}
	d := p.Diff()
	const eps = 1e-12
	return solve(-1+eps, d, z95), solve(d, 1-eps, -z95)
}
