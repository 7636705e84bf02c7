/* attn_amx.c - fused flash attention on AMX tiles, for bf16 compute with a
 * head size of 64 (every SD3 / SD3.5 model).
 *
 * Per (batch, head): q, k and v (f32, or bf16 rows as the GEMMs before wrote
 * them) are packed in bf16 once, straight into the tile layouts the
 * products want (blocks of tokens, transposed in registers). Everything
 * runs transposed (keys and dims down, the 16 queries of a block across one
 * vector), so the softmax's max and sum go down columns with no horizontal
 * reductions. Per block of 16 queries, O^T [64 dims x 16 queries] stays in
 * four accumulator tiles over every key, and for each step of 32 keys:
 *   S^T [32 x 16] = K Q^T         two accumulator tiles, 2 products each over Dh
 *   online softmax (AVX-512):     reference point m and sum l per query, P^T = 2^(c S^T - m) in bf16,
 *                                 c = log2 e / sqrt(Dh); m is the first step's max and moves only
 *                                 when a step's weights would pass 2^64 (softmax)
 *   O^T += V^T P^T                one product per accumulator tile
 * and (O^T)^T / l is the output. The tile products of the steps before and
 * after a softmax (the next scores, the last V^T P^T) are issued in pieces
 * between its rows, so that the tile unit and the vector units work at
 * once. The N x N matrix is never formed; parallel over batch x heads x
 * chunks of 512 queries, the last ones in pieces (the threads' ends at 1357
 * tokens: 336 us apart on average before, 22 after).
 *
 * The eight tile registers go 4 to O^T, 2 to S^T and 2 to streaming the
 * operands (K, Q^T; V^T, P^T). O^T leaves its tiles only when m moves
 * (rarely: see softmax) and at the end. An earlier kernel took 64 keys a
 * step with S^T in four tiles, so O^T went through memory every step and
 * eight blocks of queries shared each block of keys while it was in L1;
 * this one reads K and V from L2 for every block of queries (bringing the
 * next step's into L1 during the softmax) and ran 1.06-1.14x faster at
 * 333-4096 tokens (paired, one process; docs/PERFORMANCE.md, stop 17). */
#include "kernels/cpu/attn_amx.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define QB 16 /* queries per block: one tile's rows */
#define KS 32 /* keys per step: two 16-column accumulator tiles */
#define KB 64 /* keys per block of the packed V^T (two steps) */
#define DH 64
#define QCHUNK 512 /* queries per work item */
#define TAIL_PIECES 4 /* pieces each of the last items goes in */

/* The tile products around one step's softmax (tiles 0-3 hold O^T, dims
 * 16n..; 4-5 the scores, keys 0-15 and 16-31; 6-7 stream the operands):
 * the scores of the step after (S^T = K Q^T, Q^T's two halves of Dh
 * through tile 7) in pieces 0-3, stored in 5 and 6, and the products of
 * the step before (O^T += V^T P^T, P^T in tile 7) in pieces 4-7; the
 * softmax issues a piece every two of its rows. Issued as one block
 * before or after it, the tile loads waiting on the products fill the
 * scheduler and hold up the vector work. pk and pv: the K of the step
 * after next and the V^T of this step (read by the next step's pieces),
 * brought from L2 into L1 four lines each per two rows (1.03-1.05x). K and
 * V^T are loaded with the no-reuse hint (TILELOADDT1): this block of
 * queries does not read them again, and the next one finds them in L2
 * (1.00-1.02x, 61 pairs at 333-4096 tokens). */
typedef struct around {
    const uint16_t *q, *k; /* the next step's Q^T and K: no scores when q is NULL */
    float *St;
    const uint16_t *Pt, *v; /* the step before's P^T and V^T: no products when Pt is NULL */
    const char *pk, *pv;    /* lines to bring into L1 (NULL: none) */
} around;

