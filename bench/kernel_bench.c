/* kernel_bench.c - kiln's fast kernels against oneDNN's own matmul on the
 * same shapes, side by side in one run (SD3-medium blocks).
 *
 *   bench_kernels [--runs N] [--tokens N]
 *
 * GEMM: kiln's linear (f32 activations in, bf16 conversion, packed weights,
 * bias) against a bare oneDNN bf16 matmul whose source is already bf16.
 * Attention: kiln's attention at N tokens, GFLOP/s against the GEMM rate.
 * AMX peak: TDPBF16PS on tiles loaded from L1 (one tile load per product,
 * as in a 2x2 GEMM micro-kernel), on every thread: the most a bf16 GEMM
 * can reach on this machine, measured in the same run. */
#include "base/base.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/kernels.h"

#include <omp.h>

#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GFLOP/s of the 2x2 micro-kernel's loop on L1-resident tiles, all threads */
AMX_FN static double amx_peak_gflops(void) {
    static uint16_t a[2][512] __attribute__((aligned(64))), b[2][512] __attribute__((aligned(64)));
    for (int i = 0; i < 512; i++) a[0][i] = a[1][i] = b[0][i] = b[1][i] = 0x3c00; /* bf16 2^-7 */
    long iters = 400000;
    int nt = 1;
    double t0 = kb_now();
#pragma omp parallel
    {
        kk_tile_config cfg = {.palette = 1};
        for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
        _tile_loadconfig(&cfg);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (long i = 0; i < iters; i++) {
            _tile_loadd(4, a[0], 64);
            _tile_loadd(6, b[0], 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, b[1], 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, a[1], 64);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        float c[256];
        _tile_stored(0, c, 64);
        _tile_release();
#pragma omp single
        nt = omp_get_num_threads();
    }
    return (double)nt * (double)iters * 4 * 16 * 16 * 32 * 2 / (kb_now() - t0) / 1e9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

/* a bare oneDNN matmul: bf16 src [M,K] x packed bf16 weights -> f32 [M,N] + bias */
static double onednn_ms(int64_t M, int64_t K, int64_t N, int runs) {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    dnnl_stream_create(&st, eng, dnnl_stream_default_flags);
    dnnl_memory_desc_t a, b, c, bias;
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N}, dbias = {1, N};
    dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&b, 2, db, dnnl_bf16, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&c, 2, dc, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&bias, 2, dbias, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dnnl_matmul_desc_init(&md, &a, &b, &bias, &c);
    if (dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) || dnnl_primitive_create(&p, pd)) return -1;
    dnnl_memory_t ma, mb, mc, mbias;
    dnnl_memory_create(&ma, &a, eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&mb, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&mc, &c, eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&mbias, &bias, eng, DNNL_MEMORY_ALLOCATE);
    /* real data in every buffer: untouched memory maps the kernel's zero page, every read hits the
     * cache, and the matmul would look several times faster than it is on real weights */
    dnnl_memory_t all[4] = {ma, mb, mc, mbias};
    for (int i = 0; i < 4; i++) {
        void *h = NULL;
        dnnl_memory_get_data_handle(all[i], &h);
        const dnnl_memory_desc_t *d;
        dnnl_memory_get_memory_desc(all[i], &d);
        size_t n = dnnl_memory_desc_get_size(d);
        uint16_t *p = h;
        for (size_t k = 0; k < n / 2; k++) p[k] = (uint16_t)(0x3c00 + (k * 2654435761u >> 20) % 0x200); /* bf16 in [0.0078, 0.0156) */
    }
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_BIAS, mbias}};
    dnnl_primitive_execute(p, st, 4, args);
    dnnl_stream_wait(st);
    double t[64];
    for (int r = 0; r < runs; r++) {
        double t0 = kb_now();
        dnnl_primitive_execute(p, st, 4, args);
        dnnl_stream_wait(st);
        t[r] = (kb_now() - t0) * 1e3;
    }
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    dnnl_memory_destroy(mbias);
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return median(t, runs);
}

