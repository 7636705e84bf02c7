/* attn_bf16.h - fused flash attention on AVX512-BF16 (attn_bf16.c), for bf16
 * compute on CPUs with neither AMX nor AVX512-FP16 (AMD Zen 4 / Zen 5), any
 * head size that is a multiple of 64 up to 1024. */
#ifndef KILN_ATTN_BF16_H
#define KILN_ATTN_BF16_H

#include <stddef.h>
#include <stdint.h>

/* The bytes of the work buffer (every head's packed q, k and v, and a state
 * per thread of omp_get_max_threads()) for head size Dh; 0 for a head size
 * that does not run here (Dh not a multiple of 64 in [64, 1024]). */
size_t kk_attention_bf16_work_bytes(int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh);

/* o [B,Nq,H*Dh] = softmax(q k^T / sqrt(Dh)) v, all f32 (kk_attention_amx's
 * call, any head size a multiple of 64 up to 1024); q and k rotated first by
 * the table rope [Nk, Dh] (kk_rope_row's values; NULL: none); work holds
 * kk_attention_bf16_work_bytes(B, Nq, Nk, H, Dh), asked for on this thread. */
int kk_attention_bf16(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                      int64_t H, int64_t Dh, const float *rope, void *work);

/* o = softmax(q k^T / sqrt(Dh)) v over two token segments, exactly as
 * kk_attention_amx_joint takes them (attn_amx.h; qb NULL: qa's tokens alone
 * ask; f32 or, bf16 set, bf16 rows; o f32 or bf16 rows, or blocked by
 * segment), with bf16 products summed in f32 (VDPBF16PS) and an f32
 * softmax; q and k rotated by rope [Na+Nb, Dh] (token i of the
 * concatenation: row i; NULL: none) as they are packed; work holds kk_attention_bf16_work_bytes(B, Na+Nb, Na+Nb, H, Dh).
 * Returns 0 (and does nothing) where it does not apply: no AVX512-BF16,
 * a head size that does not run here, or no work buffer. */
int kk_attention_bf16_joint(const void *qa, const void *ka, const void *va, const void *qb, const void *kb,
                            const void *vb, int bf16, void *o, int o_fmt, int64_t B, int64_t Na, int64_t Nb, int64_t H,
                            int64_t Dh, const float *rope, void *work);

#endif
