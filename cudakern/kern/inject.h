/*
 * The per-element arithmetic of cudakern's fused inject, shared by the CUDA
 * kernels (inject.cu, compiled by nvcc) and the host build that checks them
 * (host.go, compiled by the C compiler through cgo). Both run the
 * very same functions: only the launch geometry, which token and lane a
 * thread takes, belongs to the device alone.
 *
 * Exactness: every float operation is a single IEEE operation rounded to
 * nearest (KVM_MUL and friends are __fmul_rn and friends on the device, so
 * nothing contracts into a fused multiply-add; nvcc also runs with
 * -fmad=false). The conversions are the bit manipulations of chunk/float.go
 * and the codec decode is chunk's reference formula in double, so the bits
 * are those of cudakern's Go kernels (a NaN may carry another payload, as
 * between the Go and assembly kernels).
 *
 * The code is C99 that is also valid CUDA C++.
 */
#ifndef KVMESH_INJECT_H
#define KVMESH_INJECT_H

#ifdef __CUDACC__
#define KVM_HD __host__ __device__ __forceinline__
typedef unsigned char kvm_u8;
typedef unsigned short kvm_u16;
typedef unsigned int kvm_u32;
typedef long long kvm_i64;
typedef unsigned long long kvm_u64;
#else
#include <stdint.h>
#include <string.h>
#define KVM_HD static inline
/* No contraction into fused multiply-adds on the host either (GCC's C
 * default is to contract where the target has FMA). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
typedef uint8_t kvm_u8;
typedef uint16_t kvm_u16;
typedef uint32_t kvm_u32;
typedef int64_t kvm_i64;
typedef uint64_t kvm_u64;
#endif

#ifdef __CUDA_ARCH__
#define KVM_MUL(a, b) __fmul_rn((a), (b))
#define KVM_ADD(a, b) __fadd_rn((a), (b))
#define KVM_SUB(a, b) __fsub_rn((a), (b))
#define KVM_DIV(a, b) __fdiv_rn((a), (b))
#define KVM_DMUL(a, b) __dmul_rn((a), (b))
#define KVM_DADD(a, b) __dadd_rn((a), (b))
#define KVM_D2F(a) __double2float_rn(a)
#else
#define KVM_MUL(a, b) ((float)((a) * (b)))
#define KVM_ADD(a, b) ((float)((a) + (b)))
#define KVM_SUB(a, b) ((float)((a) - (b)))
#define KVM_DIV(a, b) ((float)((a) / (b)))
#define KVM_DMUL(a, b) ((double)((a) * (b)))
#define KVM_DADD(a, b) ((double)((a) + (b)))
#define KVM_D2F(a) ((float)(a))
#endif

/* Dtypes: the values of chunk.DType. */
enum { KVM_F32 = 1, KVM_F16 = 2, KVM_BF16 = 3, KVM_FP8 = 4 };
/* Source encodings: raw elements, or a quantizing codec's layer payload. */
enum { KVM_RAW = 0, KVM_INT8 = 1, KVM_INT4 = 2, KVM_QFP8 = 3 };
/* Cache orders: the values of pagedkv.Order. NHD and HND hold all of K's
 * blocks, then all of V's; BLOCK_NHD and BLOCK_HND hold each block's K then
 * its V (FlashInfer's shapes). */
enum { KVM_NHD = 1, KVM_HND = 2, KVM_BLOCK_NHD = 3, KVM_BLOCK_HND = 4 };
/* Error bits a pass reports (codec payloads only). */
enum { KVM_ERR_PARAMS = 1, KVM_ERR_FP8NAN = 2, KVM_ERR_PADDING = 4 };

/*
 * One fused job over a range of layers. Pointers are addresses (device
 * addresses on the device). Every field is 8 or 4 bytes, the 8-byte ones
 * first, so the Go mirror (cudakern's cudaJob) has the same layout.
 */
