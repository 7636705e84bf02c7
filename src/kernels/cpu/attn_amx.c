/* attn_amx.c - fused flash attention on AMX tiles, for bf16 compute with a
 * head size of 64 (every SD3 / SD3.5 model).
 *
 * Per (batch, head): q (scaled by 1/sqrt(Dh)), k and v are converted to bf16
 * once, k and v straight into the tile layouts the products want. Then per
 * block of 16 queries, for each block of 64 keys:
 *   S [16 x 64]  = Q K^T        4 accumulator tiles, 2 steps over Dh
 *   online softmax (AVX-512):   running max m and sum l per row, P = exp(S - m) in bf16
 *   T [16 x 64]  = P V          4 accumulator tiles, 2 steps over the keys
 *   O = O * exp(m_old - m) + T  (f32)
 * and O / l is the output. The N x N matrix is never formed; parallel over
 * batch x heads. */
#include "kernels/cpu/attn_amx.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define QB 16 /* queries per block: one tile's rows */
#define KB 64 /* keys per block: four 16-column accumulator tiles */
#define DH 64

AMX_FN static inline void store_bf16(uint16_t *dst, __m512 x) {
    __m256bh h = _mm512_cvtneps_pbh(x);
    memcpy(dst, &h, 32);
}

/* one (batch, head): qh [Nqp x 64] bf16 (scaled, zero-padded rows), kp and vp packed */
AMX_FN static void head(const uint16_t *qh, const uint16_t *kp, const uint16_t *vp, float *o, int64_t ostride,
                        int64_t Nq, int64_t Nk) {
    int64_t nkb = (Nk + KB - 1) / KB;
    float S[QB * KB] __attribute__((aligned(64))), T[QB * DH] __attribute__((aligned(64)));
    float O[QB * DH] __attribute__((aligned(64)));
    uint16_t P[QB * KB] __attribute__((aligned(64)));
    for (int64_t i0 = 0; i0 < Nq; i0 += QB) {
        float m[QB], l[QB], alpha[QB];
        for (int r = 0; r < QB; r++) m[r] = -INFINITY, l[r] = 0;
        memset(O, 0, sizeof O);
        const uint16_t *q = qh + i0 * DH;
        for (int64_t kb = 0; kb < nkb; kb++) {
            /* S = Q K^T: tiles 0-3 accumulate, 4-5 hold Q's two halves of Dh, 6-7 stream K */
            const uint16_t *k = kp + kb * 4 * 2 * 512;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            _tile_loadd(4, q, DH * 2);
            _tile_loadd(5, q + 32, DH * 2);
#define QK(j)                                     \
    _tile_loadd(6, k + ((j)*2 + 0) * 512, 64);    \
    _tile_dpbf16ps(j, 4, 6);                      \
    _tile_loadd(7, k + ((j)*2 + 1) * 512, 64);    \
    _tile_dpbf16ps(j, 5, 7);                      \
    _tile_stored(j, S + (j)*16, KB * 4);
            QK(0) QK(1) QK(2) QK(3)
#undef QK
            int valid = (int)(Nk - kb * KB < KB ? Nk - kb * KB : KB);
            for (int r = 0; r < QB; r++) {
                float *s = S + r * KB;
                for (int j = valid; j < KB; j++) s[j] = -INFINITY;
                __m512 s0 = _mm512_load_ps(s), s1 = _mm512_load_ps(s + 16), s2 = _mm512_load_ps(s + 32),
                       s3 = _mm512_load_ps(s + 48);
                float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(s0, s1), _mm512_max_ps(s2, s3)));
                float mn = mx > m[r] ? mx : m[r];
                alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
                m[r] = mn;
                __m512 vm = _mm512_set1_ps(mn);
                __m512 p0 = kk_exp16(_mm512_sub_ps(s0, vm)), p1 = kk_exp16(_mm512_sub_ps(s1, vm)),
                       p2 = kk_exp16(_mm512_sub_ps(s2, vm)), p3 = kk_exp16(_mm512_sub_ps(s3, vm));
                l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(p0, p1), _mm512_add_ps(p2, p3)));
                uint16_t *pr = P + r * KB;
                store_bf16(pr, p0);
                store_bf16(pr + 16, p1);
                store_bf16(pr + 32, p2);
                store_bf16(pr + 48, p3);
            }
            /* T = P V: tiles 0-3 accumulate the four 16-wide slices of Dh, 4-5 hold P, 6-7 stream V */
            const uint16_t *v = vp + kb * 2 * 4 * 512;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            _tile_loadd(4, P, KB * 2);
            _tile_loadd(5, P + 32, KB * 2);
