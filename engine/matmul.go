package engine

// Blocked float32 matrix multiply for y = x · wᵀ (+ bias), the shape of every
// linear layer: x is [n][in] row-major, w is [out][in] (HF's layout), y is
// [n][out]. Work is split over blocks of w's rows on all workers; inside a
// block, a 2×4 register tile (two x rows against four w rows) reuses every
// load twice or four times. On amd64 with AVX2 and FMA the tile is an
// assembly kernel (8 lanes, fused multiply-add) that walks a block of x rows
// in one call and reduces four columns' lanes together; elsewhere, or with the
// purego tag, or when in is not a multiple of 8, it is pure Go. Either way a
// row's result does not depend on the batch it is computed in.

// matmulTask is the pool task of one matmul; the engine keeps one and
// refills it, so a call allocates nothing.
type matmulTask struct {
	x, w, bias, y []float32
	n, in, out    int
	avx           bool
}

// xBlock bounds the x rows one pass streams against a block of w rows, so
// both stay in L2.
const xBlock = 64

func (t *matmulTask) do(_, lo, hi int) {
	if t.avx {
		t.doAVX(lo, hi)
		return
	}
	in, out := t.in, t.out
	for x0 := 0; x0 < t.n; x0 += xBlock {
		x1 := min(x0+xBlock, t.n)
		o := lo
		for ; o+4 <= hi; o += 4 {
			w0 := t.w[o*in : o*in+in]
			w1 := t.w[(o+1)*in : (o+1)*in+in]
			w2 := t.w[(o+2)*in : (o+2)*in+in]
			w3 := t.w[(o+3)*in : (o+3)*in+in]
			i := x0
			for ; i+2 <= x1; i += 2 {
				xa := t.x[i*in : i*in+in]
				xb := t.x[(i+1)*in : (i+1)*in+in]
				a0, a1, a2, a3, b0, b1, b2, b3 := dot2x4(xa, xb, w0, w1, w2, w3)
				ya := t.y[i*out+o : i*out+o+4]
				yb := t.y[(i+1)*out+o : (i+1)*out+o+4]
				ya[0], ya[1], ya[2], ya[3] = a0, a1, a2, a3
				yb[0], yb[1], yb[2], yb[3] = b0, b1, b2, b3
			}
			for ; i < x1; i++ {
				xa := t.x[i*in : i*in+in]
				a0, a1, a2, a3 := dot1x4(xa, w0, w1, w2, w3)
				ya := t.y[i*out+o : i*out+o+4]
				ya[0], ya[1], ya[2], ya[3] = a0, a1, a2, a3
			}
		}
		for ; o < hi; o++ {
			wr := t.w[o*in : o*in+in]
			for i := x0; i < x1; i++ {
				// Same summation order as the tiled kernels, so a row's
				// result does not depend on how the work was split.
				xa := t.x[i*in : i*in+in]
				wr := wr[:len(xa)]
				var s float32
				for k, v := range xa {
					s += v * wr[k]
				}
				t.y[i*out+o] = s
			}
		}
		if t.bias != nil {
			for i := x0; i < x1; i++ {
				yr := t.y[i*out+lo : i*out+hi]
				for j, b := range t.bias[lo:hi] {
					yr[j] += b
				}
			}
		}
	}
}

func dot2x4(xa, xb, w0, w1, w2, w3 []float32) (a0, a1, a2, a3, b0, b1, b2, b3 float32) {
	n := len(xa)
	xb, w0, w1, w2, w3 = xb[:n], w0[:n], w1[:n], w2[:n], w3[:n]
	for k := 0; k < n; k++ {
		p, q := xa[k], xb[k]
		v0, v1, v2, v3 := w0[k], w1[k], w2[k], w3[k]
		a0 += p * v0
		a1 += p * v1
		a2 += p * v2
		a3 += p * v3
		b0 += q * v0
		b1 += q * v1
		b2 += q * v2
		b3 += q * v3
	}
	return
}

func dot1x4(xa, w0, w1, w2, w3 []float32) (a0, a1, a2, a3 float32) {
	n := len(xa)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	for k := 0; k < n; k++ {
		p := xa[k]
		a0 += p * w0[k]
		a1 += p * w1[k]
		a2 += p * w2[k]
		a3 += p * w3[k]
	}
	return
}

// dot is a plain float32 dot product with four partial sums.
func dot(a, b []float32) float32 {
	n := len(a)
	b = b[:n]
	var s0, s1, s2, s3 float32
	k := 0
	for ; k+4 <= n; k += 4 {
		s0 += a[k] * b[k]
		s1 += a[k+1] * b[k+1]
		s2 += a[k+2] * b[k+2]
		s3 += a[k+3] * b[k+3]
	}
	for ; k < n; k++ {
		s0 += a[k] * b[k]
	}
	return (s0 + s1) + (s2 + s3)
}

// doAVX is do with the assembly kernel: a block of four w rows (fewer at
// the end, the last one repeated) against up to xBlock x rows per call.
func (t *matmulTask) doAVX(lo, hi int) {
	in, out := t.in, t.out
	for x0 := 0; x0 < t.n; x0 += xBlock {
		x1 := min(x0+xBlock, t.n)
		for o := lo; o < hi; o += 4 {
			w0 := &t.w[o*in]
			w1 := &t.w[min(o+1, hi-1)*in]
			w2 := &t.w[min(o+2, hi-1)*in]
			w3 := &t.w[min(o+3, hi-1)*in]
			mm4AVX(&t.x[x0*in], w0, w1, w2, w3, &t.y[x0*out+o], x1-x0, in, out, min(4, hi-o))
		}
		if t.bias != nil {
			for i := x0; i < x1; i++ {
				yr := t.y[i*out+lo : i*out+hi]
				for j, b := range t.bias[lo:hi] {
					yr[j] += b
				}
			}
		}
	}
}

// matmul computes y = x · wᵀ + bias on the pool. bias may be nil.
func (p *pool) matmul(t *matmulTask, y, x, w, bias []float32, n, in, out int) {
	*t = matmulTask{x: x[:n*in], w: w[:out*in], bias: bias, y: y[:n*out], n: n, in: in, out: out,
		avx: p.avx && in%8 == 0}
	// A grain of 16 w rows is 16·in floats: 32 KiB at in = 512.
	p.run(t, out, 16)
	t.x, t.w, t.bias, t.y = nil, nil, nil, nil
}
