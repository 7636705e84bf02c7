/* attn_bf16.c - fused flash attention on AVX512-BF16, for bf16 compute on CPUs
 * with neither AMX nor AVX512-FP16 (AMD Zen 4 / 5, where VDPBF16PS runs at
 * full width: oneDNN's bf16 matmuls per strip of queries ran attention at
 * ~40% of a GEMM's rate there, docs/PERFORMANCE.md); any head size that is a
 * multiple of 64 up to 1024 (SD3's 64, the VAE's one head of 512).
 *
 * Per (batch, head), packed once (f32 rows rounded to bf16, nearest even, as
 * every bf16 kernel takes them; bf16 rows as they are; both token segments
 * read in place; q and k rotated in f32 first by a RoPE table where one is
 * given, Flux's, so the rotation is no pass of its own), NP = Dh / 2 dim pairs:
 *   Q   [query][NP dim pairs] bf16
 *   K   panels of 64 keys, [NP dim pairs][64 keys][2] bf16
 *   V   panels of 64 keys, [32 key pairs][Dh dims][2] bf16
 * Per work item (a chunk of queries of one head), per block of keys whose K
 * and V fit in L2 beside the chunk's state, per tile of TQ queries, per panel
 * of 64 keys, with VDPBF16PS (bf16 pairs multiplied, summed into f32):
 *   S [TQ x 64] = Q K^T      over the NP dim pairs, f32
 *   online softmax (f32):    reference point m and sum l per query, P = 2^(c S - m)
 *                            rounded to bf16, c = log2 e / sqrt(Dh); m is the running
 *                            max, moved only when a weight would pass 2^8
 *   O [TQ x Dh] += P V       64 dims at a time over the panel's 32 key pairs, f32;
 *                            O rescaled when m moves
 * and O / l is the output. The N x N matrix is never formed; parallel over
 * batch x heads x chunks of queries. */
#include "kernels/cpu/attn_bf16.h"
#include "kernels/cpu/attn_rows.h"
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <omp.h>

#define DMAX 1024         /* the largest head size */
#define TQ 6              /* queries per tile: 6 x 4 accumulators of 16 f32 */
#define PK 64             /* keys per panel */
#define QCHUNK (32 * TQ)  /* queries per work item */
#define KV_BYTES (256 << 10) /* a block of keys' K and V, packed: in L2 beside the chunk's O */
#define MOVE 8.0f         /* m moves when a weight 2^(s - m) would pass 2^MOVE */

/* the sizes of one head's packed operands, in bytes */
typedef struct head_layout {
    int64_t Nqp, Nkp, Dh;
    size_t q, k, v, total;
} head_layout;

static head_layout layout_of(int64_t Nq, int64_t Nk, int64_t Dh) {
    head_layout L;
    L.Nqp = (Nq + TQ - 1) / TQ * TQ;
    L.Nkp = (Nk + PK - 1) / PK * PK;
    L.Dh = Dh;
    L.q = 0;
    L.k = L.q + (size_t)(L.Nqp * Dh) * 2;
    L.v = L.k + (size_t)(L.Nkp * Dh) * 2;
    L.total = (L.v + (size_t)(L.Nkp * Dh) * 2 + 63) / 64 * 64;
    return L;
}

/* a work item's running state: O [Dh / 64][QCHUNK][64], m and l (16 lanes of
 * each query's sum) per query */
static size_t state_bytes(int64_t Dh) { return sizeof(float) * (size_t)(QCHUNK * Dh + QCHUNK + QCHUNK * 16) + 64; }

size_t kk_attention_bf16_work_bytes(int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh) {
    if (Dh < 64 || Dh > DMAX || Dh % 64) return 0;
    return (size_t)(B * H) * layout_of(Nq, Nk, Dh).total + (size_t)omp_get_max_threads() * state_bytes(Dh);
}

/* token i of batch b's 32 values of head h from dim d (d a multiple of 32) in bf16 */
BF16_FN static inline __m512i load32(const kk_rows_of *r, const char *row, int64_t h, int64_t Dh, int64_t d) {
    if (r->esz == 2) return _mm512_loadu_si512(row + 2 * (h * Dh + d));
    const float *f = (const float *)row + h * Dh + d;
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 16), _mm512_loadu_ps(f));
}

/* x [16] rotated by the table's 16 values t (pairs (cos, sin)): kk_rope_row's
 * arithmetic, lane for lane (x0 c + -(x1 s), x1 c + x0 s; no FMA) */
