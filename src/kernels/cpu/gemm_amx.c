/* gemm_amx.c - kiln's own GEMM on AMX tiles: bf16 products (TDPBF16PS) and,
 * for int8 backbones, s8 x s8 ones (TDPBSSD).
 *
 * y [rows,N] = epilogue(x [rows,K] . W^T). W is packed once (at conversion,
 * stored so in the weight cache) into panels of 32 outputs laid out exactly
 * as the B operand wants it: per step of 32 inputs (bf16; 64 for s8), two
 * 16x16 tiles of input pairs (quads). x is packed per call the same way
 * (blocks of 32 rows, two 16-row tiles per step), so every tile load reads
 * 1 KiB contiguous - unless it comes so already (KK_FMT_BLOCKED: the op
 * that made it wrote that layout).
 *
 * The micro-kernel keeps a 32 x 32 block of C in four accumulator tiles
 * (2 x 2: one tile load per product, the best ratio eight tile registers
 * allow) over K in chunks of 1536, then the epilogue applies scales, bias,
 * GELU or a gated residual and writes f32, bf16 rows or bf16 blocked - a
 * row per step of the next block's products, so the vector units work
 * while the tile unit does.
 *
 * Threads take work items dynamically: a group of panels and a chunk of
 * row blocks that fit L2 together (item_shape), the last items in pieces
 * of one row block (tail_pieces). Each thread claims its next item when it
 * starts one, a piece only when it is done with the one before; the
 * operands to come (the next row block's A, the next chunk's or item's B
 * panels) are brought into L2 a few lines per step of the blocks before,
 * so no block waits on memory for a whole operand. On the 2-core Sapphire
 * Rapids VM this runs 1.2-1.9x oneDNN 2.6's brgemm on the SD3 shapes
 * (bench_kernels, docs/PERFORMANCE.md). */
#include "kernels/cpu/gemm_amx.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"

#include <omp.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AHEAD 2     /* steps prefetched ahead into L1 (bench_kernels: 1-4 within noise, 0 slower) */
#define KCHUNK 48 /* steps of K (1536 inputs) per pass over a work item */
#define STEP 1024 /* bf16 elements per 32-input step of a block: 2 tiles x 16 x 32 */
#define SB 2048   /* bytes per step of a block: 32 inputs in bf16, 64 in s8 */
#define TAIL 1 /* items per thread at the end of a GEMM that are split into pieces (tail_pieces) */

static int64_t up32(int64_t n) { return (n + 31) / 32; }
static int64_t up64(int64_t n) { return (n + 63) / 64; }

size_t kk_amx_packed_bytes(int64_t N, int64_t K) { return (size_t)(up32(N) * up32(K)) * STEP * sizeof(uint16_t); }

/* The byte of element (n, k) of W in a packed layout of esz-byte elements
 * (2: bf16, 1: s8): a step holds 64 bytes of inputs per output, grouped in
 * 4-byte pairs (bf16) or quads (s8), one 16-output tile per 1 KiB. */
static size_t packed_byte(int64_t n, int64_t k, int64_t KB, int esz) {
    int64_t per = 4 / esz, in_step = 64 / esz, panel = n / 32, tile = (n % 32) / 16, col = n % 16;
    return (size_t)((panel * KB + k / in_step) * SB + tile * 1024 + (k % in_step) / per * 64 + col * 4 + k % per * esz);
}

void kk_amx_pack(const float *w, int64_t N, int64_t K, uint16_t *out) {
    int64_t KB = up32(K);
    memset(out, 0, kk_amx_packed_bytes(N, K));
#pragma omp parallel for schedule(static) if (N * K > (1 << 16))
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) out[packed_byte(n, k, KB, 2) / 2] = kt_f32_to_bf16(w[n * K + k]);
}

