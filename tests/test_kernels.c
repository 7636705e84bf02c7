/* test_kernels.c - each fast kernel against its reference kernel on random
 * shapes, odd sizes included (rows and sequence lengths that are no multiple
 * of any tile): f32 within 1e-5, bf16 within 1e-2 relative L2. */
#include "base/base.h"
#include "graph/graph.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/attn_ex.h"
#include "kernels/cpu/attn_bf16.h"
#include "kernels/cpu/attn_f16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/gemm_f16.h"
#include "kernels/cpu/gemm_avx2.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "test.h"

static float *rnd(uint64_t seed, size_t n, float scale) {
    float *v = kb_alloc_aligned(sizeof(float) * (n ? n : 1));
    kiln_noise(seed, v, n);
    for (size_t i = 0; i < n; i++) v[i] *= scale;
    return v;
}

static double tol_of(kiln_dtype dt) { return dt == KILN_BF16 ? 1e-2 : 1e-5; }

static void check_linear(kiln_dtype dt, int64_t rows, int64_t K, int64_t M, int bias, int act) {
    const kk_backend *fast = kk_fast(dt), *ref = kk_reference();
    if (!fast) {
        fprintf(stderr, "  (no fast %s backend on this machine: skipped)\n", kiln_dtype_name(dt));
        return;
    }
    float *x = rnd(1, (size_t)(rows * K), 1), *w = rnd(2, (size_t)(M * K), 1.0f / sqrtf((float)K));
    float *b = bias ? rnd(3, (size_t)M, 0.1f) : NULL;
    float *y0 = rnd(4, (size_t)(rows * M), 0), *y1 = rnd(5, (size_t)(rows * M), 0);
    char layout[40];
    size_t bytes;
    CHECK_OK(kk_fast_layout(M, K, dt, layout, &bytes));
    void *packed = kb_alloc_aligned(bytes);
    CHECK_OK(kk_fast_pack(w, M, K, dt, packed));
    kk_weight wr = {M, K, w, NULL, KILN_F32, NULL}, wf = {M, K, NULL, packed, dt, NULL};
    ref->linear(x, &wr, b, y0, rows, act);
    fast->linear(x, &wf, b, y1, rows, act);
    double err = rel_l2(y1, y0, (size_t)(rows * M));
    CHECK_MSG(err <= tol_of(dt), "linear %s rows %lld K %lld M %lld bias %d act %d: error %.3g", kiln_dtype_name(dt),
              (long long)rows, (long long)K, (long long)M, bias, act, err);
    kb_free_aligned(x);
    kb_free_aligned(w);
    kb_free_aligned(b);
    kb_free_aligned(y0);
    kb_free_aligned(y1);
    kb_free_aligned(packed);
}

TEST(linear_matches_reference) {
    kiln_dtype dts[2] = {KILN_F32, KILN_BF16};
    /* rows x K x outputs; K past 1536 takes the AMX GEMM's chunks of K (two, and three with a tail);
     * 40 x 1600 x 2000: all rows in each work item, with its sums over two chunks of K; the AMX
     * GEMM's last items go in pieces: 200 x 1600 x 1000 one per row block (with two chunks of K),
     * 1 x 1536 x 1600 in runs of its panels */
    int64_t shapes[][3] = {{1, 7, 5},      {3, 64, 48},       {77, 96, 130},   {129, 33, 64},
                           {300, 256, 17}, {2, 1536, 64},     {37, 1601, 70},  {70, 3100, 33},
                           {4, 100, 40},   {40, 1600, 2000},  {200, 1600, 1000}, {1, 1536, 1600}};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int variant = 0; variant < 3; variant++)
                check_linear(dts[d], shapes[s][0], shapes[s][1], shapes[s][2], variant > 0,
                             variant == 2 ? KK_ACT_GELU_TANH : KK_ACT_NONE);
}

static void check_attention(kiln_dtype dt, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh) {
    const kk_backend *fast = kk_fast(dt), *ref = kk_reference();
    if (!fast) return;
    int64_t D = H * Dh;
    float *q = rnd(11, (size_t)(B * Nq * D), 1), *k = rnd(12, (size_t)(B * Nk * D), 1), *v = rnd(13, (size_t)(B * Nk * D), 1);
    float *o0 = rnd(14, (size_t)(B * Nq * D), 0), *o1 = rnd(15, (size_t)(B * Nq * D), 0);
    ref->attention(q, k, v, o0, B, Nq, Nk, H, Dh, NULL);
    fast->attention(q, k, v, o1, B, Nq, Nk, H, Dh, NULL);
    double err = rel_l2(o1, o0, (size_t)(B * Nq * D));
    CHECK_MSG(err <= tol_of(dt), "attention %s B %lld Nq %lld Nk %lld H %lld Dh %lld: error %.3g", kiln_dtype_name(dt),
              (long long)B, (long long)Nq, (long long)Nk, (long long)H, (long long)Dh, err);
    kb_free_aligned(q);
    kb_free_aligned(k);
    kb_free_aligned(v);
    kb_free_aligned(o0);
    kb_free_aligned(o1);
}

TEST(attention_matches_reference) {
    kiln_dtype dts[2] = {KILN_F32, KILN_BF16};
    int64_t shapes[][5] = {{1, 1, 1, 1, 8}, {2, 5, 9, 3, 8}, {1, 129, 129, 2, 16}, {2, 300, 317, 4, 8},
                           {1, 257, 40, 2, 64}, {1, 20, 600, 1, 32},
                           /* head size 64: the fused AMX kernel in bf16; partial query and key blocks */
                           {2, 1, 1, 2, 64}, {1, 17, 65, 3, 64}, {2, 333, 200, 2, 64}, {1, 64, 64, 1, 64},
                           {1, 100, 1357, 1, 64},
                           /* more query blocks than one group of four shares, and more queries than keys */
                           {1, 80, 33, 2, 64}, {3, 49, 97, 2, 64}};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_attention(dts[d], shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4]);
}

/* Scores that jump by ~69 (log2 units) from one block of 64 keys to the
 * next, for half the queries (the other half fall by as much): the fused
 * kernel makes each step's weights (32 keys) against the first step's max
 * and must move that reference when they would pass 2^64, within one block
 * of queries for some lanes and not others, rescaling the O^T it holds in
 * tiles. Inputs bf16 can hold, keys alike within a block, so both sides
 * compute the same softmax: the mean of the last block's values, or of the
 * first's. */
static void check_rising_scores(int64_t Nq) {
    const kk_backend *fast = kk_fast(KILN_BF16), *ref = kk_reference();
    if (!fast) return;
    int64_t Nk = 300, H = 2, Dh = 64, D = H * Dh;
    float *q = rnd(50, (size_t)(Nq * D), 0), *k = rnd(51, (size_t)(Nk * D), 0), *v = rnd(52, (size_t)(Nk * D), 1);
    float *o0 = rnd(53, (size_t)(Nq * D), 0), *o1 = rnd(54, (size_t)(Nq * D), 0);
    for (int64_t i = 0; i < Nq * D; i++) q[i] = (i % D % 3 ? 1.0f : -1.0f) * (i / D % 2 ? -1.0f : 1.0f);
    for (int64_t j = 0; j < Nk * D; j++) k[j] = (j % D % 3 ? 1.0f : -1.0f) * (float)(1 + 6 * (j / D / 64));
    for (int64_t j = 0; j < Nk * D; j++) v[j] = kt_bf16_to_f32(kt_f32_to_bf16(v[j]));
    ref->attention(q, k, v, o0, 1, Nq, Nk, H, Dh, NULL);
    fast->attention(q, k, v, o1, 1, Nq, Nk, H, Dh, NULL);
    double err = rel_l2(o1, o0, (size_t)(Nq * D));
    CHECK_MSG(err <= 1e-3, "attention with scores rising block by block, %lld queries: error %.3g", (long long)Nq, err);
    /* the softmax is that mean: check the reference's own answer too */
    double bad = 0;
    for (int64_t i = 0; i < Nq; i++)
        for (int64_t d = 0; d < D; d++) {
            int64_t j0 = i % 2 ? 0 : 256, j1 = i % 2 ? 64 : Nk;
            double mean = 0;
            for (int64_t j = j0; j < j1; j++) mean += v[j * D + d];
            mean /= (double)(j1 - j0);
            bad = fmax(bad, fabs(o0[i * D + d] - mean));
        }
    CHECK_MSG(bad < 1e-4, "the reference attention is not the mean of one block's values: off by %.3g", bad);
    kb_free_aligned(q);
    kb_free_aligned(k);
    kb_free_aligned(v);
    kb_free_aligned(o0);
    kb_free_aligned(o1);
}

TEST(attention_rising_scores) {
    check_rising_scores(40); /* three blocks of 16 queries */
    check_rising_scores(10); /* one: each step's products add to the block the next softmax rescales */
}

/* A rotary table [N, Dh]: random angles' (cos, sin) pairs, as kk_rope_table lays them out */
static float *rope_table(uint64_t seed, int64_t N, int64_t Dh) {
    float *t = rnd(seed, (size_t)(N * Dh), 3.0f);
    for (int64_t i = 0; i < N * Dh; i += 2) {
        float a = t[i];
        t[i] = cosf(a);
        t[i + 1] = sinf(a);
    }
    return t;
}

/* attention over two token segments against the reference attention of their concatenation */
/* q_both 0: only the first segment's tokens are queries (qb NULL), o [B,Na,D]
 * and nothing written past it. rope: q and k rotated by a table (Flux's
 * RoPE) inside the attention, which must give bit for bit what the same
 * attention gives on q and k the rope op rotated */
