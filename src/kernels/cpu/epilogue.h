/* epilogue.h - what kiln's GEMMs do to their sums before writing them
 * (bias, activation, channel scales, a gated residual), shared by the AMX
 * GEMM (gemm_amx.c, which defines kk_amx_epilogue_rows) and the fp16 GEMM
 * (gemm_f16.c), and how both split their last work items. */
#ifndef KILN_EPILOGUE_H
#define KILN_EPILOGUE_H

#include <stddef.h>
#include <stdint.h>

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

#endif