void kk_amx_unpack(const uint16_t *packed, int64_t N, int64_t K, float *out) {
    int64_t KB = up32(K);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) out[n * K + k] = kt_bf16_to_f32(packed[packed_byte(n, k, KB, 2) / 2]);
}

/* x rows [r0, r0+32) (zero past rows) into their block of out: the x of
 * the GEMM as KK_FMT_BLOCKED (kk_blocked_index), as an op that makes it
 * blocked writes it. A step (2 KiB of the block) at a time, its 32 rows
 * read 64 or 128 bytes each: a row at a time wrote lines 2 KiB apart,
 * all in two of L1's sets (the context and patch embeddings, whose x is
 * f32: 0.966x and 0.971x of their time this way, 20 pairs each) */
AMX_FN static void pack_rows(const void *x, int x_bf16, int64_t rows, int64_t K, int64_t r0, uint16_t *out) {
    int64_t KB = up32(K);
    for (int64_t s = 0; s < KB; s++)
        for (int64_t r = r0; r < r0 + 32; r++) {
            int64_t k0 = s * 32, n = r >= rows ? 0 : K - k0 < 32 ? K - k0 : 32;
            __mmask32 m = n == 32 ? 0xffffffffu : ((1u << n) - 1);
            __m512i v;
            if (x_bf16) {
                v = _mm512_maskz_loadu_epi16(m, (const uint16_t *)x + r * K + k0);
            } else {
                const float *xf = (const float *)x + r * K + k0;
                __m512 lo = _mm512_maskz_loadu_ps((__mmask16)m, xf), hi = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), xf + 16);
                v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            }
            _mm512_storeu_si512(out + kk_blocked_index(r, k0, K), v);
        }
}

/* gelu_tanh(v) = 0.5 v (1 + tanh(u)) = v / (1 + e^-2u), u = c (v + 0.044715 v^3):
 * e^-2u = 2^t with t = v (a + a 0.044715 v^2), a = -2 c log2 e; the
 * reciprocal to 14 bits (1.1e-4 relative error in all, against bf16's
 * 3.9e-3; 1.13x on the ff GEMMs over a degree-6 exp and a division) */
AMX_FN static inline __m512 gelu16(__m512 v) {
    const float a = -2.0f * 0.7978845608028654f * 1.4426950408889634f;
    __m512 t = _mm512_mul_ps(v, _mm512_fmadd_ps(_mm512_mul_ps(v, v), _mm512_set1_ps(a * 0.044715f), _mm512_set1_ps(a)));
    return _mm512_mul_ps(v, _mm512_rcp14_ps(_mm512_add_ps(kk_exp2_16(t), _mm512_set1_ps(1.0f))));
}

/* What every epilogue of one GEMM shares: y [rows, N] in y_fmt (KK_FMT_*) */
typedef struct out {
    const kk_amx_epilogue *e;
    void *y;
    int y_fmt;
    int64_t N;
} out;

/* A block's C waiting for its epilogue: rows [r0, r0+nr) by outputs
 * [n0, n0+nc) in c (32 x 32 f32; int32 sums times each row's scale xs when
 * the products were s8). `rows` rows are written: nr, or all 32 when y is
 * blocked (zeros past the last row). 0: nothing waits. */
typedef struct pend {
    const float *c, *xs;
    int64_t nr, nc, n0, r0, rows;
    int whole; /* all 32 rows by 32 outputs, into blocked y with no scales and no residual: epilogue_whole_row */
} pend;

/* The row of res that row r of y adds: res has every row, or with no gate
 * one batch entry's (`tokens` rows) that every entry adds */
static inline int64_t res_row(const kk_amx_epilogue *e, int64_t r) { return e->gate ? r : r % e->tokens; }
/* of the n rows from r, those whose rows of res follow one another */
static inline int64_t res_rows(const kk_amx_epilogue *e, int64_t r, int64_t n) {
    return e->gate || e->tokens - r % e->tokens >= n ? n : e->tokens - r % e->tokens;
}