static void check_attention_joint(const kk_backend *be, double tol, int64_t B, int64_t Na, int64_t Nb, int64_t H,
                                  int64_t Dh, int q_both, int rope) {
    int64_t D = H * Dh, N = Na + Nb, Nq = q_both ? N : Na;
    float *tab = rope ? rope_table(44, N, Dh) : NULL;
    float *seg[6], *cat[3];
    /* inputs bf16 can hold, so that attention_joint_bf16 (q, k, v in bf16 rows) gets the same ones */
    uint16_t *h[6];
    for (int s = 0; s < 6; s++) {
        size_t n = (size_t)(B * (s < 3 ? Na : Nb) * D);
        seg[s] = rnd(30 + (uint64_t)s, n + 1, 1);
        h[s] = malloc(2 * n + 2);
        for (size_t i = 0; i < n; i++) seg[s][i] = kt_bf16_to_f32(h[s][i] = kt_f32_to_bf16(seg[s][i]));
    }
    for (int s = 0; s < 3; s++) {
        cat[s] = rnd(40, (size_t)(B * N * D), 0);
        kk_concat_rows(seg[s], Na * D, seg[s + 3], Nb * D, cat[s], B);
    }
    float *want = rnd(41, (size_t)(B * N * D), 0), *got = rnd(42, (size_t)(B * N * D + 1), 0);
    for (int64_t i = B * Nq * D; i <= B * N * D; i++) got[i] = 12345.0f;
    kk_reference()->attention(q_both ? cat[0] : seg[0], cat[1], cat[2], want, B, Nq, N, H, Dh, tab);
    be->attention_joint(seg[0], seg[1], seg[2], q_both ? seg[3] : NULL, seg[4], seg[5], got, B, Na, Nb, H, Dh, tab);
    double err = rel_l2(got, want, (size_t)(B * Nq * D));
    int64_t past = 0;
    for (int64_t i = B * Nq * D; i <= B * N * D; i++) past += got[i] != 12345.0f;
    CHECK_MSG(err <= tol && !past,
              "%s attention_joint%s B %lld Na %lld Nb %lld H %lld Dh %lld, queries of %s: error %.3g, %lld written past o",
              be->name, rope ? " with RoPE" : "", (long long)B, (long long)Na, (long long)Nb, (long long)H,
              (long long)Dh, q_both ? "both segments" : "the first segment", err, (long long)past);
    if (rope) { /* the rope op first (kk_rope over the concatenations, split back), then no table */
        float *r[2], *rs[4], *got2 = rnd(45, (size_t)(B * N * D + 1), 0);
        for (int s = 0; s < 2; s++) {
            r[s] = rnd(46, (size_t)(B * N * D), 0);
            kk_rope(cat[s], tab, r[s], B, N, H, Dh);
            rs[s] = rnd(47, (size_t)(B * Na * D), 0);
            rs[s + 2] = rnd(48, (size_t)(B * Nb * D + 1), 0);
            kk_slice_rows(r[s], rs[s], B, N * D, 0, Na * D);
            kk_slice_rows(r[s], rs[s + 2], B, N * D, Na * D, Nb * D);
        }
        /* (with queries of the first segment alone, q is rotated by the table's first Na rows either way) */
        be->attention_joint(rs[0], rs[1], seg[2], q_both ? rs[2] : NULL, rs[3], seg[5], got2, B, Na, Nb, H, Dh, NULL);
        CHECK_MSG(!memcmp(got2, got, sizeof(float) * (size_t)(B * Nq * D)),
                  "%s attention_joint B %lld Na %lld Nb %lld H %lld Dh %lld, queries of %s: RoPE inside differs from the "
                  "rope op before", be->name, (long long)B, (long long)Na, (long long)Nb, (long long)H, (long long)Dh,
                  q_both ? "both segments" : "the first segment");
        for (int s = 0; s < 4; s++) kb_free_aligned(s < 2 ? r[s] : NULL), kb_free_aligned(rs[s]);
        kb_free_aligned(got2);
    }
    if (be->attention_joint_bf16) {
        /* from bf16 rows: the same numbers, bit for bit, as from those values in f32 */
        float *got16 = rnd(43, (size_t)(B * N * D + 1), 0);
        for (int64_t i = B * Nq * D; i <= B * N * D; i++) got16[i] = 12345.0f;
        be->attention_joint_bf16(h[0], h[1], h[2], q_both ? h[3] : NULL, h[4], h[5], got16, KK_FMT_F32, B, Na, Nb, H, Dh, tab);
        past = 0;
        for (int64_t i = B * Nq * D; i <= B * N * D; i++) past += got16[i] != 12345.0f;
        CHECK_MSG(!memcmp(got16, got, sizeof(float) * (size_t)(B * Nq * D)) && !past,
                  "%s attention_joint_bf16 B %lld Na %lld Nb %lld H %lld Dh %lld, queries of %s: differs from f32 "
                  "inputs, %lld written past o", be->name, (long long)B, (long long)Na, (long long)Nb, (long long)H,
                  (long long)Dh, q_both ? "both segments" : "the first segment", (long long)past);
        if (!Nb && Na) { /* plain attention (one segment, no second one named) against be->attention */
            be->attention(seg[0], seg[1], seg[2], got, B, Na, Na, H, Dh, tab);
            be->attention_joint_bf16(h[0], h[1], h[2], NULL, NULL, NULL, got16, KK_FMT_F32, B, Na, 0, H, Dh, tab);
            CHECK_MSG(!memcmp(got16, got, sizeof(float) * (size_t)(B * Na * D)),
                      "%s attention_joint_bf16 as plain attention B %lld N %lld H %lld Dh %lld: differs from attention",
                      be->name, (long long)B, (long long)Na, (long long)H, (long long)Dh);
        }
        /* bf16 rows out: the f32 output rounded to nearest even, bit for bit,
         * and nothing written past them */
        size_t no = (size_t)(B * Nq * D);
        uint16_t *o16 = malloc(2 * no + 64);
        for (size_t i = 0; i < no + 32; i++) o16[i] = 0x7777;
        be->attention_joint_bf16(h[0], h[1], h[2], q_both ? h[3] : NULL, h[4], h[5], o16, KK_FMT_BF16, B, Na, Nb, H, Dh, tab);
        size_t bad = 0;
        for (size_t i = 0; i < no; i++) bad += o16[i] != kt_f32_to_bf16(got[i]);
        for (size_t i = no; i < no + 32; i++) bad += o16[i] != 0x7777;
        CHECK_MSG(!bad, "%s attention_joint_bf16 B %lld Na %lld Nb %lld H %lld Dh %lld, queries of %s, bf16 out: %zu of %zu "
                  "values differ from the f32 output rounded, or were written past it", be->name, (long long)B,
                  (long long)Na, (long long)Nb, (long long)H, (long long)Dh, q_both ? "both segments" : "the first segment",
                  bad, no);
        /* blocked by segment: the same bf16 values, each segment's rows as a
         * blocked [B*n, D] of its own (the second from the first's end), the
         * padding rows zero, nothing written past */
        int64_t nq2 = q_both ? Nb : 0;
        size_t off2 = kk_blocked_elems(B * Na, D), nblk = off2 + kk_blocked_elems(B * nq2, D);
        uint16_t *ob = malloc(2 * nblk + 64);
        for (size_t i = 0; i < nblk + 32; i++) ob[i] = 0x7777;
        be->attention_joint_bf16(h[0], h[1], h[2], q_both ? h[3] : NULL, h[4], h[5], ob, KK_FMT_BLOCKED, B, Na, Nb, H, Dh, tab);
        bad = 0;
        for (int seg = 0; seg < 2; seg++) {
            int64_t n = seg ? nq2 : Na;
            for (int64_t r = 0; r < (B * n + 31) / 32 * 32; r++)
                for (int64_t c = 0; c < D; c++) {
                    uint16_t v = ob[(seg ? off2 : 0) + kk_blocked_index(r, c, D)];
                    bad += r < B * n ? v != o16[((r / n) * Nq + (seg ? Na : 0) + r % n) * D + c] : v != 0;
                }
        }
        for (size_t i = nblk; i < nblk + 32; i++) bad += ob[i] != 0x7777;
        CHECK_MSG(!bad, "%s attention_joint_bf16 B %lld Na %lld Nb %lld H %lld Dh %lld, queries of %s, blocked out: %zu "
                  "values differ from the bf16 rows, are not zero padding, or were written past it", be->name,
                  (long long)B, (long long)Na, (long long)Nb, (long long)H, (long long)Dh,
                  q_both ? "both segments" : "the first segment", bad);
        free(ob);
        free(o16);
        kb_free_aligned(got16);
    }
    for (int s = 0; s < 6; s++) {
        kb_free_aligned(seg[s]);
        free(h[s]);
    }
    for (int s = 0; s < 3; s++) kb_free_aligned(cat[s]);
    kb_free_aligned(tab);
    kb_free_aligned(want);
    kb_free_aligned(got);
}

TEST(attention_joint_matches_reference) {
    /* head size 64 reads the segments in place (AMX, bf16); others concatenate first; 96 + 45 keys:
     * three steps of 32 keys in the first segment, one in the second and a partial one of 13 keys,
     * for two batches; 500 + 90: two chunks of queries per head, 12 work items of the AMX kernel,
     * the last four in pieces (of 1-2 blocks of 16 queries in the second chunk, or none) */
    int64_t shapes[][5] = {{1, 1, 1, 1, 64},   {2, 37, 11, 2, 64}, {1, 100, 33, 3, 64}, {2, 64, 64, 1, 64},
                           {2, 5, 9, 3, 8},    {1, 20, 0, 2, 64},  {1, 0, 20, 2, 64},   {1, 200, 90, 2, 64},
                           {2, 96, 45, 2, 64}, {1, 32, 40, 3, 64}, {2, 70, 0, 1, 64},   {2, 500, 90, 3, 64}};
    const kk_backend *bes[3] = {kk_reference(), kk_fast(KILN_F32), kk_fast(KILN_BF16)};
    for (int b = 0; b < 3; b++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int q_both = 0; q_both < 2; q_both++)
                for (int rope = 0; rope < 2; rope++)
                    if (bes[b])
                        check_attention_joint(bes[b], b == 2 ? 1e-2 : 1e-5, shapes[s][0], shapes[s][1], shapes[s][2],
                                              shapes[s][3], shapes[s][4], q_both, rope);
}

/* A fused attention kernel called directly (the fp16 one on CPUs with
 * AVX512-FP16, the AVX512-BF16 one), so that it is tested wherever it runs,
 * whichever kernel the backend would pick there: a backend of its three entry
 * points for check_attention_joint, kk_attention_<kn>{,_joint} and <kn>_work */
/* each kernel's work buffer for a call (the fp16 kernel's size does not depend on the head size) */
static void *f16_work(int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh) {
    (void)Dh;
    return kb_alloc_aligned(kk_attention_f16_work_bytes(B, Nq, Nk, H));
}
static void *bf16_work(int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh) {
    return kb_alloc_aligned(kk_attention_bf16_work_bytes(B, Nq, Nk, H, Dh));
}
/* ROPE: WITH_ROPE where the kernel takes a rotary table, NO_ROPE for the fp16 one (its rope is always NULL here) */
#define FUSED_ATTENTION_BACKEND(kn, ROPE)                                                                            \
    static void kn##_attention(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq,     \
                                 int64_t Nk, int64_t H, int64_t Dh, const float *rope) {                              \
        void *w = kn##_work(B, Nq, Nk, H, Dh);                                   \
        (void)rope;                                                                                                   \
        CHECK(kk_attention_##kn(q, k, v, o, B, Nq, Nk, H, Dh, ROPE(rope) w));                                             \
        kb_free_aligned(w);                                                                                           \
    }                                                                                                                 \
    /* (they decline only where no query asks) */                                                                     \
    static void kn##_attention_joint(const float *qa, const float *ka, const float *va, const float *qb,            \
                                       const float *kb, const float *vb, float *o, int64_t B, int64_t Na, int64_t Nb, \
                                       int64_t H, int64_t Dh, const float *rope) {                                    \
        void *w = kn##_work(B, Na + Nb, Na + Nb, H, Dh);                         \
        (void)rope;                                                                                                   \
        CHECK(kk_attention_##kn##_joint(qa, ka, va, qb, kb, vb, 0, o, KK_FMT_F32, B, Na, Nb, H, Dh, ROPE(rope) w) ||      \
              Na + (qb ? Nb : 0) == 0);                                                                               \
        kb_free_aligned(w);                                                                                           \
    }                                                                                                                 \
    static void kn##_attention_joint_bf16(const uint16_t *qa, const uint16_t *ka, const uint16_t *va,               \
                                            const uint16_t *qb, const uint16_t *kb, const uint16_t *vb, void *o,      \
                                            int o_fmt, int64_t B, int64_t Na, int64_t Nb, int64_t H, int64_t Dh,      \
                                            const float *rope) {                                                      \
        void *w = kn##_work(B, Na + Nb, Na + Nb, H, Dh);                         \
        (void)rope;                                                                                                   \
        CHECK(kk_attention_##kn##_joint(qa, ka, va, qb, kb, vb, 1, o, o_fmt, B, Na, Nb, H, Dh, ROPE(rope) w) ||           \
              Na + (qb ? Nb : 0) == 0);                                                                               \
        kb_free_aligned(w);                                                                                           \
    }                                                                                                                 \
    static const kk_backend kn##_attention_backend = {.name = #kn "-attention",                                  \
                                                        .attention = kn##_attention,                                \
                                                        .attention_joint = kn##_attention_joint,                    \
                                                        .attention_joint_bf16 = kn##_attention_joint_bf16};
