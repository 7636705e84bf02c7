/* cache_check_bench.c - the trust checks of a cache hit alone, on a published
 * manifest: the header split and xxh3, the HMAC-SHA256 signature
 * (kb_verify_sig), the field parse, and the key comparison, each timed over
 * many runs (median). What they add to kiln_load_model on a hit
 * (bench/cache_hit_bench.c measures the whole hit).
 *
 *   bench_cache_check CACHE_FOLDER [--runs N] */
#include "base/base.h"
#include "cache/cache.h"

#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cache_check CACHE_FOLDER [--runs N]\n");
        return 2;
    }
    int runs = argc > 3 && !strcmp(argv[2], "--runs") ? atoi(argv[3]) : 500;
    if (runs < 1 || runs > 1000000) return 2;
    char *p = kb_path_join(argv[1], KCACHE_MANIFEST), *text = NULL;
    size_t len;
    if (!p || kb_read_file(p, &text, &len)) {
        fprintf(stderr, "%s\n", kiln_last_error());
        return 1;
    }
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = malloc((size_t)runs * sizeof(double));
    const char *names[4] = {"header split + xxh3", "signature (HMAC-SHA256)", "field parse", "key comparison"};
    for (int i = 0; i < runs; i++) {
        int v;
        char sig[65];
        const char *body;
        size_t bl;
        double t0 = kb_now();
        if (kcache_manifest_split(text, len, argv[1], &v, sig, &body, &bl)) return 1;
        double t1 = kb_now();
        if (kb_verify_sig(body, bl, sig)) {
            fprintf(stderr, "%s\n", kiln_last_error());
            return 1;
        }
        double t2 = kb_now();
        kcache_entry *e = kb_calloc(1, sizeof *e);
        if (!e || kcache_manifest_parse(body, bl, argv[1], e)) return 1;
        double t3 = kb_now();
        e->path = kb_strdup(argv[1]);
        if (kcache_check_key(e, e->key_json, NULL)) return 1;
        double t4 = kb_now();
        kcache_close(e);
        t[0][i] = (t1 - t0) * 1e3, t[1][i] = (t2 - t1) * 1e3, t[2][i] = (t3 - t2) * 1e3, t[3][i] = (t4 - t3) * 1e3;
    }
    printf("manifest %zu bytes, %d runs (median ms):\n", len, runs);
    for (int k = 0; k < 4; k++) {
        qsort(t[k], (size_t)runs, sizeof(double), cmp);
        printf("  %-26s %.4f\n", names[k], t[k][runs / 2]);
        free(t[k]);
    }
    free(text);
    free(p);
    return 0;
}
