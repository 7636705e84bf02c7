/* gemm_amx.h - kiln's own bf16 GEMM on AMX tiles (gemm_amx.c), on weights
 * packed once into the tile layout (the "amx32" layout of the weight cache),
 * and the AMX set-up shared with the fused attention (attn_amx.c). */
#ifndef KILN_GEMM_AMX_H
#define KILN_GEMM_AMX_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this CPU has AMX-BF16 and Linux granted this process the tile
 * state (ARCH_REQ_XCOMP_PERM); checked once. */
int kk_amx_ready(void);

/* The amx32 layout of W [N outputs, K inputs]: panels of 32 outputs, each
 * [K/32 steps][2 tiles of 16 outputs][16 input pairs][16 outputs x 2] bf16,
 * N and K zero-padded to multiples of 32. Its size in bytes: */
size_t kk_amx_packed_bytes(int64_t N, int64_t K);
/* Pack W [N,K] f32 row-major (rounded to bf16, nearest even) into out. */
void kk_amx_pack(const float *w, int64_t N, int64_t K, uint16_t *out);
/* W [N,K] f32 back from the packed layout. */
void kk_amx_unpack(const uint16_t *packed, int64_t N, int64_t K, float *out);

/* The bytes of the work buffer of kk_amx_linear on `threads` threads (x
 * packed, and the sums of each thread's work item when K is long). */
size_t kk_amx_work_bytes(int64_t rows, int64_t K, int threads);
/* Piece `part` of `parts` of the range [*lo, *hi), cut at multiples of
 * `unit` from *lo (possibly empty): how both AMX kernels split the last
 * work items so that the thread done first waits less for the other */
static inline void kk_piece(int64_t *lo, int64_t *hi, int64_t part, int64_t parts, int64_t unit) {
    int64_t n = (*hi - *lo + unit - 1) / unit, a = *lo + n * part / parts * unit, b = *lo + n * (part + 1) / parts * unit;
    *lo = a < *hi ? a : *hi;
    *hi = b < *hi ? b : *hi;
}

/* What the epilogue does to a sum s = x . W^T while it is in L1:
 *   v = act(s * scales + bias)            scales, bias [N] or NULL (scales: fp8's channel scales)
 *   y = res + gate[row / tokens] * v      when res is set: res [rows,N], gate [rows/tokens, N]
 *                                         with rows gate_ld floats apart, or
 *   y = res[row % tokens] + v             when res is set and gate is NULL: res [tokens,N],
 *                                         the same for every batch entry */
typedef struct kk_amx_epilogue {
    const float *scales, *bias;
    int act; /* KK_ACT_* */
    const float *res, *gate;
    int64_t gate_ld, tokens;
} kk_amx_epilogue;

/* The epilogue e of the sums c (nr rows of 32 f32, 64-byte aligned; of
 * them the first nc) -> rows [r0, r0+nr), outputs [n0, n0+nc) of y [.., N]
 * in y_fmt, f32 or bf16 rows: this GEMM's epilogue, for the GEMMs on CPUs
 * without AMX (gemm_f16.c); it runs on any CPU with AVX512-BF16. */
void kk_amx_epilogue_rows(const kk_amx_epilogue *e, void *y, int y_fmt, int64_t N, const float *c, int64_t r0,
                          int64_t nr, int64_t n0, int64_t nc);

/* y [rows,N] = the epilogue of x [rows,K] . W^T, bf16 products with f32
 * accumulation; x_fmt / y_fmt are KK_FMT_* (kernels.h): x f32 (rounded to
 * bf16 here), bf16 rows, or bf16 blocked - this GEMM's own operand layout,
 * read with no packing pass; y likewise (f32 with res); on `threads`
 * threads; work holds kk_amx_work_bytes(rows, K, threads). Returns 0 (and
 * does nothing) where it does not apply: no AMX, or no work buffer. */
int kk_amx_linear(const void *x, int x_fmt, const uint16_t *packed, int64_t N, int64_t K, const kk_amx_epilogue *e,
                  void *y, int y_fmt, int64_t rows, int threads, uint16_t *work);

/* The s8 products (AMX-INT8): W [N,K] s8 in panels of 32 outputs, per step
 * of 64 inputs two tiles of 16 input quads x 16 outputs x 4, N and K
 * zero-padded (to 32 and 64). Its size, and packing from / to row-major s8: */
size_t kk_amx_s8_packed_bytes(int64_t N, int64_t K);
void kk_amx_s8_pack(const int8_t *q, int64_t N, int64_t K, int8_t *out);
void kk_amx_s8_unpack(const int8_t *packed, int64_t N, int64_t K, int8_t *out);
/* y = the epilogue of (xq [rows,K] . Wq^T) * xs [rows] (s8 x s8, int32 sums;
 * e->scales are W's channel scales); work as for kk_amx_linear. */
int kk_amx_linear_s8(const int8_t *xq, const float *xs, const int8_t *packed, int64_t N, int64_t K,
                     const kk_amx_epilogue *e, void *y, int y_fmt, int64_t rows, int threads, void *work);

/* ---- shared by the AMX kernels (gemm_amx.c, attn_amx.c) ---- */
#include <immintrin.h>

/* functions built for AMX; only called after kk_amx_ready() */
#define AMX_FN __attribute__((target("amx-tile,amx-bf16,amx-int8,avx512f,avx512bf16,avx512bw,avx512vl,avx512dq")))

/* the LDTILECFG operand (palette 1) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kk_tile_config;

/* 2^x for 16 lanes (-inf and +inf included): x = n + f with n = floor(x),
 * f in [0, 1); 2^f by a degree-3 polynomial (7.5e-5 relative error: for
 * values rounded to bf16, 3.9e-3, anyway) and the 2^n by scalef, which
 * floors x itself and saturates to 0 and inf past the f32 range. Results
 * below 2^-126 are subnormal: this is for code that runs with them flushed
 * (MXCSR's FTZ and DAZ, as the attention does); elsewhere kk_exp2_16. NaN
 * stays NaN. */
AMX_FN static inline __m512 kk_exp2_16_ftz(__m512 x) {
    __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.07802419f), f, _mm512_set1_ps(0.22606721f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69583374f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.99992517f));
    return _mm512_scalef_ps(p, x);
}

/* 2^x as kk_exp2_16_ftz, with no result below 2^-125 and so no subnormal:
 * each subnormal result or operand costs a microcode assist (~150 cycles),
 * which made the ff GEMMs' GELU epilogue 2-3x slower; 2^-125 is 0 wherever
 * it is used (beside 1 in GELU's 1 + 2^t). -inf gives 2^-125; NaN stays NaN
 * (max_ps returns its second operand then). */
AMX_FN static inline __m512 kk_exp2_16(__m512 x) { return kk_exp2_16_ftz(_mm512_max_ps(_mm512_set1_ps(-125.0f), x)); }

#endif