#define WITH_ROPE(r) r,
#define NO_ROPE(r)
FUSED_ATTENTION_BACKEND(f16, NO_ROPE)
FUSED_ATTENTION_BACKEND(bf16, WITH_ROPE)

/* the fused kernels' shapes: tiles of 6 queries and panels of 64 keys, partial ones; one query;
 * more work items (192 queries each) than heads; keys across the two segments inside one panel */
static const int64_t k_fused_shapes[][4] = {{1, 1, 1, 1},  {2, 37, 11, 2}, {1, 100, 33, 3}, {2, 64, 64, 1}, {1, 20, 0, 2},
                                            {1, 0, 20, 2}, {2, 70, 0, 1},  {2, 500, 90, 3}, {1, 7, 130, 2}};

/* The AVX512-BF16 attention (CPUs with AVX512-BF16; the backend's kernel where there is neither AMX
 * nor AVX512-FP16): every shape and activation format, and scores that rise along the keys (the
 * running max moves panel after panel, each move rescaling the sums so far) and a far-off one */
TEST(bf16_attention_matches_reference) {
    for (size_t s = 0; s < sizeof k_fused_shapes / sizeof k_fused_shapes[0]; s++)
        for (int q_both = 0; q_both < 2; q_both++)
            for (int rope = 0; rope < 2; rope++)
                check_attention_joint(&bf16_attention_backend, 1e-2, k_fused_shapes[s][0], k_fused_shapes[s][1],
                                      k_fused_shapes[s][2], k_fused_shapes[s][3], 64, q_both, rope);
    /* other head sizes: 128 with two heads; the VAE's one head of 512 (its key blocks of 128 keys:
     * 300 keys take three, the last partial); 1024, the largest; 96 and 2048 do not run here */
    int64_t wide[][5] = {{2, 37, 11, 2, 128}, {1, 200, 100, 1, 512}, {1, 13, 3, 1, 1024}};
    for (size_t s = 0; s < sizeof wide / sizeof wide[0]; s++)
        for (int q_both = 0; q_both < 2; q_both++)
            for (int rope = 0; rope < 2; rope++) /* Flux's heads of 128 with RoPE */
                check_attention_joint(&bf16_attention_backend, 1e-2, wide[s][0], wide[s][1], wide[s][2], wide[s][3],
                                      wide[s][4], q_both, rope);
    float one[2048] = {0}, out[2048];
    CHECK(!kk_attention_bf16(one, one, one, out, 1, 1, 1, 1, 96, NULL, out) && !kk_attention_bf16_work_bytes(1, 1, 1, 1, 96));
    CHECK(!kk_attention_bf16(one, one, one, out, 1, 1, 1, 1, 2048, NULL, out));
    int64_t Nq = 13, Nk = 300, H = 2, D = 128;
    float *q = rnd(81, (size_t)(Nq * D), 1), *k = rnd(82, (size_t)(Nk * D), 1), *v = rnd(83, (size_t)(Nk * D), 1);
    for (int64_t j = 0; j < Nk; j++)
        for (int64_t d = 0; d < D; d++) k[j * D + d] = q[d % 64] * (float)j / 40.0f + k[j * D + d] * 0.1f;
    k[(Nk - 1) * D] = 3000.0f; /* one key of head 0 far above the rest for query 0 */
    float *o0 = rnd(84, (size_t)(Nq * D), 0), *o1 = rnd(85, (size_t)(Nq * D), 0);
    kk_reference()->attention(q, k, v, o0, 1, Nq, Nk, H, 64, NULL);
    bf16_attention(q, k, v, o1, 1, Nq, Nk, H, 64, NULL);
    double err = rel_l2(o1, o0, (size_t)(Nq * D));
    CHECK_MSG(err <= 1e-2, "bf16 attention, rising scores: error %.3g", err);
    kb_free_aligned(q);
    kb_free_aligned(k);
    kb_free_aligned(v);
    kb_free_aligned(o0);
    kb_free_aligned(o1);
}

TEST(f16_attention_matches_reference) {
    for (size_t s = 0; s < sizeof k_fused_shapes / sizeof k_fused_shapes[0]; s++)
        for (int q_both = 0; q_both < 2; q_both++)
            check_attention_joint(&f16_attention_backend, 1e-2, k_fused_shapes[s][0], k_fused_shapes[s][1],
                                  k_fused_shapes[s][2], k_fused_shapes[s][3], 64, q_both, 0);
    /* operands far outside fp16's range (q 1e4, k 1e-4, v 1e6; and the reverse): each token and
     * value dim is scaled into it, so the answer is the reference's within bf16's error */
    for (int flip = 0; flip < 2; flip++) {
        int64_t Nq = 45, Nk = 150, H = 2, D = 128;
        float sq = flip ? 1e-4f : 1e4f, sk = flip ? 1e4f : 1e-4f, sv = flip ? 1e-6f : 1e6f;
        float *q = rnd(71, (size_t)(Nq * D), sq), *k = rnd(72, (size_t)(Nk * D), sk), *v = rnd(73, (size_t)(Nk * D), sv);
        for (int64_t i = 0; i < Nk * D; i++) {
            k[i] = kt_bf16_to_f32(kt_f32_to_bf16(k[i] * 2)); /* scores of a few units: a softmax that is no one-hot */
            v[i] = kt_bf16_to_f32(kt_f32_to_bf16(v[i]));
        }
        for (int64_t i = 0; i < Nq * D; i++) q[i] = kt_bf16_to_f32(kt_f32_to_bf16(q[i]));
        float *o0 = rnd(74, (size_t)(Nq * D), 0), *o1 = rnd(75, (size_t)(Nq * D), 0);
        kk_reference()->attention(q, k, v, o0, 1, Nq, Nk, H, 64, NULL);
        f16_attention(q, k, v, o1, 1, Nq, Nk, H, 64, NULL);
        double err = rel_l2(o1, o0, (size_t)(Nq * D));
        CHECK_MSG(err <= 1e-2, "fp16 attention, q %g k %g v %g: error %.3g", sq, sk, sv, err);
        kb_free_aligned(q);
        kb_free_aligned(k);
        kb_free_aligned(v);
        kb_free_aligned(o0);
        kb_free_aligned(o1);
    }
}

TEST(elementwise_matches_reference) {
    const kk_backend *fast = kk_fast(KILN_F32), *ref = kk_reference();
    if (!fast) return;
    int64_t B = 2, N = 37, D = 72, H = 3, n = B * N * D;
    float *x = rnd(21, (size_t)n, 2), *sh = rnd(22, (size_t)(B * D), 0.5f), *sc = rnd(23, (size_t)(B * D), 0.5f);
    float *w = rnd(24, (size_t)(D / H), 1), *y0 = rnd(25, (size_t)n, 0), *y1 = rnd(26, (size_t)n, 0);
    double err;
#define CMP(what)                                                                  \
    err = rel_l2(y1, y0, (size_t)n);                                               \
    CHECK_MSG(err <= 1e-5, "%s: error %.3g", what, err)
    ref->silu(x, y0, n);
    fast->silu(x, y1, n);
    CMP("silu");
    ref->gelu_tanh(x, y0, n);
    fast->gelu_tanh(x, y1, n);
    CMP("gelu_tanh");
    ref->layernorm(x, y0, B * N, D, 1e-6f);
    fast->layernorm(x, y1, B * N, D, 1e-6f);
    CMP("layernorm");
    ref->layernorm_modulate(x, sh, sc, y0, B, N, D, 1e-6f);
    fast->layernorm_modulate(x, sh, sc, y1, B, N, D, 1e-6f);
    CMP("layernorm_modulate");
    ref->rmsnorm_heads(x, w, y0, B * N, H, D / H, 1e-6f);
    fast->rmsnorm_heads(x, w, y1, B * N, H, D / H, 1e-6f);
    CMP("rmsnorm_heads");
    ref->modulate(x, sh, sc, y0, B, N, D);
    fast->modulate(x, sh, sc, y1, B, N, D);
    CMP("modulate");
    ref->gate_add(x, sh, x, y0, B, N, D);
    fast->gate_add(x, sh, x, y1, B, N, D);
    CMP("gate_add");
#undef CMP
    kb_free_aligned(x);
    kb_free_aligned(sh);
    kb_free_aligned(sc);
    kb_free_aligned(w);
    kb_free_aligned(y0);
    kb_free_aligned(y1);
}


/* 1 when every padding element of a blocked [rows, K] is zero */
static int blocked_pad_zero(const uint16_t *p, int64_t rows, int64_t K) {
    int64_t R = (rows + 31) / 32 * 32, KP = (K + 31) / 32 * 32;
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < KP; k++)
            if ((r >= rows || k >= K) && p[kk_blocked_index(r, k, K)]) return 0;
    return 1;
}

/* bf16 activations between ops: the same numbers as f32 in, f32 out, to bf16
 * precision; bf16 rows and blocked (KK_FMT_*) give bit for bit the same
 * numbers, in x and in y, and a blocked y has zero padding */