typedef struct kvm_job {
	kvm_u64 src;   /* kvm_u64[layers]: each layer's source bytes */
	kvm_u64 dst;   /* kvm_u64[layers]: each layer of the cache */
	kvm_u64 slots; /* kvm_i64[tokens]: slot of token t, or -1 */
	kvm_u64 cs;    /* float[tokens][2*half]: cos then sin of position Pos+t */
	kvm_u64 err;   /* kvm_u32: error bits, ORed */
	kvm_i64 num_blocks;
	int layers, tokens;
	int src_heads, head_lo, heads, head_dim;
	int half, rotary, neox;
	int src_dt, dst_dt, codec;
	int order, block_size;
	int copy_v; /* V passes through as bytes */
	float src_kscale, src_vscale, dst_kscale, dst_vscale;
	int pad;
} kvm_job;

/* Bit casts. */
KVM_HD float kvm_u2f(kvm_u32 u) {
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float f;
	memcpy(&f, &u, 4);
	return f;
#endif
}

KVM_HD kvm_u32 kvm_f2u(float f) {
#ifdef __CUDA_ARCH__
	return __float_as_uint(f);
#else
	kvm_u32 u;
	memcpy(&u, &f, 4);
	return u;
#endif
}

/* chunk.BF16ToF32 */
KVM_HD float kvm_bf16_to_f32(kvm_u16 h) { return kvm_u2f((kvm_u32)h << 16); }