#define PV(n)                                     \
    _tile_loadd(6, v + (0 * 4 + (n)) * 512, 64);  \
    _tile_dpbf16ps(n, 4, 6);                      \
    _tile_loadd(7, v + (1 * 4 + (n)) * 512, 64);  \
    _tile_dpbf16ps(n, 5, 7);                      \
    _tile_stored(n, T + (n)*16, DH * 4);
            PV(0) PV(1) PV(2) PV(3)
#undef PV
            for (int r = 0; r < QB; r++) {
                __m512 a = _mm512_set1_ps(alpha[r]);
                for (int c = 0; c < DH; c += 16)
                    _mm512_store_ps(O + r * DH + c, _mm512_fmadd_ps(_mm512_load_ps(O + r * DH + c), a,
                                                                    _mm512_load_ps(T + r * DH + c)));
            }
        }
        int rows = (int)(Nq - i0 < QB ? Nq - i0 : QB);
        for (int r = 0; r < rows; r++) {
            __m512 inv = _mm512_set1_ps(1.0f / l[r]);
            for (int c = 0; c < DH; c += 16)
                _mm512_storeu_ps(o + (i0 + r) * ostride + c, _mm512_mul_ps(_mm512_load_ps(O + r * DH + c), inv));
        }
    }
}

AMX_FN static void pack_head(const float *q, const float *k, const float *v, int64_t stride, int64_t Nq, int64_t Nk,
                             float scale, uint16_t *qh, uint16_t *kp, uint16_t *vp) {
    int64_t Nqp = (Nq + QB - 1) / QB * QB, Nkp = (Nk + KB - 1) / KB * KB;
    __m512 sc = _mm512_set1_ps(scale);
    for (int64_t i = 0; i < Nqp; i++)
        for (int c = 0; c < DH; c += 16) {
            __m512 x = i < Nq ? _mm512_mul_ps(_mm512_loadu_ps(q + i * stride + c), sc) : _mm512_setzero_ps();
            store_bf16(qh + i * DH + c, x);
        }
    /* K: [key/16][Dh half][Dh pair r][key%16][2]; V: [key/64][key half][Dh/16][key pair r][Dh%16][2] */
    for (int64_t key = 0; key < Nkp; key++) {
        uint16_t kb16[DH], vb16[DH];
        for (int c = 0; c < DH; c += 16) {
            store_bf16(kb16 + c, key < Nk ? _mm512_loadu_ps(k + key * stride + c) : _mm512_setzero_ps());
            store_bf16(vb16 + c, key < Nk ? _mm512_loadu_ps(v + key * stride + c) : _mm512_setzero_ps());
        }
        int64_t kk = key / 16, n = key % 16;
        for (int d = 0; d < DH; d += 2) {
            uint16_t *dst = kp + ((kk * 2 + d / 32) * 16 + (d % 32) / 2) * 32 + n * 2;
            dst[0] = kb16[d];
            dst[1] = kb16[d + 1];
        }
        int64_t kb = key / KB, half = (key % KB) / 32, r = (key % 32) / 2, e = key % 2;
        for (int d = 0; d < DH; d++) vp[(((kb * 2 + half) * 4 + d / 16) * 16 + r) * 32 + (d % 16) * 2 + e] = vb16[d];
    }
}

AMX_FN static int run(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                      int64_t H, int64_t Dh) {
    int64_t D = H * Dh, Nqp = (Nq + QB - 1) / QB * QB, Nkp = (Nk + KB - 1) / KB * KB;
    float scale = 1.0f / sqrtf((float)Dh);
    int failed = 0;
#pragma omp parallel
    {
        uint16_t *qh = aligned_alloc(64, (size_t)Nqp * DH * 2), *kp = aligned_alloc(64, (size_t)Nkp * DH * 2),
                 *vp = aligned_alloc(64, (size_t)Nkp * DH * 2);
        kk_tile_config cfg = {.palette = 1};
        for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
        if (!qh || !kp || !vp) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        else _tile_loadconfig(&cfg);
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                if (!qh || !kp || !vp) continue;
                pack_head(q + b * Nq * D + h * Dh, k + b * Nk * D + h * Dh, v + b * Nk * D + h * Dh, D, Nq, Nk, scale,
                          qh, kp, vp);
                head(qh, kp, vp, o + b * Nq * D + h * Dh, D, Nq, Nk);
            }
        if (qh && kp && vp) _tile_release();
        free(qh);
        free(kp);
        free(vp);
    }
    return !failed;
}

int kk_attention_amx(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                     int64_t H, int64_t Dh) {
    /* the check comes first, outside any function built for AMX */
    if (Dh != DH || Nq < 1 || Nk < 1 || !kk_amx_ready()) return 0;
    return run(q, k, v, o, B, Nq, Nk, H, Dh);
}