/* Row i of a waiting C -> y: scales, bias, GELU or gated residual, then f32,
 * bf16 rows or bf16 blocked (whose padding past N gets zeros) */
AMX_FN static inline void epilogue_row(const out *o, const pend *p, int64_t i) {
    const kk_amx_epilogue *e = o->e;
    int blocked = o->y_fmt == KK_FMT_BLOCKED;
    int64_t r = p->r0 + i;
    for (int64_t h = 0; h < 32; h += 16) {
        int64_t w = p->nc - h < 16 ? p->nc - h : 16, n = p->n0 + h;
        if (w <= 0 && !blocked) break;
        if (i >= p->nr) { /* blocked: the zero rows of the last block */
            _mm256_store_si256((__m256i *)((uint16_t *)o->y + kk_blocked_index(r, n, o->N)), _mm256_setzero_si256());
            continue;
        }
        __mmask16 m = w >= 16 ? 0xffff : w <= 0 ? 0 : (__mmask16)((1u << w) - 1);
        __m512 bias = e->bias ? _mm512_maskz_loadu_ps(m, e->bias + n) : _mm512_setzero_ps();
        __m512 scale = e->scales ? _mm512_maskz_loadu_ps(m, e->scales + n) : _mm512_set1_ps(1.0f);
        __m512 v = p->xs ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(p->c + i * 32 + h)), _mm512_set1_ps(p->xs[r]))
                         : _mm512_load_ps(p->c + i * 32 + h);
        v = _mm512_fmadd_ps(v, scale, bias);
        if (e->act == KK_ACT_GELU_TANH) v = gelu16(v);
        int64_t at = r * o->N + n;
        if (e->res) {
            __m512 rv = _mm512_maskz_loadu_ps(m, e->res + res_row(e, r) * o->N + n);
            v = e->gate ? _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, e->gate + r / e->tokens * e->gate_ld + n), v, rv)
                        : _mm512_add_ps(v, rv);
        }
        if (blocked)
            _mm256_store_si256((__m256i *)((uint16_t *)o->y + kk_blocked_index(r, n, o->N)),
                               (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_mov_ps(m, v)));
        else if (o->y_fmt == KK_FMT_BF16) _mm256_mask_storeu_epi16((uint16_t *)o->y + at, m, (__m256i)_mm512_cvtneps_pbh(v));
        else _mm512_mask_storeu_ps((float *)o->y + at, m, v);
    }
}

/* Row i of a waiting C that is whole (pend.whole, decided once a block):
 * epilogue_row's arithmetic, bias and GELU, on both halves at once with no
 * masks and no per-half tests, into one line of blocked y (bias + v is
 * the multiply-add by 1, and no bias adds +0 as it does: the output is
 * bitwise the same). The GEMMs writing blocked y ran 1.07-1.12x faster
 * (with GELU 1.08-1.11x; harness, paired), the others 0.98-1.01x. A
 * test per row instead of per block gained less and cost the others up
 * to 5% (the bigger epilogue inlined, or not inlined) */