AMX_FN static inline void piece(const around *w, int i) {
    if (i < 4 ? w->q != NULL : w->Pt != NULL) switch (i) {
    case 0:
        _tile_zero(4);
        _tile_zero(5);
        _tile_loadd(7, w->q, 64);
        _tile_stream_loadd(6, w->k, DH * 2);
        _tile_dpbf16ps(4, 6, 7);
        break;
    case 1:
        _tile_stream_loadd(6, w->k + 16 * DH, DH * 2);
        _tile_dpbf16ps(5, 6, 7);
        break;
    case 2:
        _tile_loadd(7, w->q + 512, 64);
        _tile_stream_loadd(6, w->k + 32, DH * 2);
        _tile_dpbf16ps(4, 6, 7);
        break;
    case 3:
        _tile_stream_loadd(6, w->k + 16 * DH + 32, DH * 2);
        _tile_dpbf16ps(5, 6, 7);
        break;
    case 4:
        _tile_loadd(7, w->Pt, 64);
        _tile_stream_loadd(6, w->v, 64);
        _tile_dpbf16ps(0, 6, 7);
        break;
    case 5:
        _tile_stream_loadd(6, w->v + 1024, 64);
        _tile_dpbf16ps(1, 6, 7);
        break;
    case 6:
        _tile_stream_loadd(6, w->v + 2048, 64);
        _tile_dpbf16ps(2, 6, 7);
        break;
    default:
        _tile_stream_loadd(6, w->v + 3072, 64);
        _tile_dpbf16ps(3, 6, 7);
        break;
    }
    /* the scores' stores two and three pieces after their last products,
     * so that they do not wait on them (stored in piece 3, the attention
     * ran 1.02-1.045x slower, paired) */
    if (w->q && i == 5) _tile_stored(4, w->St, QB * 4);
    if (w->q && i == 6) _tile_stored(5, w->St + 16 * QB, QB * 4);
}

/* O^T (tiles 0-3) into ot [64 dims x 16 queries] */
AMX_FN static inline void ot_out(float *ot) {
    _tile_stored(0, ot, QB * 4);
    _tile_stored(1, ot + 16 * QB, QB * 4);
    _tile_stored(2, ot + 32 * QB, QB * 4);
    _tile_stored(3, ot + 48 * QB, QB * 4);
}

/* P^T of one S^T step (its valid keys; zeros past them) against the
 * reference point m: 2^(c S^T - m) in key pairs (bf16), and its sums per
 * query; with w, the tile products around it, a piece every two rows, and
 * its lines into L1. The attention runs with denormals flushed (run), so
 * 2^x needs no floor here (kk_exp2_16_ftz). */
AMX_FN static inline __m512 weights(const float *St, int valid, __m512 c, __m512 m, uint16_t *Pt, const around *w) {
    /* bf16 pairs (even key, odd key) per query: [e0 o0 e1 o1 ...] from [e0..e15 o0..o15] */
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (int r = 0; r < KS; r += 2) {
        if (w) {
            if (r % 4 == 0) piece(w, r / 4);
            /* lines 2r.. of K's 64 and of V^T's four 1 KiB pieces, 2 KiB apart */
            for (int j = 0; j < 4 && w->pk; j++) _mm_prefetch(w->pk + (r * 2 + j) * 64, _MM_HINT_T0);
            for (int j = 0; j < 4 && w->pv; j++) _mm_prefetch(w->pv + r / 8 * 2048 + (r * 2 + j) % 16 * 64, _MM_HINT_T0);
        }
        __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
        if (r < valid) p0 = kk_exp2_16_ftz(_mm512_fmsub_ps(_mm512_load_ps(St + r * QB), c, m));
        if (r + 1 < valid) p1 = kk_exp2_16_ftz(_mm512_fmsub_ps(_mm512_load_ps(St + (r + 1) * QB), c, m));
        s0 = _mm512_add_ps(s0, p0);
        s1 = _mm512_add_ps(s1, p1);
        _mm512_store_si512(Pt + r * QB, _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(p1, p0)));
    }
    return _mm512_add_ps(s0, s1);
}

/* The online softmax of one S^T step down the columns, one lane per
 * query, so no horizontal reductions: updates the running reference point
 * m and sum l, rescales O^T (in tiles 0-3) when m moved, and writes P^T for
 * the product with V, issuing the tile products around it (w) on the way.
 * m is in log2 units: the scores times c (log2 e / sqrt(Dh)), applied here
 * in f32 (one FMA with the subtraction), so q goes into the products as the
 * GEMM rounded it, with no second rounding.
 * m need not be the running max: P = 2^(c S - m) is a float, as precise at
 * 2^40 as at 1, and O / l comes out the same whatever m is, as long as
 * nothing overflows. So after a query block's first step, whose max sets
 * m, the weights are made against m as it is, with no pass for the max; m
 * moves only when a step's sum reaches 2^BOUND (some score passed m by ~59
 * or more; then that step is made again against its max, and O^T goes out
 * of its tiles to be rescaled: ot is room for it), which keeps P, l and O^T
 * far inside f32's range (2^BOUND x |v| x keys). */
