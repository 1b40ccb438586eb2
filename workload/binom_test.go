package workload

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestWilson(t *testing.T) {
	// Newcombe (1998), "Two-sided confidence intervals for the single
	// proportion", worked examples.
	for _, tc := range []struct {
		k, n   int
		lo, hi float64
	}{
		{81, 263, 0.2553, 0.3662},
		{15, 148, 0.0624, 0.1605},
		{0, 20, 0, 0.1611},
		{1, 29, 0.0061, 0.1718},
	} {
		lo, hi := Wilson(tc.k, tc.n)
		if math.Abs(lo-tc.lo) > 5e-5 || math.Abs(hi-tc.hi) > 5e-5 {
			t.Errorf("Wilson(%d, %d) = [%.4f, %.4f], want [%.4f, %.4f]", tc.k, tc.n, lo, hi, tc.lo, tc.hi)
		}
	}
	if lo, hi := Wilson(0, 0); lo != 0 || hi != 1 {
		t.Errorf("Wilson(0, 0) = [%v, %v], want [0, 1]", lo, hi)
	}
}

func TestPairedDiffInterval(t *testing.T) {
	// Identical answers: an interval around 0 of half-width about
	// 3.84/(n+3.84), narrow for many prompts and not for few.
	lo, hi := Paired{Both: 300, Neither: 100}.DiffInterval()
	if want := z95 * z95 / (400 + z95*z95); math.Abs(hi-want) > 1e-4 || math.Abs(lo+want) > 1e-4 {
		t.Errorf("identical answers on 400 prompts: [%v, %v], want +-%v", lo, hi, want)
	}
	if lo, hi := (Paired{Both: 10, Neither: 3}).DiffInterval(); lo > -0.2 || hi < 0.2 {
		t.Errorf("identical answers on 13 prompts: [%v, %v] is too narrow to be honest", lo, hi)
	}
	// The same accuracies from independent-looking pairs: wide.
	lo2, hi2 := Paired{Both: 225, OnlyA: 75, OnlyB: 75, Neither: 25}.DiffInterval()
	if hi2-lo2 < 5*(hi-lo) {
		t.Errorf("discordant pairs [%v, %v] not wider than concordant ones [%v, %v]", lo2, hi2, lo, hi)
	}
	if lo, hi := (Paired{OnlyA: 40}).DiffInterval(); lo <= 0.8 || hi < 1-1e-9 {
		t.Errorf("the first way right on all 40, the second on none: [%v, %v]", lo, hi)
	}
	// Coverage: over many simulated samples (a fixed seed) the interval
	// holds the true difference about 95% of the time (score intervals
	// run a little under or over at small n).
	r := rand.New(rand.NewPCG(1, 2))
	for _, probs := range [][4]float64{{0.6, 0.15, 0.05, 0.2}, {0.85, 0.05, 0.05, 0.05}, {0.3, 0.02, 0.1, 0.58}} {
		truth := probs[1] - probs[2]
		covered := 0
		const trials = 2000
		for range trials {
			var p Paired
			for range 60 {
				switch u := r.Float64(); {
				case u < probs[0]:
					p.Both++
				case u < probs[0]+probs[1]:
					p.OnlyA++
				case u < probs[0]+probs[1]+probs[2]:
					p.OnlyB++
				default:
					p.Neither++
				}
			}
			if lo, hi := p.DiffInterval(); lo <= truth && truth <= hi {
				covered++
			}
		}
		if c := float64(covered) / trials; c < 0.92 || c > 0.995 {
			t.Errorf("%v: coverage %.3f of a 95%% interval", probs, c)
		}
	}
}
