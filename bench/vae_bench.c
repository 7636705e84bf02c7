/* vae_bench.c - kiln's side of bench/vae_bench.sh: one VAE decode (a
 * "vae-decoder" through the weight cache) in this fresh process. Public API
 * only.
 *
 *   bench_vae --model DIR --latents FILE --cache-dir DIR --name NAME [--dtype bf16|f32]
 *             [--runs N] [--warmup N] [--tile auto|off|SIZE|on] [--memory BYTES] [--output FILE]
 *
 * FILE holds latents [B, C, h, w] (f32) in the VAE's space (decoded as they
 * are: no scaling or shift, diffusers' vae.decode(latents)). Prints one JSON
 * line: where the weights came from ("hit" / "miss"), the load's ms, the
 * first decode's ms (after --warmup untimed ones; 0 runs none), the median
 * of --runs decodes and the tiling (--tile: off by default; on: the
 * config's tile size; auto within --memory, kiln_vae_parse_memory's form). --output writes the last decode's
 * sample [B, 3, H, W] (f32, key "sample"). */
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

static int usage(void) {
    fprintf(stderr, "usage: bench_vae --model DIR --latents FILE --cache-dir DIR --name NAME [--dtype bf16|f32] "
                    "[--runs N] [--warmup N] [--tile auto|off|on|SIZE] [--memory BYTES] [--output FILE]\n");
    return 2;
}

static int fail(void) {
    fprintf(stderr, "bench_vae: %s\n", kiln_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *model = NULL, *latents = NULL, *cache = NULL, *name = NULL, *dt = "bf16", *tile = "off",
               *output = NULL, *memory = NULL;
    int runs = 1, warmup = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--latents")) latents = argv[i + 1];
        else if (!strcmp(argv[i], "--cache-dir")) cache = argv[i + 1];
        else if (!strcmp(argv[i], "--name")) name = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dt = argv[i + 1];
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tile")) tile = argv[i + 1];
        else if (!strcmp(argv[i], "--output")) output = argv[i + 1];
        else if (!strcmp(argv[i], "--memory")) memory = argv[i + 1];
        else return usage();
    }
    if (!model || !latents || !cache || !name || runs < 1 || runs > 1000 || warmup < 0 ||
        (strcmp(dt, "bf16") && strcmp(dt, "f32")))
        return usage();
    kiln_vae_opts o = kiln_vae_defaults();
    o.no_scale = 1;
    if (!strcmp(tile, "on")) o.tile = KILN_VAE_TILE_ON; /* the config's tile size */
    else if (kiln_vae_parse_tile(tile, &o)) return fail();
    if (memory && kiln_vae_parse_memory(memory, &o)) return fail();

    kiln_tensor *file = NULL;
    size_t nf = 0;
    if (kiln_tensors_read(latents, &file, &nf)) return fail();
    const kiln_tensor *z = kiln_tensors_find(file, nf, "latents");
    if (!z || z->ndim != 4 || z->dtype != KILN_F32) {
        fprintf(stderr, "bench_vae: %s: no latents [B, C, h, w] in f32\n", latents);
        return 1;
    }
    kiln_load_opts lo = kiln_load_defaults();
    lo.model_name = name;
    lo.cache_root = cache;
    lo.dtype = strcmp(dt, "f32") ? KILN_BF16 : KILN_F32;
    kiln_model *vae;
    double t0 = now();
    if (kiln_vae_open(model, &lo, "vae-decoder", &vae)) return fail();
    double load_ms = (now() - t0) * 1e3;
    kiln_vae_plan plan;
    if (kiln_vae_plan_for(vae, z->shape, &o, &plan)) return fail();
    /* the sample's shape: a shapes-only run of the decoder on its input "latent" */
    kiln_tensor in = *z;
    in.name = "latent";
    kiln_output so = {.name = "sample"};
    if (kiln_run(vae, &in, 1, &so, 1)) return fail();
    size_t n = (size_t)(so.shape[0] * so.shape[1] * so.shape[2] * so.shape[3]);
    float *sample = malloc(sizeof(float) * n);
    double *ms = malloc(sizeof(double) * (size_t)runs);
    if (!sample || !ms) return 1;
    for (int k = 0; k < warmup; k++)
        if (kiln_vae_decode(vae, z->data, z->shape, &o, sample, &plan)) return fail();
    for (int k = 0; k < runs; k++) {
        double t1 = now();
        if (kiln_vae_decode(vae, z->data, z->shape, &o, sample, &plan)) return fail();
        ms[k] = (now() - t1) * 1e3;
    }
    double first = ms[0];
    qsort(ms, (size_t)runs, sizeof(double), cmp);
    double med = runs % 2 ? ms[runs / 2] : 0.5 * (ms[runs / 2 - 1] + ms[runs / 2]);
    if (output) {
        kiln_tensor t = {.name = "sample", .dtype = KILN_F32, .ndim = 4, .data = sample};
        memcpy(t.shape, so.shape, sizeof(int64_t) * 4);
        if (kiln_tensors_write(output, 1, &t)) return fail();
    }
    printf("{\"origin\": \"%s\", \"load_ms\": %.3f, \"first_ms\": %.3f, \"median_ms\": %.3f, \"runs\": %d, "
           "\"tiled\": %d, \"tiles\": %d, \"tile_size\": %d, \"exec\": \"%s\", \"kernels\": \"%s\"}\n",
           kiln_model_origin(vae), load_ms, first, med, runs, plan.tiled, plan.tiles, plan.tile_size,
           kiln_model_last_exec(vae), kiln_kernels(lo.dtype));
    kiln_model_free(vae);
    free(sample);
    free(ms);
    kiln_tensors_free(file);
    return 0;
}
