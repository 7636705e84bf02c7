/* kernel_bench.c - kiln's fast kernels against oneDNN's own matmul on the
 * same shapes, side by side in one run (SD3-medium blocks).
 *
 *   bench_kernels [--runs N] [--tokens N] [--encoder | --f32]
 *
 * --encoder: only the text encoders' GEMMs and the peaks.
 * --f32: kiln's f32 linear against a bare oneDNN f32 matmul (packed
 * weights, bias) on the SD3 and text-encoder shapes, and the f32 FMA peak
 * of the vectors this class has (ymm on the avx2 class: run it under
 * KILN_MAX_ISA=avx2 on a bigger CPU to see that class's kernels).
 *
 * GEMM: kiln's linear (f32 activations in, bf16 conversion, packed weights,
 * bias) against a bare oneDNN bf16 matmul whose source is already bf16.
 * Attention: kiln's attention at N tokens against kiln's largest forward
 * GEMM (1024x1536x6144), FLOP rate to FLOP rate. Each pair runs in turn,
 * run by run, and the ratio is the median of the per-run ratios: the host's
 * speed drifts 3-4x with other tenants, so separate medians can compare a
 * quiet minute with a busy one.
 * AMX peak: TDPBF16PS on tiles loaded from L1 (one tile load per product,
 * as in a 2x2 GEMM micro-kernel), on every thread: the most a bf16 GEMM
 * can reach on this machine, measured in the same run.
 * AVX-512 peaks (CPUs with AVX512-BF16): VDPBF16PS and VFMADD231PS on
 * registers only, 16 independent accumulators per thread, every thread:
 * the most an AVX-512 bf16 or f32 GEMM can reach here (no loads, no
 * stores). Then the text encoders' GEMMs (T5-XXL at 256 tokens, CLIP-G at
 * 77) on kiln's bf16 linear against the same GEMM on f32-packed weights in
 * the bf16 backend (what T5's q and k run since ka_spec.keep_f32), in turn. */
#include "base/base.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/kernels.h"

#include <immintrin.h>
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

/* VDPBF16PS zmm: 16 f32 lanes, each a 2-element bf16 dot product: 64 flop;
 * VFMADD231PS zmm: 16 lanes x 2 flop. 16 independent accumulators
 * (zmm0-15) hide the latency (4-6 cycles) behind the pipes; the operands
 * stay in registers. In asm so the compiler can neither fold nor drop it. */
#define VEC_ITERS 1000000L
#define VEC_TRIALS 25
#define ACC16(op) \
    op " %[b], %[a], %%zmm0\n\t" op " %[b], %[a], %%zmm1\n\t" op " %[b], %[a], %%zmm2\n\t" \
    op " %[b], %[a], %%zmm3\n\t" op " %[b], %[a], %%zmm4\n\t" op " %[b], %[a], %%zmm5\n\t" \
    op " %[b], %[a], %%zmm6\n\t" op " %[b], %[a], %%zmm7\n\t" op " %[b], %[a], %%zmm8\n\t" \
    op " %[b], %[a], %%zmm9\n\t" op " %[b], %[a], %%zmm10\n\t" op " %[b], %[a], %%zmm11\n\t" \
    op " %[b], %[a], %%zmm12\n\t" op " %[b], %[a], %%zmm13\n\t" op " %[b], %[a], %%zmm14\n\t" \
    op " %[b], %[a], %%zmm15\n\t"
#define VEC_CLOBBER "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", \
    "zmm11", "zmm12", "zmm13", "zmm14", "zmm15", "cc"

__attribute__((target("avx512f,avx512bf16"))) static double avx512_bf16_once(void) {
    int nt = 1;
    double t0 = kb_now();
#pragma omp parallel
    {
        __m512 a = _mm512_set1_ps(1e-3f), b = _mm512_set1_ps(2e-3f);
        long n = VEC_ITERS;
        __asm__ volatile("vxorps %%zmm0, %%zmm0, %%zmm0\n\t"
                         "1:\n\t" ACC16("vdpbf16ps") "dec %[n]\n\tjnz 1b"
                         : [n] "+r"(n)
                         : [a] "v"(a), [b] "v"(b)
                         : VEC_CLOBBER);
#pragma omp single
        nt = omp_get_num_threads();
    }
    return (double)nt * (double)VEC_ITERS * 16 * 64 / (kb_now() - t0) / 1e9;
}

