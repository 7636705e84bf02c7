/* flux_arch.c - the Flux.1 families' architecture tables: "flux" (with the
 * guidance embedding: Flux.1-dev) and "flux-schnell" (without), their
 * config, weights, named inputs and outputs with their symbols (batch,
 * h_tok, w_tok: the latent's 2x2 patch grid, ctx_len: text tokens), and the
 * graph builder (flux_forward.c). */
#include "arch/flux/flux.h"
#include "base/base.h"

#include <cjson/cJSON.h>
#include <string.h>

/* FluxTransformer2DModel, with (guided 1) or without (0) guidance_embeds */
static int claims_as(const char *json, int guided) {
    cJSON *root = cJSON_Parse(json);
    int yes = 0;
    if (cJSON_IsObject(root)) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
        const cJSON *ge = cJSON_GetObjectItemCaseSensitive(root, "guidance_embeds");
        yes = cJSON_IsString(cls) && !strcmp(cls->valuestring, "FluxTransformer2DModel") && cJSON_IsTrue(ge) == guided;
    }
    cJSON_Delete(root);
    return yes;
}
static int claims_dev(const char *json) { return claims_as(json, 1); }
static int claims_schnell(const char *json) { return claims_as(json, 0); }

static kiln_status parse_as(const char *json, flux_config *c, int guided) {
    kiln_status st = flux_config_parse(json, c);
    if (!st && c->guidance_embeds != guided)
        return kb_fail(KILN_ERR_CONFIG, "config guidance_embeds = %s: that is the %s family's, not this one's",
                       guided ? "false" : "true", guided ? "flux-schnell" : "flux");
    return st;
}
static kiln_status parse_dev(const char *json, void *cfg) { return parse_as(json, cfg, 1); }
static kiln_status parse_schnell(const char *json, void *cfg) { return parse_as(json, cfg, 0); }
static kiln_status validate(const void *cfg) { return flux_config_validate(cfg); }
static kiln_status infer_dev(const kc_checkpoint *c, void *cfg) { return flux_config_infer(c, cfg, 1); }
static kiln_status infer_schnell(const kc_checkpoint *c, void *cfg) { return flux_config_infer(c, cfg, 0); }
static char *to_json(const void *cfg) { return flux_config_to_json(cfg); }
static kiln_status spec(const void *cfg, ka_spec **out, size_t *n) { return flux_weight_spec(cfg, out, n); }

static void io_shapes(const void *cfg, const int64_t *s, int64_t in[][4], int64_t out[][4]) {
    const flux_config *c = cfg;
    int64_t B = s[FLUX_SYM_BATCH], C = c->in_channels / 4, H = 2 * s[FLUX_SYM_H], W = 2 * s[FLUX_SYM_W];
    int64_t v[6][4] = {{B, C, H, W}, {B, s[FLUX_SYM_CTX], c->joint_attention_dim}, {B, c->pooled_projection_dim},
                       {B}, {B}, {B, c->out_channels / 4, H, W}};
    for (int i = 0; i < 4 + c->guidance_embeds; i++) memcpy(in[i], v[i], sizeof v[i]);
    memcpy(out[0], v[5], sizeof v[5]);
}

static kiln_status check(const void *cfg, const int64_t *s) {
    kiln_status st = flux_check_latent(cfg, 2 * s[FLUX_SYM_H], 2 * s[FLUX_SYM_W]);
    if (st) return st;
    if (s[FLUX_SYM_BATCH] <= 0 || s[FLUX_SYM_CTX] <= 0 || s[FLUX_SYM_CTX] > FLUX_MAX_TOKENS)
        return kb_fail(KILN_ERR_SHAPE, "flux: batch (%lld) and context length (%lld) must be positive (context at most %d)",
                       (long long)s[FLUX_SYM_BATCH], (long long)s[FLUX_SYM_CTX], FLUX_MAX_TOKENS);
    return KILN_OK;
}