static double kiln_linear_ms(int64_t M, int64_t K, int64_t N, int runs) {
    const kk_backend *be = kk_fast(KILN_BF16);
    char layout[40];
    size_t bytes;
    if (!be || kk_fast_layout(N, K, KILN_BF16, layout, &bytes)) return -1;
    float *w = kb_alloc_aligned(sizeof(float) * (size_t)(N * K)), *x = kb_alloc_aligned(sizeof(float) * (size_t)(M * K));
    float *y = kb_alloc_aligned(sizeof(float) * (size_t)(M * N)), *bias = kb_alloc_aligned(sizeof(float) * (size_t)N);
    void *packed = kb_alloc_aligned(bytes);
    kiln_noise(1, w, (size_t)(N * K));
    kiln_noise(2, x, (size_t)(M * K));
    kiln_noise(3, bias, (size_t)N);
    kk_fast_pack(w, N, K, KILN_BF16, packed);
    kk_weight kw = {N, K, NULL, packed, KILN_BF16, NULL};
    be->linear(x, &kw, bias, y, M, KK_ACT_NONE);
    double t[64];
    for (int r = 0; r < runs; r++) {
        double t0 = kb_now();
        be->linear(x, &kw, bias, y, M, KK_ACT_NONE);
        t[r] = (kb_now() - t0) * 1e3;
    }
    kb_free_aligned(w);
    kb_free_aligned(x);
    kb_free_aligned(y);
    kb_free_aligned(bias);
    kb_free_aligned(packed);
    return median(t, runs);
}

static double kiln_attention_ms(int64_t N, int64_t H, int64_t Dh, int runs) {
    const kk_backend *be = kk_fast(KILN_BF16);
    size_t n = (size_t)(N * H * Dh);
    float *q = kb_alloc_aligned(4 * n), *k = kb_alloc_aligned(4 * n), *v = kb_alloc_aligned(4 * n), *o = kb_alloc_aligned(4 * n);
    kiln_noise(4, q, n);
    kiln_noise(5, k, n);
    kiln_noise(6, v, n);
    be->attention(q, k, v, o, 1, N, N, H, Dh);
    double t[64];
    for (int r = 0; r < runs; r++) {
        double t0 = kb_now();
        be->attention(q, k, v, o, 1, N, N, H, Dh);
        t[r] = (kb_now() - t0) * 1e3;
    }
    kb_free_aligned(q);
    kb_free_aligned(k);
    kb_free_aligned(v);
    kb_free_aligned(o);
    return median(t, runs);
}

int main(int argc, char **argv) {
    int runs = 7;
    int64_t tokens = 4096;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_kernels [--runs N] [--tokens N]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 64) runs = 7;
    if (!kk_fast(KILN_BF16)) {
        printf("no bf16 fast backend on this machine (needs AVX-512 BF16 or AMX)\n");
        return 0;
    }
    printf("bf16 GEMMs, SD3-medium shapes (rows: 1024 image tokens, 333 context tokens, 2048 = CFG batch 2, 1 = modulation), %d threads, median of %d\n\n",
           kiln_get_threads(), runs);
    printf("| M x K x N | oneDNN matmul ms | GFLOP/s | kiln linear ms | GFLOP/s | kiln / oneDNN throughput |\n");
    printf("|---|---|---|---|---|---|\n");
    /* the GEMMs a forward runs: image (1024 rows) and context (333) streams separately, CFG's
     * batch 2 (2048), and the modulations (1 row) */
    int64_t shapes[][3] = {{1024, 1536, 1536}, {1024, 1536, 6144}, {1024, 6144, 1536}, {333, 1536, 1536},
                           {333, 1536, 6144}, {333, 6144, 1536}, {2048, 1536, 1536}, {1, 1536, 9216}};
    double gemm_rate = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t M = shapes[i][0], K = shapes[i][1], N = shapes[i][2];
        double fl = 2.0 * (double)M * (double)K * (double)N;
        double d = onednn_ms(M, K, N, runs), kt = kiln_linear_ms(M, K, N, runs);
        printf("| %lldx%lldx%lld | %.2f | %.0f | %.2f | %.0f | %.0f%% |\n", (long long)M, (long long)K, (long long)N, d,
               fl / d / 1e6, kt, fl / kt / 1e6, 100.0 * d / kt);
        gemm_rate += fl / kt / 1e6 / (double)(sizeof shapes / sizeof shapes[0]);
    }
    double peak = kk_amx_ready() ? amx_peak_gflops() : 0;
    double at = kiln_attention_ms(tokens, 24, 64, runs < 5 ? runs : 5);
    double afl = 4.0 * (double)tokens * (double)tokens * 1536.0;
    printf("\nattention, %lld tokens, 24 heads of 64: %.1f ms, %.0f GFLOP/s = %.0f%% of kiln's mean GEMM rate (%.0f GFLOP/s)\n",
           (long long)tokens, at, afl / at / 1e6, 100.0 * (afl / at / 1e6) / gemm_rate, gemm_rate);
    if (peak > 0)
        printf("AMX bf16 peak (TDPBF16PS on L1-resident tiles, one tile load per product, %d threads): %.0f GFLOP/s; "
               "kiln's mean GEMM rate is %.0f%% of it\n",
               kiln_get_threads(), peak, 100.0 * gemm_rate / peak);
    return 0;
}
