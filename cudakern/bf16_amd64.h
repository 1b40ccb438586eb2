// Macros shared by the amd64 kernels (kernel_amd64.s, kernel_fp8_amd64.s).

// BF16LOAD widens the bf16 values at m (8 for a Y register r, 16 for a Z)
// to float32 values in r: zero-extended to dwords, their bits moved to the
// high half.
#define BF16LOAD(m, r) \
	VPMOVZXWD m, r; \
	VPSLLD    $16, r, r
