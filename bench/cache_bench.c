/* cache_bench.c - cold start with and without the weight cache, side by
 * side in one run, on a generated SD3-medium-shaped checkpoint (>= 1 GB).
 *
 *   bench_cache [--dir DIR] [--layers N] [--runs N] [--latent N]
 *
 * Each measurement is a fresh process (fork) so nothing is shared through
 * the in-process registry: convert (no cache), miss (convert + publish),
 * hit (map), and hit/convert + the first backbone output. Timings are
 * medians over --runs; the page cache is warm after the first read. */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { CONVERT, MISS, HIT };

typedef struct {
    const char *ckpt, *root;
    int latent;
} env;

/* In a child: load one way, optionally run one forward; returns seconds for
 * load and for load + first output through a pipe. */
static int measure(const env *e, int how, int forward, double out[2]) {
    int fd[2];
    if (pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        double r[2] = {-1, -1}, t0 = now();
        kiln_model *m = NULL;
        kiln_status s;
        if (how == CONVERT) {
            s = kiln_model_open(e->ckpt, NULL, &m);
        } else {
            kiln_load_opts o = kiln_load_defaults();
            o.model_name = "bench-sd3";
            o.cache_root = e->root;
            o.source = e->ckpt;
            s = kiln_load_model(&o, &m);
            if (!s && strcmp(kiln_model_origin(m), how == HIT ? "hit" : "miss")) s = KILN_ERR_INVALID_ARG;
        }
        r[0] = now() - t0;
        if (!s && forward) {
            const kiln_config *c = kiln_model_config(m);
            int L = e->latent, T = 8;
            size_t nh = (size_t)c->in_channels * L * L;
            float *h = malloc(nh * 4), *ctx = malloc((size_t)T * c->joint_attention_dim * 4);
            float *p = malloc((size_t)c->pooled_projection_dim * 4), t = 500, *o = malloc(nh * 4);
            kiln_noise(1, h, nh);
            kiln_noise(2, ctx, (size_t)T * c->joint_attention_dim);
            kiln_noise(3, p, (size_t)c->pooled_projection_dim);
            kiln_forward_args a = {1, L, L, T, h, ctx, p, &t};
            s = kiln_forward(m, &a, o);
            r[1] = now() - t0;
        }
        if (s) fprintf(stderr, "bench child: %s\n", kiln_last_error());
        if (write(fd[1], r, sizeof r) != sizeof r) _exit(3);
        _exit(s ? 1 : 0);
    }
    close(fd[1]);
    ssize_t got = read(fd[0], out, 2 * sizeof(double));
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return got == 2 * (ssize_t)sizeof(double) && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int64_t tree_bytes(const char *path) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "du -sb '%s' 2>/dev/null", path);
    FILE *p = popen(cmd, "r");
    long long b = 0;
    if (p) {
        if (fscanf(p, "%lld", &b) != 1) b = 0;
        pclose(p);
    }
    return b;
}

int main(int argc, char **argv) {
    const char *dir = "bench-data";
    int layers = 6, runs = 5, latent = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--latent") && i + 1 < argc) latent = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cache [--dir DIR] [--layers N] [--runs N] [--latent N]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 50) runs = 5;
    char ckpt[1024], root[1024], cmd[2200];
    snprintf(ckpt, sizeof ckpt, "%s/sd3-medium-%dl", dir, layers);
    snprintf(root, sizeof root, "%s/cache", dir);
    /* SD3-medium block dimensions: 24 heads of 64, joint 4096, pooled 2048, patch 2, table 192 */
    kiln_config c = kiln_config_demo();
    c.num_layers = layers;
    c.attention_head_dim = 64;
    c.num_attention_heads = 24;
    c.caption_projection_dim = 1536;
    c.joint_attention_dim = 4096;
    c.pooled_projection_dim = 2048;
    c.in_channels = c.out_channels = 16;
    c.patch_size = 2;
    c.pos_embed_max_size = 192;
    c.sample_size = 128;
    c.qk_norm_rms = 0;
    c.dual_attention_mask = 0;
    struct stat st;
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s/config.json", ckpt);
    if (stat(cfg, &st) != 0) {
        fprintf(stderr, "writing a seeded %d-layer SD3-medium-shaped checkpoint (bf16) to %s ...\n", layers, ckpt);
        if (kiln_write_seeded_model(ckpt, &c, 1, KILN_BF16)) {
            fprintf(stderr, "%s\n", kiln_last_error());
            return 1;
        }
    }
    double ckpt_gb = (double)tree_bytes(ckpt) / 1e9;
    env e = {ckpt, root, latent};
    double conv[50], miss[50], hit[50], conv_first[50], hit_first[50], r[2];
    int bad = 0;
    for (int i = 0; i < runs && !bad; i++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd)) return 1;
        bad |= measure(&e, CONVERT, 0, r);
        conv[i] = r[0];
        bad |= measure(&e, MISS, 0, r);
        miss[i] = r[0];
        bad |= measure(&e, HIT, 0, r);
        hit[i] = r[0];
    }
    /* first output: forwards are long, fewer runs */
    int fr = runs < 3 ? runs : 3;
    for (int i = 0; i < fr && !bad; i++) {
        bad |= measure(&e, CONVERT, 1, r);
        conv_first[i] = r[1];
        bad |= measure(&e, HIT, 1, r);
        hit_first[i] = r[1];
    }
    if (bad) {
        fprintf(stderr, "a measurement failed\n");
        return 1;
    }
    double cache_gb = (double)tree_bytes(root) / 1e9;
    double mc = median(conv, runs), mm = median(miss, runs), mh = median(hit, runs);
    double fc = median(conv_first, fr), fh = median(hit_first, fr);
    printf("checkpoint: %s, %.2f GB bf16 (%d layers, SD3-medium blocks); cache %.2f GB (bf16 GEMM weights packed for oneDNN, the default); %d threads\n", ckpt,
           ckpt_gb, layers, cache_gb, kiln_get_threads());
    printf("| path (fresh process each) | median | vs miss |\n|---|---|---|\n");
    printf("| convert, no cache | %.1f ms | %.3fx |\n", mc * 1e3, mc / mm);
    printf("| miss: convert + publish | %.1f ms | 1x |\n", mm * 1e3);
    printf("| hit: map, ready to run | %.2f ms | %.4fx (%.2f%%) |\n", mh * 1e3, mh / mm, 100 * mh / mm);
    printf("| first output, converting | %.1f ms | |\n", fc * 1e3);
    printf("| first output, from a hit | %.1f ms | %.3fx of converting |\n", fh * 1e3, fh / fc);
    printf("(first output: latent %dx%d, 8 context tokens, batch 1, fast bf16 kernels; medians of %d and %d runs)\n",
           latent, latent, runs, fr);
    printf("targets: hit < 1%% of miss: %s; hit < 50 ms for >= 1 GB: %s\n", mh / mm < 0.01 ? "yes" : "NO",
           mh < 0.05 && ckpt_gb >= 1.0 ? "yes" : "NO");
    return 0;
}
