/* attn_f16.c - fused flash attention on AVX512-FP16, for bf16 compute with a
 * head size of 64 on CPUs without AMX (where oneDNN's bf16 matmuls per strip
 * ran at a quarter of the fp16 rate: see gemm_f16.c).
 *
 * Per (batch, head), packed once (f32 or bf16 rows in, read in place over
 * both token segments):
 *   Q   [query][32 dim pairs] fp16, each query scaled into [8, 16)
 *   K   panels of 64 keys, [32 dim pairs][64 keys][2] fp16, each key scaled
 *   V   panels of 64 keys, [32 key pairs][64 dims][2] fp16, each dim scaled
 * (kk_range_scale: exact powers of two, undone in f32). Per tile of 6
 * queries, over every panel of 64 keys, with gemm_f16.c's micro-kernel:
 *   S [6 x 64] = Q K^T       fp16 products over the 32 dim pairs, then f32
 *   online softmax (f32):    reference point m and sum l per query, P = 2^(c S - m)
 *                            in fp16, c = log2 e / sqrt(Dh); m is the running max,
 *                            moved only when a weight would pass 16
 *   O [6 x 64] += P V        fp16 over the panel's 32 key pairs, then f32,
 *                            O rescaled when m moves
 * and O / l is the output. The N x N matrix is never formed; parallel over
 * batch x heads x chunks of queries. */
#include "kernels/cpu/attn_f16.h"
#include "kernels/cpu/attn_rows.h"
#include "kernels/cpu/gemm_f16.h"

#include <omp.h>
#include <string.h>

#define DH 64
#define TQ KK_F16_MR /* queries per tile */
#define PK 64        /* keys per panel */
#define QCHUNK (32 * TQ) /* queries per work item */

/* the sizes of one head's packed operands (in bytes: fp16 data, then the scales) */
typedef struct head_layout {
    int64_t Nqp, Nkp;
    size_t q, qs, k, ks, v, vs, total;
} head_layout;

static head_layout layout_of(int64_t Nq, int64_t Nk) {
    head_layout L;
    L.Nqp = (Nq + TQ - 1) / TQ * TQ;
    L.Nkp = (Nk + PK - 1) / PK * PK;
    L.q = 0;
    L.qs = L.q + (size_t)L.Nqp * DH * 2;
    L.k = L.qs + (size_t)L.Nqp * 4;
    L.ks = L.k + (size_t)L.Nkp * DH * 2;
    L.v = L.ks + (size_t)L.Nkp * 4;
    L.vs = L.v + (size_t)L.Nkp * DH * 2;
    L.total = (L.vs + DH * 4 + 63) / 64 * 64;
    return L;
}

size_t kk_attention_f16_work_bytes(int64_t B, int64_t Nq, int64_t Nk, int64_t H) {
    return (size_t)(B * H) * layout_of(Nq, Nk).total;
}

/* 16 fp16 of 16 f32 */
F16_FN static inline __m256i to_f16(__m512 v) { return (__m256i)_mm512_cvtxps_ph(v); }

/* a token's 64 values of head h as four f32 vectors (f32 rows rounded to
 * bf16 first, as every bf16 kernel takes them: the same numbers whether the
 * GEMM before wrote f32 or bf16); returns the largest |value| */
F16_FN static inline float load_head(const kk_rows_of *r, int64_t b, int64_t i, int64_t h, int64_t D, __m512 x[4]) {
    const char *row = kk_row_of(r, b, i, D);
    __m512 m = _mm512_setzero_ps();
    for (int c = 0; c < 4; c++) {
        x[c] = kk_load16(r, row, h * DH + 16 * c);
        if (r->esz == 4) x[c] = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(x[c]));
        m = _mm512_max_ps(m, _mm512_abs_ps(x[c]));
    }
    return _mm512_reduce_max_ps(m);
}