__attribute__((always_inline)) AMX_FN static inline void epilogue_whole_row(const out *o, const pend *p, int64_t i) {
    const kk_amx_epilogue *e = o->e;
    __m512 b0 = e->bias ? _mm512_loadu_ps(e->bias + p->n0) : _mm512_setzero_ps();
    __m512 b1 = e->bias ? _mm512_loadu_ps(e->bias + p->n0 + 16) : _mm512_setzero_ps();
    __m512 v0 = _mm512_add_ps(_mm512_load_ps(p->c + i * 32), b0), v1 = _mm512_add_ps(_mm512_load_ps(p->c + i * 32 + 16), b1);
    if (e->act == KK_ACT_GELU_TANH) {
        v0 = gelu16(v0);
        v1 = gelu16(v1);
    }
    _mm512_store_si512((uint16_t *)o->y + kk_blocked_index(p->r0 + i, p->n0, o->N), (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
}

/* the epilogue of row i of a waiting C, whichever way fits it */
#define EPILOGUE(o, p, i) ((p)->whole ? epilogue_whole_row(o, p, i) : epilogue_row(o, p, i))

AMX_FN void kk_amx_epilogue_rows(const kk_amx_epilogue *e, void *y, int y_fmt, int64_t N, const float *c, int64_t r0,
                                 int64_t nr, int64_t n0, int64_t nc) {
    out o = {e, y, y_fmt, N};
    pend p = {.c = c, .nr = nr, .nc = nc, .n0 = n0, .r0 = r0, .rows = nr};
    for (int64_t i = 0; i < nr; i++) epilogue_row(&o, &p, i);
}

/* Lines a work item will read next, brought into L2 a few per step of the
 * blocks before (so that no block waits on memory for a whole operand at
 * once): n lines in runs of lp (a panel's chunk, or one row block's), skip
 * bytes between the runs. */
typedef struct stream {
    const char *at; /* the next line */
    int64_t left;   /* lines left in this run */
    int64_t lp, skip, n;
} stream;

static inline stream stream_of(const char *at, int64_t runs, int64_t lp, int64_t skip) {
    return (stream){at, lp, lp, skip, runs * lp};
}

AMX_FN static inline void stream_take(stream *st, int64_t k) {
    for (; k > 0 && st->n > 0; k--, st->n--) {
        _mm_prefetch(st->at, _MM_HINT_T1);
        st->at += 64;
        if (--st->left == 0) {
            st->at += st->skip;
            st->left = st->lp;
        }
    }
}

/* One 32 x 32 block over KB steps (two A tiles when the block has more than
 * 16 rows): bf16 products into f32 sums, or s8 x s8 into int32 ones. c holds
 * the sums (acc: go on from the earlier steps' sums kept there). pfa / pfb:
 * prefetch A / B into L1 AHEAD steps ahead - only for an operand the work
 * item touches for the first time (it comes from L3); from L2 the prefetches
 * only take load slots from the tile loads (3% slower, paired runs).
 * sa / sb: streams to take qa / qb lines of over the block's steps (the
 * next row block's A; the next chunk's or work item's B). res: the first
 * of rn rows of the residual this block's epilogue will read (one line of
 * each, two when res2 is 64), brought into L1 a row per step: the residual
 * stream comes from L3, its rows 6 KiB apart, which no prefetcher follows
 * (waiting on it, the gated-residual GEMMs ran 1.025-1.08x slower, paired
 * with a residual in L3). The block before it waits in pe: its epilogue
 * goes a row per step, between this block's products, so the vector units
 * work while the tile unit does (run alone after the block it cost
 * 1.05-1.23x of the GEMM's time). A's tiles are loaded with the no-reuse
 * hint (TILELOADDT1): a row block's x is never read from L1 again (it
 * comes from L2 for every panel), and the hint leaves L1 to what is, such
 * as the sums the epilogue reads (the forward's GEMMs ran 1.03-1.04x
 * faster, 40 pairs; the hint on B as well: 0.95x). BEFORE and AFTER: what
 * each step does beside its products, in both loops. */
#define BEFORE                                                                      \
    if (s < na) stream_take(sa, qa / na + (s < qa % na));                           \
    if (s < nb) stream_take(sb, qb / nb + (s < qb % nb));
#define AFTER                                                                       \
    if (s < pe->rows) EPILOGUE(o, pe, s);                                           \
    if (s < rn) {                                                                   \
        _mm_prefetch((const char *)(res + s * o->N), _MM_HINT_T0);                  \
        _mm_prefetch((const char *)(res + s * o->N) + res2, _MM_HINT_T0);           \
    }
#define BLOCK_LOOP(DP)                                                              \
    if (two) {                                                                      \
        for (int64_t s = 0; s < KB; s++, a += SB, bp += SB) {                       \
            if (pfb)                                                                \
                for (int l = 0; l < 32; l++) _mm_prefetch(bp + AHEAD * SB + 64 * l, _MM_HINT_T0); \
            if (pfa)                                                                \
                for (int l = 0; l < 32; l++) _mm_prefetch(a + AHEAD * SB + 64 * l, _MM_HINT_T0); \
            BEFORE                                                                  \
            _tile_stream_loadd(4, a, 64);                                           \
            _tile_loadd(6, bp, 64);                                                 \
            DP(0, 4, 6);                                                            \
            _tile_loadd(7, bp + 1024, 64);                                          \
            DP(1, 4, 7);                                                            \
            _tile_stream_loadd(5, a + 1024, 64);                                    \
            DP(2, 5, 6);                                                            \
            DP(3, 5, 7);                                                            \
            AFTER                                                                   \
        }                                                                           \
    } else {                                                                        \
        for (int64_t s = 0; s < KB; s++, a += SB, bp += SB) {                       \
            BEFORE                                                                  \
            _tile_stream_loadd(4, a, 64);                                           \
            _tile_loadd(6, bp, 64);                                                 \
            DP(0, 4, 6);                                                            \
            _tile_loadd(7, bp + 1024, 64);                                          \
            DP(1, 4, 7);                                                            \
            AFTER                                                                   \
        }                                                                           \
    }

AMX_FN static void block(const char *a, const char *bp, int64_t KB, int two, void *c, int acc, int s8, int pfa, int pfb,
                         stream *sa, int64_t qa, stream *sb, int64_t qb, const out *o, const pend *pe, const float *res,
                         int64_t rn, int res2) {
    int64_t na = qa < KB ? qa : KB, nb = qb < KB ? qb : KB; /* steps the quotas spread over */
    char *cc = c;
    if (acc) {
        _tile_loadd(0, cc, 128);
        _tile_loadd(1, cc + 64, 128);
        if (two) {
            _tile_loadd(2, cc + 2048, 128);
            _tile_loadd(3, cc + 2048 + 64, 128);
        }
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    if (s8) {
        BLOCK_LOOP(_tile_dpbssd)
    } else {
        BLOCK_LOOP(_tile_dpbf16ps)
    }
    for (int64_t s = KB; s < pe->rows; s++) EPILOGUE(o, pe, s);
    _tile_stored(0, cc, 128);
    _tile_stored(1, cc + 64, 128);
    if (two) {
        _tile_stored(2, cc + 2048, 128);
        _tile_stored(3, cc + 2048 + 64, 128);
    }
}
#undef BLOCK_LOOP
#undef BEFORE
#undef AFTER

/* rows [r0, r0+32) of s8 x [rows,K] (zero past rows and K) into one block: [KB][2][16][64] */
AMX_FN static void pack_rows_s8(const int8_t *x, int64_t rows, int64_t K, int64_t r0, char *dst) {
    int64_t KB = up64(K);
    for (int64_t i = 0; i < 32; i++) {
        int64_t r = r0 + i;
        char *d = dst + (i / 16) * 1024 + (i % 16) * 64;
        for (int64_t s = 0; s < KB; s++) {
            int64_t k0 = s * 64, n = r < rows ? (K - k0 < 64 ? K - k0 : 64) : 0;
            __mmask64 m = n == 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
            _mm512_storeu_si512(d + s * SB, _mm512_maskz_loadu_epi8(m, x + r * K + k0));
        }
    }
}

/* x is f32 / bf16 rows / bf16 blocked (x_fmt; bf16 products), or s8 with
 * per-row scales xs (s8 x s8) */
typedef struct operand {
    const void *x;
    int x_fmt;
    const float *xs; /* non-NULL: x is s8 */
} operand;

/* A work item: rc row blocks by a group of panels, over a chunk of KC steps
 * of K, sized so that both stay in the core's 2 MiB L2 while the item runs
 * (with several chunks of K, the item's sums wait in its thread's part of
 * the work buffer, rc x group blocks of 4 KiB). Each side gets ITEM_BYTES;
 * smaller items when there would be fewer than 4 per thread. With few
 * rows (the 333 context tokens) all of them go in one item and the panels
 * get the rest of the budget, so each panel's weights come into L2 once
 * rather than once per chunk of rows (1.03-1.045x on those GEMMs, paired) */
#define ITEM_BYTES (3 << 18)
static void item_shape(int64_t RB, int64_t NP, int64_t KC, int nt, int64_t *rc, int64_t *group) {
    int64_t g = ITEM_BYTES / (KC * SB), r;
    if (g < 1) g = 1;
    int64_t left = (2 * ITEM_BYTES - RB * KC * SB) / (KC * SB); /* panels beside all the rows */
    if (RB * KC * SB <= 3 * ITEM_BYTES / 2 && left >= 1 && (NP + left - 1) / left >= 2 * nt) {
        *rc = RB;
        *group = left;
        return;
    }
    int64_t ng = (NP + g - 1) / g;
    for (r = g < RB ? g : RB; r > 1 && ng * ((RB + r - 1) / r) < 4 * nt;) r = (r + 1) / 2;
    *rc = r;
    *group = g;
}

/* The pieces each of the last items goes in: one per row block, or with a
 * single row block (the one-row GEMMs) up to four runs of its panels */
static int64_t tail_pieces(int64_t rc, int64_t group) { return rc > 1 ? rc : group < 4 ? group : 4; }

/* Work item `it`: panels [g, ge) and row blocks [r0, r1); past `whole`, the
 * pieces of the last items (see run; possibly empty) */
static void item_of(int64_t it, int64_t whole, int64_t nch, int64_t rc, int64_t group, int64_t NP, int64_t RB,
                    int64_t *g, int64_t *ge, int64_t *r0, int64_t *r1) {
    int64_t split = tail_pieces(rc, group), item = it < whole ? it : whole + (it - whole) / split;
    *g = item / nch * group;
    *ge = *g + group < NP ? *g + group : NP;
    *r0 = item % nch * rc;
    *r1 = *r0 + rc < RB ? *r0 + rc : RB;
    if (it >= whole) /* piece (it - whole) % split of the item's row blocks, or of its panels */
        kk_piece(rc > 1 ? r0 : g, rc > 1 ? r1 : ge, (it - whole) % split, split, 1);
}

AMX_FN static void run(const operand *in, const char *wp, int64_t N, int64_t K, const kk_amx_epilogue *e, void *y,
                       int y_fmt, int64_t rows, int threads, char *work) {
    int s8 = in->xs != NULL, blocked = !s8 && in->x_fmt == KK_FMT_BLOCKED;
    int64_t KB = s8 ? up64(K) : up32(K), RB = up32(rows), NP = up32(N), KC = KB < KCHUNK ? KB : KCHUNK;
    /* x packed into the work buffer (already so when blocked), then the sums */
    const char *ap = blocked ? in->x : work;
    char *sums = blocked ? work : work + RB * KB * SB;
    int64_t claimed = 0; /* work items taken */
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads();
#pragma omp for schedule(static)
        for (int64_t rb = 0; rb < RB * !blocked; rb++) {
            if (s8) pack_rows_s8(in->x, rows, K, rb * 32, work + rb * KB * SB);
            else pack_rows(in->x, in->x_fmt == KK_FMT_BF16, rows, K, rb * 32, (uint16_t *)work);
        }
        kk_tile_config cfg = {.palette = 1};
        for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
        _tile_loadconfig(&cfg);
        /* two C buffers: a block's products go into one while the epilogue of
         * the block before reads the other */
        float c[2][32 * 32] __attribute__((aligned(64)));
        int cur = 0;
        out o = {e, y, y_fmt, N};
        /* taken dynamically (the cores of a shared VM do not run at the same
         * speed, so a static split waits on the slower one), each thread
         * claiming its next item when it starts one, so that it can bring
         * that item's weights into L2 meanwhile. The pieces at the end are
         * claimed one at a time: claimed ahead, the last ones left the
         * thread done first waiting for up to two pieces of the other's
         * (the two threads ended 2.4-5.6 ms a forward apart, 1.1-2.2 ms
         * with pieces of one row block claimed one at a time; paired) */
        int64_t rc, group;
        item_shape(RB, NP, KC, nt, &rc, &group);
        int64_t ng = (NP + group - 1) / group, nch = (RB + rc - 1) / rc;
        /* the last TAIL items per thread go in pieces (tail_pieces), so the
         * thread that ends first waits less for the other's last item (all
         * of them when there are no more: a GEMM of one item is shared) */
        int64_t items = ng * nch, tail = items > TAIL * nt ? TAIL * nt : items, whole = items - tail;
        int64_t total = whole + tail * tail_pieces(rc, group), it = __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
        int warm = 0; /* this item's first B chunk is in L2 (the item before brought it) */
        while (it < total) {
            /* (a piece, or an item of one row block, brings nothing ahead: the
             * next is claimed when this one is done) */
            int64_t nx = it < whole && rc > 1 ? __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED) : -1, g, ge, r0, r1,
                    g2 = 0, ge2 = 0, r2, r3;
            item_of(it, whole, nch, rc, group, NP, RB, &g, &ge, &r0, &r1);
            if (nx >= 0 && nx < total) item_of(nx, whole, nch, rc, group, NP, RB, &g2, &ge2, &r2, &r3);
            pend pe = {0};
            for (int64_t k0 = 0; k0 < KB; k0 += KC) {
                int64_t kn = KB - k0 < KC ? KB - k0 : KC, last = k0 + kn == KB;
                /* the B to come: this item's next chunk, or the next item's first
                 * (none when it is this one's: one chunk, the same panels) */
                int64_t bk = last ? 0 : k0 + KC, bn = KB - bk < KC ? KB - bk : KC, bg = last ? g2 : g, bge = last ? ge2 : ge;
                if (last && KB == KC && bg == g) bge = bg;
                stream sb = stream_of(wp + (bg * KB + bk) * SB, bge - bg, bn * SB / 64, (KB - bn) * SB);
                int64_t nbl = (r1 - r0 - 1) * (ge - g), bi = 0; /* blocks after the first row's */
                for (int64_t rb = r0; rb < r1; rb++) {
                    int64_t nr = rows - rb * 32 < 32 ? rows - rb * 32 : 32;
                    /* the next row block's A, a share per block of this row's */
                    stream sa = stream_of(rb + 1 < r1 ? ap + ((rb + 1) * KB + k0) * SB : ap, rb + 1 < r1, kn * SB / 64, 0);
                    for (int64_t p = g; p < ge; p++) {
                        float *cb = KB == KC ? c[cur]
                                             : (float *)(sums + ((omp_get_thread_num() * rc + (rb - r0)) * group + (p - g)) * 4096);
                        int64_t qa = sa.n / (ge - p) + (sa.n % (ge - p) != 0), qb = 0;
                        if (rb > r0) {
                            qb = sb.n / (nbl - bi) + (sb.n % (nbl - bi) != 0);
                            bi++;
                        }
                        int64_t nc = N - p * 32 < 32 ? N - p * 32 : 32;
                        block(ap + (rb * KB + k0) * SB, wp + (p * KB + k0) * SB, kn, nr > 16, cb, k0 > 0, s8,
                              p == g && rb == r0, rb == r0 && !warm, &sa, qa, &sb, qb, &o, &pe,
                              e->res ? e->res + res_row(e, rb * 32) * N + p * 32 : NULL,
                              last && e->res ? res_rows(e, rb * 32, nr) : 0, nc > 16 ? 64 : 0);
                        pe.rows = 0;
                        if (!last) continue;
                        pe = (pend){cb, in->xs, nr, nc, p * 32, rb * 32, y_fmt == KK_FMT_BLOCKED ? 32 : nr,
                                    nr == 32 && nc == 32 && y_fmt == KK_FMT_BLOCKED && !e->scales && !in->xs && !e->res};
                        cur ^= 1;
                    }
                }
                /* one row block, or a piece (no next item claimed): nothing was brought ahead */
                warm = nx >= 0 && (r1 - r0 > 1 || (last && KB == KC && bg == g));
            }
            for (int64_t i = 0; i < pe.rows; i++) EPILOGUE(&o, &pe, i);
            it = nx >= 0 ? nx : __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
        }
        _tile_release();
    }
}

int kk_amx_linear(const void *x, int x_fmt, const uint16_t *packed, int64_t N, int64_t K, const kk_amx_epilogue *e,
                  void *y, int y_fmt, int64_t rows, int threads, uint16_t *work) {
    /* the check comes first, outside any function built for AMX */
    if (!kk_amx_ready() || !work) return 0;
    if (rows < 1) return 1;
    operand in = {x, x_fmt, NULL};
    run(&in, (const char *)packed, N, K, e, y, e->res ? KK_FMT_F32 : y_fmt, rows, threads < 1 ? 1 : threads, (char *)work);
    return 1;
}

int kk_amx_linear_s8(const int8_t *xq, const float *xs, const int8_t *packed, int64_t N, int64_t K,
                     const kk_amx_epilogue *e, void *y, int y_fmt, int64_t rows, int threads, void *work) {
    if (!kk_amx_ready() || !work || !xs) return 0;
    if (rows < 1) return 1;
    operand in = {xq, KK_FMT_F32, xs};
    run(&in, (const char *)packed, N, K, e, y, e->res ? KK_FMT_F32 : y_fmt, rows, threads < 1 ? 1 : threads, work);
    return 1;
}

/* An upper bound for both products: s8 steps cover twice the inputs of bf16 ones */
size_t kk_amx_work_bytes(int64_t rows, int64_t K, int threads) {
    /* the sums of an item, rc x group blocks (item_shape): split, at most
     * g x g; all rows, RB x (L - RB) with L = 2 ITEM_BYTES / (KC SB) <= 2g + 1,
     * at most L^2 / 4, so g (g + 1) bounds both */
    int64_t KB = up32(K), KC = KB < KCHUNK ? KB : KCHUNK, g = ITEM_BYTES / (KC * SB);
    if (g < 1) g = 1;
    size_t sums = KB > KCHUNK ? (size_t)((threads < 1 ? 1 : threads) * g * (g + 1)) * 4096 : 0;
    return (size_t)(up32(rows) * KB) * SB + sums;
}

/* ---- the s8 layout: panels of 32 outputs, per step of 64 inputs two tiles of
 * 16 input quads x 16 outputs x 4 (TDPBSSD's B operand) ---- */

size_t kk_amx_s8_packed_bytes(int64_t N, int64_t K) { return (size_t)(up32(N) * up64(K)) * SB; }

void kk_amx_s8_pack(const int8_t *q, int64_t N, int64_t K, int8_t *out) {
    int64_t KB = up64(K);
    memset(out, 0, kk_amx_s8_packed_bytes(N, K));
#pragma omp parallel for schedule(static) if (N * K > (1 << 16))
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) out[packed_byte(n, k, KB, 1)] = q[n * K + k];
}

void kk_amx_s8_unpack(const int8_t *packed, int64_t N, int64_t K, int8_t *out) {
    int64_t KB = up64(K);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) out[n * K + k] = packed[packed_byte(n, k, KB, 1)];
}
