package engine

import (
	"context"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// fwdPlan says which tokens of a sequence one forward pass computes.
type fwdPlan struct {
	// active are the token indices computed in layer 0, ascending. Tokens
	// not listed must already have KV in the cache (injected or computed
	// earlier). The sequence's last token must be active.
	active []int
	// approx[i], when approx is non-nil, marks active[i] as an APPROXIMATE
	// token eligible for deviation-guided recomputation: it is computed for
	// layers 0..check, and after that only if selected.
	approx []bool
	// check is the check layer; keep is the number of approximate tokens to
	// keep recomputing after it (the top scores under sel).
	check, keep int
	sel         Selection
	// group[i] is the chunk (index in Response.Chunks) of active[i], or -1;
	// groups is the number of chunks. bound, when > 0, recomputes whole
	// every chunk whose relative key deviation at the check layer exceeds it.
	group  []int
	groups int
	bound  float64
	// capture, if non-nil, receives the pre-RoPE K and V of tokens
	// [capLo, capHi) in float32, canonical layout
	// [layer][K|V][token][kv_head][head_dim]. Those tokens must be active.
	capture      []float32
	capLo, capHi int
	// logits, if non-nil, receives the last token's logits.
	logits []float32
	// wait, if not nil, is called before layer l first reads or writes
	// the cache (after its projections): it returns once the injected KV of
	// layer l is in place, or an error that ends the pass.
	wait func(layer int) error
}

// fwdStats counts the work of one forward pass.
type fwdStats struct {
	tokenLayers int // sum over layers of the tokens computed there
	selected    int // approximate tokens kept after the check layer
	// deviation and fallback, per chunk of the plan's groups: relative key
	// deviation at the check layer, and whether the bound recomputed it.
	deviation []float64
	fallback  []bool
}

// scratch holds the forward pass's buffers, grown as needed and reused, so
// steady-state decoding does not allocate.
type scratch struct {
	idx          []int
	slots        []int
	h, x, o      []float32
	q, k, v, att []float32
	g, u         []float32
	dev, knorm   []float64
	recv         []float64
	order        []int
	scores       [][]float32
	offK, offV   []int32
	rowSeq       []int
	seqs         []attnSeq
	last         []float32 // the last rows' logits of a batch, [seqs][vocab]
	mm           matmulTask
	attn         attnTask
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, n+n/4)
	}
	return s[:n]
}

// indices returns the reusable slice [lo, hi).
func (sc *scratch) indices(lo, hi int) []int {
	sc.idx = grow(sc.idx, hi-lo)
	for i := range sc.idx {
		sc.idx[i] = lo + i
	}
	return sc.idx
}

// attnTask computes causal attention for (active token, kv head) items
// against the cache of one layer. The query heads sharing a kv head are
// done together, up to four at a time, so each key and value row is read
// once for all of them.
type attnTask struct {
	q, out []float32 // [n][heads][head_dim]
	idx    []int     // token index of each active row in its sequence
	// seqs are the sequences of the pass; rowSeq[a] is row a's (nil: all
	// rows are of seqs[0]).
	seqs    []attnSeq
	rowSeq  []int
	kv      []float32 // the cache layer
	layout  pagedkv.CacheLayout
	heads   int
	kvHeads int
	group   int // query heads per kv head
	hd      int
	scale   float32
	scores  [][]float32 // per worker, at least 4 × seq length
	avx     bool        // use the assembly kernels
}

// attnSeq is one sequence of a forward pass as attention reads it.
type attnSeq struct {
	slots []int // slot of every token of the sequence
	// offK and offV hold, for kv head g, the float offset of token j's key
	// and value at [g*seqLen+j] (from cudakern's layout), for the kernels.
	offK, offV []int32
	seqLen     int
}

// seq is row a's sequence.
func (t *attnTask) seq(a int) *attnSeq {
	if t.rowSeq == nil {
		return &t.seqs[0]
	}
	return &t.seqs[t.rowSeq[a]]
}

func (t *attnTask) do(w, lo, hi int) {
	for it := lo; it < hi; it++ {
		a, g := it/t.kvHeads, it%t.kvHeads
		for hb := 0; hb < t.group; hb += 4 {
			t.heads4(w, a, g, g*t.group+hb, min(4, t.group-hb))
		}
	}
}