static void check_activation_io(int64_t rows, int64_t K, int64_t M) {
    const kk_backend *fast = kk_fast(KILN_BF16), *ref = kk_reference();
    if (!fast || !fast->linear_io) return;
    int64_t B = 1, N = rows, D = K;
    float *x = rnd(31, (size_t)(rows * K), 1), *w = rnd(32, (size_t)(M * K), 0.1f), *b = rnd(33, (size_t)M, 0.1f);
    float *y0 = rnd(34, (size_t)(rows * M), 0), *y1 = rnd(35, (size_t)(rows * M), 0);
    uint16_t *xb = kb_alloc_aligned(2 * (size_t)(rows * K)), *yb = kb_alloc_aligned(2 * (size_t)(rows * M));
    uint16_t *xk = kb_alloc_aligned(2 * kk_blocked_elems(rows, K)), *yk = kb_alloc_aligned(2 * kk_blocked_elems(rows, M));
    uint16_t *first = kb_alloc_aligned(2 * (size_t)(rows * M));
    char layout[40];
    size_t bytes;
    CHECK_OK(kk_fast_layout(M, K, KILN_BF16, layout, &bytes));
    void *packed = kb_alloc_aligned(bytes);
    CHECK_OK(kk_fast_pack(w, M, K, KILN_BF16, packed));
    kk_weight wr = {M, K, w, NULL, KILN_F32, NULL}, wf = {M, K, NULL, packed, KILN_BF16, NULL};
    ref->linear(x, &wr, b, y0, rows, KK_ACT_GELU_TANH);
    kt_from_f32(KILN_BF16, x, xb, (size_t)(rows * K));
    memset(xk, 0xff, 2 * kk_blocked_elems(rows, K)); /* kk_block_rows must write the padding */
    kk_block_rows(xb, rows, K, xk);
    CHECK_MSG(blocked_pad_zero(xk, rows, K), "kk_block_rows: padding not zero");
    const void *xs[3] = {x, xb, xk};
    for (int xin = 0; xin < 3; xin++)
        for (int yout = 0; yout < 3; yout++) {
            memset(yk, 0xff, 2 * kk_blocked_elems(rows, M));
            void *yp = yout == KK_FMT_F32 ? (void *)y1 : yout == KK_FMT_BF16 ? (void *)yb : (void *)yk;
            fast->linear_io(xs[xin], xin, &wf, b, yp, yout, rows, KK_ACT_GELU_TANH);
            if (yout == KK_FMT_BLOCKED) {
                CHECK_MSG(blocked_pad_zero(yk, rows, M), "linear_io x_fmt %d: blocked y's padding not zero", xin);
                kk_unblock_rows(yk, rows, M, yb);
            }
            if (yout) kt_to_f32(KILN_BF16, yb, y1, (size_t)(rows * M));
            double err = rel_l2(y1, y0, (size_t)(rows * M));
            CHECK_MSG(err <= 1e-2, "linear_io x_fmt %d y_fmt %d: error %.3g", xin, yout, err);
            /* bf16 x as rows or blocked, bf16 y as rows or blocked: the same bits */
            if (xin && yout && xin + yout == 2) memcpy(first, yb, 2 * (size_t)(rows * M));
            if (xin && yout && xin + yout > 2)
                CHECK_MSG(!memcmp(first, yb, 2 * (size_t)(rows * M)), "linear_io x_fmt %d y_fmt %d differs from bf16 rows", xin, yout);
        }
    /* no bias and no GELU: blocked y (whole blocks take the epilogue's short
     * path) still the bits of bf16 rows (the long one), zeros' signs included */
    fast->linear_io(xk, KK_FMT_BLOCKED, &wf, NULL, yb, KK_FMT_BF16, rows, KK_ACT_NONE);
    memcpy(first, yb, 2 * (size_t)(rows * M));
    fast->linear_io(xk, KK_FMT_BLOCKED, &wf, NULL, yk, KK_FMT_BLOCKED, rows, KK_ACT_NONE);
    kk_unblock_rows(yk, rows, M, yb);
    CHECK_MSG(!memcmp(first, yb, 2 * (size_t)(rows * M)), "linear_io with no bias: blocked y differs from bf16 rows");
    float *sh = rnd(36, (size_t)D, 0.3f), *sc = rnd(37, (size_t)D, 0.3f);
    float *z0 = rnd(38, (size_t)(N * D), 0), *z1 = rnd(39, (size_t)(N * D), 0);
    uint16_t *zb = kb_alloc_aligned(2 * (size_t)(N * D)), *zr = kb_alloc_aligned(2 * (size_t)(N * D));
    for (int op = 0; op < 2; op++) {
        const char *name = op ? "modulate_bf16" : "layernorm_modulate_bf16";
        if (op) ref->modulate(x, sh, sc, z0, B, N, D);
        else ref->layernorm_modulate(x, sh, sc, z0, B, N, D, 1e-6f);
        for (int fmt = KK_FMT_BF16; fmt <= KK_FMT_BLOCKED; fmt++) {
            uint16_t *out = fmt == KK_FMT_BLOCKED ? xk : zb;
            memset(xk, 0xff, 2 * kk_blocked_elems(N, D));
            if (op) fast->modulate_bf16(x, sh, sc, out, B, N, D, fmt);
            else fast->layernorm_modulate_bf16(x, sh, sc, out, B, N, D, 1e-6f, fmt);
            if (fmt == KK_FMT_BLOCKED) {
                CHECK_MSG(blocked_pad_zero(xk, N, D), "%s: blocked padding not zero", name);
                kk_unblock_rows(xk, N, D, zr);
                CHECK_MSG(!memcmp(zr, zb, 2 * (size_t)(N * D)), "%s: blocked differs from bf16 rows", name);
            }
            kt_to_f32(KILN_BF16, fmt == KK_FMT_BLOCKED ? zr : zb, z1, (size_t)(N * D));
            CHECK_MSG(rel_l2(z1, z0, (size_t)(N * D)) <= 1e-2, "%s y_fmt %d", name, fmt);
        }
    }
    void *bufs[] = {x, w, b, y0, y1, xb, yb, xk, yk, first, packed, sh, sc, z0, z1, zb, zr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kb_free_aligned(bufs[i]);
}

TEST(bf16_activation_io) {
    check_activation_io(45, 96, 70); /* rows and M past a multiple of 32 */
    check_activation_io(2, 64, 40);  /* a modulation GEMM's few rows */
    check_activation_io(33, 45, 17); /* K too */
    check_activation_io(64, 64, 32); /* no padding */
}

/* linear + gate_add in one call (the GEMM epilogue in the bf16 AMX kernel,
 * the composition elsewhere) against the reference's linear then gate_add:
 * batch 2, a gate read from a wider modulation row, odd sizes, f32 and bf16
 * inputs, every backend */
static void check_linear_gate_add(int64_t N) {
    const kk_backend *ref = kk_reference();
    int64_t B = 2, K = 96, M = 70, E = 3 * M + 5, off = M + 3;
    float *x = rnd(61, (size_t)(B * N * K), 1), *w = rnd(62, (size_t)(M * K), 0.1f), *b = rnd(63, (size_t)M, 0.1f);
    float *res = rnd(64, (size_t)(B * N * M), 1), *mod = rnd(65, (size_t)(B * E), 0.5f);
    float *gate = rnd(66, (size_t)(B * M), 0), *want = rnd(67, (size_t)(B * N * M), 0), *got = rnd(68, (size_t)(B * N * M), 0);
    float *plain = rnd(69, (size_t)(B * N * M), 0);
    uint16_t *xb = kb_alloc_aligned(2 * (size_t)(B * N * K)), *xk = kb_alloc_aligned(2 * kk_blocked_elems(B * N, K));
    kt_from_f32(KILN_BF16, x, xb, (size_t)(B * N * K));
    kk_block_rows(xb, B * N, K, xk);
    const void *xs[3] = {x, xb, xk};
    for (int64_t i = 0; i < B; i++) memcpy(gate + i * M, mod + i * E + off, sizeof(float) * (size_t)M);
    kk_weight wr = {M, K, w, NULL, KILN_F32, NULL};
    ref->linear(x, &wr, b, want, B * N, KK_ACT_NONE);
    ref->gate_add(res, gate, want, want, B, N, M);
    ref->linear_gate_add(x, 0, &wr, b, res, mod + off, E, got, B, N);
    CHECK_MSG(rel_l2(got, want, (size_t)(B * N * M)) <= 1e-6, "reference linear_gate_add");
    kiln_dtype dts[2] = {KILN_F32, KILN_BF16};
    for (int d = 0; d < 2; d++) {
        const kk_backend *fast = kk_fast(dts[d]);
        if (!fast) continue;
        char layout[40];
        size_t bytes;
        CHECK_OK(kk_fast_layout(M, K, dts[d], layout, &bytes));
        void *packed = kb_alloc_aligned(bytes);
        CHECK_OK(kk_fast_pack(w, M, K, dts[d], packed));
        kk_weight wf = {M, K, NULL, packed, dts[d], NULL};
        for (int xin = 0; xin < (fast->linear_io ? 3 : 1); xin++) {
            fast->linear_gate_add(xs[xin], xin, &wf, b, res, mod + off, E, got, B, N);
            double err = rel_l2(got, want, (size_t)(B * N * M)), tol = dts[d] == KILN_BF16 ? 1e-2 : 1e-5;
            CHECK_MSG(err <= tol, "%s linear_gate_add x_fmt %d: error %.3g", kiln_dtype_name(dts[d]), xin, err);
            /* no gate (an add folded in): the linear's f32 output plus res's first
             * [N,M], the same for each batch entry, bit for bit */
            fast->linear_gate_add(xs[xin], xin, &wf, b, res, NULL, 0, got, B, N);
            if (xin) fast->linear_io(xs[xin], xin, &wf, b, plain, KK_FMT_F32, B * N, KK_ACT_NONE);
            else fast->linear(x, &wf, b, plain, B * N, KK_ACT_NONE);
            kk_add_bcast(plain, res, plain, B * N * M, N * M);
            CHECK_MSG(!memcmp(got, plain, sizeof(float) * (size_t)(B * N * M)),
                      "%s linear_gate_add without a gate, x_fmt %d: not the linear then the add", kiln_dtype_name(dts[d]), xin);
        }
        kb_free_aligned(packed);
    }
    ref->linear_gate_add(x, 0, &wr, b, res, NULL, 0, got, B, N);
    ref->linear(x, &wr, b, plain, B * N, KK_ACT_NONE);
    kk_add_bcast(plain, res, plain, B * N * M, N * M);
    CHECK_MSG(!memcmp(got, plain, sizeof(float) * (size_t)(B * N * M)), "reference linear_gate_add without a gate");
    void *bufs[] = {x, w, b, res, mod, gate, want, got, xb, xk, plain};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kb_free_aligned(bufs[i]);
}

TEST(linear_gate_add_matches_reference) {
    check_linear_gate_add(37);
    check_linear_gate_add(1); /* 2 rows, a gate row each */
}

/* kg_fuse folds the add of a linear's output [B,N,M] and a table [1,N,M]
 * made from weights (the position embedding) into the linear's epilogue:
 * the same numbers, bit for bit, with no add left to run; an add of an
 * input stays */
typedef struct one_linear {
    int64_t M, K, N;
    float *w, *b, *pos;
    kk_weight kw;
} one_linear;

static int one_linear_resolve(void *user, const char *name, int *ndim, int64_t shape[4], const float **data,
                              const kk_weight **kw) {
    one_linear *t = user;
    *kw = NULL;
    if (!strcmp(name, "pos")) {
        *ndim = 3;
        shape[0] = 1, shape[1] = t->N, shape[2] = t->M;
        *data = t->pos;
        return 1;
    }
    int is_w = !strcmp(name, "w");
    if (!is_w && strcmp(name, "b")) return 0;
    *ndim = is_w ? 2 : 1;
    shape[0] = t->M;
    shape[1] = t->K;
    *data = is_w ? t->w : t->b;
    if (is_w) *kw = &t->kw;
    return 1;
}

/* y = linear(x) + pos, pos a weight (table) or an input */
static kiln_status add_after_linear(kg_graph *g, one_linear *t, int64_t B, int table, int fuse, const kk_backend *be,
                                    const float *x, float *y) {
    kg_init(g, one_linear_resolve, t);
    kg_id in = kg_input(g, "x", 3, (int64_t[]){B, t->N, t->K});
    /* (through an op of one source, as the position table's crop) */
    kg_id p = kg_silu(g, table ? kg_weight(g, "pos") : kg_input(g, "pos", 3, (int64_t[]){1, t->N, t->M}));
    kg_mark_output(g, kg_add(g, kg_linear(g, in, kg_weight(g, "w"), kg_weight(g, "b")), p));
    if (fuse) kg_fuse(g);
    const float *inputs[2] = {x, t->pos};
    float *outputs[1] = {y};
    return kg_run_eager(g, be, inputs, outputs);
}

TEST(an_add_folds_into_the_linear) {
    int64_t B = 2, N = 77, K = 64, M = 96;
    kiln_dtype dts[2] = {KILN_F32, KILN_BF16};
    for (int d = 0; d < 2; d++) {
        const kk_backend *fast = kk_fast(dts[d]);
        if (!fast) continue;
        one_linear t = {M, K, N, rnd(81, (size_t)(M * K), 0.1f), rnd(82, (size_t)M, 0.1f), rnd(84, (size_t)(N * M), 1), {0}};
        char layout[40];
        size_t bytes;
        CHECK_OK(kk_fast_layout(M, K, dts[d], layout, &bytes));
        void *packed = kb_alloc_aligned(bytes);
        CHECK_OK(kk_fast_pack(t.w, M, K, dts[d], packed));
        t.kw = (kk_weight){M, K, NULL, packed, dts[d], NULL};
        float *x = rnd(83, (size_t)(B * N * K), 1);
        float *y0 = rnd(85, (size_t)(B * N * M), 0), *y1 = rnd(86, (size_t)(B * N * M), 0);
        for (int64_t b = 1; b <= B; b++) {
            kg_graph g0, g1, g2;
            CHECK_OK(add_after_linear(&g0, &t, b, 1, 0, fast, x, y0));
            CHECK_OK(add_after_linear(&g1, &t, b, 1, 1, fast, x, y1));
            const kg_node *lin = &g1.nodes[g1.outputs[0]];
            CHECK_MSG(lin->op == KG_LINEAR && lin->iparam[1] == 1 && lin->src[4] < 0, "%s batch %lld: the add was not folded",
                      kiln_dtype_name(dts[d]), (long long)b);
            CHECK_MSG(!memcmp(y0, y1, sizeof(float) * (size_t)(b * N * M)), "%s batch %lld: the folded add changed the numbers",
                      kiln_dtype_name(dts[d]), (long long)b);
            CHECK_OK(add_after_linear(&g2, &t, b, 0, 1, fast, x, y1)); /* pos an input: no fold */
            CHECK_MSG(g2.nodes[g2.outputs[0]].op == KG_ADD, "an add of an input was folded");
            CHECK_MSG(!memcmp(y0, y1, sizeof(float) * (size_t)(b * N * M)), "the add of an input differs");
            kg_free(&g0);
            kg_free(&g1);
            kg_free(&g2);
        }
        void *bufs[] = {t.w, t.b, t.pos, packed, x, y0, y1};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kb_free_aligned(bufs[i]);
    }
}

/* Weights of a joint attention's graph: "w" [D,D] (every projection) */
typedef struct joint_w {
    int64_t D;
    float *w;
    kk_weight kw;
} joint_w;

static int joint_resolve(void *user, const char *name, int *ndim, int64_t shape[4], const float **data,
                         const kk_weight **kw) {
    joint_w *t = user;
    if (strcmp(name, "w")) return 0;
    *ndim = 2;
    shape[0] = shape[1] = t->D;
    *data = t->w;
    *kw = &t->kw;
    return 1;
}

/* oa, ob = linear(slice(attention over [a; b])) for image tokens a [B,Na,D]
 * and context tokens b [B,Nb,D], q, k, v made by linears (SD3's joint
 * block); planned (kg_fuse, kg_plan_bf16 for be) or not */
static kiln_status joint_block_graph(kg_graph *g, joint_w *t, int64_t B, int64_t Na, int64_t Nb, int plan,
                                     const kk_backend *be, const float *const *in, float *const *out) {
    kg_init(g, joint_resolve, t);
    kg_id x[2] = {kg_input(g, "a", 3, (int64_t[]){B, Na, t->D}), kg_input(g, "b", 3, (int64_t[]){B, Nb, t->D})}, qkv[3];
    for (int k = 0; k < 3; k++)
        qkv[k] = kg_concat_tokens(g, kg_linear(g, x[0], kg_weight(g, "w"), -1), kg_linear(g, x[1], kg_weight(g, "w"), -1));
    kg_id o = kg_attention(g, qkv[0], qkv[1], qkv[2], (int)(t->D / 64));
    kg_mark_output(g, kg_linear(g, kg_slice_tokens(g, o, 0, Na), kg_weight(g, "w"), -1));
    kg_mark_output(g, kg_linear(g, kg_slice_tokens(g, o, Na, Nb), kg_weight(g, "w"), -1));
    if (plan) {
        kg_fuse(g);
        kg_plan_bf16(g, be);
    }
    return kg_run_eager(g, be, in, out);
}

/* kg_plan_bf16: the joint attention's output goes blocked by token segment
 * where the AMX GEMM reads that layout, each segment's linear reading it in
 * place (the context's after the image tokens' B*Na rows), the slices not
 * run; the numbers bit for bit those of the unplanned graph (whose GEMMs
 * round the same f32 values to bf16 as they pack them) */
TEST(attention_segments_go_blocked_to_the_gemms) {
    const kk_backend *be = kk_fast(KILN_BF16);
    if (!be || !be->attention_joint_bf16) return;
    int64_t D = 128, shapes[][3] = {{1, 40, 21}, {2, 37, 11}, {2, 64, 32}};
    joint_w t = {D, rnd(91, (size_t)(D * D), 0.1f), {0}};
    char layout[40];
    size_t bytes;
    CHECK_OK(kk_fast_layout(D, D, KILN_BF16, layout, &bytes));
    void *packed = kb_alloc_aligned(bytes);
    CHECK_OK(kk_fast_pack(t.w, D, D, KILN_BF16, packed));
    t.kw = (kk_weight){D, D, NULL, packed, KILN_BF16, NULL};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t B = shapes[s][0], Na = shapes[s][1], Nb = shapes[s][2];
        float *a = rnd(92, (size_t)(B * Na * D), 1), *b = rnd(93, (size_t)(B * Nb * D), 1);
        float *y[4];
        for (int k = 0; k < 4; k++) y[k] = rnd(94 + (uint64_t)k, (size_t)(B * (k % 2 ? Nb : Na) * D), 0);
        const float *in[2] = {a, b};
        kg_graph g0, g1;
        CHECK_OK(joint_block_graph(&g0, &t, B, Na, Nb, 0, be, in, (float *const[]){y[0], y[1]}));
        CHECK_OK(joint_block_graph(&g1, &t, B, Na, Nb, 1, be, in, (float *const[]){y[2], y[3]}));
        const kg_node *oa = &g1.nodes[g1.outputs[0]], *ob = &g1.nodes[g1.outputs[1]];
        if (kk_amx_ready()) {
            const kg_node *att = &g1.nodes[oa->src[0]];
            CHECK_MSG(att->op == KG_ATTENTION && att->out_bf16 == KK_FMT_BLOCKED && ob->src[0] == oa->src[0] &&
                          oa->iparam[3] == 0 && ob->iparam[3] == B * Na,
                      "B %lld Na %lld Nb %lld: the linears do not read the attention's blocked segments in place "
                      "(they read node %d and %d, rows before %lld and %lld)", (long long)B, (long long)Na,
                      (long long)Nb, oa->src[0], ob->src[0], (long long)oa->iparam[3], (long long)ob->iparam[3]);
        } else {
            CHECK_MSG(g1.nodes[oa->src[0]].op == KG_SLICE_TOKENS, "no AMX GEMM, yet the slices were taken out");
        }
        CHECK_MSG(!memcmp(y[0], y[2], sizeof(float) * (size_t)(B * Na * D)) &&
                      !memcmp(y[1], y[3], sizeof(float) * (size_t)(B * Nb * D)),
                  "B %lld Na %lld Nb %lld: the planned graph's numbers differ from the unplanned one's", (long long)B,
                  (long long)Na, (long long)Nb);
        kg_free(&g0);
        kg_free(&g1);
        for (int k = 0; k < 4; k++) kb_free_aligned(y[k]);
        kb_free_aligned(a);
        kb_free_aligned(b);
    }
    kb_free_aligned(packed);
    kb_free_aligned(t.w);
}

