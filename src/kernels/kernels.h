/* kernels.h - the backend interface: every executor calls kernels through a
 * kk_backend, so a fast backend can replace the reference one op by op while
 * the reference kernels stay as the oracle in tests.
 * All tensors are f32, row-major, and shapes are given in comments. */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <stdint.h>

typedef struct kk_backend {
    const char *name;
    /* y [rows,M] = x [rows,K] . w [M,K]^T + b [M] (b may be NULL) */
    void (*linear)(const float *x, const float *w, const float *b, float *y, int64_t rows,
                   int64_t K, int64_t M);
    void (*silu)(const float *x, float *y, int64_t n);
    void (*gelu_tanh)(const float *x, float *y, int64_t n);
    /* y [rows,D] = (x - mean) / sqrt(var + eps), per row */
    void (*layernorm)(const float *x, float *y, int64_t rows, int64_t D, float eps);
    /* y [rows,H*Dh] = x / rms(x per head) * w [Dh] */
    void (*rmsnorm_heads)(const float *x, const float *w, float *y, int64_t rows, int64_t H,
                          int64_t Dh, float eps);
    /* y [B,N,D] = x * (1 + scale [B,D]) + shift [B,D] */
    void (*modulate)(const float *x, const float *shift, const float *scale, float *y, int64_t B,
                     int64_t N, int64_t D);
    /* y [B,N,D] = res + gate [B,D] * v */
    void (*gate_add)(const float *res, const float *gate, const float *v, float *y, int64_t B,
                     int64_t N, int64_t D);
    /* o [B,Nq,H*Dh] = softmax(q k^T / sqrt(Dh)) v, per batch and head */
    void (*attention)(const float *q, const float *k, const float *v, float *o, int64_t B,
                      int64_t Nq, int64_t Nk, int64_t H, int64_t Dh);
} kk_backend;

/* The reference kernels: straightforward loops, double accumulation. */
const kk_backend *kk_reference(void);

#endif
