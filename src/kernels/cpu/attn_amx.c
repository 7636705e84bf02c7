/* attn_amx.c - fused flash attention on AMX tiles, for bf16 compute with a
 * head size of 64 (every SD3 / SD3.5 model).
 *
 * Per (batch, head): q (scaled by 1/sqrt(Dh)), k and v are converted to bf16
 * once, straight into the tile layouts the products want. Everything runs
 * transposed (keys and dims down, the 16 queries of a block across one
 * vector), so the softmax's max and sum go down columns with no horizontal
 * reductions. Per block of 16 queries, for each block of 64 keys:
 *   S^T [64 x 16] = K Q^T         4 accumulator tiles, 2 steps over Dh
 *   online softmax (AVX-512):     running max m and sum l per query, P^T = exp(S^T - m) in bf16
 *   O^T [64 x 16] = O^T exp(m_old - m) + V^T P^T   4 accumulator tiles, 2 steps over the keys
 * and (O^T)^T / l is the output. The N x N matrix is never formed; parallel
 * over batch x heads. */
#include "kernels/cpu/attn_amx.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define QB 16 /* queries per block: one tile's rows */
#define KB 64 /* keys per block: four 16-column accumulator tiles */
#define DH 64

/* 2^x for 16 lanes, x <= 0 (clamped at -126): degree-3 polynomial on the
 * fraction, 1.1e-4 relative error - P is rounded to bf16 (3.9e-3) anyway */
AMX_FN static inline __m512 exp2_16(__m512 x) {
    __m512 t = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.05459283f), f, _mm512_set1_ps(0.24221838f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69336869f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

AMX_FN static inline void store_bf16(uint16_t *dst, __m512 x) {
    __m256bh h = _mm512_cvtneps_pbh(x);
    memcpy(dst, &h, 32);
}

/* one (batch, head): qp (Q^T tiles per block of 16 queries, scaled), kp and
 * vp packed by pack_head */
AMX_FN static void head(const uint16_t *qp, const uint16_t *kp, const uint16_t *vp, float *o, int64_t ostride,
                        int64_t Nq, int64_t Nk) {
    int64_t nkb = (Nk + KB - 1) / KB;
    float St[KB * QB] __attribute__((aligned(64))); /* S^T: 64 keys x 16 queries */
    float Ot[DH * QB] __attribute__((aligned(64))); /* O^T: 64 dims x 16 queries */
    uint16_t Pt[KB * QB] __attribute__((aligned(64))); /* P^T in key pairs: [32][16 queries x 2] */
    /* bf16 pairs (even key, odd key) per query: [e0 o0 e1 o1 ...] from [e0..e15 o0..o15] */
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t i0 = 0; i0 < Nq; i0 += QB, qp += 2 * 512) {
        __m512 m = _mm512_set1_ps(-INFINITY), l = _mm512_setzero_ps();
        memset(Ot, 0, sizeof Ot);
        for (int64_t kb = 0; kb < nkb; kb++) {
            /* S^T = K Q^T: tiles 0-3 = keys 16j.., 4-5 hold Q^T's two halves of Dh, 6-7 stream K */
            const uint16_t *k = kp + kb * KB * DH;
            _tile_loadd(4, qp, 64);
            _tile_loadd(5, qp + 512, 64);
#define QK(j)                                      \
    _tile_zero(j);                                 \
    _tile_loadd(6, k + (j)*16 * DH, DH * 2);       \
    _tile_dpbf16ps(j, 6, 4);                       \
    _tile_loadd(7, k + (j)*16 * DH + 32, DH * 2);  \
    _tile_dpbf16ps(j, 7, 5);                       \
    _tile_stored(j, St + (j)*16 * QB, QB * 4);
            QK(0) QK(1) QK(2) QK(3)
#undef QK
            /* online softmax down the columns (one lane per query): no horizontal reductions */
            int valid = (int)(Nk - kb * KB < KB ? Nk - kb * KB : KB);
            __m512 mx = m;
            for (int r = 0; r < valid; r++) mx = _mm512_max_ps(mx, _mm512_load_ps(St + r * QB));
            /* the scores are in log2 units (log2 e is folded into q's scale); when no
             * query's max moved, nothing needs rescaling */
            int moved = _mm512_cmp_ps_mask(mx, m, _CMP_GT_OQ) != 0;
            __m512 alpha = moved ? exp2_16(_mm512_sub_ps(m, mx)) : _mm512_set1_ps(1.0f); /* m = -inf at first: O, l are 0 */
            m = mx;
            __m512 sum = _mm512_setzero_ps();
            for (int r = 0; r < KB; r += 2) {
                __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
                if (r < valid) p0 = exp2_16(_mm512_sub_ps(_mm512_load_ps(St + r * QB), m));
                if (r + 1 < valid) p1 = exp2_16(_mm512_sub_ps(_mm512_load_ps(St + (r + 1) * QB), m));
                sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
                __m512i pair = _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
                _mm512_store_si512(Pt + r * QB, pair);
            }
            l = _mm512_fmadd_ps(l, alpha, sum);
            if (moved)
                for (int d = 0; d < DH; d++) _mm512_store_ps(Ot + d * QB, _mm512_mul_ps(_mm512_load_ps(Ot + d * QB), alpha));
            /* O^T += V^T P^T: tiles 0-3 = dims 16n.., 4-5 hold P^T (keys 0-31, 32-63), 6-7 stream V^T */
            const uint16_t *v = vp + kb * KB * DH;
            _tile_loadd(4, Pt, 64);
            _tile_loadd(5, Pt + 512, 64);
#define PV(n)                                      \
    _tile_loadd(n, Ot + (n)*16 * QB, QB * 4);      \
    _tile_loadd(6, v + ((n)*2 + 0) * 512, 64);     \
    _tile_dpbf16ps(n, 6, 4);                       \
    _tile_loadd(7, v + ((n)*2 + 1) * 512, 64);     \
    _tile_dpbf16ps(n, 7, 5);                       \
    _tile_stored(n, Ot + (n)*16 * QB, QB * 4);
            PV(0) PV(1) PV(2) PV(3)
#undef PV
        }
        /* o = (O^T)^T / l */
        float inv[QB] __attribute__((aligned(64)));
        _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), l));
        int rows = (int)(Nq - i0 < QB ? Nq - i0 : QB);
        for (int r = 0; r < rows; r++) {
            float *dst = o + (i0 + r) * ostride;
            for (int d = 0; d < DH; d++) dst[d] = Ot[d * QB + r] * inv[r];
        }
    }
}