// heads4 computes query heads [h0, h0+m) (m <= 4, all on kv head g) of
// active row a. Every score of a head goes through the same kernel lane
// whatever m is, so a head's result does not depend on its neighbours.
func (t *attnTask) heads4(w, a, g, h0, m int) {
	hd := t.hd
	i := t.idx[a]
	n := i + 1
	if t.avx {
		t.headsAVX(w, a, g, h0, m, n)
		return
	}
	var qs [4][]float32
	for k := 0; k < 4; k++ {
		h := h0 + min(k, m-1)
		qs[k] = t.q[(a*t.heads+h)*hd : (a*t.heads+h+1)*hd]
	}
	buf := t.scores[w]
	var sc [4][]float32
	for k := range sc {
		sc[k] = buf[k*n : (k+1)*n]
	}
	var r4 [4]float32
	slots := t.seq(a).slots
	for j := 0; j < n; j++ {
		off := t.layout.Offset(0, slots[j], g) / 4
		kr := t.kv[off : off+hd]
		for k := 0; k < m; k++ {
			r4[k] = dot(kr, qs[k])
		}
		for k := 0; k < m; k++ {
			sc[k][j] = r4[k]
		}
	}
	var inv [4]float32
	for k := 0; k < m; k++ {
		inv[k] = 1 / softmaxRow(sc[k], t.scale)
		clear(t.out[(a*t.heads+h0+k)*hd : (a*t.heads+h0+k+1)*hd])
	}
	for j := 0; j < n; j++ {
		off := t.layout.Offset(1, slots[j], g) / 4
		vr := t.kv[off : off+hd]
		for k := 0; k < m; k++ {
			out := t.out[(a*t.heads+h0+k)*hd : (a*t.heads+h0+k+1)*hd]
			p := sc[k][j]
			vr := vr[:len(out)]
			for d := range out {
				out[d] += p * vr[d]
			}
		}
	}
	for k := 0; k < m; k++ {
		out := t.out[(a*t.heads+h0+k)*hd : (a*t.heads+h0+k+1)*hd]
		for d := range out {
			out[d] *= inv[k]
		}
	}
}

// headsAVX is heads4 with the assembly kernels: scores of four keys at a
// time, and the weighted sum of values kept in registers across keys. Heads
// go in pairs, so each key and value row is read once for two of them; a
// head's scores and output have the same bits alone or in a pair.
func (t *attnTask) headsAVX(w, a, g, h0, m, n int) {
	hd := t.hd
	s0 := t.scores[w][:n]
	s1 := t.scores[w][n : 2*n]
	sq := t.seq(a)
	offK := sq.offK[g*sq.seqLen : g*sq.seqLen+n]
	offV := sq.offV[g*sq.seqLen : g*sq.seqLen+n]
	h := h0
	for ; h+2 <= h0+m; h += 2 {
		q := t.q[(a*t.heads+h)*hd : (a*t.heads+h+2)*hd]
		qk2AVX(&q[0], &q[hd], &t.kv[0], &offK[0], n, hd, &s0[0], &s1[0])
		inv0 := 1 / softmaxAVX(&s0[0], n, t.scale)
		inv1 := 1 / softmaxAVX(&s1[0], n, t.scale)
		out := t.out[(a*t.heads+h)*hd : (a*t.heads+h+2)*hd]
		pv2AVX(&s0[0], &s1[0], &t.kv[0], &offV[0], n, hd, inv0, inv1, &out[0], &out[hd])
	}
	if h < h0+m {
		qv := t.q[(a*t.heads+h)*hd : (a*t.heads+h+1)*hd]
		qkAVX(&qv[0], &t.kv[0], &offK[0], n, hd, &s0[0])
		inv := 1 / softmaxAVX(&s0[0], n, t.scale)
		out := t.out[(a*t.heads+h)*hd : (a*t.heads+h+1)*hd]
		pvAVX(&s0[0], &t.kv[0], &offV[0], n, hd, inv, &out[0])
	}
}

// softmaxRow replaces s[j] by e^(s[j]·scale − m), m the largest s[j]·scale,
// and returns their sum; scale > 0. softmaxAVX is this in eight lanes.
func softmaxRow(s []float32, scale float32) float32 {
	mx := float32(math.Inf(-1))
	for j, v := range s {
		v *= scale
		s[j] = v
		mx = max(mx, v)
	}
	var sum float32
	for j, v := range s {
		p := expNeg(v - mx)
		s[j] = p
		sum += p
	}
	return sum
}

