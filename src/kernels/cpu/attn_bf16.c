/* attn_bf16.c - fused flash attention on AVX512-BF16, for bf16 compute with a
 * head size of 64 on CPUs with neither AMX nor AVX512-FP16 (AMD Zen 4 / 5,
 * where VDPBF16PS runs at full width: oneDNN's bf16 matmuls per strip of
 * queries ran attention at ~40% of a GEMM's rate there, docs/PERFORMANCE.md).
 *
 * Per (batch, head), packed once (f32 rows rounded to bf16, nearest even, as
 * every bf16 kernel takes them; bf16 rows as they are; both token segments
 * read in place):
 *   Q   [query][32 dim pairs] bf16
 *   K   panels of 64 keys, [32 dim pairs][64 keys][2] bf16
 *   V   panels of 64 keys, [32 key pairs][64 dims][2] bf16
 * Per tile of TQ queries, over every panel of 64 keys (a head's K and V stay
 * in L2: passes over a panel by several tiles in turn gained nothing), with
 * VDPBF16PS (bf16 pairs multiplied, summed into f32):
 *   S [TQ x 64] = Q K^T      over the 32 dim pairs, f32
 *   online softmax (f32):    reference point m and sum l per query, P = 2^(c S - m)
 *                            rounded to bf16, c = log2 e / sqrt(Dh); m is the running
 *                            max, moved only when a weight would pass 2^8
 *   O [TQ x 64] += P V       over the panel's 32 key pairs, f32; O rescaled when m moves
 * and O / l is the output. The N x N matrix is never formed; parallel over
 * batch x heads x chunks of queries. */
#include "kernels/cpu/attn_bf16.h"
#include "kernels/cpu/attn_rows.h"
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#define DH 64
#define TQ 6             /* queries per tile: 6 x 4 accumulators of 16 f32 */
#define PK 64            /* keys per panel */
#define QCHUNK (32 * TQ) /* queries per work item */
#define MOVE 8.0f        /* m moves when a weight 2^(s - m) would pass 2^MOVE */

/* the sizes of one head's packed operands, in bytes */
typedef struct head_layout {
    int64_t Nqp, Nkp;
    size_t q, k, v, total;
} head_layout;

static head_layout layout_of(int64_t Nq, int64_t Nk) {
    head_layout L;
    L.Nqp = (Nq + TQ - 1) / TQ * TQ;
    L.Nkp = (Nk + PK - 1) / PK * PK;
    L.q = 0;
    L.k = L.q + (size_t)L.Nqp * DH * 2;
    L.v = L.k + (size_t)L.Nkp * DH * 2;
    L.total = (L.v + (size_t)L.Nkp * DH * 2 + 63) / 64 * 64;
    return L;
}

size_t kk_attention_bf16_work_bytes(int64_t B, int64_t Nq, int64_t Nk, int64_t H) {
    return (size_t)(B * H) * layout_of(Nq, Nk).total;
}

/* token i of batch b's 64 values of head h in bf16: dims 0-31 in x[0], 32-63 in x[1] */
BF16_FN static inline void load_head(const kk_rows_of *r, int64_t b, int64_t i, int64_t h, int64_t D, __m512i x[2]) {
    const char *row = kk_row_of(r, b, i, D);
    if (r->esz == 2) {
        x[0] = _mm512_loadu_si512(row + 2 * h * DH);
        x[1] = _mm512_loadu_si512(row + 2 * (h * DH + 32));
        return;
    }
    const float *f = (const float *)row + h * DH;
    x[0] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 16), _mm512_loadu_ps(f));
    x[1] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 48), _mm512_loadu_ps(f + 32));
}

