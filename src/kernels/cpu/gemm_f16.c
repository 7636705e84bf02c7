/* gemm_f16.c - kiln's bf16 GEMM for CPUs with AVX512-FP16 and no AMX (a
 * Sapphire or Emerald Rapids under a hypervisor that hides AMX, say).
 *
 * Why fp16: on those cores VDPBF16PS, the bf16 dot product that oneDNN's
 * avx512_core_bf16 kernels (and PyTorch's) are built on, retires one per
 * ~2.2 cycles, while VFMADD231PH does two per cycle: 83 against 364
 * GFLOP/s per core (docs/PERFORMANCE.md). bf16 values are exact in fp16
 * once scaled into its range, so the products are those of the bf16
 * operands; the sums are where fp16 is short, so they run in fp16 for 128
 * inputs at most and are then added into f32.
 *
 * y [rows,N] = epilogue(x [rows,K] . W^T):
 *   - W is packed once (at conversion, stored so in the weight cache) in
 *     panels of 64 outputs, per pair of inputs [64 outputs][2] fp16, each
 *     output times a power of two that puts its largest |w| in [8, 16);
 *   - x is packed per call in tiles of 6 rows, per pair of inputs [6][2]
 *     fp16, each row times a power of two that puts its largest |x| in
 *     [8, 16) - so every product is below 256 and 64 of them below 16384,
 *     far from fp16's 65504, whatever the model's scale;
 *   - the micro-kernel keeps a 6 x 64 block of C in 24 registers (an
 *     output's even and odd inputs in two lanes), broadcasting a row's
 *     input pair (one 32-bit load) against four 16-output vectors of W;
 *     every 64 pairs the fp16 sums go into f32 in L1;
 *   - the epilogue adds each output's two lanes, undoes both scales (exact:
 *     powers of two) and hands the rows to the AMX GEMM's epilogue (bias,
 *     GELU, gated residual; f32 or bf16 rows: kk_amx_epilogue_rows).
 * Threads take work items dynamically: one panel against a block of row
 * tiles (up to 8 MiB of packed x: every row of the SD3 shapes at batch 1),
 * the panel's weights staying in L2 while the tiles stream past from L3 in
 * order. Blocks of 512 KiB that stayed in L2 across the panels, each panel
 * coming back from L3 per block, made the forward 1.11x slower (10 pairs). */
#include "kernels/cpu/gemm_f16.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define MR KK_F16_MR        /* rows per tile */
#define NV KK_F16_NV        /* 16-output vectors per panel */
#define NP (16 * NV)        /* outputs per panel */
#define ABLOCK (8 << 20) /* bytes of packed x per work item (L3) */

static int64_t panels(int64_t N) { return (N + NP - 1) / NP; }
static int64_t pairs(int64_t K) { return (K + 1) / 2; }

size_t kk_f16_packed_bytes(int64_t N, int64_t K) {
    return (size_t)(panels(N) * pairs(K)) * NP * 2 * sizeof(_Float16) + (size_t)panels(N) * NP * sizeof(float);
}

/* the fp16 of element (n, k) in a panel: pair k/2, output n % 64, lane k % 2 */
static size_t packed_at(int64_t n, int64_t k, int64_t KP) {
    return (size_t)(((n / NP) * KP + k / 2) * NP * 2 + (n % NP) * 2 + k % 2);
}

/* 32 values of W's row from k (f32 rounded to bf16; zeros past K) */
F16_FN static inline void row32(const float *row, int64_t k, int64_t K, __m512 *lo, __m512 *hi) {
    int64_t n = K - k < 32 ? K - k : 32;
    __mmask32 m = n == 32 ? 0xffffffffu : ((1u << n) - 1);
    *lo = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps((__mmask16)m, row + k)));
    *hi = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps((__mmask16)(m >> 16), row + k + 16)));
}

F16_FN void kk_f16_pack(const float *w, int64_t N, int64_t K, void *out) {
    int64_t KP = pairs(K), NPn = panels(N);
    _Float16 *h = out;
    float *inv = (float *)(h + (size_t)NPn * KP * NP * 2);
    memset(out, 0, kk_f16_packed_bytes(N, K));
    /* a pair p of an output sits NP pairs (32 bits each) after pair p - 1 */
    const __m512i step = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(NP));
