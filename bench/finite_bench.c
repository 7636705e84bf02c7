/* finite_bench.c - what the NaN/Inf checks of kiln_forward cost, against
 * the forward itself, side by side in one run.
 *
 *   bench_finite [--runs N] [--layers N] [--latent N] [--dir DIR]
 *
 * The model is the demo's (kiln_config_demo) cut to --layers blocks
 * (default 2: the smallest forward, so the worst case for the ratio),
 * seeded, batch 2 (CFG), context 77, latent --latent (default 32) square.
 * Each run times one forward without the checks (km_forward: the execution
 * chain alone) and then the checks kiln_forward adds on the same buffers
 * (a scan of each of the four inputs and of the output), and the result is
 * the median of the per-run ratios: the host's speed drifts with other
 * tenants, so separate medians could compare a quiet moment with a busy one.
 * A sampler step adds one more scan of a latent (batch 1 of the output). */
#include "base/base.h"
#include "model/model.h"
#include "tensor/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int runs = 21, layers = 2, latent = 32;
    const char *dir = "build/bench-data/finite-model";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--latent")) latent = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_finite [--runs N] [--layers N] [--latent N] [--dir DIR]\n");
            return 2;
        }
    }
    if (runs < 1 || layers < 1 || layers > 64) return 2;
    kiln_config c = kiln_config_demo();
    c.num_layers = layers;
    c.dual_attention_mask &= (1ull << layers) - 1;
    kiln_model *m = NULL;
    kiln_status st = kiln_write_seeded_model(dir, &c, 1, KILN_BF16);
    if (!st) st = kiln_model_open(dir, NULL, &m);
    if (st) {
        fprintf(stderr, "bench_finite: %s\n", kiln_last_error());
        return 1;
    }
    int B = 2, T = 77;
    km_sizes z;
    if (km_check_sizes(&c, B, latent, latent, T, &z)) {
        fprintf(stderr, "bench_finite: %s\n", kiln_last_error());
        return 1;
    }
    float *in[4], *out = kb_alloc_aligned(z.out * sizeof(float));
    size_t n[4] = {z.hidden, z.context, z.pooled, z.timestep};
    for (int i = 0; i < 4; i++) {
        in[i] = kb_alloc_aligned(n[i] * sizeof(float));
        kiln_noise((uint64_t)i, in[i], n[i]);
    }
    for (size_t k = 0; k < n[3]; k++) in[3][k] = 500.0f;
    kiln_forward_args a = {B, latent, latent, T, in[0], in[1], in[2], in[3]};
    if ((st = kiln_forward(m, &a, out))) { /* warm up: the plan, the arena */
        fprintf(stderr, "bench_finite: %s\n", kiln_last_error());
        return 1;
    }
    double *fw = malloc(sizeof(double) * (size_t)runs), *sc = malloc(sizeof(double) * (size_t)runs),
           *ratio = malloc(sizeof(double) * (size_t)runs);
    size_t bad = 0, scanned = z.hidden + z.context + z.pooled + z.timestep + z.out;
    for (int r = 0; r < runs; r++) {
        double t0 = kb_now();
        st = km_forward(m, &a, out);
        double t1 = kb_now();
        for (int i = 0; i < 4; i++) bad += kt_find_nonfinite(in[i], n[i]) != n[i];
        bad += kt_find_nonfinite(out, z.out) != z.out;
        double t2 = kb_now();
        if (st) {
            fprintf(stderr, "bench_finite: %s\n", kiln_last_error());
            return 1;
        }
        fw[r] = (t1 - t0) * 1e3;
        sc[r] = (t2 - t1) * 1e3;
        ratio[r] = (t2 - t1) / (t1 - t0);
    }
    printf("bench_finite: demo config, %d layers, batch %d, latent %dx%d, context %d, %d threads, exec %s\n", layers, B,
           latent, latent, T, kiln_get_threads(), kiln_model_last_exec(m));
    printf("  forward (no checks)   %10.3f ms   median of %d\n", median(fw, runs), runs);
    printf("  checks (5 scans)      %10.4f ms   %zu floats (%.1f MB), %.1f GB/s\n", median(sc, runs), scanned,
           scanned * 4 / 1e6, scanned * 4 / 1e6 / median(sc, runs));
    printf("  checks / forward      %10.4f %%   median of per-run ratios\n", 100 * median(ratio, runs));
    if (bad) printf("  (a scan found a non-finite value)\n");
    for (int i = 0; i < 4; i++) kb_free_aligned(in[i]);
    kb_free_aligned(out);
    free(fw);
    free(sc);
    free(ratio);
    kiln_model_free(m);
    return 0;
}
