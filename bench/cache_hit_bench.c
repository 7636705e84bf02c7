/* cache_hit_bench.c - what one cache hit costs inside a process: kiln_load_model
 * on a published cache (map, the manifest's checks, the model's views), the
 * model freed in between so every load takes the whole hit path. Public API
 * only, so the same file builds against any libkiln and two builds compare
 * side by side (docs/cache.md: the signature and key checks).
 *
 *   bench_cache_hit [--dir DIR] [--layers N] [--runs N]
 *
 * The model is seeded with tiny dimensions and N layers (24: the tensor count,
 * so the manifest's size, of SD3-medium); a manifest's checks scale with the
 * tensor count, not the weights' bytes. Prints median, p10 and p90 in ms. */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *dir = "/tmp/kiln-bench-hit";
    int layers = 24, runs = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
    }
    if (runs < 1 || runs > 100000 || layers < 1 || layers > 64) {
        fprintf(stderr, "usage: bench_cache_hit [--dir DIR] [--layers 1..64] [--runs N]\n");
        return 2;
    }
    char model[1024], root[1024];
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(root, sizeof root, "%s/cache", dir);
    kiln_config c = kiln_config_demo();
    c.num_layers = layers;
    c.dual_attention_mask = 0;
    if (kiln_write_seeded_model(model, &c, 1, KILN_F32)) {
        fprintf(stderr, "cannot write %s: %s\n", model, kiln_last_error());
        return 1;
    }
    kiln_load_opts o = kiln_load_defaults();
    o.model_name = "bench-hit";
    o.cache_root = root;
    o.source = model;
    kiln_model *m = NULL;
    if (kiln_load_model(&o, &m)) { /* publish (or an existing hit) */
        fprintf(stderr, "load: %s\n", kiln_last_error());
        return 1;
    }
    kiln_model_free(m);
    double *t = malloc((size_t)runs * sizeof *t);
    if (!t) return 1;
    for (int i = 0; i < runs; i++) {
        double t0 = now();
        kiln_status s = kiln_load_model(&o, &m);
        t[i] = (now() - t0) * 1e3;
        if (s || strcmp(kiln_model_origin(m), "hit")) {
            fprintf(stderr, "run %d: not a hit: %s\n", i, s ? kiln_last_error() : kiln_model_origin(m));
            return 1;
        }
        kiln_model_free(m);
    }
    qsort(t, (size_t)runs, sizeof *t, cmp);
    printf("hit (kiln_load_model, %d layers, %d runs): median %.3f ms, p10 %.3f, p90 %.3f\n", layers, runs,
           t[runs / 2], t[runs / 10], t[runs * 9 / 10]);
    free(t);
    return 0;
}