/* batch entry b, head h's Q, K and V into their layouts (zeros past Nq, Nk) */
F16_FN static void pack_head(const kk_rows_of *q, const kk_rows_of *k, const kk_rows_of *v, int64_t b, int64_t h,
                             int64_t H, const head_layout *L, char *base, float c) {
    int64_t D = H * DH, Nq = q->na + q->nb, Nk = k->na + k->nb;
    uint16_t *qh = (uint16_t *)(base + L->q);
    float *qs = (float *)(base + L->qs);
    uint32_t *kh = (uint32_t *)(base + L->k);
    float *ks = (float *)(base + L->ks);
    uint16_t *vh = (uint16_t *)(base + L->v);
    float *vs = (float *)(base + L->vs);
    __m512 x[4];
    for (int64_t i = 0; i < L->Nqp; i++) {
        if (i >= Nq) {
            memset(qh + i * DH, 0, DH * 2);
            qs[i] = 0;
            continue;
        }
        float s = kk_range_scale(load_head(q, b, i, h, D, x));
        qs[i] = c / s;
        for (int j = 0; j < 4; j++) _mm256_storeu_si256((__m256i *)(qh + i * DH + 16 * j), to_f16(_mm512_mul_ps(x[j], _mm512_set1_ps(s))));
    }
    /* K: key j's dim pair p at [j / 64][p][j % 64] (32 bits) */
    for (int64_t j = 0; j < L->Nkp; j++) {
        uint32_t pr[DH / 2];
        if (j < Nk) {
            float s = kk_range_scale(load_head(k, b, j, h, D, x));
            ks[j] = 1.0f / s;
            for (int t = 0; t < 4; t++) _mm256_storeu_si256((__m256i *)((uint16_t *)pr + 16 * t), to_f16(_mm512_mul_ps(x[t], _mm512_set1_ps(s))));
        } else {
            ks[j] = 0;
            memset(pr, 0, sizeof pr);
        }
        uint32_t *panel = kh + j / PK * PK * (DH / 2) + j % PK;
        for (int p = 0; p < DH / 2; p++) panel[p * PK] = pr[p];
    }
    /* V: each dim scaled by its largest |value| over the keys; key pair
     * (j, j+1)'s dims side by side: [j / 64][j % 64 / 2][dim][2] */
    __m512 vm[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t j = 0; j < Nk; j++) {
        load_head(v, b, j, h, D, x);
        for (int t = 0; t < 4; t++) vm[t] = _mm512_max_ps(vm[t], _mm512_abs_ps(x[t]));
    }
    float mx[DH] __attribute__((aligned(64))), sc[DH] __attribute__((aligned(64)));
    for (int t = 0; t < 4; t++) _mm512_store_ps(mx + 16 * t, vm[t]);
    for (int d = 0; d < DH; d++) {
        sc[d] = kk_range_scale(mx[d]);
        vs[d] = 1.0f / sc[d];
    }
    static const uint16_t zip[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_loadu_si512(zip), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t j = 0; j < L->Nkp; j += 2) {
        __m512i e[2][2]; /* key j, j+1: dims 0-31, 32-63 in fp16 */
        for (int u = 0; u < 2; u++) {
            if (j + u < Nk) {
                load_head(v, b, j + u, h, D, x);
                for (int t = 0; t < 2; t++)
                    e[u][t] = _mm512_inserti64x4(
                        _mm512_castsi256_si512(to_f16(_mm512_mul_ps(x[2 * t], _mm512_load_ps(sc + 32 * t)))),
                        to_f16(_mm512_mul_ps(x[2 * t + 1], _mm512_load_ps(sc + 32 * t + 16))), 1);
            } else
                e[u][0] = e[u][1] = _mm512_setzero_si512();
        }
        uint16_t *dst = vh + (j / PK * (PK / 2) + j % PK / 2) * DH * 2;
        for (int t = 0; t < 2; t++) {
            _mm512_storeu_si512(dst + 64 * t, _mm512_permutex2var_epi16(e[0][t], lo, e[1][t]));
            _mm512_storeu_si512(dst + 64 * t + 32, _mm512_permutex2var_epi16(e[0][t], hi, e[1][t]));
        }
    }
}

