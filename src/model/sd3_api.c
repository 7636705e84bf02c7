/* sd3_api.c - the SD3 calls of the public API, thin wrappers over the
 * family-neutral model: kiln_forward (the four SD3 inputs by position) over
 * km_exec_run, kiln_model_config, the demo config and seeded SD3 folders. */
#include "arch/sd3/sd3.h"
#include "base/base.h"
#include "model/model.h"
#include "tensor/dtype.h"

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

kiln_status kiln_write_seeded_model(const char *dir, const kiln_config *cfg, uint64_t seed, kiln_dtype dtype) {
    return km_write_seeded(&ka_sd3, cfg, dir, seed, dtype);
}

const kiln_config *kiln_model_config(const kiln_model *m) { return m && m->arch == &ka_sd3 ? m->cfg : NULL; }

kiln_status km_forward(kiln_model *m, const kiln_forward_args *a, float *out) {
    const kiln_config *c = m->cfg;
    kiln_status st = sd3_check_latent(c, a->height, a->width);
    if (st) return kb_fail(st, "forward: %s", kiln_last_error()); /* as the chain says it */
    int64_t p = c->patch_size, s[SD3_NSYM] = {a->batch, a->height / p, a->width / p, a->context_len};
    const float *in[4] = {a->hidden, a->context, a->pooled, a->timestep};
    float *outs[1] = {out};
    return m->mesh ? km_exec_run_dist(m, s, in, outs) : km_exec_run(m, s, in, outs);
}

kiln_status km_forward_bytes(kiln_model *m, int64_t B, int64_t H, int64_t W, int64_t T, size_t *bytes) {
    const kiln_config *c = m->cfg;
    kiln_status st = sd3_check_latent(c, H, W);
    if (st) return st;
    int64_t p = c->patch_size, s[SD3_NSYM] = {B, H / p, W / p, T};
    return km_exec_arena_bytes(m, s, bytes);
}

/* n = a * b * c * d, or 0 on overflow (every factor is positive here) */
static int mul4(size_t a, size_t b, size_t c, size_t d, size_t *n) {
    return kb_mul_ok(a, b, n) && kb_mul_ok(*n, c, n) && kb_mul_ok(*n, d, n);
}

kiln_status km_check_sizes(const kiln_config *c, int64_t B, int64_t H, int64_t W, int64_t T, km_sizes *out) {
    if (B < 1 || B > KM_MAX_BATCH)
        return kb_fail(KILN_ERR_RANGE, "batch %lld: must be between 1 and %d", (long long)B, KM_MAX_BATCH);
    if (T < 1 || T > KM_MAX_CONTEXT)
        return kb_fail(KILN_ERR_RANGE, "context length %lld: must be between 1 and %d tokens", (long long)T,
                       KM_MAX_CONTEXT);
    kiln_status st = sd3_check_latent(c, H, W);
    if (st) return st;
    km_sizes z;
    size_t bytes;
    /* element counts and their bytes: B <= 2^10, C <= 2^12, H, W <= 2^18
     * (patch x pos_embed_max_size), so the counts may pass 2^53: check */
    if (!mul4((size_t)B, (size_t)c->in_channels, (size_t)H, (size_t)W, &z.hidden) ||
        !kb_mul_ok(z.hidden, sizeof(float), &bytes) ||
        !mul4((size_t)B, (size_t)c->out_channels, (size_t)H, (size_t)W, &z.out) ||
        !kb_mul_ok(z.out, sizeof(float), &bytes) ||
        !mul4((size_t)B, (size_t)T, (size_t)c->joint_attention_dim, 1, &z.context) ||
        !kb_mul_ok(z.context, sizeof(float), &bytes))
        return kb_fail(KILN_ERR_RANGE, "a forward of batch %lld, latent %lldx%lld, context %lld is too large "
                       "to address", (long long)B, (long long)H, (long long)W, (long long)T);
    z.pooled = (size_t)B * (size_t)c->pooled_projection_dim;
    z.timestep = (size_t)B;
    if (out) *out = z;
    return KILN_OK;
}

kiln_status kiln_forward(kiln_model *m, const kiln_forward_args *a, float *out) {
    if (!m || !a || !out || !a->hidden || !a->context || !a->pooled || !a->timestep)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_forward: model, inputs and output are required");
    if (m->arch != &ka_sd3)
        return kb_fail(KILN_ERR_UNSUPPORTED, "kiln_forward runs SD3 backbones; this is a %s model: use kiln_run", m->arch->name);
    /* NaN or Inf in, error out: one fast scan of each input (finite.c), far
     * under 1% of the forward. Sizes that fail their checks skip the scan:
     * the executors report those with the messages they always gave. */
    km_sizes z;
    kiln_status zs = km_check_sizes(m->cfg, a->batch, a->height, a->width, a->context_len, &z);
    if (zs && (a->batch > KM_MAX_BATCH || a->context_len > KM_MAX_CONTEXT)) return zs; /* limits of their own */
    int sized = zs == KILN_OK;
    kb_clear_error();
    if (sized) {
        const struct {
            const char *name;
            const float *x;
            size_t n;
        } in[4] = {{"kiln_forward: input hidden_states", a->hidden, z.hidden},
                   {"kiln_forward: input encoder_hidden_states", a->context, z.context},
                   {"kiln_forward: input pooled_projections", a->pooled, z.pooled},
                   {"kiln_forward: input timestep", a->timestep, z.timestep}};
        for (int i = 0; i < 4; i++) {
            kiln_status st = kt_check_finite(in[i].name, in[i].x, in[i].n);
            if (st) return st;
        }
    }
    kiln_status st = km_forward(m, a, out);
    if (st || !sized) return st;
    size_t bad = kt_find_nonfinite(out, z.out);
    if (bad < z.out)
        return kb_fail(KILN_ERR_NONFINITE, "forward (%s) gave a non-finite output sample (%s at index %zu)",
                       kiln_model_last_exec(m), kt_nonfinite_name(out[bad]), bad);
    return KILN_OK;
}
