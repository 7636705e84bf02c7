/* package_bench.c - what opening a compiled package costs: kx_package_open
 * (the trust checks of the folders, reading the manifest, its signature,
 * parsing) and kx_package_load (the trust checks again, hashing model.so
 * through its descriptor, dlopen, binding every weight, the arena), each
 * repetition a fresh package object (dlclose between, so each load maps
 * the library again, as a new process would). Prints the median and the
 * quartiles of N repetitions.
 *
 *   build/bench_package PACKAGE_DIR MODEL_DIR [N]
 *
 * PACKAGE_DIR is a package compiled for MODEL_DIR with --dtype f32 (kiln
 * compile MODEL --dtype f32 --package-dir ROOT ...). docs/package.md keeps
 * the numbers. */
#include "base/base.h"
#include "compile/compile.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bind(void *user, const char *name, kx_bound *b) {
    const km_weight *w = km_find(user, name);
    if (!w) return 0;
    *b = (kx_bound){w->ndim, {w->shape[0], w->shape[1], w->shape[2], w->shape[3]}, &w->kw, w->data,
                    w->packed ? w->kw.packed_dtype : KILN_F32, w->layout};
    return 1;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp);
    printf("%-22s median %8.3f ms   p25 %8.3f   p75 %8.3f   (n=%d)\n", what, t[n / 2] * 1e3, t[n / 4] * 1e3,
           t[3 * n / 4] * 1e3, n);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PACKAGE_DIR MODEL_DIR [N]\n", argv[0]);
        return 2;
    }
    int n = argc > 3 ? atoi(argv[3]) : 200;
    if (n < 4) n = 4;
    kiln_model *m = NULL;
    kiln_open_opts o = {.dtype = KILN_F32};
    if (kiln_model_open(argv[2], &o, &m)) {
        fprintf(stderr, "%s\n", kiln_last_error());
        return 1;
    }
    double *t_open = malloc(sizeof(double) * (size_t)n), *t_load = malloc(sizeof(double) * (size_t)n),
           *t_both = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n + 3; i++) { /* 3 warm-up rounds */
        kx_package *p = NULL;
        double t0 = kb_now();
        if (kx_package_open(argv[1], &p)) {
            fprintf(stderr, "%s\n", kiln_last_error());
            return 1;
        }
        double t1 = kb_now();
        if (kx_package_load(p, m->backend, NULL, bind, m)) {
            fprintf(stderr, "%s\n", kiln_last_error());
            return 1;
        }
        double t2 = kb_now();
        kx_package_close(p);
        if (i >= 3) {
            t_open[i - 3] = t1 - t0;
            t_load[i - 3] = t2 - t1;
            t_both[i - 3] = t2 - t0;
        }
    }
    report("open", t_open, n);
    report("load", t_load, n);
    report("open + load", t_both, n);
    free(t_open);
    free(t_load);
    free(t_both);
    kiln_model_free(m);
    return 0;
}