#define BOUND 64.0f
AMX_FN static inline void softmax(const float *St, int valid, int first, __m512 c, __m512 *m, __m512 *l, float *ot,
                                  uint16_t *Pt, const around *w) {
    if (!first) {
        __m512 s = weights(St, valid, c, *m, Pt, w);
        w = NULL; /* issued */
        if (_mm512_cmp_ps_mask(s, _mm512_set1_ps(exp2f(BOUND)), _CMP_LT_OQ) == 0xffff) { /* NaN: not below */
            *l = _mm512_add_ps(*l, s);
            return;
        }
    }
    __m512 mx0 = _mm512_set1_ps(-INFINITY), mx1 = mx0, mx2 = mx0, mx3 = mx0; /* four chains: a max waits 4 cycles on the one before */
    int r = 0;
    for (; r + 4 <= valid; r += 4) {
        mx0 = _mm512_max_ps(mx0, _mm512_load_ps(St + r * QB));
        mx1 = _mm512_max_ps(mx1, _mm512_load_ps(St + (r + 1) * QB));
        mx2 = _mm512_max_ps(mx2, _mm512_load_ps(St + (r + 2) * QB));
        mx3 = _mm512_max_ps(mx3, _mm512_load_ps(St + (r + 3) * QB));
    }
    for (; r < valid; r++) mx0 = _mm512_max_ps(mx0, _mm512_load_ps(St + r * QB));
    __m512 mx = _mm512_max_ps(_mm512_max_ps(mx0, mx1), _mm512_max_ps(mx2, mx3));
    /* lanes whose step max passed m (all of them at first: m = -inf, l 0) */
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_mul_ps(mx, c), *m, _CMP_GT_OQ);
    __m512 mnew = _mm512_mask_mul_ps(*m, up, mx, c);
    __m512 alpha = kk_exp2_16(_mm512_sub_ps(*m, mnew)); /* -inf at first: 0 (kk_exp2_16 floors it) */
    *m = mnew;
    *l = _mm512_fmadd_ps(*l, alpha, weights(St, valid, c, mnew, Pt, w));
    /* (the products of the step before are issued by now, so O^T holds
     * every key before this step; at first it is zero and stays so) */
    if (up && !first) {
        ot_out(ot);
        for (int d = 0; d < DH; d++) _mm512_store_ps(ot + d * QB, _mm512_mul_ps(_mm512_load_ps(ot + d * QB), alpha));
        _tile_loadd(0, ot, QB * 4);
        _tile_loadd(1, ot + 16 * QB, QB * 4);
        _tile_loadd(2, ot + 32 * QB, QB * 4);
        _tile_loadd(3, ot + 48 * QB, QB * 4);
    }
}

/* queries [q0, q1) of batch entry b, head h (q0 a multiple of QB): qp
 * (Q^T tiles per block of 16 queries), kp and vp packed by pack_q_block
 * and pack_kv_block. One block of queries at a time goes over every key,
 * its O^T in tiles 0-3; the steps are pipelined: the softmax of step t
 * issues the scores of t + 1 and the products of t - 1 between its rows. */
AMX_FN static void head(const uint16_t *qp, const uint16_t *kp, const uint16_t *vp, const kk_out_of *out, int64_t b,
                        int64_t h, int64_t q0, int64_t q1, int64_t Nk, float scale) {
    __m512 c = _mm512_set1_ps(scale);
    int64_t ns = (Nk + KS - 1) / KS;
    float St[2][KS * QB] __attribute__((aligned(64))); /* S^T of this step and the next: 32 keys x 16 queries */
    float Ot[DH * QB] __attribute__((aligned(64)));    /* O^T out of its tiles: 64 dims x 16 queries */
    uint16_t Pt[2][KS * QB] __attribute__((aligned(64))); /* P^T in key pairs, [16][16 queries x 2]: this step's and the one before's */
    /* step t's V^T: the half t % 2 of 64-key block t / 2 */
#define V_OF(t) (vp + (t) / 2 * KB * DH + (t) % 2 * 512)
    qp += q0 / QB * 2 * 512;
    for (int64_t b0 = q0; b0 < q1; b0 += QB, qp += 2 * 512) {
        __m512 m = _mm512_set1_ps(-INFINITY), l = _mm512_setzero_ps();
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        around w0 = {qp, kp, St[0], NULL, NULL, NULL, NULL}; /* the first step's scores */
        for (int i = 0; i < 8; i++) piece(&w0, i);
        for (int64_t t = 0; t <= ns; t++) { /* t = ns: the last step's products alone */
            around w = {NULL, NULL, St[(t + 1) & 1], NULL, NULL, NULL, NULL};
            if (t + 1 < ns) {
                w.q = qp;
                w.k = kp + (t + 1) * KS * DH;
            }
            if (t > 0) {
                w.Pt = Pt[(t - 1) & 1];
                w.v = V_OF(t - 1);
            }
            if (t + 2 < ns) w.pk = (const char *)(kp + (t + 2) * KS * DH);
            if (t < ns) {
                w.pv = (const char *)V_OF(t);
                softmax(St[t & 1], (int)(Nk - t * KS < KS ? Nk - t * KS : KS), t == 0, c, &m, &l, Ot, Pt[t & 1], &w);
            } else
                for (int i = 4; i < 8; i++) piece(&w, i);
        }
        ot_out(Ot);
        /* o = (O^T)^T / l: f32, or bf16 (rounded to nearest even, as the GEMMs
         * do) in rows or blocked, 32 outputs at a time */
        float inv[QB] __attribute__((aligned(64)));
        _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), l));
        int rows = (int)(q1 - b0 < QB ? q1 - b0 : QB);
        for (int r = 0; r < rows; r++) {
            float row[DH] __attribute__((aligned(64)));
            for (int d = 0; d < DH; d++) row[d] = Ot[d * QB + r] * inv[r];
            for (int d = 0; d < DH; d += 32) {
                void *dst = kk_out_at(out, b, b0 + r, h, d);
                if (out->fmt == KK_FMT_F32) memcpy(dst, row + d, 32 * sizeof(float));
                else _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(row + d + 16), _mm512_load_ps(row + d)));
            }
        }
    }