/* queries [q0, q1) of batch entry b, head h (q0 a multiple of TQ) */
F16_FN static void head(const head_layout *L, const char *base, const kk_out_of *out, int64_t b, int64_t h, int64_t q0,
                        int64_t q1, int64_t Nk) {
    const uint32_t *qh = (const uint32_t *)(base + L->q), *kh = (const uint32_t *)(base + L->k);
    const uint32_t *vh = (const uint32_t *)(base + L->v);
    const float *qs = (const float *)(base + L->qs), *ks = (const float *)(base + L->ks), *vs = (const float *)(base + L->vs);
    float c[TQ * 4 * 32] __attribute__((aligned(64)));
    float O[TQ][DH] __attribute__((aligned(64)));
    uint16_t P[TQ][PK] __attribute__((aligned(64)));
    __m512 vsc[4];
    for (int t = 0; t < 4; t++) vsc[t] = _mm512_loadu_ps(vs + 16 * t);
    for (int64_t i0 = q0; i0 < q1; i0 += TQ) {
        float m[TQ];
        __m512 l[TQ]; /* each query's sum of weights, 16 lanes of it */
        for (int i = 0; i < TQ; i++) {
            m[i] = -INFINITY;
            l[i] = _mm512_setzero_ps();
            for (int t = 0; t < 4; t++) _mm512_store_ps(&O[i][16 * t], _mm512_setzero_ps());
        }
        for (int64_t k0 = 0; k0 < L->Nkp; k0 += PK) {
            kk_f16_micro(qh + i0 * (DH / 2), 1, DH / 2, (const _Float16 *)(kh + k0 * (DH / 2)), DH / 2, c, 0);
            int valid = (int)(Nk - k0 < PK ? Nk - k0 : PK);
            for (int i = 0; i < TQ; i++) {
                __m512 s[4], mx = _mm512_set1_ps(-INFINITY), qsc = _mm512_set1_ps(qs[i0 + i]);
                for (int t = 0; t < 4; t++) {
                    __mmask16 ok = valid >= 16 * (t + 1) ? 0xffff : valid <= 16 * t ? 0 : (__mmask16)((1u << (valid - 16 * t)) - 1);
                    s[t] = _mm512_mul_ps(kk_f16_pairsum(c + (i * 4 + t) * 32), _mm512_mul_ps(qsc, _mm512_loadu_ps(ks + k0 + 16 * t)));
                    s[t] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, s[t]);
                    mx = _mm512_max_ps(mx, s[t]);
                }
                /* the reference point m moves only when a weight 2^(s - m) would pass 16 (P V's
                 * products stay below 16 x 16 then, and its sums over a panel below 8192) */
                if (_mm512_cmp_ps_mask(mx, _mm512_set1_ps(m[i] + 4.0f), _CMP_GT_OQ)) {
                    float top = _mm512_reduce_max_ps(mx);
                    float corr = m[i] == -INFINITY ? 0.0f : exp2f(m[i] - top);
                    m[i] = top;
                    l[i] = _mm512_mul_ps(l[i], _mm512_set1_ps(corr));
                    for (int t = 0; t < 4; t++) _mm512_store_ps(&O[i][16 * t], _mm512_mul_ps(_mm512_load_ps(&O[i][16 * t]), _mm512_set1_ps(corr)));
                }
                __m512 mm = _mm512_set1_ps(m[i]);
                for (int t = 0; t < 4; t++) {
                    __m512 p = kk_exp2_16_ftz(_mm512_sub_ps(s[t], mm));
                    l[i] = _mm512_add_ps(l[i], p);
                    _mm256_store_si256((__m256i *)&P[i][16 * t], to_f16(p));
                }
            }
            kk_f16_micro((const uint32_t *)P, 1, PK / 2, (const _Float16 *)(vh + k0 * (DH / 2)), PK / 2, c, 0);
            for (int i = 0; i < TQ; i++)
                for (int t = 0; t < 4; t++)
                    _mm512_store_ps(&O[i][16 * t], _mm512_fmadd_ps(kk_f16_pairsum(c + (i * 4 + t) * 32), vsc[t], _mm512_load_ps(&O[i][16 * t])));
        }
        for (int i = 0; i < TQ && i0 + i < q1; i++) {
            __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(l[i]));
            for (int d = 0; d < DH; d += 32) {
                __m512 a = _mm512_mul_ps(_mm512_load_ps(&O[i][d]), inv), z = _mm512_mul_ps(_mm512_load_ps(&O[i][d + 16]), inv);
                void *dst = kk_out_at(out, b, i0 + i, h, d);
                if (out->fmt == KK_FMT_F32) {
                    _mm512_storeu_ps((float *)dst, a);
                    _mm512_storeu_ps((float *)dst + 16, z);
                } else
                    _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(z, a));
            }
        }
    }
}