/* chunk.F32ToBF16: nearest even; NaN stays a quiet NaN. */
KVM_HD kvm_u16 kvm_f32_to_bf16(float f) {
	kvm_u32 u = kvm_f2u(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (kvm_u16)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (kvm_u16)(u >> 16);
}

/* chunk.F16ToF32 */
KVM_HD float kvm_f16_to_f32(kvm_u16 h) {
	kvm_u32 sign = (kvm_u32)(h & 0x8000u) << 16;
	kvm_u32 exp = ((kvm_u32)h >> 10) & 0x1fu;
	kvm_u32 man = (kvm_u32)h & 0x3ffu;
	if (exp == 0x1f)
		return kvm_u2f(sign | 0x7f800000u | man << 13);
	if (exp != 0)
		return kvm_u2f(sign | (exp + 112) << 23 | man << 13);
	if (man == 0)
		return kvm_u2f(sign);
	return kvm_u2f(sign | kvm_f2u(KVM_MUL((float)man, 1.0f / 16777216.0f)));
}

/* chunk.F32ToF16: nearest even, overflow to Inf. */
KVM_HD kvm_u16 kvm_f32_to_f16(float f) {
	kvm_u32 u = kvm_f2u(f);
	kvm_u16 sign = (kvm_u16)((u >> 16) & 0x8000u);
	kvm_u32 a = u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return (kvm_u16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477ff000u)
		return (kvm_u16)(sign | 0x7c00u);
	if (a >= 0x38800000u) {
		a -= 112u << 23;
		a += 0x0fffu + ((a >> 13) & 1u);
		return (kvm_u16)(sign | (kvm_u16)(a >> 13));
	}
	if (a < 0x33000000u)
		return sign;
	{
		kvm_u32 exp = a >> 23;
		kvm_u32 man = (a & 0x7fffffu) | 0x800000u;
		kvm_u32 shift = 126 - exp;
		kvm_u32 half_unit = 1u << (shift - 1);
		kvm_u32 r = man >> shift;
		kvm_u32 rem = man & ((1u << shift) - 1);
		if (rem > half_unit || (rem == half_unit && (r & 1u)))
			r++;
		return (kvm_u16)(sign | (kvm_u16)r);
	}
}

/* chunk.FP8E4M3ToF32 (OCP e4m3fn: bias 7, no Inf, 0x7f/0xff NaN). */
KVM_HD float kvm_fp8_to_f32(kvm_u8 b) {
	kvm_u32 sign = (kvm_u32)(b & 0x80u) << 24;
	kvm_u32 exp = ((kvm_u32)b >> 3) & 0xfu;
	kvm_u32 man = (kvm_u32)b & 7u;
	if (exp == 0xf && man == 7)
		return kvm_u2f(sign | 0x7fc00000u);
	if (exp != 0)
		return kvm_u2f(sign | (exp + 120) << 23 | man << 20);
	return kvm_u2f(sign | kvm_f2u(KVM_MUL((float)man, 1.0f / 512.0f)));
}

/* chunk.F32ToFP8E4M3: nearest even, saturating to +-448. */
KVM_HD kvm_u8 kvm_f32_to_fp8(float f) {
	kvm_u32 u = kvm_f2u(f);
	kvm_u8 sign = (kvm_u8)((u >> 24) & 0x80u);
	kvm_u32 a = u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return (kvm_u8)(sign | 0x7fu);
	if (a >= 0x43e00000u)
		return (kvm_u8)(sign | 0x7eu);
	if (a >= 0x3c800000u) {
		kvm_u32 r;
		a -= 120u << 23;
		a += 0x7ffffu + ((a >> 20) & 1u);
		r = a >> 20;
		if (r > 0x7eu)
			r = 0x7eu;
		return (kvm_u8)(sign | (kvm_u8)r);
	}
	if (a < 0x3a800000u)
		return sign;
	{
		kvm_u32 exp = a >> 23;
		kvm_u32 man = (a & 0x7fffffu) | 0x800000u;
		kvm_u32 shift = 141 - exp;
		kvm_u32 half_unit = 1u << (shift - 1);
		kvm_u32 r = man >> shift;
		kvm_u32 rem = man & ((1u << shift) - 1);
		if (rem > half_unit || (rem == half_unit && (r & 1u)))
			r++;
		return (kvm_u8)(sign | (kvm_u8)r);
	}
}

KVM_HD int kvm_size(int dt) { return dt == KVM_F32 ? 4 : dt == KVM_FP8 ? 1 : 2; }

/* Raw element bits i of a dtype-dt array (elements are aligned). */
KVM_HD kvm_u32 kvm_bits(const kvm_u8 *p, int dt, kvm_i64 i) {
	switch (dt) {
	case KVM_F32:
		return ((const kvm_u32 *)p)[i];
	case KVM_FP8:
		return p[i];
	}
	return ((const kvm_u16 *)p)[i];
}

KVM_HD void kvm_put_bits(kvm_u8 *p, int dt, kvm_i64 i, kvm_u32 v) {
	switch (dt) {
	case KVM_F32:
		((kvm_u32 *)p)[i] = v;
		return;
	case KVM_FP8:
		p[i] = (kvm_u8)v;
		return;
	}
	((kvm_u16 *)p)[i] = (kvm_u16)v;
}

/* Widen element bits exactly; fp8 is multiplied by scale (loadF32). */
KVM_HD float kvm_widen(kvm_u32 b, int dt, float scale) {
	switch (dt) {
	case KVM_F32:
		return kvm_u2f(b);
	case KVM_F16:
		return kvm_f16_to_f32((kvm_u16)b);
	case KVM_BF16:
		return kvm_bf16_to_f32((kvm_u16)b);
	}
	return KVM_MUL(kvm_fp8_to_f32((kvm_u8)b), scale);
}

/* Round once into dt; fp8 stores fp8(x / scale) (storeF32). */
KVM_HD kvm_u32 kvm_round(float v, int dt, float scale) {
	switch (dt) {
	case KVM_F32:
		return kvm_f2u(v);
	case KVM_F16:
		return kvm_f32_to_f16(v);
	case KVM_BF16:
		return kvm_f32_to_bf16(v);
	}
	if (scale != 1.0f)
		v = KVM_DIV(v, scale);
	return kvm_f32_to_fp8(v);
}

/* ---- Codec payloads (chunk/codec_quant.go) ----
 * A layer is [K params][K codes][V params][V codes]. K groups are
 * [token/64][head][dim], V groups [token][head][dim/64]; int parameters are
 * zero then scale, fp8 ones a scale, each an element of the entry dtype. */

#define KVM_GROUP_TOKENS 64
#define KVM_GROUP_DIMS 64

/* Unaligned little-endian element of the entry dtype, widened to double. */
KVM_HD double kvm_param(const kvm_u8 *p, int dt) {
	if (dt == KVM_F32)
		return (double)kvm_u2f((kvm_u32)p[0] | (kvm_u32)p[1] << 8 | (kvm_u32)p[2] << 16 | (kvm_u32)p[3] << 24);
	{
		kvm_u16 h = (kvm_u16)(p[0] | p[1] << 8);
		return (double)(dt == KVM_F16 ? kvm_f16_to_f32(h) : kvm_bf16_to_f32(h));
	}
}

KVM_HD int kvm_codec_params(int codec) { return codec == KVM_QFP8 ? 1 : 2; }

KVM_HD kvm_i64 kvm_code_bytes(int codec, kvm_i64 n) { return codec == KVM_INT4 ? (n + 1) / 2 : n; }

/* Geometry of one encoded layer. */
typedef struct kvm_qgeom {
	kvm_i64 chans, elems;
	kvm_i64 k_groups, v_groups; /* token groups of K, dim groups per head of V */
	kvm_i64 k_params, k_codes, v_params, v_codes; /* section offsets */
	kvm_i64 bytes;
} kvm_qgeom;

KVM_HD kvm_qgeom kvm_geom(const kvm_job *j) {
	kvm_qgeom g;
	int es = kvm_size(j->src_dt);
	kvm_i64 ps = (kvm_i64)kvm_codec_params(j->codec) * es;
	kvm_i64 cb;
	g.chans = (kvm_i64)j->src_heads * j->head_dim;
	g.elems = (kvm_i64)j->tokens * g.chans;
	g.k_groups = (j->tokens + KVM_GROUP_TOKENS - 1) / KVM_GROUP_TOKENS;
	g.v_groups = (j->head_dim + KVM_GROUP_DIMS - 1) / KVM_GROUP_DIMS;
	cb = kvm_code_bytes(j->codec, g.elems);
	g.k_params = 0;
	g.k_codes = g.k_groups * g.chans * ps;
	g.v_params = g.k_codes + cb;
	g.v_codes = g.v_params + (kvm_i64)j->tokens * j->src_heads * g.v_groups * ps;
	g.bytes = g.v_codes + cb;
	return g;
}

/* chunk's maxFinite */
KVM_HD double kvm_max_finite(int dt) {
	if (dt == KVM_F16)
		return 65504.0;
	if (dt == KVM_BF16)
		return (double)kvm_bf16_to_f32(0x7f7f);
	return 3.40282346638528859811704183484516925440e+38;
}

/*
 * The entry-dtype bits chunk's decoder writes for element e (canonical
 * index within the K or V half, kv 0 or 1) of an encoded layer:
 * clampF32(zero + code*scale) or clampF32(e4m3(code)*scale), computed in
 * double and narrowed once into the dtype. Bad parameters and fp8 NaN codes
 * set error bits (the caller's flag), as chunk rejects them with ErrCorrupt.
 */
KVM_HD kvm_u32 kvm_decode(const kvm_job *j, const kvm_qgeom *g, const kvm_u8 *layer, int kv, kvm_i64 tok, kvm_i64 chan,
			  kvm_u32 *err) {
	int dt = j->src_dt, es = kvm_size(dt);
	kvm_i64 ps = (kvm_i64)kvm_codec_params(j->codec) * es;
	kvm_i64 e = tok * g->chans + chan, gi;
	const kvm_u8 *codes = layer + (kv ? g->v_codes : g->k_codes);
	const kvm_u8 *p;
	double zero = 0, scale, v, lim = kvm_max_finite(dt);
	kvm_u32 code;
	float f;
	if (kv == 0)
		gi = tok / KVM_GROUP_TOKENS * g->chans + chan;
	else
		gi = (tok * j->src_heads + chan / j->head_dim) * g->v_groups + (chan % j->head_dim) / KVM_GROUP_DIMS;
	p = layer + (kv ? g->v_params : g->k_params) + gi * ps;
	if (j->codec == KVM_QFP8) {
		scale = kvm_param(p, dt);
	} else {
		zero = kvm_param(p, dt);
		scale = kvm_param(p + es, dt);
	}
	/* loadParams: a finite, non-negative scale and a finite zero. */
	if (!(scale >= 0) || scale > 3.40282346638528859811704183484516925440e+38 || !(zero == zero) ||
	    zero > 3.40282346638528859811704183484516925440e+38 || zero < -3.40282346638528859811704183484516925440e+38)
		*err |= KVM_ERR_PARAMS;
	if (j->codec == KVM_INT4)
		code = (codes[e >> 1] >> (4 * (e & 1))) & 15u;
	else
		code = codes[e];
	if (j->codec == KVM_QFP8) {
		if ((code & 0x7fu) == 0x7fu)
			*err |= KVM_ERR_FP8NAN;
		v = KVM_DMUL((double)kvm_fp8_to_f32((kvm_u8)code), scale);
	} else {
		v = KVM_DADD(zero, KVM_DMUL((double)code, scale));
	}
	/* clampF32 */
	if (v > lim)
		v = lim;
	else if (v < -lim)
		v = -lim;
	f = KVM_D2F(v);
	if (dt == KVM_F32)
		return kvm_f2u(f);
	if (dt == KVM_F16)
		return kvm_f32_to_f16(f);
	{
		/* fromF32's bf16: finite, nearest even, no NaN case. */
		kvm_u32 u = kvm_f2u(f);
		u += 0x7fffu + ((u >> 16) & 1u);
		return u >> 16;
	}
}

/* int4 layers of an odd element count keep the last high nibble of each
 * half zero (one encoding per entry). */
KVM_HD kvm_u32 kvm_check_padding(const kvm_job *j, const kvm_qgeom *g, const kvm_u8 *layer) {
	kvm_i64 cb;
	if (j->codec != KVM_INT4 || (g->elems & 1) == 0)
		return 0;
	cb = kvm_code_bytes(j->codec, g->elems);
	if ((layer[g->k_codes + cb - 1] >> 4) != 0 || (layer[g->v_codes + cb - 1] >> 4) != 0)
		return KVM_ERR_PADDING;
	return 0;
}

/* ---- The fused pass ---- */

/*
 * Element offset of (kv, slot, head, 0) in one layer (CacheLayout.Offset):
 * a block of K or of V is a plane of block_size*heads head vectors, slot-
 * or head-major; the plane's index is kv*num_blocks+block, or 2*block+kv
 * where a block holds its K and V. NHD, the common case, needs no division.
 */
KVM_HD kvm_i64 kvm_offset(const kvm_job *j, int kv, kvm_i64 slot, int head) {
	kvm_i64 bs = j->block_size, b, o, plane, in;
	if (j->order == KVM_NHD)
		return ((kv * j->num_blocks * bs + slot) * j->heads + head) * j->head_dim;
	b = slot / bs;
	o = slot % bs;
	plane = j->order == KVM_HND ? kv * j->num_blocks + b : 2 * b + kv;
	in = j->order == KVM_BLOCK_NHD ? o * j->heads + head : head * bs + o;
	return (plane * bs * j->heads + in) * j->head_dim;
}

/* Source element bits of (kv, tok, source head, dim), in the source dtype
 * (the entry dtype for a codec payload). */
KVM_HD kvm_u32 kvm_src_bits(const kvm_job *j, const kvm_qgeom *g, const kvm_u8 *layer, int kv, kvm_i64 tok, int sh,
			    int d, kvm_u32 *err) {
	kvm_i64 chan = (kvm_i64)sh * j->head_dim + d;
	if (j->codec != KVM_RAW)
		return kvm_decode(j, g, layer, kv, tok, chan, err);
	return kvm_bits(layer, j->src_dt, ((kvm_i64)kv * j->tokens + tok) * g->chans + chan);
}

/*
 * Work item w of one token of one layer. A token has heads*(half +
 * head_dim - rotary) items of K (one per rotating pair, one per
 * pass-through dim) followed by heads*head_dim items of V. Items write
 * disjoint elements, so any thread may take any item.
 */
KVM_HD int kvm_token_items(const kvm_job *j) {
	return j->heads * (j->half + j->head_dim - j->rotary) + j->heads * j->head_dim;
}

KVM_HD void kvm_item(const kvm_job *j, const kvm_qgeom *g, const kvm_u8 *src, kvm_u8 *dst, kvm_i64 tok, kvm_i64 slot,
		     const float *cs, int w, kvm_u32 *err) {
	int kper = j->half + j->head_dim - j->rotary;
	int kitems = j->heads * kper;
	int sdt = j->src_dt, ddt = j->dst_dt;
	if (w < kitems) {
		int h = w / kper, i = w % kper;
		int sh = j->head_lo + h;
		kvm_i64 o = kvm_offset(j, 0, slot, h);
		if (i < j->half) {
			/* One pair: NeoX (i, i+half), GPT-J (2i, 2i+1). */
			int d0 = j->neox ? i : 2 * i, d1 = j->neox ? i + j->half : 2 * i + 1;
			float c = cs[i], s = cs[j->half + i];
			float x0 = kvm_widen(kvm_src_bits(j, g, src, 0, tok, sh, d0, err), sdt, j->src_kscale);
			float x1 = kvm_widen(kvm_src_bits(j, g, src, 0, tok, sh, d1, err), sdt, j->src_kscale);
			float y0 = KVM_SUB(KVM_MUL(x0, c), KVM_MUL(x1, s));
			float y1 = KVM_ADD(KVM_MUL(x1, c), KVM_MUL(x0, s));
			kvm_put_bits(dst, ddt, o + d0, kvm_round(y0, ddt, j->dst_kscale));
			kvm_put_bits(dst, ddt, o + d1, kvm_round(y1, ddt, j->dst_kscale));
		} else {
			/* Beyond the rotary dims: bytes for the same 16/32-bit
			 * dtype, else widened and rounded. */
			int d = j->rotary + (i - j->half);
			kvm_u32 b = kvm_src_bits(j, g, src, 0, tok, sh, d, err);
			if (sdt != ddt || ddt == KVM_FP8)
				b = kvm_round(kvm_widen(b, sdt, j->src_kscale), ddt, j->dst_kscale);
			kvm_put_bits(dst, ddt, o + d, b);
		}
		return;
	}
	w -= kitems;
	{
		int h = w / j->head_dim, d = w % j->head_dim;
		kvm_u32 b = kvm_src_bits(j, g, src, 1, tok, j->head_lo + h, d, err);
		if (!j->copy_v)
			b = kvm_round(kvm_widen(b, sdt, j->src_vscale), ddt, j->dst_vscale);
		kvm_put_bits(dst, ddt, kvm_offset(j, 1, slot, h) + d, b);
	}
}

/* Items [lane, items) step lanes of token tok of layer l: what one thread
 * of a token's block does. A slot of -1 writes nothing. */
KVM_HD kvm_u32 kvm_token(const kvm_job *j, int l, kvm_i64 tok, int lane, int lanes) {
	const kvm_u8 *src = (const kvm_u8 *)(((const kvm_u64 *)j->src)[l]);
	kvm_u8 *dst = (kvm_u8 *)(((const kvm_u64 *)j->dst)[l]);
	kvm_i64 slot = ((const kvm_i64 *)j->slots)[tok];
	const float *cs = (const float *)j->cs + tok * 2 * j->half;
	kvm_qgeom g = kvm_geom(j);
	kvm_u32 err = 0;
	int n = kvm_token_items(j), w;
	if (j->codec != KVM_RAW && tok == 0 && lane == 0)
		err |= kvm_check_padding(j, &g, src);
	if (slot < 0)
		return err;
	for (w = lane; w < n; w += lanes)
		kvm_item(j, &g, src, dst, tok, slot, cs, w, &err);
	return err;
}

#endif