__attribute__((target("avx512f"))) static double avx512_f32_once(void) {
    int nt = 1;
    double t0 = kb_now();
#pragma omp parallel
    {
        __m512 a = _mm512_set1_ps(1e-3f), b = _mm512_set1_ps(2e-3f);
        long n = VEC_ITERS;
        __asm__ volatile("1:\n\t" ACC16("vfmadd231ps") "dec %[n]\n\tjnz 1b"
                         : [n] "+r"(n)
                         : [a] "v"(a), [b] "v"(b)
                         : VEC_CLOBBER);
#pragma omp single
        nt = omp_get_num_threads();
    }
    return (double)nt * (double)VEC_ITERS * 16 * 32 / (kb_now() - t0) / 1e9;
}

/* VFMADD231PS ymm: 8 lanes x 2 flop; 12 accumulators (ymm0-11) as the
 * avx2 GEMM's micro-kernel keeps */
#define ACC12Y(op) \
    op " %[b], %[a], %%ymm0\n\t" op " %[b], %[a], %%ymm1\n\t" op " %[b], %[a], %%ymm2\n\t" \
    op " %[b], %[a], %%ymm3\n\t" op " %[b], %[a], %%ymm4\n\t" op " %[b], %[a], %%ymm5\n\t" \
    op " %[b], %[a], %%ymm6\n\t" op " %[b], %[a], %%ymm7\n\t" op " %[b], %[a], %%ymm8\n\t" \
    op " %[b], %[a], %%ymm9\n\t" op " %[b], %[a], %%ymm10\n\t" op " %[b], %[a], %%ymm11\n\t"

__attribute__((target("avx2,fma"))) static double avx2_f32_once(void) {
    int nt = 1;
    double t0 = kb_now();
#pragma omp parallel
    {
        __m256 a = _mm256_set1_ps(1e-3f), b = _mm256_set1_ps(2e-3f);
        long n = VEC_ITERS;
        __asm__ volatile("1:\n\t" ACC12Y("vfmadd231ps") "dec %[n]\n\tjnz 1b"
                         : [n] "+r"(n)
                         : [a] "x"(a), [b] "x"(b)
                         : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", "ymm10",
                           "ymm11", "cc");
#pragma omp single
        nt = omp_get_num_threads();
    }
    return (double)nt * (double)VEC_ITERS * 12 * 16 / (kb_now() - t0) / 1e9;
}

/* the best of VEC_TRIALS short bursts (~10 ms each): other tenants take the
 * CPUs for whole time slices, so a long loop measures their share; the
 * best burst is the machine's rate */
