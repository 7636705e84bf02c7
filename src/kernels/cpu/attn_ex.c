/* attn_ex.c - attention with a scale, an additive bias [1 or B, 1 or H, Nq,
 * Nk] and a causal mask on AVX-512 (avx512f/bw/vl/dq: every AVX-512 CPU,
 * AMD Zen 4/5 included), for the text encoders (CLIP: causal; T5: position
 * bias, no scaling). The reference kk_attention_general is a double-precision
 * loop; this one takes the scores q k^T in double (T5's unscaled scores reach
 * tens) and the softmax and P V in f32, within ~2e-7 relative of it, so the
 * f32 and the bf16 backends both use it (attention is ~1% of an encoder's
 * FLOPs; its GEMMs set the dtype's speed).
 *
 * Work: tasks of QT query rows of one (batch entry, head), in parallel. A
 * task packs the keys it can see as K^T [Dh][Nkp] (Nkp: keys rounded up to
 * 16, zero padded) and V [nk][Dv] (Dv: Dh rounded up to 64, zero padded),
 * then takes RQ = 4 queries at a time: their scores against every visible
 * key (16 keys a step, K^T's rows shared by the 4 queries), the exact row
 * softmax over that full row (max first, so no online rescaling: a row is
 * Nk scores, RQ rows at a time), and P V with 4 x 4 accumulators of 16
 * lanes, summed in blocks of 16 keys. */
#include "kernels/cpu/attn_ex.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/onednn.h"
#include "base/base.h"
#include "kernels/kernels.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#define EX_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define QT 64 /* query rows per task */
#define RQ 4  /* query rows per register tile */

static int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* elements [j, j+16) of a row (f32, or bf16 widened: exact) as f32, lanes past n zero */
EX_FN static inline __m512 load16(const void *row, int bf16, int64_t j, int64_t n) {
    __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : n - j <= 0 ? (__mmask16)0 : (__mmask16)((1u << (n - j)) - 1u);
    if (bf16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + j)), 16));
    return _mm512_maskz_loadu_ps(m, (const float *)row + j);
}

/* e^x over 16 lanes, x <= 0 or -inf (scores minus their row maximum): the
 * Cephes expf (Cody-Waite reduction, degree-6 polynomial, ~1 ulp) that
 * fast.c's softmax uses; -inf gives exactly 0 (a masked key adds nothing) */
EX_FN static inline __m512 exp16(__m512 x) {
    __mmask16 ninf = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~ninf, p, _mm512_castsi512_ps(e));
}

typedef struct ex_args {
    const char *q, *k, *v;
    int bf16;
    size_t esz;
    const float *bias;
    int64_t sbb, sbh; /* bias strides of a batch entry and a head (0: broadcast) */
    float *o;
    int64_t B, Nq, Nk, H, Dh, D, Nkp, Dv;
    float scale;
    int causal;
} ex_args;

/* keys query i sees: j <= i when causal (kk_attention_general's rule) */
static inline int64_t keys_of(const ex_args *a, int64_t i) { return a->causal && i + 1 < a->Nk ? i + 1 : a->Nk; }

/* one task: queries [i0, i1) of head h of batch entry b; w holds
 * Dh*Nkp (K^T) + Nk*Dv (V) + RQ*Nkp (P) floats and RQ*Nkp (scores) doubles */