#undef V_OF
}

/* Layouts, per (batch, head):
 * Q^T: [query/16][Dh half][Dh pair][query%16][2] (zero past Nq);
 * K:   [key][Dh] (zero past Nk, to a whole block of 64);
 * V^T: [key/64][Dh/16][key half][Dh%16][key%32] (zero past Nk).
 * Blocks of tokens of every head at a time: the rows of q, k and v are read
 * whole and in order (per head they would be 256-byte pieces 6 KiB apart,
 * which the prefetchers do not follow); Q and V are transposed in
 * registers, 16 x 16 lanes of 32 bits at a time. */

/* elements [j, j+32) of a row as bf16 (f32 rounded to nearest even; bf16 as it is) */
AMX_FN static inline __m512i load32_bf16(const kk_rows_of *r, const char *row, int64_t j) {
    if (r->esz == 2) return _mm512_loadu_si512(row + 2 * j);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps((const float *)row + j + 16), _mm512_loadu_ps((const float *)row + j));
}

/* queries [i0, i0+16) of one batch into Q^T: each query's Dh pairs (32
 * bits, even dim low) become a lane of 16 vectors */
AMX_FN static void pack_q_block(const kk_rows_of *q, int64_t batch, int64_t i0, int64_t Nq, int64_t H, int64_t Nqp,
                                uint16_t *qp) {
    for (int64_t h = 0; h < H; h++) {
        __m512i half[2][16];
        for (int r = 0; r < QB; r++) {
            const char *row = i0 + r < Nq ? kk_row_of(q, batch, i0 + r, H * DH) : NULL;
            for (int c = 0; c < 2; c++) half[c][r] = row ? load32_bf16(q, row, h * DH + 32 * c) : _mm512_setzero_si512();
        }
        uint16_t *blk = qp + h * Nqp * DH + i0 / QB * 2 * 512;
        for (int c = 0; c < 2; c++) {
            kk_transpose16(half[c]);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(blk + c * 512 + j * 32, half[c][j]);
        }
    }
}

/* keys [k0, k0+32) of one batch into K and V^T */
AMX_FN static void pack_kv_block(const kk_rows_of *k, const kk_rows_of *v, int64_t batch, int64_t k0, int64_t Nk, int64_t H,
                                 int64_t Nkp, uint16_t *kp, uint16_t *vp) {
    const char *vrow[32];
    for (int r = 0; r < 32; r++) vrow[r] = k0 + r < Nk ? kk_row_of(v, batch, k0 + r, H * DH) : NULL;
    for (int64_t h = 0; h < H; h++) {
        for (int r = 0; r < 32; r++) {
            uint16_t *kdst = kp + h * Nkp * DH + (k0 + r) * DH;
            const char *row = k0 + r < Nk ? kk_row_of(k, batch, k0 + r, H * DH) : NULL;
            for (int c = 0; c < DH; c += 32)
                _mm512_storeu_si512(kdst + c, row ? load32_bf16(k, row, h * DH + c) : _mm512_setzero_si512());
        }
        uint16_t *blk = vp + h * Nkp * DH + k0 / KB * KB * DH + (k0 % KB) / 32 * 512;
        for (int d0 = 0; d0 < DH; d0 += 16) {
            __m512i lo[16], hi[16]; /* keys k0.. and k0+16.. x 16 dims, then 16 dims x those keys */
            for (int r = 0; r < 16; r++) {
                lo[r] = vrow[r] ? _mm512_castps_si512(kk_load16(v, vrow[r], h * DH + d0)) : _mm512_setzero_si512();
                hi[r] = vrow[16 + r] ? _mm512_castps_si512(kk_load16(v, vrow[16 + r], h * DH + d0)) : _mm512_setzero_si512();
            }
            kk_transpose16(lo);
            kk_transpose16(hi);
            for (int d = 0; d < 16; d++)
                _mm512_storeu_si512(blk + d0 / 16 * 1024 + d * 32,
                                   (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(hi[d]), _mm512_castsi512_ps(lo[d])));
        }
    }
}