static double best_of(double (*once)(void)) {
    double best = 0;
    for (int t = 0; t < VEC_TRIALS; t++) {
        double g = once();
        if (g > best) best = g;
    }
    return best;
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
typedef struct onednn_mm {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    dnnl_memory_t mem[4];
    dnnl_exec_arg_t args[4];
} onednn_mm;

static int onednn_open_dt(onednn_mm *o, int64_t M, int64_t K, int64_t N, dnnl_data_type_t dt) {
    memset(o, 0, sizeof *o);
    dnnl_engine_create(&o->eng, dnnl_cpu, 0);
    dnnl_stream_create(&o->st, o->eng, dnnl_stream_default_flags);
    dnnl_memory_desc_t a, b, c, bias;
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N}, dbias = {1, N};
    dnnl_memory_desc_init_by_tag(&a, 2, da, dt, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&b, 2, db, dt, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&c, 2, dc, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&bias, 2, dbias, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t md;
    dnnl_matmul_desc_init(&md, &a, &b, &bias, &c);
    if (dnnl_primitive_desc_create(&o->pd, &md, NULL, o->eng, NULL) || dnnl_primitive_create(&o->p, o->pd)) return 0;
    dnnl_memory_create(&o->mem[0], &a, o->eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&o->mem[1], dnnl_primitive_desc_query_md(o->pd, dnnl_query_weights_md, 0), o->eng,
                       DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&o->mem[2], &c, o->eng, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_create(&o->mem[3], &bias, o->eng, DNNL_MEMORY_ALLOCATE);
    /* real data in every buffer: untouched memory maps the kernel's zero page, every read hits the
     * cache, and the matmul would look several times faster than it is on real weights */
    for (int i = 0; i < 4; i++) {
        void *h = NULL;
        dnnl_memory_get_data_handle(o->mem[i], &h);
        const dnnl_memory_desc_t *d;
        dnnl_memory_get_memory_desc(o->mem[i], &d);
        size_t n = dnnl_memory_desc_get_size(d);
        uint16_t *p = h;
        for (size_t k = 0; k < n / 2; k++) p[k] = (uint16_t)(0x3c00 + (k * 2654435761u >> 20) % 0x200); /* bf16 in [0.0078, 0.0156) */
    }
    int argk[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    for (int i = 0; i < 4; i++) o->args[i] = (dnnl_exec_arg_t){argk[i], o->mem[i]};
    return 1;
}

static int onednn_open(onednn_mm *o, int64_t M, int64_t K, int64_t N) { return onednn_open_dt(o, M, K, N, dnnl_bf16); }

static double onednn_run_ms(onednn_mm *o) {
    double t0 = kb_now();
    dnnl_primitive_execute(o->p, o->st, 4, o->args);
    dnnl_stream_wait(o->st);
    return (kb_now() - t0) * 1e3;
}

static void onednn_close(onednn_mm *o) {
    for (int i = 0; i < 4; i++)
        if (o->mem[i]) dnnl_memory_destroy(o->mem[i]);
    if (o->p) dnnl_primitive_destroy(o->p);
    if (o->pd) dnnl_primitive_desc_destroy(o->pd);
    dnnl_stream_destroy(o->st);
    dnnl_engine_destroy(o->eng);
}

/* kiln's linear on f32 input (converted to bf16 inside) and packed weights, + bias */
typedef struct kiln_lin {
    const kk_backend *be;
    kk_weight kw;
    float *w, *x, *y, *bias;
    void *packed;
    int64_t M;
} kiln_lin;

/* wdt: the packed weights' type (BF16; F32 = a weight kept f32 in a bf16
 * model, which the bf16 backend runs in f32) */
static int kiln_open_dt(kiln_lin *l, int64_t M, int64_t K, int64_t N, kiln_dtype wdt) {
    memset(l, 0, sizeof *l);
    l->be = kk_fast(KILN_BF16) ? kk_fast(KILN_BF16) : kk_fast(KILN_F32);
    char layout[40];
    size_t bytes;
    if (!l->be || kk_fast_layout(N, K, wdt, layout, &bytes)) return 0;
    l->w = kb_alloc_aligned(sizeof(float) * (size_t)(N * K));
    l->x = kb_alloc_aligned(sizeof(float) * (size_t)(M * K));
    l->y = kb_alloc_aligned(sizeof(float) * (size_t)(M * N));
    l->bias = kb_alloc_aligned(sizeof(float) * (size_t)N);
    l->packed = kb_alloc_aligned(bytes);
    kiln_noise(1, l->w, (size_t)(N * K));
    kiln_noise(2, l->x, (size_t)(M * K));
    kiln_noise(3, l->bias, (size_t)N);
    if (!l->w || !l->x || !l->y || !l->bias || !l->packed || kk_fast_pack(l->w, N, K, wdt, l->packed)) return 0;
    l->kw = (kk_weight){N, K, NULL, l->packed, wdt, NULL};
    l->M = M;
    return 1;
}

static int kiln_open(kiln_lin *l, int64_t M, int64_t K, int64_t N) { return kiln_open_dt(l, M, K, N, KILN_BF16); }

static double kiln_run_ms(kiln_lin *l) {
    double t0 = kb_now();
    l->be->linear(l->x, &l->kw, l->bias, l->y, l->M, KK_ACT_NONE);
    return (kb_now() - t0) * 1e3;
}

static void kiln_close(kiln_lin *l) {
    kb_free_aligned(l->w);
    kb_free_aligned(l->x);
    kb_free_aligned(l->y);
    kb_free_aligned(l->bias);
    kb_free_aligned(l->packed);
}

/* The host's speed drifts between runs (the tile unit is shared with other
 * tenants), so two kernels are compared run by run: a[r] and b[r] are timed
 * back to back (in turn first), and the ratio is the median of a[r] / b[r]. */
typedef double (*run_fn)(void *);

static double paired(run_fn fa, void *a, run_fn fb, void *b, int runs, double *ma, double *mb) {
    double ta[64], tb[64], ratio[64];
    fa(a); /* warm-up */
    fb(b);
    for (int r = 0; r < runs; r++) {
        if (r % 2) {
            tb[r] = fb(b);
            ta[r] = fa(a);
        } else {
            ta[r] = fa(a);
            tb[r] = fb(b);
        }
        ratio[r] = ta[r] / tb[r];
    }
    *ma = median(ta, runs);
    *mb = median(tb, runs);
    return median(ratio, runs);
}

static double onednn_run(void *o) { return onednn_run_ms(o); }
static double kiln_layer_run(void *l) { return kiln_run_ms(l); }

typedef struct attn_case {
    const kk_backend *be;
    float *q, *k, *v, *o;
    int64_t N, H, Dh;
} attn_case;

static double attn_run(void *p) {
    attn_case *a = p;
    double t0 = kb_now();
    a->be->attention(a->q, a->k, a->v, a->o, 1, a->N, a->N, a->H, a->Dh, NULL);
    return (kb_now() - t0) * 1e3;
}

static void sd3_kernels(int runs, int64_t tokens) {
    printf("bf16 GEMMs, SD3-medium shapes (rows: 1024 image tokens, 333 context tokens, 2048 = CFG batch 2, 1 = "
           "modulation), %d threads; %d runs of each, oneDNN and kiln in turn; medians, and the median of the "
           "per-run ratios\n\n",
           kiln_get_threads(), runs);
    printf("| M x K x N | oneDNN matmul ms | GFLOP/s | kiln linear ms | GFLOP/s | kiln / oneDNN throughput |\n");
    printf("|---|---|---|---|---|---|\n");
    /* the GEMMs a forward runs: image (1024 rows) and context (333) streams separately, CFG's
     * batch 2 (2048), and the modulations (1 row) */
    int64_t shapes[][3] = {{1024, 1536, 1536}, {1024, 1536, 6144}, {1024, 6144, 1536}, {333, 1536, 1536},
                           {333, 1536, 6144}, {333, 6144, 1536}, {2048, 1536, 1536}, {1, 1536, 9216}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t M = shapes[i][0], K = shapes[i][1], N = shapes[i][2];
        double fl = 2.0 * (double)M * (double)K * (double)N, d, kt;
        onednn_mm o;
        kiln_lin l;
        int have_o = onednn_open(&o, M, K, N), have_l = have_o && kiln_open(&l, M, K, N);
        if (!have_l) {
            printf("| %lldx%lldx%lld | (cannot create) |\n", (long long)M, (long long)K, (long long)N);
            onednn_close(&o); /* whatever was created */
            if (have_o) kiln_close(&l);
            continue;
        }
        double ratio = paired(onednn_run, &o, kiln_layer_run, &l, runs, &d, &kt);
        printf("| %lldx%lldx%lld | %.2f | %.0f | %.2f | %.0f | %.0f%% |\n", (long long)M, (long long)K, (long long)N, d,
               fl / d / 1e6, kt, fl / kt / 1e6, 100.0 * ratio);
        onednn_close(&o);
        kiln_close(&l);
    }
    /* attention against the forward's largest GEMM (the feed-forward's up-projection), in turn */
    attn_case ac = {kk_fast(KILN_BF16), NULL, NULL, NULL, NULL, tokens, 24, 64};
    size_t n = (size_t)(tokens * 24 * 64);
    ac.q = kb_alloc_aligned(4 * n), ac.k = kb_alloc_aligned(4 * n), ac.v = kb_alloc_aligned(4 * n);
    ac.o = kb_alloc_aligned(4 * n);
    kiln_noise(4, ac.q, n);
    kiln_noise(5, ac.k, n);
    kiln_noise(6, ac.v, n);
    kiln_lin ref;
    if (kiln_open(&ref, 1024, 1536, 6144)) {
        double at, gt, ratio = paired(attn_run, &ac, kiln_layer_run, &ref, runs < 9 ? runs : 9, &at, &gt);
        double afl = 4.0 * (double)tokens * (double)tokens * 1536.0, gfl = 2.0 * 1024 * 1536 * 6144;
        /* rate ratio = (afl / at) / (gfl / gt), per run */
        printf("\nattention, %lld tokens, 24 heads of 64: %.1f ms, %.0f GFLOP/s; kiln's 1024x1536x6144 GEMM in turn: "
               "%.0f GFLOP/s; attention runs at %.0f%% of the GEMM's FLOP rate (median of the per-run ratios)\n",
               (long long)tokens, at, afl / at / 1e6, gfl / gt / 1e6, 100.0 * afl / gfl / ratio);
        kiln_close(&ref);
    }
    kb_free_aligned(ac.q);
    kb_free_aligned(ac.k);
    kb_free_aligned(ac.v);
    kb_free_aligned(ac.o);
}

static void encoder_gemms(int runs) {
    /* the text encoders' GEMMs: bf16 weights against weights kept f32 (T5's q and k), in turn */
    printf("\ntext-encoder GEMMs, %d threads: kiln's bf16 linear on bf16-packed weights against the same on "
           "f32-packed weights (f32 GEMM in the bf16 backend, as T5's q and k since keep_f32), in turn\n\n",
           kiln_get_threads());
    printf("| GEMM | M x K x N | bf16 ms | GFLOP/s | f32 weights ms | GFLOP/s | f32 / bf16 time |\n|---|---|---|---|---|---|---|\n");
    struct { const char *what; int64_t m, k, n; } enc[] = {{"T5-XXL q, k, v, o", 256, 4096, 4096},
                                                            {"T5-XXL wi_0, wi_1", 256, 4096, 10240},
                                                            {"T5-XXL wo", 256, 10240, 4096},
                                                            {"CLIP-G q, k, v, o", 77, 1280, 1280},
                                                            {"CLIP-G fc1", 77, 1280, 5120},
                                                            {"CLIP-G fc2", 77, 5120, 1280}};
    for (size_t i = 0; i < sizeof enc / sizeof enc[0]; i++) {
        int64_t M = enc[i].m, K = enc[i].k, N = enc[i].n;
        double fl = 2.0 * (double)M * (double)K * (double)N, tb, tf;
        kiln_lin lb, lf;
        int ok_b = kiln_open_dt(&lb, M, K, N, KILN_BF16), ok_f = ok_b && kiln_open_dt(&lf, M, K, N, KILN_F32);
        if (ok_f) {
            double ratio = paired(kiln_layer_run, &lf, kiln_layer_run, &lb, runs, &tf, &tb);
            printf("| %s | %lldx%lldx%lld | %.2f | %.0f | %.2f | %.0f | %.2fx |\n", enc[i].what, (long long)M,
                   (long long)K, (long long)N, tb, fl / tb / 1e6, tf, fl / tf / 1e6, ratio);
        } else {
            printf("| %s | %lldx%lldx%lld | (cannot create) |\n", enc[i].what, (long long)M, (long long)K, (long long)N);
        }
        kiln_close(&lb);
        if (ok_b) kiln_close(&lf);
    }
}

/* f32: kiln's linear (the avx2 GEMM on that class, else oneDNN's f32
 * matmul through kiln) against a bare oneDNN f32 matmul, in turn */
static void f32_gemms(int runs) {
    printf("f32 GEMMs (CPU class %s), %d threads; %d runs of each, oneDNN and kiln in turn; medians, and the "
           "median of the per-run ratios\n\n", kiln_cpu_class(0), kiln_get_threads(), runs);
    printf("| M x K x N | oneDNN f32 matmul ms | GFLOP/s | kiln f32 linear ms | GFLOP/s | kiln / oneDNN throughput |\n");
    printf("|---|---|---|---|---|---|\n");
    int64_t shapes[][3] = {{1024, 1536, 1536}, {1024, 1536, 6144}, {1024, 6144, 1536}, {333, 1536, 1536},
                           {2048, 1536, 1536}, {1, 1536, 9216},   {256, 4096, 4096},  {256, 4096, 10240},
                           {77, 1280, 1280},   {77, 1280, 5120}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t M = shapes[i][0], K = shapes[i][1], N = shapes[i][2];
        double fl = 2.0 * (double)M * (double)K * (double)N, d, kt;
        onednn_mm o;
        kiln_lin l;
        int have_o = onednn_open_dt(&o, M, K, N, dnnl_f32), have_l = have_o && kiln_open_dt(&l, M, K, N, KILN_F32);
        if (have_l) l.be = kk_fast(KILN_F32);
        if (!have_l || !l.be) {
            printf("| %lldx%lldx%lld | (cannot create) |\n", (long long)M, (long long)K, (long long)N);
            onednn_close(&o);
            if (have_o) kiln_close(&l);
            continue;
        }
        double ratio = paired(onednn_run, &o, kiln_layer_run, &l, runs, &d, &kt);
        printf("| %lldx%lldx%lld | %.2f | %.0f | %.2f | %.0f | %.0f%% |\n", (long long)M, (long long)K, (long long)N, d,
               fl / d / 1e6, kt, fl / kt / 1e6, 100.0 * ratio);
        onednn_close(&o);
        kiln_close(&l);
    }
    if (kk_cpu_has("avx512"))
        printf("\nf32 FMA peak (zmm, registers only, 16 accumulators, %d threads, best of %d bursts): %.0f GFLOP/s\n",
               kiln_get_threads(), VEC_TRIALS, best_of(avx512_f32_once));
    else
        printf("\nf32 FMA peak (ymm, registers only, 12 accumulators, %d threads, best of %d bursts): %.0f GFLOP/s\n",
               kiln_get_threads(), VEC_TRIALS, best_of(avx2_f32_once));
}

int main(int argc, char **argv) {
    int runs = 7;
    int64_t tokens = 4096;
    int encoder_only = 0, f32 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--encoder")) encoder_only = 1;
        else if (!strcmp(argv[i], "--f32")) f32 = 1;
        else {
            fprintf(stderr, "usage: bench_kernels [--runs N] [--tokens N] [--encoder | --f32]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 64) runs = 7;
    if (f32) {
        f32_gemms(runs);
        return 0;
    }
    if (!kk_fast(KILN_BF16)) {
        printf("no bf16 fast backend on this machine (needs AVX-512 BF16 or AMX)\n");
        return 0;
    }
    if (!encoder_only) sd3_kernels(runs, tokens);
    encoder_gemms(runs);
    if (__builtin_cpu_supports("avx512bf16")) {
        double pb = best_of(avx512_bf16_once), pf = best_of(avx512_f32_once);
        printf("\nAVX-512 peaks (registers only, 16 accumulators, %d threads, best of %d bursts): VDPBF16PS %.0f GFLOP/s, VFMADD231PS "
               "%.0f GFLOP/s\n",
               kiln_get_threads(), VEC_TRIALS, pb, pf);
    }
    if (kk_amx_ready()) {
        double peak = amx_peak_gflops();
        printf("AMX bf16 peak (TDPBF16PS on L1-resident tiles, one tile load per product, %d threads): %.0f GFLOP/s\n",
               kiln_get_threads(), peak);
    }
    return 0;
}