/* A row's result does not depend on what else is in its batch, nor on the
 * threads (what lets a server batch strangers' requests): each fast linear
 * of rows R, against the same rows computed one at a time, as a prefix of
 * the batch and on one thread; each attention of a batch of 3 against each
 * entry alone. Bitwise, on whatever class this runs (KILN_MAX_ISA: every
 * class the machine can emulate, CMakeLists.txt). */
static int same_bits(const float *a, const float *b, size_t n) { return !memcmp(a, b, sizeof(float) * n); }

static void check_linear_rows(kiln_dtype dt, int64_t R, int64_t K, int64_t M, int act) {
    const kk_backend *fast = kk_fast(dt);
    if (!fast) return;
    float *x = rnd(61, (size_t)(R * K), 1), *w = rnd(62, (size_t)(M * K), 1.0f / sqrtf((float)K)), *b = rnd(63, (size_t)M, 0.1f);
    float *y = rnd(64, (size_t)(R * M), 0), *y1 = rnd(65, (size_t)(R * M), 0);
    char layout[40];
    size_t bytes;
    CHECK_OK(kk_fast_layout(M, K, dt, layout, &bytes));
    void *packed = kb_alloc_aligned(bytes);
    CHECK_OK(kk_fast_pack(w, M, K, dt, packed));
    kk_weight wf = {M, K, NULL, packed, dt, NULL};
    fast->linear(x, &wf, b, y, R, act);
    int same = 1;
    int64_t picks[4] = {0, 1, R / 2, R - 1};
    for (int i = 0; i < 4; i++) { /* one row alone */
        fast->linear(x + picks[i] * K, &wf, b, y1, 1, act);
        same &= same_bits(y1, y + picks[i] * M, (size_t)M);
    }
    int64_t prefix[3] = {2, 7, R - 3};
    for (int i = 0; i < 3; i++) /* the first rows as a batch of their own */
        if (prefix[i] > 0 && prefix[i] < R) {
            fast->linear(x, &wf, b, y1, prefix[i], act);
            same &= same_bits(y1, y, (size_t)(prefix[i] * M));
        }
    int threads = kiln_get_threads();
    kiln_set_threads(1);
    fast->linear(x, &wf, b, y1, R, act);
    kiln_set_threads(threads);
    same &= same_bits(y1, y, (size_t)(R * M));
    CHECK_MSG(same, "linear %s (%s) rows %lld K %lld M %lld act %d: a row's bits depend on its batch or the threads",
              kiln_dtype_name(dt), layout, (long long)R, (long long)K, (long long)M, act);
    kb_free_aligned(x);
    kb_free_aligned(w);
    kb_free_aligned(b);
    kb_free_aligned(y);
    kb_free_aligned(y1);
    kb_free_aligned(packed);
}