BF16_FN static inline __m512 rotate16(__m512 x, const float *t) {
    __m512 tv = _mm512_loadu_ps(t), c = _mm512_moveldup_ps(tv), sn = _mm512_movehdup_ps(tv);
    __m512 xs = _mm512_mul_ps(_mm512_permute_ps(x, 0xb1), sn); /* x1 s, x0 s */
    xs = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(xs), _mm512_set1_epi64(0x80000000LL)));
    return _mm512_add_ps(_mm512_mul_ps(x, c), xs);
}

/* load32 of q or k rotated by the table's row t (RoPE) first, in f32 */
BF16_FN static inline __m512i load32_rot(const kk_rows_of *r, const char *row, int64_t h, int64_t Dh, int64_t d,
                                         const float *t) {
    __m512 lo = rotate16(kk_load16(r, row, h * Dh + d), t + d);
    __m512 hi = rotate16(kk_load16(r, row, h * Dh + d + 16), t + d + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* batch entry b, head h's Q, K and V into their layouts (zeros past Nq, Nk),
 * Q and K rotated by the table rope [Nk, Dh] (row = token) where given */
BF16_FN static void pack_head(const kk_rows_of *q, const kk_rows_of *k, const kk_rows_of *v, int64_t b, int64_t h,
                              int64_t H, const head_layout *L, const float *rope, char *base) {
    int64_t Dh = L->Dh, NP = Dh / 2, D = H * Dh, Nq = q->na + q->nb, Nk = k->na + k->nb;
    uint32_t *qh = (uint32_t *)(base + L->q), *kh = (uint32_t *)(base + L->k), *vh = (uint32_t *)(base + L->v);
    for (int64_t i = 0; i < L->Nqp; i++) {
        const char *row = i < Nq ? kk_row_of(q, b, i, D) : NULL;
        for (int64_t d = 0; d < Dh; d += 32)
            _mm512_storeu_si512(qh + i * NP + d / 2, !row  ? _mm512_setzero_si512()
                                                     : rope ? load32_rot(q, row, h, Dh, d, rope + i * Dh)
                                                            : load32(q, row, h, Dh, d));
    }
    /* K: key j's dim pair p at [j / 64][p][j % 64], 16 keys x 16 pairs transposed at a time */
    for (int64_t j0 = 0; j0 < L->Nkp; j0 += 16) {
        const char *rows[16];
        for (int u = 0; u < 16; u++) rows[u] = j0 + u < Nk ? kk_row_of(k, b, j0 + u, D) : NULL;
        uint32_t *panel = kh + j0 / PK * PK * NP + j0 % PK;
        for (int64_t d = 0; d < Dh; d += 32) {
            __m512i t[16]; /* key j0 + u's pairs d/2 .. d/2 + 15 */
            for (int u = 0; u < 16; u++)
                t[u] = !rows[u] ? _mm512_setzero_si512()
                       : rope   ? load32_rot(k, rows[u], h, Dh, d, rope + (j0 + u) * Dh)
                                : load32(k, rows[u], h, Dh, d);
            kk_transpose16(t);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(panel + (d / 2 + p) * PK, t[p]);
        }
    }
    /* V: key pair (j, j+1)'s dims side by side: [j / 64][j % 64 / 2][dim][2] */
    static const uint16_t zip[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_loadu_si512(zip), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t j = 0; j < L->Nkp; j += 2) {
        const char *r0 = j < Nk ? kk_row_of(v, b, j, D) : NULL, *r1 = j + 1 < Nk ? kk_row_of(v, b, j + 1, D) : NULL;
        uint32_t *dst = vh + (j / PK * (PK / 2) + j % PK / 2) * Dh;
        for (int64_t d = 0; d < Dh; d += 32) {
            __m512i e0 = r0 ? load32(v, r0, h, Dh, d) : _mm512_setzero_si512();
            __m512i e1 = r1 ? load32(v, r1, h, Dh, d) : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + d, _mm512_permutex2var_epi16(e0, lo, e1));
            _mm512_storeu_si512(dst + d + 16, _mm512_permutex2var_epi16(e0, hi, e1));
        }
    }
}

/* c [TQ][4 x 16] += a [TQ rows, as apart][np pairs] . b [np pairs, bs apart][64 columns]:
 * the pairs of bf16 multiplied and summed into f32; zero set: c starts at 0 */
__attribute__((always_inline)) BF16_FN static inline void micro(const uint32_t *a, int64_t as, const uint32_t *b,
                                                                int64_t bs, int64_t np, float *c, int zero) {
    __m512 acc[TQ][4];
    for (int i = 0; i < TQ; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = zero ? _mm512_setzero_ps() : _mm512_load_ps(c + (i * 4 + j) * 16);
    for (int64_t p = 0; p < np; p++) {
        __m512i w[4];
        for (int j = 0; j < 4; j++) w[j] = _mm512_loadu_si512(b + p * bs + 16 * j);
        for (int i = 0; i < TQ; i++) {
            __m512i x = _mm512_set1_epi32((int)a[i * as + p]);
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)x, (__m512bh)w[j]);
        }
    }
    for (int i = 0; i < TQ; i++)
        for (int j = 0; j < 4; j++) _mm512_store_ps(c + (i * 4 + j) * 16, acc[i][j]);
}