static kiln_status solve(const void *cfg, const int64_t (*in)[4], int64_t *s) {
    kiln_status st = flux_check_latent(cfg, in[0][2], in[0][3]);
    if (st) return st;
    s[FLUX_SYM_BATCH] = in[0][0];
    s[FLUX_SYM_H] = in[0][2] / 2;
    s[FLUX_SYM_W] = in[0][3] / 2;
    s[FLUX_SYM_CTX] = in[1][1];
    return check(cfg, s);
}

/* one image of 512x512 (a 64x64 latent) and the T5 tokens of schnell's
 * max_sequence_length (256) */
static void example(const void *cfg, int64_t *s) {
    (void)cfg;
    s[FLUX_SYM_BATCH] = 1;
    s[FLUX_SYM_H] = s[FLUX_SYM_W] = 32;
    s[FLUX_SYM_CTX] = 256;
}

static kiln_status example_opts(const void *cfg, const kiln_compile_opts *o, int64_t *s) {
    int64_t H = o->height ? o->height : 2 * s[FLUX_SYM_H], W = o->width ? o->width : 2 * s[FLUX_SYM_W];
    kiln_status st = flux_check_latent(cfg, H, W);
    if (st) return st;
    s[FLUX_SYM_H] = H / 2;
    s[FLUX_SYM_W] = W / 2;
    if (o->context_len) s[FLUX_SYM_CTX] = o->context_len;
    return KILN_OK;
}

/* kiln's normal noise; timestep 0.5 and guidance 3.5 for every row */
static void example_input(const void *cfg, int k, float *x, size_t n) {
    (void)cfg;
    if (k < 3) kiln_noise(0x5eed + (uint64_t)k, x, n);
    else
        for (size_t i = 0; i < n; i++) x[i] = k == 3 ? 0.5f : 3.5f;
}

static kiln_status check_parallel(const void *cfg, int tp, int sp) { return flux_check_parallel(cfg, tp, sp); }

static kiln_status build(const void *cfg, kg_graph *g, const int64_t *s, const ka_par *par) {
    return flux_build_forward(cfg, g, s, par);
}

#define FLUX_TABLE(NAME, TITLE, CLAIMS, PARSE, INFER, NIN)                                                                    \
    {                                                                                                                  \
        .name = NAME, .title = TITLE, .component = "transformer", .config_size = sizeof(flux_config),                 \
        .claims = CLAIMS, .config_parse = PARSE, .config_validate = validate, .config_to_json = to_json,              \
        .weight_spec = spec, .config_infer = INFER, .renamer = &flux_renamer,                                          \
        /* the blocks' linears but their modulations; embedders, norm_out and proj_out stay bf16 */                   \
        .quant_layers = "transformer_blocks.*,single_transformer_blocks.*,!*.norm1.linear,!*.norm1_context.linear,"    \
                        "!*.norm.linear",                                                                              \
        .nsym = FLUX_NSYM, .sym = {"batch", "h_tok", "w_tok", "ctx_len"},                                              \
        .sym_doc = {"batch rows", "latent height / 2", "latent width / 2", "context (T5) tokens"}, .n_in = NIN,        \
        .n_out = 1,                                                                                                    \
        .in = {{"latents", 4}, {"encoder_hidden_states", 3}, {"pooled_projections", 2}, {"timestep", 1},               \
               {"guidance", 1}},                                                                                       \
        .out = {{"sample", 4}}, .io_shapes = io_shapes, .solve = solve, .check = check, .example = example,           \
        .example_opts = example_opts, .example_input = example_input, .check_parallel = check_parallel, .build = build, \
    }

const ka_arch ka_flux = FLUX_TABLE("flux", "Flux.1 guidance-distilled (dev), diffusers FluxTransformer2DModel",
                                   claims_dev, parse_dev, infer_dev, 5);
const ka_arch ka_flux_schnell = FLUX_TABLE("flux-schnell", "Flux.1 without guidance (schnell), diffusers FluxTransformer2DModel",
                                           claims_schnell, parse_schnell, infer_schnell, 4);