TEST(rows_do_not_depend_on_their_batch) {
    kiln_dtype dts[2] = {KILN_F32, KILN_BF16};
    int64_t shapes[][3] = {{77, 96, 130}, {154, 48, 192}, {40, 1601, 70}, {333, 256, 96}, {13, 3100, 33}};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int act = 0; act < 2; act++) check_linear_rows(dts[d], shapes[s][0], shapes[s][1], shapes[s][2], act);
    /* attention, joint attention and the text encoders' attention: a batch of 3 against each entry alone */
    for (int d = 0; d < 2; d++) {
        const kk_backend *be = kk_fast(dts[d]);
        if (!be) continue;
        int64_t B = 3, Na = 77, Nb = 29, H = 2, Dh = 64, D = H * Dh, N = Na + Nb;
        float *q = rnd(71, (size_t)(B * N * D), 1), *k = rnd(72, (size_t)(B * N * D), 1), *v = rnd(73, (size_t)(B * N * D), 1);
        float *o = rnd(74, (size_t)(B * N * D), 0), *o1 = rnd(75, (size_t)(N * D), 0);
        int same = 1;
        be->attention(q, k, v, o, B, N, N, H, Dh, NULL);
        for (int64_t e = 0; e < B; e++) {
            be->attention(q + e * N * D, k + e * N * D, v + e * N * D, o1, 1, N, N, H, Dh, NULL);
            same &= same_bits(o1, o + e * N * D, (size_t)(N * D));
        }
        CHECK_MSG(same, "attention %s: an entry's bits depend on its batch", kiln_dtype_name(dts[d]));
        /* joint: segment a [B, Na, D], segment b [B, Nb, D] */
        const float *qa = q, *ka = k, *va = v, *qb = q + B * Na * D, *kb = k + B * Na * D, *vb = v + B * Na * D;
        be->attention_joint(qa, ka, va, qb, kb, vb, o, B, Na, Nb, H, Dh, NULL);
        same = 1;
        for (int64_t e = 0; e < B; e++) {
            be->attention_joint(qa + e * Na * D, ka + e * Na * D, va + e * Na * D, qb + e * Nb * D, kb + e * Nb * D,
                                vb + e * Nb * D, o1, 1, Na, Nb, H, Dh, NULL);
            same &= same_bits(o1, o + e * N * D, (size_t)(N * D)); /* o [B, Na + Nb, D] */
        }
        CHECK_MSG(same, "joint attention %s: an entry's bits depend on its batch", kiln_dtype_name(dts[d]));
        /* both again with RoPE inside (Flux's) */
        float *tab = rope_table(78, N, Dh);
        be->attention(q, k, v, o, B, N, N, H, Dh, tab);
        float *o2 = rnd(79, (size_t)(N * D), 0);
        same = 1;
        for (int64_t e = 0; e < B; e++) {
            be->attention(q + e * N * D, k + e * N * D, v + e * N * D, o2, 1, N, N, H, Dh, tab);
            same &= same_bits(o2, o + e * N * D, (size_t)(N * D));
        }
        be->attention_joint(qa, ka, va, qb, kb, vb, o, B, Na, Nb, H, Dh, tab);
        for (int64_t e = 0; e < B; e++) {
            be->attention_joint(qa + e * Na * D, ka + e * Na * D, va + e * Na * D, qb + e * Nb * D, kb + e * Nb * D,
                                vb + e * Nb * D, o2, 1, Na, Nb, H, Dh, tab);
            same &= same_bits(o2, o + e * N * D, (size_t)(N * D));
        }
        CHECK_MSG(same, "attention with RoPE %s: an entry's bits depend on its batch", kiln_dtype_name(dts[d]));
        kb_free_aligned(o2);
        kb_free_aligned(tab);
        int64_t bs[4] = {1, H, N, N};
        float *bias = rnd(76, (size_t)(H * N * N), 1);
        be->attention_ex(q, k, v, bias, bs, o, B, N, N, H, Dh, 0.125f, 1);
        same = 1;
        for (int64_t e = 0; e < B; e++) {
            be->attention_ex(q + e * N * D, k + e * N * D, v + e * N * D, bias, bs, o1, 1, N, N, H, Dh, 0.125f, 1);
            same &= same_bits(o1, o + e * N * D, (size_t)(N * D));
        }
        CHECK_MSG(same, "attention_ex %s: an entry's bits depend on its batch", kiln_dtype_name(dts[d]));
        kb_free_aligned(q);
        kb_free_aligned(k);
        kb_free_aligned(v);
        kb_free_aligned(o);
        kb_free_aligned(o1);
        kb_free_aligned(bias);
    }
}

TEST(packed_layouts_are_stable) {
    /* the same shape and dtype always gives the same layout name and size */
    char a[40], b[40];
    size_t na, nb;
    if (!kk_fast(KILN_F32)) return;
    CHECK_OK(kk_fast_layout(64, 96, KILN_F32, a, &na));
    CHECK_OK(kk_fast_layout(64, 96, KILN_F32, b, &nb));
    CHECK(!strcmp(a, b) && na == nb && na >= 64 * 96 * 4);
    /* f32: kiln's AVX2 GEMM's panels on the avx2 class (gemm_avx2.c), exact both ways; else oneDNN's */
    if (kk_cpu_class() == KK_CLASS_AVX2) {
        CHECK(!strcmp(a, "f32p16") && na == kk_avx2_packed_bytes(64, 96) && strstr(kk_fast_isa(), "-f32p16"));
        CHECK(strstr(kiln_kernels(KILN_F32), "AVX2 f32 GEMM") != NULL);
        float *w = rnd(53, 17 * 45, 1), *back = rnd(54, 17 * 45, 0);
        size_t n17;
        CHECK_OK(kk_fast_layout(17, 45, KILN_F32, b, &n17));
        void *p = kb_alloc_aligned(n17);
        CHECK_OK(kk_fast_pack(w, 17, 45, KILN_F32, p));
        CHECK_OK(kk_fast_unpack(&(kk_weight){17, 45, NULL, p, KILN_F32, NULL}, back));
        CHECK(n17 == 32 * 45 * 4 && !memcmp(w, back, sizeof(float) * 17 * 45));
        kb_free_aligned(p);
        kb_free_aligned(w);
        kb_free_aligned(back);
    } else {
        CHECK(!strncmp(a, "dnnl-", 5));
    }
    /* bf16: kiln's AMX layout where the CPU has AMX (N and K padded to 32),
     * and unpacking gives back exactly the weights rounded to bf16 */
    if (!kk_fast(KILN_BF16)) return;
    CHECK_OK(kk_fast_layout(17, 45, KILN_BF16, a, &na));
    /* kiln_kernels names the bf16 kernels that run */
    CHECK(strstr(kiln_kernels(KILN_BF16), kk_amx_ready() ? "AMX GEMM" : kk_f16_ready() ? "fp16 GEMM" : "oneDNN") != NULL);
    /* and the attention: AVX512-BF16's on class 3 only (KILN_ATTENTION=strips unset in the tests) */
    CHECK((strstr(kiln_kernels(KILN_BF16), "AVX512-BF16 attention") != NULL) == kk_bf16_only());
    if (!kk_cpu_has("amx")) {
        /* the fp16 GEMM's layout where it runs (gemm_f16.c), else oneDNN's */
        CHECK(kk_f16_ready() ? !strcmp(a, "f16p64") && na == kk_f16_packed_bytes(17, 45) : !strncmp(a, "dnnl-", 5));
        CHECK(!kk_f16_ready() || strstr(kk_fast_isa(), "-f16p64") != NULL);
    }
}

/* AMX only (test_kernels amx): kiln's bf16 layout amx32 */
TEST(amx_layouts) {
    char a[40];
    size_t na;
    CHECK_OK(kk_fast_layout(17, 45, KILN_BF16, a, &na));
    CHECK(!strcmp(a, "amx32") && na == 32 * 64 * 2);
    CHECK(strstr(kk_fast_isa(), "-amx32") != NULL);
    float *w = rnd(51, 17 * 45, 1), *back = rnd(52, 17 * 45, 0);
    void *p = kb_alloc_aligned(na);
    CHECK_OK(kk_fast_pack(w, 17, 45, KILN_BF16, p));
    CHECK_OK(kk_fast_unpack(&(kk_weight){17, 45, NULL, p, KILN_BF16, NULL}, back));
    int exact = 1;
    for (int i = 0; i < 17 * 45; i++) exact &= back[i] == kt_bf16_to_f32(kt_f32_to_bf16(w[i]));
    CHECK_MSG(exact, "amx32 pack / unpack is not exact");
    /* the padding is zero, so the padded steps add nothing */
    const uint16_t *u = p;
    size_t nz = 0;
    for (size_t i = 0; i < na / 2; i++) nz += u[i] != 0;
    CHECK(nz <= 17 * 45);
    kb_free_aligned(p);
    kb_free_aligned(w);
    kb_free_aligned(back);
}


/* ---- the fp16 GEMM (CPUs with AVX512-FP16 and no AMX; tested wherever AVX512-FP16 runs) ---- */

/* y = epilogue(x . W^T) on kk_f16_linear against double sums of the
 * bf16-rounded operands: x f32 or bf16 rows, y f32 or bf16 rows, bias and
 * GELU or a gated residual; the rows of x span 1e-6 to 1e6 and so do
 * W's outputs (each scaled into fp16's range on its own); every row must
 * be within 1e-2 relative L2 (with GELU, relative to the row's sums before
 * it: the fp16 sums' error is relative to their size, and GELU can leave a
 * row only its smallest outputs), and nothing past y's last row is written */
static void check_f16_gemm(int64_t rows, int64_t K, int64_t N, int x_fmt, int y_fmt, int mode) {
    float *x = rnd(61, (size_t)(rows * K), 1), *w = rnd(62, (size_t)(N * K), 1.0f / sqrtf((float)K));
    float *b = rnd(63, (size_t)N, 0.1f), *res = rnd(64, (size_t)(rows * N), 1), *gate = rnd(65, (size_t)N, 1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < K; k++) x[r * K + k] = kt_bf16_to_f32(kt_f32_to_bf16(x[r * K + k] * powf(10.0f, (float)(r % 13 - 6))));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) w[n * K + k] = kt_bf16_to_f32(kt_f32_to_bf16(w[n * K + k] * powf(10.0f, (float)(n % 7 - 3) * 2)));
    void *packed = kb_alloc_aligned(kk_f16_packed_bytes(N, K));
    kk_f16_pack(w, N, K, packed);
    float *back = rnd(66, (size_t)(N * K), 0);
    kk_f16_unpack(packed, N, K, back);
    int exact = 1;
    for (int64_t i = 0; i < N * K; i++) exact &= back[i] == w[i] || fabsf(w[i]) < 1e-30f;
    CHECK_MSG(exact, "f16p64 pack / unpack of %lld x %lld is not exact", (long long)N, (long long)K);
    uint16_t *xb = kb_alloc_aligned(sizeof(uint16_t) * (size_t)(rows * K));
    for (int64_t i = 0; i < rows * K; i++) xb[i] = kt_f32_to_bf16(x[i]);
    size_t esz = y_fmt == KK_FMT_F32 ? 4 : 2, ybytes = esz * (size_t)((rows + 1) * N);
    unsigned char *y = kb_alloc_aligned(ybytes);
    memset(y, 0x5a, ybytes);
    kk_amx_epilogue e = {.bias = mode ? b : NULL, .act = mode == 1 ? KK_ACT_GELU_TANH : KK_ACT_NONE};
    if (mode == 2) e = (kk_amx_epilogue){.bias = b, .res = res, .gate = gate, .gate_ld = 0, .tokens = rows};
    int threads = 2 + (int)(rows % 5); /* 2-6: with few panels, more threads split the rows in more blocks */
    void *work = kb_alloc_aligned(kk_f16_work_bytes(rows, K, threads));
    CHECK(kk_f16_linear(x_fmt == KK_FMT_F32 ? (const void *)x : xb, x_fmt, packed, N, K, &e, y, y_fmt, rows, threads, work));
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double e2 = 0, r2 = 0;
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)x[r * K + k] * w[n * K + k];
            if (e.bias) s += b[n];
            double pre = s; /* the row's scale: GELU leaves few outputs of a row whose sums are mostly negative */
            if (mode == 1) s = 0.5 * s * (1 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
            if (mode == 2) s = res[r * N + n] + gate[n] * s;
            double got = y_fmt == KK_FMT_F32 ? ((float *)y)[r * N + n] : kt_bf16_to_f32(((uint16_t *)y)[r * N + n]);
            e2 += (got - s) * (got - s);
            r2 += mode == 1 ? pre * pre : s * s;
        }
        double err = sqrt(e2 / (r2 > 0 ? r2 : 1));
        worst = err > worst ? err : worst;
    }
    CHECK_MSG(worst <= 1e-2, "f16 GEMM rows %lld K %lld N %lld x_fmt %d y_fmt %d mode %d: worst row error %.3g",
              (long long)rows, (long long)K, (long long)N, x_fmt, y_fmt, mode, worst);
    int untouched = 1;
    for (size_t i = esz * (size_t)(rows * N); i < ybytes; i++) untouched &= y[i] == 0x5a;
    CHECK_MSG(untouched, "f16 GEMM wrote past y's last row");
    kb_free_aligned(x);
    kb_free_aligned(w);
    kb_free_aligned(b);
    kb_free_aligned(res);
    kb_free_aligned(gate);
    kb_free_aligned(packed);
    kb_free_aligned(back);
    kb_free_aligned(xb);
    kb_free_aligned(y);
    kb_free_aligned(work);
}

