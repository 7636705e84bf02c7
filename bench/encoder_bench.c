/* encoder_bench.c - kiln's side of bench/encoder_bench.sh: one text encoder
 * (any family kiln_load_model finds by config.json: T5, CLIP) through the
 * weight cache, in this fresh process. Public API only.
 *
 *   bench_encoder --model DIR --inputs FILE --cache-dir DIR --name NAME
 *                 [--component C] [--dtype bf16|f32] [--runs N] [--timings]
 *
 * FILE holds input_ids [B, T] (integers as values). Prints one JSON line:
 * where the weights came from ("hit" / "miss"), the load's ms (a hit: map
 * the cache, ready to run), the first encode's ms in this process (cold:
 * first touch of the mapped weights, plans, scratch), and the median of
 * --runs encodes after it (warm), each also as the process's CPU time (all
 * threads: on a shared host the wall clock counts other tenants' slices
 * too). Only last_hidden_state is asked for, as transformers' forward
 * returns it. --timings: the timing ledger (kiln_timings_print) of the
 * first encode and of the second, on stderr: what only the first pays. */
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

/* CPU time of the whole process (every thread): on a shared host the wall
 * clock also counts the time other processes held the CPUs */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_encoder --model DIR --inputs FILE --cache-dir DIR --name NAME [--component C] "
                    "[--dtype bf16|f32] [--runs N] [--timings]\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *model = NULL, *inputs = NULL, *cache = NULL, *name = NULL, *component = "text_encoder", *dt = "bf16";
    int runs = 3, timings = 0;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--timings")) {
            timings = 1;
            i--;
            continue;
        }
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--inputs")) inputs = argv[i + 1];
        else if (!strcmp(argv[i], "--cache-dir")) cache = argv[i + 1];
        else if (!strcmp(argv[i], "--name")) name = argv[i + 1];
        else if (!strcmp(argv[i], "--component")) component = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dt = argv[i + 1];
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
        else return usage();
    }
    if (!model || !inputs || !cache || !name || runs < 1 || runs > 1000 || (strcmp(dt, "bf16") && strcmp(dt, "f32")))
        return usage();
    kiln_tensor *file = NULL;
    size_t nf = 0;
    if (kiln_tensors_read(inputs, &file, &nf)) {
        fprintf(stderr, "bench_encoder: %s\n", kiln_last_error());
        return 1;
    }
    const kiln_tensor *ids = kiln_tensors_find(file, nf, "input_ids");
    if (!ids || ids->ndim != 2 || ids->dtype != KILN_I64) {
        fprintf(stderr, "bench_encoder: %s: no input_ids [B, T] of integers\n", inputs);
        return 1;
    }
    size_t n = (size_t)(ids->shape[0] * ids->shape[1]);
    float *fid = malloc(sizeof(float) * n);
    if (!fid) return 1;
    for (size_t i = 0; i < n; i++) fid[i] = (float)((const int64_t *)ids->data)[i]; /* token ids enter as values */
    kiln_tensor in = *ids;
    in.dtype = KILN_F32;
    in.data = fid;

    kiln_load_opts lo = kiln_load_defaults();
    lo.model_name = name;
    lo.component = component;
    lo.source = model;
    lo.cache_root = cache;
    lo.dtype = strcmp(dt, "f32") ? KILN_BF16 : KILN_F32;
    kiln_model *m;
    double t0 = now();
    if (kiln_load_model(&lo, &m)) {
        fprintf(stderr, "bench_encoder: %s\n", kiln_last_error());
        return 1;
    }
    double load_ms = (now() - t0) * 1e3;
    kiln_output out = {.name = "last_hidden_state"};
    if (kiln_run(m, &in, 1, &out, 1)) { /* the shape only */
        fprintf(stderr, "bench_encoder: %s\n", kiln_last_error());
        return 1;
    }
    size_t no = 1;
    for (int d = 0; d < out.ndim; d++) no *= (size_t)out.shape[d];
    out.data = malloc(sizeof(float) * no);
    out.capacity = no;
    double *ms = malloc(sizeof(double) * (size_t)(runs + 1)), *cpu = malloc(sizeof(double) * (size_t)(runs + 1));
    if (!out.data || !ms || !cpu) return 1;
    for (int k = 0; k <= runs; k++) {
        double t1 = now(), c1 = cpu_now();
        if (kiln_run(m, &in, 1, &out, 1)) {
            fprintf(stderr, "bench_encoder: %s\n", kiln_last_error());
            return 1;
        }
        ms[k] = (now() - t1) * 1e3;
        cpu[k] = (cpu_now() - c1) * 1e3;
        if (timings && k < 2) { /* the ledger of the first call, then of one warm call */
            fprintf(stderr, "-- call %d: %.1f ms\n", k, ms[k]);
            kiln_timings_print(stderr);
            kiln_timings_reset();
        }
    }
    double first = ms[0], first_cpu = cpu[0];
    qsort(ms + 1, (size_t)runs, sizeof(double), cmp);
    qsort(cpu + 1, (size_t)runs, sizeof(double), cmp);
    double med = runs % 2 ? ms[1 + runs / 2] : 0.5 * (ms[runs / 2] + ms[1 + runs / 2]);
    double med_cpu = runs % 2 ? cpu[1 + runs / 2] : 0.5 * (cpu[runs / 2] + cpu[1 + runs / 2]);
    printf("{\"origin\": \"%s\", \"load_ms\": %.3f, \"first_ms\": %.3f, \"median_ms\": %.3f, "
           "\"first_cpu_ms\": %.3f, \"median_cpu_ms\": %.3f, \"runs\": %d, \"exec\": \"%s\", \"kernels\": \"%s\"}\n",
           kiln_model_origin(m), load_ms, first, med, first_cpu, med_cpu, runs, kiln_model_last_exec(m),
           kiln_kernels(lo.dtype));
    kiln_model_free(m);
    free(out.data);
    free(ms);
    free(cpu);
    free(fid);
    kiln_tensors_free(file);
    return 0;
}