AMX_FN static void run(const kk_rows_of *q, const kk_rows_of *k, const kk_rows_of *v, void *o, int o_fmt, int64_t B,
                       int64_t H, int64_t Dh, uint16_t *all) {
    int64_t D = H * Dh, Nq = q->na + q->nb, Nk = k->na + k->nb, Nqp = (Nq + QB - 1) / QB * QB, Nkp = (Nk + KB - 1) / KB * KB;
    float scale = 1.4426950408889634f / sqrtf((float)Dh); /* log2 e / sqrt(Dh): softmax in base 2 */
    size_t per_b = (size_t)(H * (Nqp + 2 * Nkp) * DH);
    kk_out_of out = {o, o_fmt, B, q->na, q->nb, D};
    kk_out_zero_padding(&out);
#pragma omp parallel
    {
        /* flush denormals to zero here: a rescale by a tiny exp(m_old - m) makes
         * them by the thousand, and each one costs a microcode assist */
        unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);
        kk_tile_config cfg = {.palette = 1};
        for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
        _tile_loadconfig(&cfg);
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < (Nqp > Nkp ? Nqp : Nkp); i += 32) {
                uint16_t *qp = all + b * per_b, *kp = qp + H * Nqp * DH, *vp = kp + H * Nkp * DH;
                for (int64_t i0 = i; i0 < i + 32 && i0 < Nqp; i0 += QB) pack_q_block(q, b, i0, Nq, H, Nqp, qp);
                if (i < Nkp) pack_kv_block(k, v, b, i, Nk, H, Nkp, kp, vp);
            }
        /* work items: a head's queries in chunks of QCHUNK, so that the
         * thread done first waits for at most one chunk of the other's; the
         * last two per thread in TAIL_PIECES pieces (whole blocks of QB) */
        int64_t nch = (Nq + QCHUNK - 1) / QCHUNK, items = B * H * nch, nt = omp_get_num_threads();
        int64_t tail = items > 2 * nt ? 2 * nt : items, whole = items - tail;
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < whole + tail * TAIL_PIECES; it++) {
            int64_t item = it < whole ? it : whole + (it - whole) / TAIL_PIECES;
            int64_t b = item / (H * nch), h = item / nch % H, q0 = item % nch * QCHUNK;
            int64_t q1 = q0 + QCHUNK < Nq ? q0 + QCHUNK : Nq;
            if (it >= whole) kk_piece(&q0, &q1, (it - whole) % TAIL_PIECES, TAIL_PIECES, QB);
            const uint16_t *qp = all + b * per_b, *kp = qp + H * Nqp * DH, *vp = kp + H * Nkp * DH;
            head(qp + h * Nqp * DH, kp + h * Nkp * DH, vp + h * Nkp * DH, &out, b, h, q0, q1, Nk, scale);
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
    kk_rows_of rq = {q, NULL, Nq, 0, 4}, rk = {k, NULL, Nk, 0, 4}, rv = {v, NULL, Nk, 0, 4};
    run(&rq, &rk, &rv, o, KK_FMT_F32, B, H, Dh, work);
    return 1;
}

int kk_attention_amx_joint(const void *qa, const void *ka, const void *va, const void *qb, const void *kb,
                           const void *vb, int bf16, void *o, int o_fmt, int64_t B, int64_t Na, int64_t Nb, int64_t H,
                           int64_t Dh, uint16_t *work) {
    if (Dh != DH || Na < 0 || Nb < 0 || Na + (qb ? Nb : 0) < 1 || !work || !kk_amx_ready()) return 0;
    int esz = bf16 ? 2 : 4;
    kk_rows_of rq = {qa, qb, Na, qb ? Nb : 0, esz}, rk = {ka, kb, Na, Nb, esz}, rv = {va, vb, Na, Nb, esz};
    run(&rq, &rk, &rv, o, o_fmt, B, H, Dh, work);
    return 1;
}