/* batch entry b, head h's Q, K and V into their layouts (zeros past Nq, Nk) */
BF16_FN static void pack_head(const kk_rows_of *q, const kk_rows_of *k, const kk_rows_of *v, int64_t b, int64_t h,
                              int64_t H, const head_layout *L, char *base) {
    int64_t D = H * DH, Nq = q->na + q->nb, Nk = k->na + k->nb;
    uint32_t *qh = (uint32_t *)(base + L->q), *kh = (uint32_t *)(base + L->k), *vh = (uint32_t *)(base + L->v);
    __m512i x[2];
    for (int64_t i = 0; i < L->Nqp; i++) {
        if (i < Nq) load_head(q, b, i, h, D, x);
        else x[0] = x[1] = _mm512_setzero_si512();
        _mm512_storeu_si512(qh + i * (DH / 2), x[0]);
        _mm512_storeu_si512(qh + i * (DH / 2) + 16, x[1]);
    }
    /* K: key j's dim pair p at [j / 64][p][j % 64], 16 keys x 16 pairs transposed at a time */
    for (int64_t j0 = 0; j0 < L->Nkp; j0 += 16) {
        __m512i lo[16], hi[16]; /* key j0 + u's pairs 0-15, 16-31 */
        for (int u = 0; u < 16; u++) {
            if (j0 + u < Nk) load_head(k, b, j0 + u, h, D, x);
            else x[0] = x[1] = _mm512_setzero_si512();
            lo[u] = x[0];
            hi[u] = x[1];
        }
        kk_transpose16(lo);
        kk_transpose16(hi);
        uint32_t *panel = kh + j0 / PK * PK * (DH / 2) + j0 % PK;
        for (int p = 0; p < 16; p++) {
            _mm512_storeu_si512(panel + p * PK, lo[p]);
            _mm512_storeu_si512(panel + (p + 16) * PK, hi[p]);
        }
    }
    /* V: key pair (j, j+1)'s dims side by side: [j / 64][j % 64 / 2][dim][2] */
    static const uint16_t zip[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_loadu_si512(zip), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t j = 0; j < L->Nkp; j += 2) {
        __m512i e[2][2]; /* key j, j+1: dims 0-31, 32-63 */
        for (int u = 0; u < 2; u++) {
            if (j + u < Nk) load_head(v, b, j + u, h, D, e[u]);
            else e[u][0] = e[u][1] = _mm512_setzero_si512();
        }
        uint32_t *dst = vh + (j / PK * (PK / 2) + j % PK / 2) * DH;
        for (int t = 0; t < 2; t++) {
            _mm512_storeu_si512(dst + 32 * t, _mm512_permutex2var_epi16(e[0][t], lo, e[1][t]));
            _mm512_storeu_si512(dst + 32 * t + 16, _mm512_permutex2var_epi16(e[0][t], hi, e[1][t]));
        }
    }
}

/* c [TQ][4 x 16] += a [TQ rows of 32 pairs] . b [32 pairs][64 columns]: the
 * pairs of bf16 multiplied and summed into f32; zero set: c starts at 0 */
__attribute__((always_inline)) BF16_FN static inline void micro(const uint32_t *a, const uint32_t *b, float *c,
                                                                int zero) {
    __m512 acc[TQ][4];
    for (int i = 0; i < TQ; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = zero ? _mm512_setzero_ps() : _mm512_load_ps(c + (i * 4 + j) * 16);
    for (int p = 0; p < DH / 2; p++) {
        __m512i w[4];
        for (int j = 0; j < 4; j++) w[j] = _mm512_load_si512(b + p * PK + 16 * j);
        for (int i = 0; i < TQ; i++) {
            __m512i x = _mm512_set1_epi32((int)a[i * (DH / 2) + p]);
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)x, (__m512bh)w[j]);
        }
    }
    for (int i = 0; i < TQ; i++)
        for (int j = 0; j < 4; j++) _mm512_store_ps(c + (i * 4 + j) * 16, acc[i][j]);
}

