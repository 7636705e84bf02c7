/* golden_util.h - read a golden case's io.safetensors tensors as f32. */
#ifndef KILN_GOLDEN_UTIL_H
#define KILN_GOLDEN_UTIL_H

#include "format/safetensors.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "tensor/dtype.h"
#include "test.h"

/* The cache folder prefix of a single-process model loaded with the
 * default dtype: bf16, or f32 on a CPU without a bf16 GEMM (the load
 * falls back) */
static inline const char *default_key_prefix(void) {
    km_compute cp;
    if (km_compute_resolve(KILN_DTYPE_INVALID, 0, NULL, &cp)) return "?";
    return cp.dtype == KILN_BF16 ? "mesh1x1_bf16_" : "mesh1x1_f32_";
}

/* Whether this CPU runs a quantization scheme, by kiln's own check
 * (km_compute_set_quant, on the dtype a default load computes in): int8
 * needs AVX-512 VNNI or AMX, fp8 a bf16 GEMM (the refusal is tested in
 * test_cli). Prints a skip line for `what` when it does not. */
static inline int quant_runs_here(kiln_quant q, const char *what) {
    km_compute cp;
    int ok = km_compute_resolve(KILN_DTYPE_INVALID, 0, NULL, &cp) == KILN_OK && km_compute_set_quant(&cp, q, NULL) == KILN_OK;
    if (!ok) fprintf(stderr, "  %s: %s does not run here (%s): skipped\n", what, kiln_quant_name(q), kiln_last_error());
    return ok;
}

/* A malloc'd f32 copy of tensor name (any float dtype), its element count in *n. */
static inline float *golden_tensor(const st_file *f, const char *name, size_t *n) {
    const st_tensor *t = st_find(f, name);
    if (!t) {
        fprintf(stderr, "golden tensor %s missing\n", name);
        exit(2);
    }
    size_t cnt = (size_t)st_numel(t);
    float *out = malloc(sizeof(float) * (cnt ? cnt : 1));
    if (!out || kt_to_f32(t->dtype, t->data, out, cnt) != KILN_OK) exit(2);
    if (n) *n = cnt;
    return out;
}

static inline const st_tensor *golden_info(const st_file *f, const char *name) {
    const st_tensor *t = st_find(f, name);
    if (!t) {
        fprintf(stderr, "golden tensor %s missing\n", name);
        exit(2);
    }
    return t;
}

static inline char *golden_path(const char *c, const char *file) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/goldens/%s%s%s", test_data_dir(), c, file ? "/" : "",
             file ? file : "");
    return buf[k];
}

/* Run a golden case's inputs through m; returns a malloc'd sample. */
static inline float *golden_forward(kiln_model *m, const char *golden, size_t *n) {
    st_file *io = NULL;
    if (st_open(golden_path(golden, "io.safetensors"), &io)) return NULL;
    const st_tensor *hs = golden_info(io, "hidden_states"), *ctx = golden_info(io, "encoder_hidden_states");
    float *h = golden_tensor(io, "hidden_states", NULL), *c = golden_tensor(io, "encoder_hidden_states", NULL);
    float *p = golden_tensor(io, "pooled_projections", NULL), *t = golden_tensor(io, "timestep", NULL);
    *n = (size_t)st_numel(golden_info(io, "sample"));
    float *out = calloc(*n, sizeof(float));
    kiln_forward_args a = {(int)hs->shape[0], (int)hs->shape[2], (int)hs->shape[3], (int)ctx->shape[1], h, c, p, t};
    kiln_status s = kiln_forward(m, &a, out);
    CHECK_MSG(s == KILN_OK, "forward: %s", kiln_last_error());
    free(h);
    free(c);
    free(p);
    free(t);
    st_close(io);
    return out;
}

#endif
