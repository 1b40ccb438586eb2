package engine

import "math"

// Fidelity accumulates how close next-token distributions are to a
// reference (full prefill): the quality measure for random-weight models.
type Fidelity struct {
	N        int     // prompts compared
	Top1     int     // prompts whose argmax agrees with the reference
	SumKL    float64 // sum of KL(reference || got) in nats
	MaxKL    float64
	MaxLogit float64 // largest |logit difference| seen
}

// Add compares got with ref.
func (f *Fidelity) Add(ref, got []float32) {
	kl := KL(ref, got)
	f.N++
	f.SumKL += kl
	f.MaxKL = math.Max(f.MaxKL, kl)
	if Argmax(ref) == Argmax(got) {
		f.Top1++
	}
	for i := range ref {
		f.MaxLogit = math.Max(f.MaxLogit, math.Abs(float64(ref[i])-float64(got[i])))
	}
}

// MeanKL is the average KL divergence.
func (f *Fidelity) MeanKL() float64 {
	if f.N == 0 {
		return 0
	}
	return f.SumKL / float64(f.N)
}

// Top1Rate is the fraction of prompts whose argmax agrees.
func (f *Fidelity) Top1Rate() float64 {
	if f.N == 0 {
		return 0
	}
	return float64(f.Top1) / float64(f.N)
}

// KL is KL(softmax(p) || softmax(q)) in nats, computed in float64.
func KL(p, q []float32) float64 {
	lp, lq := logSoftmax(p), logSoftmax(q)
	var kl float64
	for i := range lp {
		kl += math.Exp(lp[i]) * (lp[i] - lq[i])
	}
	return math.Max(kl, 0)
}

func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	ls := math.Log(s)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - mx - ls
	}
	return out
}
