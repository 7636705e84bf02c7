/* gemm_avx2.h - kiln's f32 GEMM for CPUs with AVX2 + FMA and no AVX-512
 * (class avx2, docs/PERFORMANCE.md; gemm_avx2.c): weights packed once (the
 * "f32p16" layout of the weight cache), every output's sum over its inputs
 * in one fixed order whatever the number of rows, so that a row's result
 * does not depend on the rest of its batch. */
#ifndef KILN_GEMM_AVX2_H
#define KILN_GEMM_AVX2_H

#include <stddef.h>
#include <stdint.h>

/* The f32p16 layout of W [N outputs, K inputs]: panels of 16 outputs, each
 * [K][16] f32 (an input's 16 outputs side by side), N padded to 16 with
 * zeros. Its size in bytes: */
size_t kk_avx2_packed_bytes(int64_t N, int64_t K);
/* Pack W [N,K] f32 row-major into out; and back. */
void kk_avx2_pack(const float *w, int64_t N, int64_t K, void *out);
void kk_avx2_unpack(const void *packed, int64_t N, int64_t K, float *out);

/* y [rows,N] = act(x [rows,K] . W^T + bias) (act: KK_ACT_*; bias [N] or
 * NULL), x and y f32 row-major, on `threads` threads. Output (r, n) is
 * the FMA chain over k = 0 .. K-1 in order from 0, then + bias, then act:
 * the same bits for any rows and threads. Returns 0 (and does nothing) on
 * a CPU below the avx2 class. */
int kk_avx2_linear(const float *x, const void *packed, int64_t N, int64_t K, const float *bias, int act, float *y,
                   int64_t rows, int threads);

#endif
