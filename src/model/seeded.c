/* seeded.c - models made from a seed: test or benchmark checkpoints of any
 * family and shape (the demo's embedded default among them), written as
 * diffusers folders. */
#include "base/base.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* what the stream writer needs to make tensor i's values */
typedef struct seeded {
    const ka_arch *a;
    const void *cfg;
    const ka_spec *spec;
    uint64_t seed;
    kiln_dtype dtype;
} seeded;

/* tensor i of the spec, seeded, into buf in the dtype: N(0, 1/fan_in)
 * weights, biases 0.02 wide, norm scales about 1 (or the family's own
 * values: a position table) */
static kiln_status seeded_fill(void *user, size_t i, void *buf) {
    const seeded *sd = user;
    const ka_spec *t = &sd->spec[i];
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    float *v = kb_malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!v) return kb_fail(KILN_ERR_NOMEM, "out of memory for %s", t->name);
    const char *name = t->name;
    size_t len = strlen(name);
    if (!sd->a->seed_tensor || !sd->a->seed_tensor(sd->cfg, name, v, (size_t)n)) {
        kiln_noise(sd->seed ^ fnv1a(name), v, (size_t)n);
        int is_bias = len > 5 && !strcmp(name + len - 5, ".bias");
        int is_norm = strstr(name, ".norm_") && !strstr(name, "linear");
        /* weights ~ N(0, 1/fan_in) keep activations O(1) through the layers */
        double fan_in = 1;
        for (int d = 1; d < t->ndim; d++) fan_in *= (double)t->shape[d];
        double sdv = is_bias ? 0.02 : is_norm ? 0.1 : 1.0 / sqrt(fan_in);
        for (int64_t k = 0; k < n; k++) v[k] = (float)((is_norm ? 1.0 : 0.0) + sdv * v[k]);
    }
    kt_from_f32(sd->dtype, v, buf, (size_t)n);
    free(v);
    return KILN_OK;
}

kiln_status km_write_seeded(const ka_arch *a, const void *cfg, const char *dir, uint64_t seed, kiln_dtype dtype) {
    if (!a || !dir || !cfg) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_write_seeded_model: dir and cfg are required");
    if (!kt_dtype_is_float_source(dtype))
        return kb_fail(KILN_ERR_DTYPE, "seeded weights can be F32, F16 or BF16, not %s", kiln_dtype_name(dtype));
    kiln_status st = a->config_validate(cfg);
    if (st) return st;
    ka_spec *spec = NULL;
    size_t ns = 0;
    if ((st = a->weight_spec(cfg, &spec, &ns))) return st;
    st_tensor *t = kb_calloc(ns ? ns : 1, sizeof *t);
    char *cfg_json = NULL, *path = NULL, *cfg_path = NULL;
    if (!t) {
        st = KILN_ERR_NOMEM;
        goto done;
    }
    /* the header from the spec; each tensor's values made as the file is
     * written (st_write_stream), so a model larger than the memory is
     * written in one tensor's */
    size_t esz = kiln_dtype_size(dtype);
    for (size_t i = 0; i < ns; i++) {
        int64_t n = 1;
        for (int d = 0; d < spec[i].ndim; d++) n *= spec[i].shape[d];
        t[i].name = spec[i].name;
        t[i].dtype = dtype;
        t[i].ndim = spec[i].ndim;
        memcpy(t[i].shape, spec[i].shape, sizeof spec[i].shape);
        t[i].nbytes = esz * (size_t)n;
    }
    if ((st = kb_mkdir_p(dir))) goto done;
    path = kb_path_join(dir, a->weights_file ? a->weights_file : "diffusion_pytorch_model.safetensors");
    cfg_path = kb_path_join(dir, "config.json");
    cfg_json = a->config_to_json(cfg);
    if (!path || !cfg_path || !cfg_json) {
        st = kb_fail(KILN_ERR_NOMEM, "out of memory");
        goto done;
    }
    const char *meta[] = {"format", "pt"};
    seeded sd = {a, cfg, spec, seed, dtype};
    if ((st = st_write_stream(path, t, ns, meta, 1, seeded_fill, &sd))) goto done;
    st = kb_write_file_atomic(cfg_path, cfg_json, strlen(cfg_json));
done:
    free(t);
    free(spec);
    free(cfg_json);
    free(path);
    free(cfg_path);
    return st;
}

kiln_status kiln_write_seeded_model_json(const char *dir, const char *config_json, uint64_t seed, kiln_dtype dtype,
                                         const char **family) {
    if (family) *family = NULL;
    if (!dir || !config_json) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_write_seeded_model_json: dir and config are required");
    const ka_arch *a = NULL;
    void *cfg = NULL;
    kiln_status st = km_config_parse(config_json, NULL, &a, &cfg); /* the family that claims it */
    if (!st) st = km_write_seeded(a, cfg, dir, seed, dtype);
    if (!st && family) *family = a->name;
    free(cfg);
    return st;
}

const char *kiln_config_family(const char *config_json) {
    const ka_arch *a = config_json ? ka_for_config(config_json) : NULL;
    return a ? a->name : NULL;
}

kiln_status kiln_write_example_inputs(const char *config_json, const char *path, int batch, int height, int width,
                                      int context_len) {
    if (!config_json || !path) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_write_example_inputs: config and path are required");
    const ka_arch *a = NULL;
    void *cfg = NULL;
    kiln_status st = km_config_parse(config_json, NULL, &a, &cfg);
    if (st) return st;
    int64_t s[KA_MAX_SYMS] = {0}, in[KA_MAX_IO][4], out[KA_MAX_OUT][4];
    a->example(cfg, s);
    if (batch > 0) s[0] = batch; /* symbol 0 is every family's batch */
    kiln_compile_opts o = kiln_compile_defaults();
    o.height = height, o.width = width, o.context_len = context_len;
    if (a->example_opts) st = a->example_opts(cfg, &o, s);
    else if (height || width || context_len)
        st = kb_fail(KILN_ERR_INVALID_ARG, "%s models take no latent size or context length", a->name);
    if (!st) st = a->check(cfg, s);
    if (st) st = kb_wrap(st, "the inputs of a %s model", a->name);
    st_tensor t[KA_MAX_IO];
    memset(t, 0, sizeof t);
    if (!st) {
        memset(in, 0, sizeof in);
        a->io_shapes(cfg, s, in, out);
        for (int k = 0; k < a->n_in && !st; k++) {
            size_t n = ka_numel(a->in[k].ndim, in[k]);
            float *x = malloc(sizeof(float) * (n ? n : 1));
            if (!x) {
                st = kb_fail(KILN_ERR_NOMEM, "out of memory for input %s", a->in[k].name);
                break;
            }
            a->example_input(cfg, k, x, n);
            t[k] = (st_tensor){.name = a->in[k].name, .dtype = KILN_F32, .ndim = a->in[k].ndim, .data = x,
                               .nbytes = n * sizeof(float)};
            memcpy(t[k].shape, in[k], sizeof in[k]);
        }
    }
    if (!st) st = st_write(path, t, (size_t)a->n_in, NULL, 0);
    for (int k = 0; k < a->n_in; k++) free((void *)t[k].data);
    free(cfg);
    return st;
}