#pragma omp parallel for schedule(static) if (N * K > (1 << 16))
    for (int64_t n = 0; n < NPn * NP; n++) {
        if (n >= N) {
            inv[n] = 1.0f;
            continue;
        }
        const float *row = w + n * K;
        __m512 lo, hi, mx = _mm512_setzero_ps();
        for (int64_t k = 0; k < K; k += 32) {
            row32(row, k, K, &lo, &hi);
            mx = _mm512_max_ps(mx, _mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        }
        float s = kk_range_scale(_mm512_reduce_max_ps(mx));
        inv[n] = 1.0f / s;
        uint32_t *dst = (uint32_t *)(h + packed_at(n, 0, KP));
        for (int64_t k = 0; k < K; k += 32) { /* 16 pairs of fp16, one per step of NP pairs */
            row32(row, k, K, &lo, &hi);
            __m512i v = _mm512_inserti64x4(
                _mm512_castsi256_si512((__m256i)_mm512_cvtxps_ph(_mm512_mul_ps(lo, _mm512_set1_ps(s)))),
                (__m256i)_mm512_cvtxps_ph(_mm512_mul_ps(hi, _mm512_set1_ps(s))), 1);
            int64_t np = (K - k + 1) / 2 < 16 ? (K - k + 1) / 2 : 16;
            _mm512_mask_i32scatter_epi32(dst + k / 2 * NP, (__mmask16)((1u << np) - 1), step, v, 4);
        }
    }
}

void kk_f16_unpack(const void *packed, int64_t N, int64_t K, float *out) {
    int64_t KP = pairs(K);
    const _Float16 *h = packed;
    const float *inv = (const float *)(h + (size_t)panels(N) * KP * NP * 2);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) out[n * K + k] = (float)h[packed_at(n, k, KP)] * inv[n];
}

/* a row of x in f32: 2 KP values, then room for pack_tile's last 32-value loads */
static size_t row_floats(int64_t K) { return (size_t)(2 * pairs(K) + 32) & ~(size_t)15; }

size_t kk_f16_work_bytes(int64_t rows, int64_t K, int threads) {
    int64_t tiles = (rows + MR - 1) / MR;
    return (size_t)tiles * pairs(K) * MR * sizeof(uint32_t) + (size_t)tiles * MR * sizeof(float) +
           (size_t)threads * row_floats(K) * sizeof(float);
}

/* Row r of x (f32 or bf16) as bf16-rounded f32 into f (K values, then a
 * zero when K is odd); returns the largest |value| */
F16_FN static float load_row(const void *x, int x_bf16, int64_t r, int64_t K, float *f) {
    __m512 mx = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? 0xffff : (__mmask16)((1u << (K - k)) - 1);
        __m512 v;
        if (x_bf16)
            v = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x + r * K + k)), 16));
        else /* f32 x is rounded to bf16 here, as the other bf16 GEMMs do */
            v = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, (const float *)x + r * K + k)));
        _mm512_storeu_ps(f + k, _mm512_maskz_mov_ps(m, v));
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    if (K % 2) f[K] = 0;
    return _mm512_reduce_max_ps(mx);
}

/* Tile t of x: rows [6t, 6t+6) (zeros past `rows`) as [K/2 pairs][6] fp16
 * pairs, each row scaled into [8, 16) (inv: the scales' inverses) */