/* queries [q0, q1) of batch entry b, head h (q0 a multiple of TQ) */
BF16_FN static void head(const head_layout *L, const char *base, const kk_out_of *out, int64_t b, int64_t h, int64_t q0,
                         int64_t q1, int64_t Nk, float c) {
    const uint32_t *qh = (const uint32_t *)(base + L->q), *kh = (const uint32_t *)(base + L->k);
    const uint32_t *vh = (const uint32_t *)(base + L->v);
    float s[TQ * 4 * 16] __attribute__((aligned(64)));
    float O[TQ][DH] __attribute__((aligned(64)));
    uint32_t P[TQ][PK / 2] __attribute__((aligned(64)));
    for (int64_t i0 = q0; i0 < q1; i0 += TQ) {
        float m[TQ];
        __m512 l[TQ]; /* each query's sum of weights, 16 lanes of it */
        for (int i = 0; i < TQ; i++) {
            m[i] = -INFINITY;
            l[i] = _mm512_setzero_ps();
            for (int t = 0; t < 4; t++) _mm512_store_ps(&O[i][16 * t], _mm512_setzero_ps());
        }
        for (int64_t k0 = 0; k0 < L->Nkp; k0 += PK) {
            int valid = (int)(Nk - k0 < PK ? Nk - k0 : PK);
            micro(qh + i0 * (DH / 2), kh + k0 * (DH / 2), s, 1);
            for (int i = 0; i < TQ; i++) {
                __m512 x[4], mx = _mm512_set1_ps(-INFINITY);
                for (int t = 0; t < 4; t++) {
                    __mmask16 ok = valid >= 16 * (t + 1) ? 0xffff
                                   : valid <= 16 * t     ? 0
                                                         : (__mmask16)((1u << (valid - 16 * t)) - 1);
                    x[t] = _mm512_mul_ps(_mm512_load_ps(s + (i * 4 + t) * 16), _mm512_set1_ps(c));
                    x[t] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, x[t]);
                    mx = _mm512_max_ps(mx, x[t]);
                }
                if (_mm512_cmp_ps_mask(mx, _mm512_set1_ps(m[i] + MOVE), _CMP_GT_OQ)) {
                    float top = _mm512_reduce_max_ps(mx);
                    float corr = m[i] == -INFINITY ? 0.0f : exp2f(m[i] - top);
                    m[i] = top;
                    l[i] = _mm512_mul_ps(l[i], _mm512_set1_ps(corr));
                    for (int t = 0; t < 4; t++)
                        _mm512_store_ps(&O[i][16 * t], _mm512_mul_ps(_mm512_load_ps(&O[i][16 * t]), _mm512_set1_ps(corr)));
                }
                __m512 mm = _mm512_set1_ps(m[i]), p[4];
                for (int t = 0; t < 4; t++) {
                    p[t] = kk_exp2_16_ftz(_mm512_sub_ps(x[t], mm));
                    l[i] = _mm512_add_ps(l[i], p[t]);
                }
                _mm512_store_si512(&P[i][0], (__m512i)_mm512_cvtne2ps_pbh(p[1], p[0]));
                _mm512_store_si512(&P[i][16], (__m512i)_mm512_cvtne2ps_pbh(p[3], p[2]));
            }
            micro(&P[0][0], vh + k0 * (DH / 2), &O[0][0], 0);
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

BF16_FN static void run(const kk_rows_of *q, const kk_rows_of *k, const kk_rows_of *v, void *o, int o_fmt, int64_t B,
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
        for (int64_t bh = 0; bh < B * H; bh++) pack_head(q, k, v, bh / H, bh % H, H, &L, work + bh * L.total);
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < B * H * nch; it++) {
            int64_t bh = it / nch, q0 = it % nch * QCHUNK, q1 = q0 + QCHUNK < Nq ? q0 + QCHUNK : Nq;
            head(&L, work + bh * L.total, &out, bh / H, bh % H, q0, q1, Nk, c);
        }
        _mm_setcsr(csr);
    }
}

int kk_attention_bf16_joint(const void *qa, const void *ka, const void *va, const void *qb, const void *kb,
                            const void *vb, int bf16, void *o, int o_fmt, int64_t B, int64_t Na, int64_t Nb, int64_t H,
                            int64_t Dh, void *work) {
    /* the check comes first, outside any function built for AVX512-BF16 */
    if (Dh != DH || Na < 0 || Nb < 0 || Na + (qb ? Nb : 0) < 1 || Na + Nb < 1 || !work || !kk_bf16_ready()) return 0;
    int esz = bf16 ? 2 : 4;
    kk_rows_of rq = {qa, qb, Na, qb ? Nb : 0, esz}, rk = {ka, kb, Na, Nb, esz}, rv = {va, vb, Na, Nb, esz};
    run(&rq, &rk, &rv, o, o_fmt, B, H, work);
    return 1;
}

int kk_attention_bf16(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                      int64_t H, int64_t Dh, void *work) {
    if (Dh != DH || Nq < 1 || Nk < 1 || !work || !kk_bf16_ready()) return 0;
    kk_rows_of rq = {q, NULL, Nq, 0, 4}, rk = {k, NULL, Nk, 0, 4}, rv = {v, NULL, Nk, 0, 4};
    run(&rq, &rk, &rv, o, KK_FMT_F32, B, H, work);
    return 1;
}