EX_FN static void ex_task(const ex_args *a, int64_t b, int64_t h, int64_t i0, int64_t i1, float *w) {
    const int64_t Dh = a->Dh, D = a->D, Dv = a->Dv;
    const int64_t nk = keys_of(a, i1 - 1), nkp = up(nk, 16);
    float *kt = w, *vp = kt + Dh * a->Nkp, *s = vp + a->Nk * Dv;
    double *sd = (double *)(s + RQ * a->Nkp); /* 64-byte aligned: every part is a multiple of 16 floats */
    /* K^T [Dh][nkp] and V [nk][Dv] of the keys this task's queries see */
    for (int64_t j = 0; j < nk; j++) {
        const char *kr = a->k + ((b * a->Nk + j) * D + h * Dh) * a->esz;
        const char *vr = a->v + ((b * a->Nk + j) * D + h * Dh) * a->esz;
        if (a->bf16) {
            for (int64_t d = 0; d < Dh; d++) {
                uint32_t u = (uint32_t)((const uint16_t *)kr)[d] << 16;
                memcpy(kt + d * a->Nkp + j, &u, 4);
            }
        } else {
            for (int64_t d = 0; d < Dh; d++) kt[d * a->Nkp + j] = ((const float *)kr)[d];
        }
        for (int64_t d = 0; d < Dv; d += 16) _mm512_storeu_ps(vp + j * Dv + d, load16(vr, a->bf16, d, Dh));
    }
    for (int64_t d = 0; d < Dh; d++)
        for (int64_t j = nk; j < nkp; j++) kt[d * a->Nkp + j] = 0;

    for (int64_t i = i0; i < i1; i += RQ) {
        int64_t nr = i1 - i < RQ ? i1 - i : RQ;
        const char *qr[RQ];
        const float *br[RQ];
        int64_t nkr[RQ];
        for (int r = 0; r < RQ; r++) { /* rows past nr repeat the last one (their results are dropped) */
            int64_t ii = i + (r < nr ? r : nr - 1);
            qr[r] = a->q + ((b * a->Nq + ii) * D + h * Dh) * a->esz;
            br[r] = a->bias ? a->bias + b * a->sbb + h * a->sbh + ii * a->Nk : NULL;
            nkr[r] = keys_of(a, ii);
        }
        const int64_t tk = nkr[RQ - 1]; /* the tile's widest row: causal rows grow with i */
        /* scores sd [RQ][tk] = scale * q k^T + bias in double, -inf past each
         * row's keys: T5 does not scale its scores (|s| reaches tens), and an
         * f32 dot product's rounding there moved its outputs by 5e-6 */
        const __m512d sc = _mm512_set1_pd(a->scale);
        for (int64_t j = 0; j < tk; j += 16) {
            __m512d acc[RQ][2];
            for (int r = 0; r < RQ; r++) acc[r][0] = acc[r][1] = _mm512_setzero_pd();
            const float *kc = kt + j;
            for (int64_t d = 0; d < Dh; d++) {
                __m512 kv = _mm512_loadu_ps(kc + d * a->Nkp);
                __m512d k0 = _mm512_cvtps_pd(_mm512_castps512_ps256(kv));
                __m512d k1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(kv), 1)));
                for (int r = 0; r < RQ; r++) {
                    float qd;
                    if (a->bf16) {
                        uint32_t u = (uint32_t)((const uint16_t *)qr[r])[d] << 16;
                        memcpy(&qd, &u, 4);
                    } else {
                        qd = ((const float *)qr[r])[d];
                    }
                    __m512d qv = _mm512_set1_pd((double)qd);
                    acc[r][0] = _mm512_fmadd_pd(qv, k0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_pd(qv, k1, acc[r][1]);
                }
            }
            for (int r = 0; r < RQ; r++) {
                int64_t left = nkr[r] - j;
                __mmask16 live = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
                __m512d x0 = _mm512_mul_pd(acc[r][0], sc), x1 = _mm512_mul_pd(acc[r][1], sc);
                if (br[r]) {
                    __m512 bv = load16(br[r], 0, j, nkr[r]);
                    x0 = _mm512_add_pd(x0, _mm512_cvtps_pd(_mm512_castps512_ps256(bv)));
                    x1 = _mm512_add_pd(x1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(bv), 1))));
                }
                double *row = sd + r * a->Nkp + j;
                _mm512_storeu_pd(row, _mm512_mask_blend_pd((__mmask8)live, _mm512_set1_pd(-INFINITY), x0));
                _mm512_storeu_pd(row + 8, _mm512_mask_blend_pd((__mmask8)(live >> 8), _mm512_set1_pd(-INFINITY), x1));
            }
        }
        /* the exact softmax of each row: max and s - max in double, e^(s -
         * max) in f32 into s (unnormalized), 1 / sum kept */
        float inv[RQ];
        for (int r = 0; r < RQ; r++) {
            double *dr = sd + r * a->Nkp;
            float *sr = s + r * a->Nkp;
            __m512d mx = _mm512_set1_pd(-INFINITY);
            for (int64_t j = 0; j < tk; j += 8) mx = _mm512_max_pd(mx, _mm512_loadu_pd(dr + j));
            double m = _mm512_reduce_max_pd(mx);
            if (m == -INFINITY) { /* every key masked: the row gives 0 */
                memset(sr, 0, sizeof(float) * (size_t)up(tk, 16));
                inv[r] = 0;
                continue;
            }
            __m512 sum = _mm512_setzero_ps();
            __m512d mv = _mm512_set1_pd(m);
            for (int64_t j = 0; j < tk; j += 16) {
                __m256 lo = _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_loadu_pd(dr + j), mv));
                __m256 hi = _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_loadu_pd(dr + j + 8), mv));
                __m512 x = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
                __m512 e = exp16(x);
                _mm512_storeu_ps(sr + j, e);
                sum = _mm512_add_ps(sum, e);
            }
            inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
        }
        /* o = P V / sum, 64 output dims (4 vectors) at a time, summed in
         * blocks of 16 keys added into totals: T5's padding tokens make long
         * runs of equal values, whose one-by-one f32 sum drifts by N * eps */
        for (int64_t dc = 0; dc < Dv; dc += 64) {
            __m512 tot[RQ][4];
            for (int r = 0; r < RQ; r++)
                for (int c = 0; c < 4; c++) tot[r][c] = _mm512_setzero_ps();
            for (int64_t j0 = 0; j0 < tk; j0 += 16) {
                __m512 acc[RQ][4];
                for (int r = 0; r < RQ; r++)
                    for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
                int64_t j1 = j0 + 16 < tk ? j0 + 16 : tk;
                for (int64_t j = j0; j < j1; j++) {
                    const float *vr = vp + j * Dv + dc;
                    __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16), v2 = _mm512_loadu_ps(vr + 32),
                           v3 = _mm512_loadu_ps(vr + 48);
                    for (int r = 0; r < RQ; r++) {
                        __m512 p = _mm512_set1_ps(s[r * a->Nkp + j]);
                        acc[r][0] = _mm512_fmadd_ps(p, v0, acc[r][0]);
                        acc[r][1] = _mm512_fmadd_ps(p, v1, acc[r][1]);
                        acc[r][2] = _mm512_fmadd_ps(p, v2, acc[r][2]);
                        acc[r][3] = _mm512_fmadd_ps(p, v3, acc[r][3]);
                    }
                }
                for (int r = 0; r < RQ; r++)
                    for (int c = 0; c < 4; c++) tot[r][c] = _mm512_add_ps(tot[r][c], acc[r][c]);
            }
            for (int r = 0; r < nr; r++) {
                float *orow = a->o + (b * a->Nq + i + r) * D + h * Dh;
                __m512 iv = _mm512_set1_ps(inv[r]);
                for (int c = 0; c < 4; c++) {
                    int64_t d = dc + 16 * c, left = Dh - d;
                    if (left <= 0) break;
                    __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
                    _mm512_mask_storeu_ps(orow + d, m, _mm512_mul_ps(tot[r][c], iv));
                }
            }
        }
    }
}