F16_FN static void pack_tile(const void *x, int x_bf16, int64_t rows, int64_t K, int64_t t, uint32_t *a, float *inv,
                             float *f) {
    int64_t KP = pairs(K);
    for (int i = 0; i < MR; i++) {
        int64_t r = t * MR + i;
        if (r >= rows) {
            inv[i] = 1.0f;
            for (int64_t p = 0; p < KP; p++) a[p * MR + i] = 0;
            continue;
        }
        float s = kk_range_scale(load_row(x, x_bf16, r, K, f));
        inv[i] = 1.0f / s;
        /* 32 values -> 16 pairs of fp16 -> 16 strided 32-bit stores */
        for (int64_t p = 0; p < KP; p += 16) {
            int64_t n = KP - p < 16 ? KP - p : 16;
            __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(f + 2 * p), _mm512_set1_ps(s));
            __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(f + 2 * p + 16), _mm512_set1_ps(s));
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)_mm512_cvtxps_ph(lo)),
                                           (__m256i)_mm512_cvtxps_ph(hi), 1);
            uint32_t u[16];
            _mm512_storeu_si512(u, v);
            for (int64_t j = 0; j < n; j++) a[(p + j) * MR + i] = u[j];
        }
    }
}

/* The tile's sums c -> y rows [r0, r0 + nr), panel q: each output's two
 * lanes added, both scales undone, then the epilogue */
F16_FN static void finish(const float *c, const float *xinv, const float *winv, const kk_amx_epilogue *e, void *y,
                          int y_fmt, int64_t N, int64_t r0, int64_t nr, int64_t q) {
    _Alignas(64) float s[2][MR][32];
    for (int64_t i = 0; i < nr; i++)
        for (int j = 0; j < NV; j++) {
            __m512 sum = kk_f16_pairsum(c + (i * NV + j) * 32);
            __m512 sc = _mm512_mul_ps(_mm512_loadu_ps(winv + q * NP + j * 16), _mm512_set1_ps(xinv[i]));
            _mm512_store_ps(&s[j / 2][i][(j % 2) * 16], _mm512_mul_ps(sum, sc));
        }
    for (int h = 0; h < 2; h++) {
        int64_t n0 = q * NP + h * 32, nc = N - n0 < 32 ? N - n0 : 32;
        if (nc > 0) kk_amx_epilogue_rows(e, y, y_fmt, N, &s[h][0][0], r0, nr, n0, nc);
    }
}

F16_FN int kk_f16_linear(const void *x, int x_fmt, const void *packed, int64_t N, int64_t K, const kk_amx_epilogue *e,
                         void *y, int y_fmt, int64_t rows, int threads, void *work) {
    if (!kk_f16_ready() || !work || x_fmt == KK_FMT_BLOCKED || y_fmt == KK_FMT_BLOCKED) return 0;
    int64_t KP = pairs(K), NPn = panels(N), tiles = (rows + MR - 1) / MR;
    /* tiles per block: up to ABLOCK of packed x, and blocks enough for two items per thread */
    int64_t per = ABLOCK / (KP * MR * 4), min_blocks = (2 * threads + NPn - 1) / NPn;
    per = per < (tiles + min_blocks - 1) / min_blocks ? per : (tiles + min_blocks - 1) / min_blocks;
    per = per < 1 ? 1 : per > tiles ? tiles : per;
    int64_t blocks = (tiles + per - 1) / per, items = blocks * NPn;
    uint32_t *a = work;
    float *xinv = (float *)(a + (size_t)tiles * KP * MR), *rowf = xinv + tiles * MR;
    const _Float16 *w = packed;
    const float *winv = (const float *)(w + (size_t)NPn * KP * NP * 2);
    int x_bf16 = x_fmt == KK_FMT_BF16;
#pragma omp parallel num_threads(threads)
    {
        float *f = rowf + (size_t)omp_get_thread_num() * row_floats(K);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) pack_tile(x, x_bf16, rows, K, t, a + (size_t)t * KP * MR, xinv + t * MR, f);
        _Alignas(64) float c[MR * NV * 32];
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t blk = it / NPn, q = it % NPn;
            for (int64_t t = blk * per; t < tiles && t < (blk + 1) * per; t++) {
                if (tiles == 1) kk_f16_micro(a, MR, 1, w + (size_t)q * KP * NP * 2, KP, c, 1);
                else kk_f16_micro(a + (size_t)t * KP * MR, MR, 1, w + (size_t)q * KP * NP * 2, KP, c, 0);
                int64_t nr = rows - t * MR < MR ? rows - t * MR : MR;
                finish(c, xinv + t * MR, winv, e, y, y_fmt, N, t * MR, nr, q);
            }
        }
    }
    return 1;
}
