/* sd3_arch.c - the SD3 family's architecture table: its config, weights,
 * original names, named inputs and outputs with their symbolic dimensions
 * (batch, h_tok, w_tok: the latent's patch grid, ctx_len: context tokens),
 * and the graph builder (sd3_forward.c). */
#include "arch/sd3/sd3.h"
#include "base/base.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

/* SD3Transformer2DModel; a config without _class_name (and without
 * transformers' "architectures" or "model_type") is taken as SD3's, as it
 * always was */
static int claims(const char *json) {
    cJSON *root = cJSON_Parse(json);
    int yes = 0;
    if (cJSON_IsObject(root)) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
        yes = cls ? cJSON_IsString(cls) && !strcmp(cls->valuestring, "SD3Transformer2DModel")
                  : !cJSON_GetObjectItemCaseSensitive(root, "architectures") &&
                        !cJSON_GetObjectItemCaseSensitive(root, "model_type");
    }
    cJSON_Delete(root);
    return yes;
}

static kiln_status parse(const char *json, void *cfg) { return sd3_config_parse(json, cfg); }
static kiln_status validate(const void *cfg) { return sd3_config_validate(cfg); }
static char *to_json(const void *cfg) { return sd3_config_to_json(cfg); }
static kiln_status infer(const kc_checkpoint *c, void *cfg) { return sd3_config_infer(c, cfg); }
static kiln_status spec(const void *cfg, ka_spec **out, size_t *n) { return sd3_weight_spec(cfg, out, n); }

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

static int seed_tensor(const void *cfg, const char *name, float *v, size_t n) {
    const kiln_config *c = cfg;
    if (strcmp(name, "pos_embed.pos_embed")) return 0;
    int64_t M = c->pos_embed_max_size;
    sincos_table(v, M, (int64_t)(n / (size_t)(M * M)), (double)c->sample_size / c->patch_size);
    return 1;
}

static void io_shapes(const void *cfg, const int64_t *s, int64_t in[][4], int64_t out[][4]) {
    const kiln_config *c = cfg;
    int64_t p = c->patch_size, B = s[SD3_SYM_BATCH], H = p * s[SD3_SYM_H], W = p * s[SD3_SYM_W];
    int64_t v[5][4] = {{B, c->in_channels, H, W}, {B, s[SD3_SYM_CTX], c->joint_attention_dim}, {B, c->pooled_projection_dim},
                       {B}, {B, c->out_channels, H, W}};
    for (int i = 0; i < 4; i++) memcpy(in[i], v[i], sizeof v[i]);
    memcpy(out[0], v[4], sizeof v[4]);
}

static kiln_status check(const void *cfg, const int64_t *s) {
    const kiln_config *c = cfg;
    int64_t p = c->patch_size;
    kiln_status st = sd3_check_latent(c, p * s[SD3_SYM_H], p * s[SD3_SYM_W]);
    if (st) return st;
    if (s[SD3_SYM_BATCH] <= 0 || s[SD3_SYM_CTX] <= 0)
        return kb_fail(KILN_ERR_SHAPE, "batch (%lld) and context length (%lld) must be positive",
                       (long long)s[SD3_SYM_BATCH], (long long)s[SD3_SYM_CTX]);
    return KILN_OK;
}

static kiln_status solve(const void *cfg, const int64_t (*in)[4], int64_t *s) {
    const kiln_config *c = cfg;
    int64_t p = c->patch_size;
    kiln_status st = sd3_check_latent(c, in[0][2], in[0][3]);
    if (st) return st;
    s[SD3_SYM_BATCH] = in[0][0];
    s[SD3_SYM_H] = in[0][2] / p;
    s[SD3_SYM_W] = in[0][3] / p;
    s[SD3_SYM_CTX] = in[1][1];
    return check(cfg, s);
}

/* batch 2 (CFG), a 64x64 latent (or the largest the position table allows),
 * 333 context tokens (CLIP 77 + T5 256) */
static void example(const void *cfg, int64_t *s) {
    const kiln_config *c = cfg;
    int64_t p = c->patch_size, side = 64 < p * c->pos_embed_max_size ? 64 : p * c->pos_embed_max_size;
    s[SD3_SYM_BATCH] = 2;
    s[SD3_SYM_H] = s[SD3_SYM_W] = side / p;
    s[SD3_SYM_CTX] = 333;
}

/* kiln_compile_opts' latent height and width, context length */
static kiln_status example_opts(const void *cfg, const kiln_compile_opts *o, int64_t *s) {
    const kiln_config *c = cfg;
    int64_t p = c->patch_size, H = o->height ? o->height : p * s[SD3_SYM_H], W = o->width ? o->width : p * s[SD3_SYM_W];
    kiln_status st = sd3_check_latent(c, H, W);
    if (st) return st;
    s[SD3_SYM_H] = H / p;
    s[SD3_SYM_W] = W / p;
    if (o->context_len) s[SD3_SYM_CTX] = o->context_len;
    return KILN_OK;
}

/* kiln's normal noise, and timestep 500 for every row */
static void example_input(const void *cfg, int k, float *x, size_t n) {
    (void)cfg;
    if (k < 3) kiln_noise(0x5eed + (uint64_t)k, x, n);
    else
        for (size_t i = 0; i < n; i++) x[i] = 500.0f;
}

static kiln_status check_parallel(const void *cfg, int tp, int sp) { return sd3_check_parallel(cfg, tp, sp); }

static kiln_status build(const void *cfg, kg_graph *g, const int64_t *s, const ka_par *par) {
    const kiln_config *c = cfg;
    int64_t p = c->patch_size;
    return sd3_build_forward_par(c, g, s[SD3_SYM_BATCH], p * s[SD3_SYM_H], p * s[SD3_SYM_W], s[SD3_SYM_CTX], par);
}

const ka_arch ka_sd3 = {
    .name = "sd3",
    .title = "SD3 / SD3.5 MMDiT, diffusers SD3Transformer2DModel",
    .component = "transformer",
    .config_size = sizeof(kiln_config),
    .claims = claims,
    .config_parse = parse,
    .config_validate = validate,
    .config_to_json = to_json,
    .config_infer = infer,
    .weight_spec = spec,
    .renamer = &sd3_renamer,
    /* every linear of the transformer blocks except the modulations
     * (norm1*.linear); embedders, norm_out and proj_out stay bf16 */
    .quant_layers = "transformer_blocks.*,!*.norm1.linear,!*.norm1_context.linear",
    .seed_tensor = seed_tensor,
    .nsym = SD3_NSYM,
    .sym = {"batch", "h_tok", "w_tok", "ctx_len"},
    .sym_doc = {"batch rows (2 with classifier-free guidance)", "latent height / patch size", "latent width / patch size",
                "context (prompt) tokens"},
    .n_in = 4,
    .n_out = 1,
    .in = {{"hidden_states", 4}, {"encoder_hidden_states", 3}, {"pooled_projections", 2}, {"timestep", 1}},
    .out = {{"sample", 4}},
    .io_shapes = io_shapes,
    .solve = solve,
    .check = check,
    .example = example,
    .example_opts = example_opts,
    .example_input = example_input,
    .check_parallel = check_parallel,
    .build = build,
};
