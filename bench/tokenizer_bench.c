/* tokenizer_bench.c - how long the CLIP and T5 tokenizers take to open and
 * to tokenize: the `tokenizers` case's folders, a pipeline-length prompt, and
 * 10k-character prompts (English, CJK, emoji, random Unicode). Median of
 * --runs runs (default 9), in CPU time of the process (one thread does the
 * work): on a shared, loaded machine wall time mostly measures the wait for
 * a core.
 *
 *   build/bench_tokenizer [--dir tests/data/goldens/tokenizers] [--runs 9] */
#include "kiln.h"
#include "base/base.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* text repeated up to at least n bytes (malloc'd) */
static char *repeat(const char *text, size_t n) {
    size_t l = strlen(text), k = (n + l - 1) / l;
    char *s = malloc(k * l + 1);
    for (size_t i = 0; i < k; i++) memcpy(s + i * l, text, l);
    s[k * l] = 0;
    return s;
}

int main(int argc, char **argv) {
    const char *dir = "tests/data/goldens/tokenizers";
    int runs = 9;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_tokenizer [--dir DIR] [--runs N]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 1000) runs = 9;
    static const char *names[3] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    const char *what[3] = {"CLIP-L", "CLIP-G", "T5"};
    /* random valid Unicode, every plane, fixed seed */
    char *rnd = malloc(4 * 10000 + 1);
    size_t rl = 0;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 10000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t cp = (uint32_t)(x % 4 == 0 ? x % 0x110000 : x % 4 == 1 ? x % 0x3000 : 0x20 + x % 0x5f);
        if (cp < 0x20 || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 'x';
        if (cp < 0x80) rnd[rl++] = (char)cp;
        else if (cp < 0x800) rnd[rl++] = (char)(0xC0 | cp >> 6), rnd[rl++] = (char)(0x80 | (cp & 63));
        else if (cp < 0x10000)
            rnd[rl++] = (char)(0xE0 | cp >> 12), rnd[rl++] = (char)(0x80 | (cp >> 6 & 63)), rnd[rl++] = (char)(0x80 | (cp & 63));
        else
            rnd[rl++] = (char)(0xF0 | cp >> 18), rnd[rl++] = (char)(0x80 | (cp >> 12 & 63)),
            rnd[rl++] = (char)(0x80 | (cp >> 6 & 63)), rnd[rl++] = (char)(0x80 | (cp & 63));
    }
    rnd[rl] = 0;
    struct {
        const char *name;
        char *text;
    } prompts[] = {
        {"a 77-token prompt", repeat("masterpiece, best quality, a breathtaking landscape at golden hour, ", 400)},
        {"10k chars English", repeat("The quick brown fox jumps over the lazy dog, don't it? ", 10000)},
        {"10k chars CJK", repeat("\xe6\x9d\xb1\xe4\xba\xac\xe3\x82\xbf\xe3\x83\xaf\xe3\x83\xbc\xe3\x81\xae\xe5\xa4\x9c", 10000 * 3)},
        {"10k chars emoji", repeat("\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xaf\xf0\x9f\x87\xb5 ", 10000 * 3)},
        {"10k chars random Unicode", rnd},
    };
    prompts[0].text[300] = 0; /* about 60 words: a real prompt's size */
    const int np = (int)(sizeof prompts / sizeof prompts[0]);
    printf("tokenizers of %s, median of %d runs, CPU ms\n\n", dir, runs);
    printf("| tokenizer | open (ms) |");
    for (int p = 0; p < np; p++) printf(" %s (ms) |", prompts[p].name);
    printf("\n| --- | --- |");
    for (int p = 0; p < np; p++) printf(" --- |");
    printf("\n");
    double *t = malloc(sizeof(double) * (size_t)runs);
    int64_t *ids = malloc(sizeof(int64_t) * 256);
    for (int k = 0; k < 3; k++) {
        char *path = kb_path_join(dir, names[k]);
        kiln_tokenizer *tok = NULL;
        for (int r = 0; r < runs; r++) {
            double t0 = cpu_now();
            kiln_status s = kiln_tokenizer_open(path, &tok);
            t[r] = cpu_now() - t0;
            if (s) {
                fprintf(stderr, "bench_tokenizer: %s\n", kiln_last_error());
                return 1;
            }
            if (r + 1 < runs) kiln_tokenizer_free(tok);
        }
        printf("| %s (%s) | %.1f |", names[k], what[k], 1e3 * median(t, runs));
        for (int p = 0; p < np; p++) {
            for (int r = 0; r < runs; r++) {
                double t0 = cpu_now();
                kiln_status s = kiln_tokenize(tok, prompts[p].text, 0, ids, NULL, NULL);
                t[r] = cpu_now() - t0;
                if (s) {
                    fprintf(stderr, "bench_tokenizer: %s\n", kiln_last_error());
                    return 1;
                }
            }
            printf(" %.2f |", 1e3 * median(t, runs));
        }
        printf("\n");
        kiln_tokenizer_free(tok);
        free(path);
    }
    for (int p = 0; p < np; p++) free(prompts[p].text);
    free(t);
    free(ids);
    return 0;
}