/* queries [q0, q1) of batch entry b, head h (q0 a multiple of TQ) on this
 * thread's state st (state_bytes) */
BF16_FN static void head(const head_layout *L, const char *base, const kk_out_of *out, int64_t b, int64_t h, int64_t q0,
                         int64_t q1, int64_t Nk, float c, char *st) {
    const int64_t Dh = L->Dh, NP = Dh / 2, NC = Dh / 64, nq = q1 - q0, ntile = (nq + TQ - 1) / TQ;
    const uint32_t *qh = (const uint32_t *)(base + L->q), *kh = (const uint32_t *)(base + L->k);
    const uint32_t *vh = (const uint32_t *)(base + L->v);
    float *O = (float *)(((uintptr_t)st + 63) & ~(uintptr_t)63); /* [NC][QCHUNK][64] */
    float *m = O + QCHUNK * Dh;
    __m512 *l = (__m512 *)(m + QCHUNK); /* (64-byte aligned: QCHUNK * (Dh + 1) floats is a multiple of 16) */
    float s[TQ * 4 * 16] __attribute__((aligned(64)));
    uint32_t P[TQ][PK / 2] __attribute__((aligned(64)));
    for (int64_t i = 0; i < ntile * TQ; i++) {
        m[i] = -INFINITY;
        l[i] = _mm512_setzero_ps();
        for (int64_t ch = 0; ch < NC; ch++)
            for (int t = 0; t < 4; t++) _mm512_store_ps(O + (ch * QCHUNK + i) * 64 + 16 * t, _mm512_setzero_ps());
    }
    int64_t kblock = KV_BYTES / (Dh * 4) / PK * PK;
    if (kblock < PK) kblock = PK;
    for (int64_t kb0 = 0; kb0 < L->Nkp; kb0 += kblock) {
        int64_t kb1 = kb0 + kblock < L->Nkp ? kb0 + kblock : L->Nkp;
        for (int64_t t0 = 0; t0 < ntile; t0++) {
            int64_t i0 = q0 + t0 * TQ, r0 = t0 * TQ; /* the tile's first query, and its first state row */
            for (int64_t k0 = kb0; k0 < kb1; k0 += PK) {
                int valid = (int)(Nk - k0 < PK ? Nk - k0 : PK);
                micro(qh + i0 * NP, NP, kh + k0 * NP, PK, NP, s, 1);
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
                    float *mi = &m[r0 + i];
                    if (_mm512_cmp_ps_mask(mx, _mm512_set1_ps(*mi + MOVE), _CMP_GT_OQ)) {
                        float top = _mm512_reduce_max_ps(mx);
                        __m512 corr = _mm512_set1_ps(*mi == -INFINITY ? 0.0f : exp2f(*mi - top));
                        *mi = top;
                        l[r0 + i] = _mm512_mul_ps(l[r0 + i], corr);
                        for (int64_t ch = 0; ch < NC; ch++)
                            for (int t = 0; t < 4; t++) {
                                float *o = O + (ch * QCHUNK + r0 + i) * 64 + 16 * t;
                                _mm512_store_ps(o, _mm512_mul_ps(_mm512_load_ps(o), corr));
                            }
                    }
                    __m512 mm = _mm512_set1_ps(*mi), p[4];
                    for (int t = 0; t < 4; t++) {
                        p[t] = kk_exp2_16_ftz(_mm512_sub_ps(x[t], mm));
                        l[r0 + i] = _mm512_add_ps(l[r0 + i], p[t]);
                    }
                    _mm512_store_si512(&P[i][0], (__m512i)_mm512_cvtne2ps_pbh(p[1], p[0]));
                    _mm512_store_si512(&P[i][16], (__m512i)_mm512_cvtne2ps_pbh(p[3], p[2]));
                }
                for (int64_t ch = 0; ch < NC; ch++)
                    micro(&P[0][0], PK / 2, vh + k0 / 2 * Dh + ch * 64, Dh, PK / 2, O + (ch * QCHUNK + r0) * 64, 0);
            }
        }
    }
    for (int64_t r = 0; r < nq; r++) {
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(l[r]));
        for (int64_t d = 0; d < Dh; d += 32) {
            const float *o = O + (d / 64 * QCHUNK + r) * 64 + d % 64;
            __m512 a = _mm512_mul_ps(_mm512_load_ps(o), inv), z = _mm512_mul_ps(_mm512_load_ps(o + 16), inv);
            void *dst = kk_out_col(out, b, q0 + r, h * Dh + d);
            if (out->fmt == KK_FMT_F32) {
                _mm512_storeu_ps((float *)dst, a);
                _mm512_storeu_ps((float *)dst + 16, z);
            } else
                _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(z, a));
        }
    }
}

