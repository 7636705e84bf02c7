/* attn_ex.c - attention with a scale, an additive bias [1 or B, 1 or H, Nq,
 * Nk] and a causal mask on AVX-512 (avx512f/bw/vl/dq: every AVX-512 CPU,
 * AMD Zen 4/5 included), for the text encoders (CLIP: causal; T5: position
 * bias, no scaling). The reference kk_attention_general is a double-precision
 * loop; this one keeps f32 throughout (products, softmax, sums), which is
 * within 1e-6 relative of it, so the f32 and the bf16 backends both use it
 * (attention is ~1% of an encoder's FLOPs; its GEMMs set the dtype's speed).
 *
 * Work: tasks of QT query rows of one (batch entry, head), in parallel. A
 * task packs the keys it can see as K^T [Dh][Nkp] (Nkp: keys rounded up to
 * 16, zero padded) and V [nk][Dv] (Dv: Dh rounded up to 64, zero padded),
 * then takes RQ = 4 queries at a time: their scores against every visible
 * key (16 keys a vector, K^T's rows shared by the 4 queries), the exact row
 * softmax over that full row (max first, so no rescaling pass: the score
 * rows are short, QT x Nk floats at most), and P V with 4 x 4 accumulators
 * of 16 lanes. */
#include "kernels/cpu/attn_ex.h"
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
    __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
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
 * Dh*Nkp (K^T) + Nk*Dv (V) + RQ*Nkp (scores) floats */
EX_FN static void ex_task(const ex_args *a, int64_t b, int64_t h, int64_t i0, int64_t i1, float *w) {
    const int64_t Dh = a->Dh, D = a->D, Dv = a->Dv;
    const int64_t nk = keys_of(a, i1 - 1), nkp = up(nk, 16);
    float *kt = w, *vp = kt + Dh * a->Nkp, *s = vp + a->Nk * Dv;
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
        const __m512 sc = _mm512_set1_ps(a->scale);
        /* scores s [RQ][tk] = scale * q k^T + bias, -inf past each row's keys */
        for (int64_t j = 0; j < tk; j += 16) {
            __m512 acc[RQ];
            for (int r = 0; r < RQ; r++) acc[r] = _mm512_setzero_ps();
            const float *kc = kt + j;
            if (a->bf16) {
                for (int64_t d = 0; d < Dh; d++) {
                    __m512 kv = _mm512_loadu_ps(kc + d * a->Nkp);
                    for (int r = 0; r < RQ; r++) {
                        uint32_t u = (uint32_t)((const uint16_t *)qr[r])[d] << 16;
                        float qd;
                        memcpy(&qd, &u, 4);
                        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qd), kv, acc[r]);
                    }
                }
            } else {
                for (int64_t d = 0; d < Dh; d++) {
                    __m512 kv = _mm512_loadu_ps(kc + d * a->Nkp);
                    for (int r = 0; r < RQ; r++)
                        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(((const float *)qr[r])[d]), kv, acc[r]);
                }
            }
            for (int r = 0; r < RQ; r++) {
                __m512 x = _mm512_mul_ps(acc[r], sc);
                if (br[r]) x = _mm512_add_ps(x, load16(br[r], 0, j, nkr[r]));
                int64_t left = nkr[r] - j;
                __mmask16 live = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
                _mm512_storeu_ps(s + r * a->Nkp + j, _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), x));
            }
        }
        /* the exact softmax of each row, unnormalized (e^(s - max)); 1 / sum kept */
        float inv[RQ];
        for (int r = 0; r < RQ; r++) {
            float *sr = s + r * a->Nkp;
            __m512 mx = _mm512_set1_ps(-INFINITY);
            for (int64_t j = 0; j < tk; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sr + j));
            float m = _mm512_reduce_max_ps(mx);
            if (m == -INFINITY) { /* every key masked: the row gives 0 */
                memset(sr, 0, sizeof(float) * (size_t)up(tk, 16));
                inv[r] = 0;
                continue;
            }
            __m512 sum = _mm512_setzero_ps(), mv = _mm512_set1_ps(m);
            for (int64_t j = 0; j < tk; j += 16) {
                __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + j), mv));
                _mm512_storeu_ps(sr + j, e);
                sum = _mm512_add_ps(sum, e);
            }
            inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
        }
        /* o = P V / sum, 64 output dims (4 vectors) at a time */
        for (int64_t dc = 0; dc < Dv; dc += 64) {
            __m512 acc[RQ][4];
            for (int r = 0; r < RQ; r++)
                for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
            for (int64_t j = 0; j < tk; j++) {
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
            for (int r = 0; r < nr; r++) {
                float *orow = a->o + (b * a->Nq + i + r) * D + h * Dh;
                __m512 iv = _mm512_set1_ps(inv[r]);
                for (int c = 0; c < 4; c++) {
                    int64_t d = dc + 16 * c, left = Dh - d;
                    if (left <= 0) break;
                    __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
                    _mm512_mask_storeu_ps(orow + d, m, _mm512_mul_ps(acc[r][c], iv));
                }
            }
        }
    }
}

int kk_attention_ex_avx512(const void *q, const void *k, const void *v, int bf16, const float *bias,
                           const int64_t bs[4], float *o, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh,
                           float scale, int causal) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq"))
        return 0;
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
    size_t per = (size_t)(Dh * a.Nkp + Nk * a.Dv + RQ * a.Nkp) + 16; /* floats; 16: keeps slices 64-byte aligned */
    per = (per + 15) / 16 * 16;
    static _Thread_local float *buf;
    static _Thread_local size_t cap;
    if (cap < per * (size_t)nt) {
        kb_free_aligned(buf);
        buf = kb_alloc_aligned(sizeof(float) * per * (size_t)nt);
        cap = buf ? per * (size_t)nt : 0;
        if (!buf) return 0;
    }
    float *work = buf;
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