// expNeg is e^x for x <= 0 in float32 (softmax after subtracting the max):
// 2^n times a degree-6 polynomial on [-ln2/2, ln2/2], within 4e-7 relative
// of math.Exp (TestExpNeg), several times faster.
func expNeg(x float32) float32 {
	if x < -87 {
		return 0
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	n := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - n*ln2hi
	r -= n * ln2lo
	// Taylor coefficients of e^r up to r^6.
	p := float32(1.0 / 720)
	p = p*r + 1.0/120
	p = p*r + 1.0/24
	p = p*r + 1.0/6
	p = p*r + 0.5
	p = p*r + 1
	p = p*r + 1
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

// rmsNorm writes x = h * rsqrt(mean(h²) + eps) * w row by row, in float32
// with the sum of squares accumulated in float64.
func rmsNorm(x, h, w []float32, rows, dim int, eps float64) {
	for r := 0; r < rows; r++ {
		hr := h[r*dim : (r+1)*dim]
		xr := x[r*dim : (r+1)*dim]
		var ss float64
		for _, v := range hr {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(dim)+eps))
		w := w[:len(hr)]
		for i, v := range hr {
			xr[i] = v * inv * w[i]
		}
	}
}

// rmsNorm is rmsNorm with the model's epsilon, on rmsNormAVX where the
// kernels run and dim is a multiple of 8.
func (e *Engine) rmsNorm(x, h, w []float32, rows, dim int) {
	if e.attnAVX && dim%8 == 0 {
		x, h, w = x[:rows*dim], h[:rows*dim], w[:dim]
		rmsNormAVX(&x[0], &h[0], &w[0], rows, dim, e.cfg.RMSNormEps)
		return
	}
	rmsNorm(x, h, w, rows, dim, e.cfg.RMSNormEps)
}

func silu(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// siluMul sets g[i] = silu(g[i]) * u[i], the MLP's gate; siluMulAVX is this
// in eight lanes with expNeg's polynomial.
func siluMul(g, u []float32) {
	u = u[:len(g)]
	for i, v := range g {
		g[i] = silu(v) * u[i]
	}
}

// fwdSeq is one sequence of a batched forward pass: the token indices it
// computes (ascending, its last token among them) and where its last
// token's logits go (nil: nowhere).
type fwdSeq struct {
	s      *Sequence
	active []int
	logits []float32
}

// forward runs plan over s. Called with e.mu held.
func (e *Engine) forward(ctx context.Context, s *Sequence, p fwdPlan) (fwdStats, error) {
	return e.forwardSeqs(ctx, []fwdSeq{{s: s, active: p.active, logits: p.logits}}, p)
}

// forwardSeqs runs one forward pass over the active tokens of several
// sequences: their rows go through every matmul together, and each row
// attends over its own sequence. A row's result does not depend on the
// other rows (the matmuls' and attention's are per row), so a batch gives
// every sequence the bits a pass of its own would. Recomputation, capture
// and wait (p's) take one sequence. Called with e.mu held.
func (e *Engine) forwardSeqs(ctx context.Context, seqs []fwdSeq, p fwdPlan) (fwdStats, error) {
	var st fwdStats
	if e.closed {
		return st, ErrClosed
	}
	if len(seqs) != 1 && (p.approx != nil || p.capture != nil || p.wait != nil) {
		return st, fmt.Errorf("engine: recomputation, capture and wait take one sequence")
	}
	c := &e.cfg
	n, maxLen := 0, 0
	for _, f := range seqs {
		m := len(f.active)
		if m == 0 || f.active[m-1] != len(f.s.tokens)-1 {
			return st, fmt.Errorf("engine: forward must compute the last token")
		}
		n += m
		maxLen = max(maxLen, len(f.s.tokens))
	}
	H, Q, KV, F := c.HiddenSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim, c.IntermediateSize
	hd := c.HeadDim
	sc := &e.sc
	sc.h = grow(sc.h, n*H)
	sc.x = grow(sc.x, n*H)
	sc.o = grow(sc.o, n*H)
	sc.q = grow(sc.q, n*Q)
	sc.att = grow(sc.att, n*Q)
	sc.k = grow(sc.k, n*KV)
	sc.v = grow(sc.v, n*KV)
	sc.g = grow(sc.g, n*F)
	sc.u = grow(sc.u, n*F)
	sc.slots = grow(sc.slots, n)
	if len(sc.scores) != e.pool.workers {
		sc.scores = make([][]float32, e.pool.workers)
	}
	for w := range sc.scores {
		sc.scores[w] = grow(sc.scores[w], 4*maxLen)
	}
	// active is copied because selection compacts it; with one sequence
	// rowSeq stays nil.
	active, rows := sc.order[:0], sc.rowSeq[:0]
	for b, f := range seqs {
		active = append(active, f.active...)
		for range f.active {
			rows = append(rows, b)
		}
	}
	sc.order, sc.rowSeq = active, rows
	var rowSeq []int
	if len(seqs) > 1 {
		rowSeq = rows
	}
	approx := p.approx
	for r, i := range active {
		tok := int(seqs[rowOf(rowSeq, r)].s.tokens[i])
		copy(sc.h[r*H:(r+1)*H], e.w.embed[tok*H:(tok+1)*H])
	}
	at := &sc.attn
	*at = attnTask{layout: e.layout, heads: c.NumHeads, kvHeads: c.NumKVHeads, group: c.NumHeads / c.NumKVHeads,
		hd: hd, scale: float32(1 / math.Sqrt(float64(hd))), scores: sc.scores, avx: e.attnAVX, rowSeq: rowSeq}
	sc.seqs = grow(sc.seqs, len(seqs))
	if at.avx {
		total := 0
		for _, f := range seqs {
			total += c.NumKVHeads * len(f.s.tokens)
		}
		sc.offK = grow(sc.offK, total)
		sc.offV = grow(sc.offV, total)
	}
	base := 0
	for b, f := range seqs {
		seqLen := len(f.s.tokens)
		sq := attnSeq{slots: f.s.slots, seqLen: seqLen}
		if at.avx {
			sq.offK = sc.offK[base : base+c.NumKVHeads*seqLen]
			sq.offV = sc.offV[base : base+c.NumKVHeads*seqLen]
			base += c.NumKVHeads * seqLen
			for g := 0; g < c.NumKVHeads; g++ {
				for j, slot := range f.s.slots[:seqLen] {
					sq.offK[g*seqLen+j] = int32(e.layout.Offset(0, slot, g) / 4)
					sq.offV[g*seqLen+j] = int32(e.layout.Offset(1, slot, g) / 4)
				}
			}
		}
		sc.seqs[b] = sq
	}
	at.seqs = sc.seqs
	for l := range e.w.layers {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		lw := &e.w.layers[l]
		if approx != nil && l == p.check+1 {
			n = e.selectTokens(active, &p, H, &st)
			active = active[:n]
		}
		st.tokenLayers += n
		for r, i := range active {
			sc.slots[r] = seqs[rowOf(rowSeq, r)].s.slots[i]
		}
		e.rmsNorm(sc.x, sc.h, lw.inputNorm, n, H)
		e.pool.matmul(&sc.mm, sc.q, sc.x, lw.q, lw.qBias, n, H, Q)
		e.pool.matmul(&sc.mm, sc.k, sc.x, lw.k, lw.kBias, n, H, KV)
		e.pool.matmul(&sc.mm, sc.v, sc.x, lw.v, lw.vBias, n, H, KV)
		if c.QKNorm {
			e.rmsNorm(sc.q, sc.q, lw.qNorm, n*c.NumHeads, hd)
			e.rmsNorm(sc.k, sc.k, lw.kNorm, n*c.NumKVHeads, hd)
		}
		if p.capture != nil {
			e.capture(p, l, active, n)
		}
		for r, i := range active {
			pos := seqs[rowOf(rowSeq, r)].s.start + i
			for h := 0; h < c.NumHeads; h++ {
				e.rope.RotateF32(sc.q[(r*c.NumHeads+h)*hd:(r*c.NumHeads+h+1)*hd], pos)
			}
			for h := 0; h < c.NumKVHeads; h++ {
				e.rope.RotateF32(sc.k[(r*c.NumKVHeads+h)*hd:(r*c.NumKVHeads+h+1)*hd], pos)
			}
		}
		if p.wait != nil {
			if err := p.wait(l); err != nil {
				return st, err
			}
		}
		cl := e.cache[l]
		if approx != nil && l == p.check {
			e.checkLayer(cl.f, n)
		}
		if err := cudakern.ScatterF32(cl.b, e.layout, 0, sc.slots[:n], sc.k[:n*KV]); err != nil {
			return st, fmt.Errorf("engine: store keys: %w", err)
		}
		if approx != nil && l == p.check && p.sel != SelectDeviation {
			e.attentionReceived(cl.f, active, approx, seqs[0].s.slots, n)
		}
		if err := cudakern.ScatterF32(cl.b, e.layout, 1, sc.slots[:n], sc.v[:n*KV]); err != nil {
			return st, fmt.Errorf("engine: store values: %w", err)
		}
		at.q, at.out, at.idx, at.kv = sc.q[:n*Q], sc.att[:n*Q], active, cl.f
		e.pool.run(at, n*c.NumKVHeads, 1)
		e.pool.matmul(&sc.mm, sc.o, sc.att, lw.o, lw.oBias, n, Q, H)
		for i, v := range sc.o[:n*H] {
			sc.h[i] += v
		}
		e.rmsNorm(sc.x, sc.h, lw.postNorm, n, H)
		e.pool.matmul(&sc.mm, sc.g, sc.x, lw.gate, nil, n, H, F)
		e.pool.matmul(&sc.mm, sc.u, sc.x, lw.up, nil, n, H, F)
		if e.attnAVX && F%8 == 0 {
			siluMulAVX(&sc.g[0], &sc.u[0], n*F)
		} else {
			siluMul(sc.g[:n*F], sc.u[:n*F])
		}
		e.pool.matmul(&sc.mm, sc.o, sc.g, lw.down, nil, n, F, H)
		for i, v := range sc.o[:n*H] {
			sc.h[i] += v
		}
	}
	*at = attnTask{}
	e.logits(seqs, n)
	return st, nil
}

// rowOf is the sequence of row r (rowSeq nil: one sequence).
func rowOf(rowSeq []int, r int) int {
	if rowSeq == nil {
		return 0
	}
	return rowSeq[r]
}

// logits writes each sequence's last-token logits from the final hidden
// states of the pass's n rows (a sequence's rows are contiguous, in order,
// so its last row ends its run).
func (e *Engine) logits(seqs []fwdSeq, n int) {
	c := &e.cfg
	H := c.HiddenSize
	sc := &e.sc
	if len(seqs) == 1 {
		if lg := seqs[0].logits; lg != nil {
			sc.x = grow(sc.x, H)
			e.rmsNorm(sc.x, sc.h[(n-1)*H:n*H], e.w.norm, 1, H)
			e.pool.matmul(&sc.mm, lg, sc.x, e.w.lmHead, nil, 1, H, c.VocabSize)
		}
		return
	}
	// Gather the last rows of the sequences that want logits, and run the
	// head over them together.
	sc.x = grow(sc.x, len(seqs)*H)
	m, end := 0, 0
	for _, f := range seqs {
		end += len(f.active)
		if f.logits == nil {
			continue
		}
		copy(sc.x[m*H:(m+1)*H], sc.h[(end-1)*H:end*H])
		m++
	}
	if m == 0 {
		return
	}
	sc.o = grow(sc.o, m*H)
	e.rmsNorm(sc.o, sc.x, e.w.norm, m, H)
	sc.last = grow(sc.last, m*c.VocabSize)
	e.pool.matmul(&sc.mm, sc.last, sc.o, e.w.lmHead, nil, m, H, c.VocabSize)
	m = 0
	for _, f := range seqs {
		if f.logits != nil {
			copy(f.logits[:c.VocabSize], sc.last[m*c.VocabSize:(m+1)*c.VocabSize])
			m++
		}
	}
}

// capture copies the pre-RoPE K and V rows of the captured range.
func (e *Engine) capture(p fwdPlan, l int, active []int, n int) {
	c := &e.cfg
	KV := c.NumKVHeads * c.HeadDim
	span := p.capHi - p.capLo
	base := l * 2 * span * KV
	for r, i := range active[:n] {
		if i < p.capLo || i >= p.capHi {
			continue
		}
		t := i - p.capLo
		copy(p.capture[base+t*KV:base+(t+1)*KV], e.sc.k[r*KV:(r+1)*KV])
		copy(p.capture[base+(span+t)*KV:base+(span+t+1)*KV], e.sc.v[r*KV:(r+1)*KV])
	}
}