int kk_attention_ex_avx512(const void *q, const void *k, const void *v, int bf16, const float *bias,
                           const int64_t bs[4], float *o, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh,
                           float scale, int causal) {
    if (!kk_avx512_ready()) return 0;
    if (B <= 0 || Nq <= 0 || H <= 0 || Dh <= 0) return 1;
    if (Nk <= 0) { /* no keys: every row gives 0, as the reference */
        memset(o, 0, sizeof(float) * (size_t)(B * Nq * H * Dh));
        return 1;
    }
    ex_args a = {.q = q, .k = k, .v = v, .bf16 = bf16, .esz = bf16 ? 2 : 4, .bias = bias, .o = o, .B = B, .Nq = Nq,
                 .Nk = Nk, .H = H, .Dh = Dh, .D = H * Dh, .Nkp = up(Nk, 16), .Dv = up(Dh, 64), .scale = scale,
                 .causal = causal};
    a.sbb = bias && bs[0] > 1 ? bs[1] * Nq * Nk : 0;
    a.sbh = bias && bs[1] > 1 ? Nq * Nk : 0;
    /* one work slice per thread, in a buffer the calling thread keeps (a
     * steady state allocates nothing) */
    int nt = omp_get_max_threads();
    size_t per = (size_t)(Dh * a.Nkp + Nk * a.Dv + 3 * RQ * a.Nkp) + 16; /* floats; 16: keeps slices 64-byte aligned */
    per = (per + 15) / 16 * 16;
    float *work = kk_scratch(KK_SCRATCH_ATTN_EX, sizeof(float) * per * (size_t)nt);
    if (!work) return 0;
    int64_t tiles = (Nq + QT - 1) / QT;
#pragma omp parallel for collapse(3) schedule(dynamic) num_threads(nt)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < tiles; t++) {
                int64_t i0 = t * QT, i1 = i0 + QT < Nq ? i0 + QT : Nq;
                ex_task(&a, b, h, i0, i1, work + per * (size_t)omp_get_thread_num());
            }
    return 1;
}
