/* attn_amx.h - fused flash attention on AMX tiles (attn_amx.c). */
#ifndef KILN_ATTN_AMX_H
#define KILN_ATTN_AMX_H

#include "kernels/cpu/attn_rows.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/kernels.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The bytes of kk_attention_amx's work buffer (every head's packed q, k, v). */
size_t kk_attention_amx_work_bytes(int64_t B, int64_t Nq, int64_t Nk, int64_t H);
/* o [B,Nq,H*Dh] = softmax(q k^T / sqrt(Dh)) v with bf16 operands and f32
 * accumulation, one pass with an online softmax; work holds
 * kk_attention_amx_work_bytes. Returns 0 (and does nothing) where it does
 * not apply: no AMX on this CPU, head size not 64, or no work buffer. */
int kk_attention_amx(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                     int64_t H, int64_t Dh, uint16_t *work);

/* The same over two token segments: q = [qa; qb] along the tokens of each
 * batch (qa [B,Na,H*Dh], qb [B,Nb,H*Dh]; qb NULL: qa's tokens alone ask,
 * o [B,Na,H*Dh]), k and v alike, read in place, f32 or (bf16 set) bf16 rows;
 * o [B,Na+Nb,H*Dh] in o_fmt: f32 or bf16 rows, or blocked by segment as
 * attention_joint_bf16 writes it (kernels.h); work holds
 * kk_attention_amx_work_bytes(B, Na+Nb, Na+Nb, H). */
int kk_attention_amx_joint(const void *qa, const void *ka, const void *va, const void *qb, const void *kb,
                           const void *vb, int bf16, void *o, int o_fmt, int64_t B, int64_t Na, int64_t Nb, int64_t H,
                           int64_t Dh, uint16_t *work);

#endif
