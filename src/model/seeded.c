/* seeded.c - models made from a seed: the demo's embedded default and test
 * or benchmark checkpoints of any SD3 shape, written as diffusers folders. */
#include "base/base.h"
#include "format/safetensors.h"
#include "model/sd3.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kiln_config kiln_config_demo(void) {
    kiln_config c = sd3_config_defaults();
    c.sample_size = 32;
    c.patch_size = 2;
    c.in_channels = c.out_channels = 16;
    c.num_layers = 3;
    c.attention_head_dim = 16;
    c.num_attention_heads = 4;
    c.caption_projection_dim = 64;
    c.joint_attention_dim = 64;
    c.pooled_projection_dim = 64;
    c.pos_embed_max_size = 48;
    c.qk_norm_rms = 1;
    c.dual_attention_mask = 1; /* block 0, as SD3.5-medium's first blocks */
    return c;
}

/* diffusers' get_2d_sincos_pos_embed(D, grid M, base_size, interpolation 1):
 * the first D/2 features encode the column, the last D/2 the row; each half
 * is sin(pos w_i) then cos(pos w_i) with w_i = 10000^(-i/(D/4)). */
static void sincos_table(float *out, int64_t M, int64_t D, double base) {
    int64_t quarter = D / 4;
    for (int64_t r = 0; r < M; r++)
        for (int64_t c = 0; c < M; c++) {
            float *e = out + (r * M + c) * D;
            double pos[2] = {(double)c * base / (double)M, (double)r * base / (double)M};
            for (int h = 0; h < 2; h++)
                for (int64_t i = 0; i < quarter; i++) {
                    double w = pow(10000.0, -(double)i / (double)quarter);
                    e[h * 2 * quarter + i] = (float)sin(pos[h] * w);
                    e[h * 2 * quarter + quarter + i] = (float)cos(pos[h] * w);
                }
        }
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

kiln_status kiln_write_seeded_model(const char *dir, const kiln_config *cfg, uint64_t seed,
                                    kiln_dtype dtype) {
    if (!dir || !cfg) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_write_seeded_model: dir and cfg are required");
    if (!kt_dtype_is_float_source(dtype))
        return kb_fail(KILN_ERR_DTYPE, "seeded weights can be F32, F16 or BF16, not %s", kiln_dtype_name(dtype));
    kiln_status st = sd3_config_validate(cfg);
    if (st) return st;
    sd3_spec *spec = NULL;
    size_t ns = 0;
    if ((st = sd3_weight_spec(cfg, &spec, &ns))) return st;
    st_tensor *t = kb_calloc(ns, sizeof *t);
    char *cfg_json = NULL, *path = NULL, *cfg_path = NULL;
    if (!t) {
        st = KILN_ERR_NOMEM;
        goto done;
    }
    size_t esz = kiln_dtype_size(dtype);
    for (size_t i = 0; i < ns && !st; i++) {
        int64_t n = 1;
        for (int d = 0; d < spec[i].ndim; d++) n *= spec[i].shape[d];
        float *v = kb_malloc(sizeof(float) * (size_t)(n ? n : 1));
        void *out = kb_malloc(esz * (size_t)(n ? n : 1));
        if (!v || !out) {
            free(v);
            free(out);
            st = KILN_ERR_NOMEM;
            break;
        }
        const char *name = spec[i].name;
        size_t len = strlen(name);
        if (!strcmp(name, "pos_embed.pos_embed")) {
            sincos_table(v, cfg->pos_embed_max_size, spec[i].shape[2],
                         (double)cfg->sample_size / cfg->patch_size);
        } else {
            kiln_noise(seed ^ fnv1a(name), v, (size_t)n);
            int is_bias = len > 5 && !strcmp(name + len - 5, ".bias");
            int is_norm = strstr(name, ".norm_") && !strstr(name, "linear");
            /* weights ~ N(0, 1/fan_in) keep activations O(1) through the layers */
            double fan_in = 1;
            for (int d = 1; d < spec[i].ndim; d++) fan_in *= (double)spec[i].shape[d];
            double sd = is_bias ? 0.02 : is_norm ? 0.1 : 1.0 / sqrt(fan_in);
            for (int64_t k = 0; k < n; k++) v[k] = (float)((is_norm ? 1.0 : 0.0) + sd * v[k]);
        }
        kt_from_f32(dtype, v, out, (size_t)n);
        free(v);
        t[i].name = name;
        t[i].dtype = dtype;
        t[i].ndim = spec[i].ndim;
        memcpy(t[i].shape, spec[i].shape, sizeof spec[i].shape);
        t[i].data = out;
        t[i].nbytes = esz * (size_t)n;
    }
    if (st) goto done;
    if ((st = kb_mkdir_p(dir))) goto done;
    path = kb_path_join(dir, "diffusion_pytorch_model.safetensors");
    cfg_path = kb_path_join(dir, "config.json");
    cfg_json = sd3_config_to_json(cfg);
    if (!path || !cfg_path || !cfg_json) {
        st = kb_fail(KILN_ERR_NOMEM, "out of memory");
        goto done;
    }
    const char *meta[] = {"format", "pt"};
    if ((st = st_write(path, t, ns, meta, 1))) goto done;
    st = kb_write_file_atomic(cfg_path, cfg_json, strlen(cfg_json));
done:
    if (t)
        for (size_t i = 0; i < ns; i++) free((void *)t[i].data);
    free(t);
    free(spec);
    free(cfg_json);
    free(path);
    free(cfg_path);
    return st;
}