TEST(f16_gemm_matches_reference) {
    /* rows x K x N: rows no multiple of the 6-row tile, odd K (a padded pair), N no multiple of 64, K
     * past one 128-input fp16 chunk (several, with a short last one), one row, past one work item */
    int64_t shapes[][3] = {{1, 7, 5}, {7, 33, 70}, {13, 300, 130}, {50, 1537, 64}, {200, 1536, 200}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int mode = 0; mode < 3; mode++)
            for (int f = 0; f < 4; f++) {
                int x_fmt = f & 1 ? KK_FMT_BF16 : KK_FMT_F32, y_fmt = f & 2 && mode != 2 ? KK_FMT_BF16 : KK_FMT_F32;
                check_f16_gemm(shapes[s][0], shapes[s][1], shapes[s][2], x_fmt, y_fmt, mode);
            }
    /* x past one work item's 8 MiB of packed rows: two blocks of row tiles, each over every panel */
    check_f16_gemm(1100, 4000, 70, KK_FMT_BF16, KK_FMT_BF16, 1);
}

/* ---- quantized weights ------------------------------------------------------------- */

#include "tensor/quant.h"

/* One quantized linear: the packed blob unpacks to exactly q * scale of the
 * quantizer (the layout round trip), the dequantized weights are close to the
 * originals, and the fast kernel matches the reference linear on those
 * dequantized weights (f32, double sums) within tol, for every combination of
 * f32 / bf16 activations in and out. Returns the worst kernel error. */
static double check_quant_linear(kiln_dtype qt, int64_t rows, int64_t K, int64_t M, int bias, int act, double tol) {
    const kk_backend *fast = kk_fast(KILN_BF16), *ref = kk_reference();
    if (!fast) {
        fprintf(stderr, "  (no fast bf16 backend: skipped)\n");
        return 0;
    }
    float *x = rnd(41, (size_t)(rows * K), 1), *w = rnd(42, (size_t)(M * K), 1.0f / sqrtf((float)K));
    for (int64_t k = 0; k < K; k += 7) w[k] *= 8; /* an outlier column in row 0 and others: per-channel scales */
    float *b = bias ? rnd(43, (size_t)M, 0.1f) : NULL;
    float *wd = rnd(44, (size_t)(M * K), 0), *wq = rnd(45, (size_t)(M * K), 0);
    float *y0 = rnd(46, (size_t)(rows * M), 0), *y1 = rnd(47, (size_t)(rows * M), 0);
    uint16_t *xb = kb_alloc_aligned(2 * (size_t)(rows * K)), *yb = kb_alloc_aligned(2 * (size_t)(rows * M));
    char layout[40];
    size_t bytes;
    double worst = 0;
    CHECK_OK(kk_fast_layout(M, K, qt, layout, &bytes));
    void *packed = kb_alloc_aligned(bytes);
    CHECK_OK(kk_fast_pack(w, M, K, qt, packed));
    kk_weight wf = {M, K, NULL, packed, qt, kk_weight_scales(packed, bytes, M, qt)};
    CHECK(wf.scales != NULL);
    CHECK_OK(kk_fast_unpack(&wf, wd));
    /* the quantizer alone, row-major, then dequantized: must be bit-identical */
    void *q = malloc((size_t)(M * K));
    float *sc = malloc(sizeof(float) * (size_t)M);
    CHECK_OK(kt_quantize_rows(w, M, K, qt, q, sc));
    kt_dequantize_rows(q, sc, M, K, qt, wq);
    CHECK_MSG(!memcmp(sc, wf.scales, sizeof(float) * (size_t)M), "%s: stored scales differ from the quantizer's",
              kiln_dtype_name(qt));
    CHECK_MSG(!memcmp(wd, wq, sizeof(float) * (size_t)(M * K)), "%s %lldx%lld: unpacked weights differ from q * scale",
              kiln_dtype_name(qt), (long long)M, (long long)K);
    double werr = rel_l2(wd, w, (size_t)(M * K));
    CHECK_MSG(werr <= (qt == KILN_I8 ? 1e-2 : 4e-2), "%s: weight quantization error %.3g", kiln_dtype_name(qt), werr);
    ref->linear(x, &(kk_weight){M, K, wd, NULL, KILN_F32, NULL}, b, y0, rows, act);
    kt_from_f32(KILN_BF16, x, xb, (size_t)(rows * K));
    /* every activation format in and out (KK_FMT_*: f32, bf16 rows, bf16 blocked) */
    uint16_t *xk = kb_alloc_aligned(2 * kk_blocked_elems(rows, K)), *yk = kb_alloc_aligned(2 * kk_blocked_elems(rows, M));
    kk_block_rows(xb, rows, K, xk);
    const void *xs[3] = {x, xb, xk};
    for (int xin = 0; xin < 3; xin++)
        for (int yout = 0; yout < 3; yout++) {
            memset(y1, 0, sizeof(float) * (size_t)(rows * M));
            void *yp = yout == KK_FMT_F32 ? (void *)y1 : yout == KK_FMT_BF16 ? (void *)yb : (void *)yk;
            fast->linear_io(xs[xin], xin, &wf, b, yp, yout, rows, act);
            if (yout == KK_FMT_BLOCKED) kk_unblock_rows(yk, rows, M, yb);
            if (yout) kt_to_f32(KILN_BF16, yb, y1, (size_t)(rows * M));
            double err = rel_l2(y1, y0, (size_t)(rows * M));
            if (err > worst) worst = err;
            CHECK_MSG(err <= tol, "%s linear rows %lld K %lld M %lld bias %d act %d x_fmt %d y_fmt %d: error %.3g",
                      kiln_dtype_name(qt), (long long)rows, (long long)K, (long long)M, bias, act, xin, yout, err);
        }
    kb_free_aligned(xk);
    kb_free_aligned(yk);
    /* the f32 backend's plain linear takes quantized weights too */
    if (kk_fast(KILN_F32)) {
        kk_fast(KILN_F32)->linear(x, &wf, b, y1, rows, act);
        double err = rel_l2(y1, y0, (size_t)(rows * M));
        CHECK_MSG(err <= tol, "%s linear through the f32 backend: error %.3g", kiln_dtype_name(qt), err);
    }
    void *bufs[] = {x, w, b, wd, wq, y0, y1, xb, yb, packed};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kb_free_aligned(bufs[i]);
    free(q);
    free(sc);
    return worst;
}

TEST(quant_linear_matches_dequantized_reference) {
    int64_t shapes[][3] = {{1, 7, 5}, {3, 64, 48}, {77, 96, 130}, {129, 33, 64}, {300, 256, 17}, {2, 1536, 64},
                           {64, 1536, 1536}, {37, 3200, 130}}; /* K 3200: the s8 products in two chunks of K */
    kiln_dtype qts[2] = {KILN_I8, KILN_F8_E4M3};
    for (int d = 0; d < 2; d++) {
        double worst = 0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int variant = 0; variant < 3; variant++) {
                double e = check_quant_linear(qts[d], shapes[s][0], shapes[s][1], shapes[s][2], variant > 0,
                                              variant == 2 ? KK_ACT_GELU_TANH : KK_ACT_NONE, 1e-2);
                if (e > worst) worst = e;
            }
        fprintf(stderr, "  %s: worst error against the dequantized reference %.3g\n", kiln_dtype_name(qts[d]), worst);
    }
}

TEST(quant_layouts) {
    if (!kk_fast(KILN_BF16)) return;
    char a[40], b[40], c[40];
    size_t na, nb, nc;
    CHECK_OK(kk_fast_layout(64, 96, KILN_BF16, a, &na));
    CHECK_OK(kk_fast_layout(64, 96, KILN_I8, b, &nb));
    CHECK_OK(kk_fast_layout(64, 96, KILN_F8_E4M3, c, &nc));
    /* distinct names; fp8 is half the bf16 bytes plus its scales */
    CHECK(strcmp(a, b) && strcmp(a, c) && strcmp(b, c));
    CHECK(!strncmp(c, "e4m3-", 5));
    /* int8: the AMX GEMM's s8 layout where it runs, else oneDNN's */
    CHECK(!strcmp(b, kk_cpu_has("amx") ? "s8-amx32" : b) && (kk_cpu_has("amx") || !strncmp(b, "dnnl-", 5)));
    /* (fp8 takes this machine's bf16 layout for AMX or oneDNN, not the fp16 GEMM's) */
    if (strcmp(a, "f16p64"))
        CHECK_MSG(nc == ((na / 2 + 63) & ~(size_t)63) + 64 * 4, "fp8 bytes %zu, bf16 bytes %zu", nc, na);
    else
        CHECK(nc == ((64 * 96 + 63) & ~(size_t)63) + 64 * 4 || !strncmp(c, "e4m3-", 5));
    CHECK(nb >= 64 * 96 + 64 * 4);
    CHECK(kk_weight_scales(NULL, nb, 64, KILN_I8) == NULL);
    float w[4] = {1, 2, NAN, 4};
    uint8_t q[4];
    float s[1];
    CHECK_FAILS(kt_quantize_rows(w, 1, 4, KILN_I8, q, s), KILN_ERR_FORMAT, "row 0");
    CHECK_FAILS(kt_quantize_rows(w, 1, 4, KILN_F16, q, s), KILN_ERR_DTYPE, "F16");
    /* a zero row: scale 1, codes 0 */
    float z[4] = {0, 0, -0.0f, 0};
    CHECK_OK(kt_quantize_rows(z, 1, 4, KILN_F8_E4M3, q, s));
    CHECK(s[0] == 1.0f && (q[0] | q[1] | (q[2] & 0x7f) | q[3]) == 0);
}