BF16_FN static void run(const kk_rows_of *q, const kk_rows_of *k, const kk_rows_of *v, void *o, int o_fmt, int64_t B,
                        int64_t H, int64_t Dh, const float *rope, char *work, int nt) {
    int64_t D = H * Dh, Nq = q->na + q->nb, Nk = k->na + k->nb;
    head_layout L = layout_of(Nq, Nk, Dh);
    float c = 1.4426950408889634f / sqrtf((float)Dh); /* log2 e / sqrt(Dh): softmax in base 2 */
    kk_out_of out = {o, o_fmt, B, q->na, q->nb, D};
    kk_out_zero_padding(&out);
    int64_t nch = (Nq + QCHUNK - 1) / QCHUNK;
    char *states = work + (size_t)(B * H) * L.total;
#pragma omp parallel num_threads(nt)
    {
        /* flush f32 denormals to zero: the weights of far-off keys make them, each costing a microcode assist */
        unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);
        char *st = states + (size_t)omp_get_thread_num() * state_bytes(Dh);
#pragma omp for schedule(dynamic)
        for (int64_t bh = 0; bh < B * H; bh++) pack_head(q, k, v, bh / H, bh % H, H, &L, rope, work + bh * L.total);
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < B * H * nch; it++) {
            int64_t bh = it / nch, q0 = it % nch * QCHUNK, q1 = q0 + QCHUNK < Nq ? q0 + QCHUNK : Nq;
            head(&L, work + bh * L.total, &out, bh / H, bh % H, q0, q1, Nk, c, st);
        }
        _mm_setcsr(csr);
    }
}

int kk_attention_bf16_joint(const void *qa, const void *ka, const void *va, const void *qb, const void *kb,
                            const void *vb, int bf16, void *o, int o_fmt, int64_t B, int64_t Na, int64_t Nb, int64_t H,
                            int64_t Dh, const float *rope, void *work) {
    /* the check comes first, outside any function built for AVX512-BF16 */
    if (Dh < 64 || Dh > DMAX || Dh % 64 || Na < 0 || Nb < 0 || Na + (qb ? Nb : 0) < 1 || !work ||
        !kk_bf16_ready())
        return 0;
    int esz = bf16 ? 2 : 4;
    kk_rows_of rq = {qa, qb, Na, qb ? Nb : 0, esz}, rk = {ka, kb, Na, Nb, esz}, rv = {va, vb, Na, Nb, esz};
    run(&rq, &rk, &rv, o, o_fmt, B, H, Dh, rope, work, omp_get_max_threads());
    return 1;
}

int kk_attention_bf16(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                      int64_t H, int64_t Dh, const float *rope, void *work) {
    if (Dh < 64 || Dh > DMAX || Dh % 64 || Nq < 1 || Nk < 1 || !work || !kk_bf16_ready()) return 0;
    kk_rows_of rq = {q, NULL, Nq, 0, 4}, rk = {k, NULL, Nk, 0, 4}, rv = {v, NULL, Nk, 0, 4};
    run(&rq, &rk, &rv, o, KK_FMT_F32, B, H, Dh, rope, work, omp_get_max_threads());
    return 1;
}
