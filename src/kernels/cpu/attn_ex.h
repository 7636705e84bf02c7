/* attn_ex.h - attention with a scale, an additive bias and a causal mask
 * (the text encoders' attention_ex) on AVX-512 (attn_ex.c). */
#ifndef KILN_ATTN_EX_H
#define KILN_ATTN_EX_H

#include <stddef.h>
#include <stdint.h>

/* o [B,Nq,H*Dh] f32 = softmax(scale * q k^T + bias) v per batch entry and
 * head, exactly the contract of kk_attention_general (kernels.h): q
 * [B,Nq,H*Dh], k and v [B,Nk,H*Dh], f32 or (bf16 set) bf16 rows; bias
 * [Bb,Hb,Nq,Nk] f32 with bs its shape (Bb 1 or B, Hb 1 or H; NULL: none);
 * causal: key j only for query i >= j; a key whose score is -inf adds
 * nothing and a row of such keys gives 0. Scores in double, softmax and
 * P V in f32 (any head size). Returns 0 and writes nothing where it cannot run: no
 * AVX-512 on this CPU, or no memory for its per-thread work buffers. */
int kk_attention_ex_avx512(const void *q, const void *k, const void *v, int bf16, const float *bias,
                           const int64_t bs[4], float *o, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh,
                           float scale, int causal);

#endif