/* Groups, one CTest test each, so that a kernel this CPU cannot run shows as
 * skipped (exit TEST_SKIPPED) instead of passing without running:
 *   test_kernels       every kernel this machine runs, against the reference
 *   test_kernels f16   the fp16 GEMM and attention (AVX512-FP16)
 *   test_kernels bf16  the AVX512-BF16 attention (AVX512-BF16)
 *   test_kernels amx   the AMX layouts (AMX) */
/* attention_ex (scale, additive bias broadcast over batch and / or heads,
 * causal mask) on the fast backends' kernel against the double-precision
 * general form: both dtypes (f32 arithmetic in both: within 1e-5), q, k
 * and v also as bf16 rows (the reference fed the same values widened),
 * and a bias of -inf that masks every key of some queries (their rows 0) */
static double g_ex_worst;

static void check_attention_ex(int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, int bias_kind, int causal,
                               float scale, int masked_rows) {
    int64_t D = H * Dh, bs[4] = {1, 1, Nq, Nk};
    if (bias_kind & 1) bs[0] = B;
    if (bias_kind & 2) bs[1] = H;
    size_t nb = (size_t)(bs[0] * bs[1] * Nq * Nk), nq = (size_t)(B * Nq * D), nk = (size_t)(B * Nk * D);
    float *q = rnd(11, nq, 1), *k = rnd(12, nk, 1), *v = rnd(13, nk, 1);
    float *bias = bias_kind ? rnd(14, nb, 2) : NULL;
    if (bias && masked_rows) /* query 0 of every (batch, head) the bias covers sees no key; query 1 only its last */
        for (size_t r = 0; r < nb / (size_t)(Nq * Nk); r++)
            for (int64_t j = 0; j < Nk; j++) {
                bias[r * (size_t)(Nq * Nk) + (size_t)j] = -INFINITY;
                if (Nq > 1 && j + 1 < Nk) bias[r * (size_t)(Nq * Nk) + (size_t)(Nk + j)] = -INFINITY;
            }
    float *o0 = rnd(15, nq, 0), *o1 = rnd(16, nq, 0);
    kk_attention_general(q, k, v, bias, bs, o0, B, Nq, Nk, H, Dh, scale, causal);
    kiln_dtype dts[2] = {KILN_F32, KILN_BF16};
    for (int d = 0; d < 2; d++) {
        const kk_backend *fast = kk_fast(dts[d]);
        if (!fast) continue;
        CHECK(fast->attention_ex != NULL);
        if (!fast->attention_ex) continue;
        for (size_t i = 0; i < nq; i++) o1[i] = NAN;
        fast->attention_ex(q, k, v, bias, bs, o1, B, Nq, Nk, H, Dh, scale, causal);
        double err = rel_l2(o1, o0, nq);
        g_ex_worst = err > g_ex_worst ? err : g_ex_worst;
        CHECK_MSG(err <= 1e-5, "attention_ex %s B %lld Nq %lld Nk %lld H %lld Dh %lld bias %d causal %d: error %.3g",
                  kiln_dtype_name(dts[d]), (long long)B, (long long)Nq, (long long)Nk, (long long)H, (long long)Dh,
                  bias_kind, causal, err);
        if (masked_rows && bias) { /* query 0 (all keys masked) gives exactly 0 in each batch entry and head */
            int zero = 1;
            for (int64_t b = 0; b < B; b++)
                for (int64_t c = 0; c < D; c++) zero &= o1[b * Nq * D + c] == 0.0f;
            CHECK_MSG(zero, "attention_ex: a query whose keys are all masked is not 0");
        }
    }
    /* bf16 rows in: the kernel on the rounded values against the reference on them widened */
    uint16_t *q16 = kb_alloc_aligned(2 * nq), *k16 = kb_alloc_aligned(2 * nk), *v16 = kb_alloc_aligned(2 * nk);
    kt_from_f32(KILN_BF16, q, q16, nq);
    kt_from_f32(KILN_BF16, k, k16, nk);
    kt_from_f32(KILN_BF16, v, v16, nk);
    kt_to_f32(KILN_BF16, q16, q, nq);
    kt_to_f32(KILN_BF16, k16, k, nk);
    kt_to_f32(KILN_BF16, v16, v, nk);
    kk_attention_general(q, k, v, bias, bs, o0, B, Nq, Nk, H, Dh, scale, causal);
    if (kk_attention_ex_avx512(q16, k16, v16, 1, bias, bs, o1, B, Nq, Nk, H, Dh, scale, causal)) {
        double err = rel_l2(o1, o0, nq);
        g_ex_worst = err > g_ex_worst ? err : g_ex_worst;
        CHECK_MSG(err <= 1e-5, "attention_ex bf16 rows B %lld Nq %lld Nk %lld H %lld Dh %lld: error %.3g",
                  (long long)B, (long long)Nq, (long long)Nk, (long long)H, (long long)Dh, err);
    }
    kb_free_aligned(q16);
    kb_free_aligned(k16);
    kb_free_aligned(v16);
    kb_free_aligned(q);
    kb_free_aligned(k);
    kb_free_aligned(v);
    kb_free_aligned(bias);
    kb_free_aligned(o0);
    kb_free_aligned(o1);
}

TEST(attention_ex_matches_reference) {
    if (!kk_fast(KILN_F32)) {
        fprintf(stderr, "  (no fast backend on this machine: skipped)\n");
        return;
    }
    /* B, Nq, Nk, H, Dh, bias (1: per batch, 2: per head, 3: both, 0: none), causal, scale, masked rows */
    check_attention_ex(1, 1, 1, 1, 64, 0, 1, 0.125f, 0);                 /* one token */
    check_attention_ex(2, 77, 77, 20, 64, 0, 1, 0.125f, 0);              /* CLIP: causal */
    check_attention_ex(1, 77, 77, 64, 64, 2, 0, 1.0f, 0);                /* T5: position bias per head, no scaling */
    check_attention_ex(2, 300, 300, 3, 64, 2, 0, 1.0f, 0);               /* long, odd heads */
    check_attention_ex(2, 257, 257, 2, 64, 3, 1, 0.3f, 0);               /* bias per batch and head, causal */
    check_attention_ex(3, 33, 45, 5, 24, 1, 0, 0.2f, 0);                 /* Nq != Nk, bias per batch, head 24 */
    check_attention_ex(1, 45, 33, 4, 80, 0, 1, 0.11f, 0);                /* causal with more queries than keys */
    check_attention_ex(2, 19, 19, 1, 7, 3, 1, 0.5f, 1);                  /* head size 7; masked rows */
    check_attention_ex(1, 131, 131, 2, 130, 2, 0, 0.09f, 1);             /* head size past 128 */
    check_attention_ex(2, 5, 5, 64, 16, 2, 1, 1.0f, 1);
    fprintf(stderr, "  attention_ex: worst relative L2 against the general form %.2g\n", g_ex_worst);
}

/* the fast backends' unary (exact GELU by an f32 erf, quick GELU, ReLU)
 * against kk_unary's double form: values from -12 to 12, odd lengths, a
 * few extremes; relative L2 within 1e-6 and no element off by more than
 * 3e-7 of the largest output */
TEST(unary_matches_reference) {
    const kk_backend *fast = kk_fast(KILN_F32);
    if (!fast) return;
    CHECK(fast->unary != NULL);
    if (!fast->unary) return;
    int64_t lens[] = {1, 17, 1000, 70001};
    int ops[] = {KK_UN_GELU, KK_UN_QUICK_GELU, KK_UN_RELU};
    double worst = 0;
    for (int l = 0; l < 4; l++)
        for (int o = 0; o < 3; o++) {
            int64_t n = lens[l];
            float *x = rnd(21, (size_t)n, 4), *y0 = rnd(22, (size_t)n, 0), *y1 = rnd(23, (size_t)n, 0);
            float ext[] = {0.0f, -0.0f, 12.0f, -12.0f, 100.0f, -100.0f, 1e-20f, -1e-20f, 3e38f, -3e38f};
            for (int64_t i = 0; i < n && i < 10; i++) x[i] = ext[i];
            kk_unary(ops[o], x, y0, n);
            fast->unary(ops[o], x, y1, n);
            size_t s0 = n > 10 ? 10 : 0; /* the error of the random values, past the extremes */
            double err = rel_l2(y1 + s0, y0 + s0, (size_t)n - s0), big = 0, off = 0;
            for (int64_t i = 0; i < n; i++) {
                if (n > 10 && i < 10) continue; /* the extremes: checked for finiteness only */
                big = fabs(y0[i]) > big ? fabs(y0[i]) : big;
                off = fabs(y1[i] - y0[i]) > off ? fabs(y1[i] - y0[i]) : off;
            }
            int finite = 1;
            for (int64_t i = 0; i < n && i < 10; i++) finite &= isfinite(y1[i]) || (ops[o] == KK_UN_RELU);
            worst = err > worst ? err : worst;
            CHECK_MSG(err <= 1e-6 && off <= 3e-7 * (big > 0 ? big : 1) && finite,
                      "unary %d n %lld: relative L2 %.3g, worst element %.3g of %.3g, finite %d", ops[o], (long long)n,
                      err, off, big, finite);
            kb_free_aligned(x);
            kb_free_aligned(y0);
            kb_free_aligned(y1);
        }
    fprintf(stderr, "  unary: worst relative L2 against the double form %.2g\n", worst);
}

int main(int argc, char **argv) {
    const char *group = argc > 1 ? argv[1] : "";
    if (!strcmp(group, "f16")) {
        if (!kk_f16_ready()) return test_skip("no AVX512-FP16 on this CPU: the fp16 GEMM and attention cannot run here");
        RUN(f16_attention_matches_reference);
        RUN(f16_gemm_matches_reference);
        return TEST_SUMMARY();
    }
    if (!strcmp(group, "bf16")) {
        if (!kk_bf16_ready()) return test_skip("no AVX512-BF16 on this CPU: the AVX512-BF16 attention cannot run here");
        RUN(bf16_attention_matches_reference);
        return TEST_SUMMARY();
    }
    if (!strcmp(group, "amx")) {
        if (!kk_amx_ready() || !kk_fast(KILN_BF16)) return test_skip("no AMX on this CPU: kiln's AMX kernels cannot run here");
        RUN(amx_layouts);
        return TEST_SUMMARY();
    }
    if (*group) {
        fprintf(stderr, "test_kernels: unknown group '%s' (none, f16, bf16 or amx)\n", group);
        return 2;
    }
    RUN(linear_matches_reference);
    RUN(attention_matches_reference);
    RUN(attention_joint_matches_reference);
    RUN(attention_rising_scores);
    RUN(attention_ex_matches_reference);
    RUN(unary_matches_reference);
    RUN(elementwise_matches_reference);
    RUN(bf16_activation_io);
    RUN(linear_gate_add_matches_reference);
    RUN(an_add_folds_into_the_linear);
    RUN(attention_segments_go_blocked_to_the_gemms);
    RUN(packed_layouts_are_stable);
    RUN(rows_do_not_depend_on_their_batch);
    RUN(quant_linear_matches_dequantized_reference);
    RUN(quant_layouts);
    return TEST_SUMMARY();
}