F16_FN static void run(const kk_rows_of *q, const kk_rows_of *k, const kk_rows_of *v, void *o, int o_fmt, int64_t B,
                       int64_t H, char *work) {
    int64_t D = H * DH, Nq = q->na + q->nb, Nk = k->na + k->nb;
    head_layout L = layout_of(Nq, Nk);
    float c = 1.4426950408889634f / sqrtf((float)DH); /* log2 e / sqrt(Dh): softmax in base 2 */
    kk_out_of out = {o, o_fmt, B, q->na, q->nb, D};
    kk_out_zero_padding(&out);
    int64_t nch = (Nq + QCHUNK - 1) / QCHUNK;
#pragma omp parallel
    {
        /* flush f32 denormals to zero: the weights of far-off keys make them, each costing a microcode assist */
        unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);
#pragma omp for schedule(dynamic)
        for (int64_t bh = 0; bh < B * H; bh++) pack_head(q, k, v, bh / H, bh % H, H, &L, work + bh * L.total, c);
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < B * H * nch; it++) {
            int64_t bh = it / nch, q0 = it % nch * QCHUNK, q1 = q0 + QCHUNK < Nq ? q0 + QCHUNK : Nq;
            head(&L, work + bh * L.total, &out, bh / H, bh % H, q0, q1, Nk);
        }
        _mm_setcsr(csr);
    }
}

int kk_attention_f16_joint(const void *qa, const void *ka, const void *va, const void *qb, const void *kb,
                           const void *vb, int bf16, void *o, int o_fmt, int64_t B, int64_t Na, int64_t Nb, int64_t H,
                           int64_t Dh, void *work) {
    /* the check comes first, outside any function built for AVX512-FP16 */
    if (Dh != DH || Na < 0 || Nb < 0 || Na + (qb ? Nb : 0) < 1 || !work || !kk_f16_ready()) return 0;
    int esz = bf16 ? 2 : 4;
    kk_rows_of rq = {qa, qb, Na, qb ? Nb : 0, esz}, rk = {ka, kb, Na, Nb, esz}, rv = {va, vb, Na, Nb, esz};
    run(&rq, &rk, &rv, o, o_fmt, B, H, work);
    return 1;
}

int kk_attention_f16(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                     int64_t H, int64_t Dh, void *work) {
    if (Dh != DH || Nq < 1 || Nk < 1 || !work || !kk_f16_ready()) return 0;
    kk_rows_of rq = {q, NULL, Nq, 0, 4}, rk = {k, NULL, Nk, 0, 4}, rv = {v, NULL, Nk, 0, 4};
    run(&rq, &rk, &rv, o, KK_FMT_F32, B, H, work);
    return 1;
}