/* Layouts, per (batch, head):
 * Q^T: [query/16][Dh half][Dh pair][query%16][2] (scaled, zero past Nq);
 * K:   [key][Dh] (zero past Nk, to a whole block of 64);
 * V^T: [key/64][Dh/16][key half][Dh%16][key%32] (zero past Nk).
 * One token (row) of every head at a time: the rows of q, k and v are read
 * whole and in order (per head they would be 256-byte pieces 6 KiB apart,
 * which the prefetchers do not follow). */
AMX_FN static void pack_q_row(const float *row, int64_t i, int64_t H, int64_t Nqp, float scale, uint16_t *qp) {
    __m512 sc = _mm512_set1_ps(scale);
    for (int64_t h = 0; h < H; h++) {
        uint16_t b16[DH];
        for (int c = 0; c < DH; c += 16)
            store_bf16(b16 + c, row ? _mm512_mul_ps(_mm512_loadu_ps(row + h * DH + c), sc) : _mm512_setzero_ps());
        uint16_t *blk = qp + h * Nqp * DH + (i / QB) * 2 * 512 + (i % QB) * 2;
        for (int d = 0; d < DH; d += 2) {
            uint16_t *dst = blk + (d / 32) * 512 + ((d % 32) / 2) * 32;
            dst[0] = b16[d];
            dst[1] = b16[d + 1];
        }
    }
}

AMX_FN static void pack_kv_row(const float *krow, const float *vrow, int64_t key, int64_t H, int64_t Nkp, uint16_t *kp,
                               uint16_t *vp) {
    for (int64_t h = 0; h < H; h++) {
        uint16_t vb16[DH];
        uint16_t *kdst = kp + h * Nkp * DH + key * DH;
        for (int c = 0; c < DH; c += 16) {
            store_bf16(kdst + c, krow ? _mm512_loadu_ps(krow + h * DH + c) : _mm512_setzero_ps());
            store_bf16(vb16 + c, vrow ? _mm512_loadu_ps(vrow + h * DH + c) : _mm512_setzero_ps());
        }
        uint16_t *blk = vp + h * Nkp * DH + (key / KB) * KB * DH + ((key % KB) / 32) * 512 + key % 32;
        for (int d = 0; d < DH; d++) blk[(d / 16) * 1024 + (d % 16) * 32] = vb16[d];
    }
}

AMX_FN static void run(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                       int64_t H, int64_t Dh, uint16_t *all) {
    int64_t D = H * Dh, Nqp = (Nq + QB - 1) / QB * QB, Nkp = (Nk + KB - 1) / KB * KB;
    float scale = 1.4426950408889634f / sqrtf((float)Dh); /* log2 e / sqrt(Dh): softmax in base 2 */
    size_t per_b = (size_t)(H * (Nqp + 2 * Nkp) * DH);
#pragma omp parallel
    {
        /* flush denormals to zero here: a rescale by a tiny exp(m_old - m) makes
         * them by the thousand, and each one costs a microcode assist */
        unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);
        kk_tile_config cfg = {.palette = 1};
        for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
        _tile_loadconfig(&cfg);
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < (Nqp > Nkp ? Nqp : Nkp); i++) {
                uint16_t *qp = all + b * per_b, *kp = qp + H * Nqp * DH, *vp = kp + H * Nkp * DH;
                if (i < Nqp) pack_q_row(i < Nq ? q + (b * Nq + i) * D : NULL, i, H, Nqp, scale, qp);
                if (i < Nkp)
                    pack_kv_row(i < Nk ? k + (b * Nk + i) * D : NULL, i < Nk ? v + (b * Nk + i) * D : NULL, i, H, Nkp,
                                kp, vp);
            }
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                const uint16_t *qp = all + b * per_b, *kp = qp + H * Nqp * DH, *vp = kp + H * Nkp * DH;
                head(qp + h * Nqp * DH, kp + h * Nkp * DH, vp + h * Nkp * DH, o + b * Nq * D + h * Dh, D, Nq, Nk);
            }
        _tile_release();
        _mm_setcsr(csr);
    }
}

size_t kk_attention_amx_work_bytes(int64_t B, int64_t Nq, int64_t Nk, int64_t H) {
    int64_t Nqp = (Nq + QB - 1) / QB * QB, Nkp = (Nk + KB - 1) / KB * KB;
    return sizeof(uint16_t) * (size_t)(B * H * (Nqp + 2 * Nkp) * DH);
}

int kk_attention_amx(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                     int64_t H, int64_t Dh, uint16_t *work) {
    /* the check comes first, outside any function built for AMX */
    if (Dh != DH || Nq < 1 || Nk < 1 || !work || !kk_amx_ready()) return 0;
    run(q, k, v, o, B, Nq, Nk, H, Dh, work);
    return 1;
}
