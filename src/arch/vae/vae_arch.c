/* vae_arch.c - the VAE decoder family's architecture table: diffusers'
 * AutoencoderKL (a vae/ folder), its config and every weight of its file,
 * the input `latent` [batch, latent_channels, h, w] (symbols batch, h, w:
 * the latent's size, already scaled and shifted into the VAE's space) and
 * the output `sample` [batch, out_channels, h*f, w*f], f = 2^(blocks - 1),
 * and the graph builder (vae_decoder.c). */
#include "arch/vae/vae.h"
#include "base/base.h"

#include <cjson/cJSON.h>
#include <string.h>

static int claims(const char *json) {
    cJSON *root = cJSON_Parse(json);
    const cJSON *cls = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "_class_name") : NULL;
    int yes = cJSON_IsString(cls) && !strcmp(cls->valuestring, "AutoencoderKL");
    cJSON_Delete(root);
    return yes;
}

static kiln_status parse(const char *json, void *cfg) { return vae_config_parse(json, cfg); }
static kiln_status validate(const void *cfg) { return vae_config_validate(cfg); }
static char *to_json(const void *cfg) { return vae_config_to_json(cfg); }
static kiln_status spec(const void *cfg, ka_spec **out, size_t *n) { return vae_weight_spec(cfg, out, n); }
static kiln_status infer(const kc_checkpoint *c, void *cfg) { return vae_config_infer(c, cfg); }

static void io_shapes(const void *cfg, const int64_t *s, int64_t in[][4], int64_t out[][4]) {
    const vae_config *c = cfg;
    int64_t B = s[VAE_SYM_BATCH], h = s[VAE_SYM_H], w = s[VAE_SYM_W], f = vae_scale(c);
    int64_t lat[4] = {B, c->latent_channels, h, w}, img[4] = {B, c->out_channels, h * f, w * f};
    memcpy(in[0], lat, sizeof lat);
    memcpy(out[0], img, sizeof img);
}

static kiln_status check(const void *cfg, const int64_t *s) {
    return vae_check_latent(cfg, s[VAE_SYM_BATCH], s[VAE_SYM_H], s[VAE_SYM_W]);
}

/* latent [B, C, h, w]: the channels are checked against the config after
 * (ka_check_inputs names the shape wanted) */
static kiln_status solve(const void *cfg, const int64_t (*in)[4], int64_t *s) {
    s[VAE_SYM_BATCH] = in[0][0];
    s[VAE_SYM_H] = in[0][2];
    s[VAE_SYM_W] = in[0][3];
    return check(cfg, s);
}

/* one 32x32 latent (256x256 pixels at f = 8) */
static void example(const void *cfg, int64_t *s) {
    (void)cfg;
    s[VAE_SYM_BATCH] = 1;
    s[VAE_SYM_H] = s[VAE_SYM_W] = 32;
}

/* kiln_compile_opts' height and width are the latent's, as for the backbone */
static kiln_status example_opts(const void *cfg, const kiln_compile_opts *o, int64_t *s) {
    if (o->height) s[VAE_SYM_H] = o->height;
    if (o->width) s[VAE_SYM_W] = o->width;
    kiln_status st = check(cfg, s);
    return st;
}

static void example_input(const void *cfg, int k, float *x, size_t n) {
    (void)cfg;
    kiln_noise(0x7ae5eed + (uint64_t)k, x, n);
}

static kiln_status build(const void *cfg, kg_graph *g, const int64_t *s, const ka_par *par) {
    if (par && (par->tp > 1 || par->sp > 1 || par->fsdp))
        return kb_fail(KILN_ERR_UNSUPPORTED, "the VAE decoder runs in one process (no tensor, sequence or FSDP split)");
    return vae_build_decoder(cfg, g, s[VAE_SYM_BATCH], s[VAE_SYM_H], s[VAE_SYM_W]);
}

const ka_arch ka_vae_decoder = {
    .name = "vae-decoder",
    .title = "VAE decoder (diffusers AutoencoderKL)",
    .component = "vae",
    .config_size = sizeof(vae_config),
    .claims = claims,
    .config_parse = parse,
    .config_validate = validate,
    .config_to_json = to_json,
    .config_infer = infer,
    .weight_spec = spec,
    .renamer = &vae_ldm_renamer,
    .nsym = VAE_NSYM,
    .sym = {"batch", "h", "w"},
    .sym_doc = {"latents decoded at once", "latent height (the image's / 2^(blocks - 1))",
                "latent width (the image's / 2^(blocks - 1))"},
    .n_in = 1,
    .n_out = 1,
    .in = {{"latent", 4}},
    .out = {{"sample", 4}},
    .io_shapes = io_shapes,
    .solve = solve,
    .check = check,
    .example = example,
    .example_opts = example_opts,
    .example_input = example_input,
    .build = build,
};

/* ---- the encoder: image [batch, in_channels, H, W] (in [-1, 1], sides
 * multiples of f) -> mean, std [batch, latent_channels, H/f, W/f]; symbols
 * batch, h, w are the latent's, as the decoder's. Listed but claims no
 * config: one config.json describes both halves and the decoder claims it,
 * so only kiln_open_opts.family / kiln_load_opts.family = "vae-encoder"
 * opens a VAE folder as its encoder */

static void enc_io_shapes(const void *cfg, const int64_t *s, int64_t in[][4], int64_t out[][4]) {
    const vae_config *c = cfg;
    int64_t B = s[VAE_SYM_BATCH], h = s[VAE_SYM_H], w = s[VAE_SYM_W], f = vae_scale(c);
    int64_t img[4] = {B, c->in_channels, h * f, w * f}, lat[4] = {B, c->latent_channels, h, w};
    memcpy(in[0], img, sizeof img);
    memcpy(out[0], lat, sizeof lat);
    memcpy(out[1], lat, sizeof lat);
}

static kiln_status enc_solve(const void *cfg, const int64_t (*in)[4], int64_t *s) {
    const vae_config *c = cfg;
    kiln_status st = vae_check_image(c, in[0][0], in[0][2], in[0][3]);
    if (st) return st;
    s[VAE_SYM_BATCH] = in[0][0];
    s[VAE_SYM_H] = in[0][2] / vae_scale(c);
    s[VAE_SYM_W] = in[0][3] / vae_scale(c);
    return KILN_OK;
}

/* values in [-1, 1], as an image the pipeline hands the encoder */
static void enc_example_input(const void *cfg, int k, float *x, size_t n) {
    (void)cfg;
    kiln_noise(0xe5c0de + (uint64_t)k, x, n);
    for (size_t i = 0; i < n; i++) x[i] = x[i] > 1 ? 1 : x[i] < -1 ? -1 : x[i];
}

static kiln_status enc_build(const void *cfg, kg_graph *g, const int64_t *s, const ka_par *par) {
    const vae_config *c = cfg;
    if (par && (par->tp > 1 || par->sp > 1 || par->fsdp))
        return kb_fail(KILN_ERR_UNSUPPORTED, "the VAE encoder runs in one process (no tensor, sequence or FSDP split)");
    int64_t f = vae_scale(c);
    return vae_build_encoder(c, g, s[VAE_SYM_BATCH], s[VAE_SYM_H] * f, s[VAE_SYM_W] * f);
}

static int claims_none(const char *json) {
    (void)json;
    return 0;
}

const ka_arch ka_vae_encoder = {
    .name = "vae-encoder",
    .title = "VAE encoder (diffusers AutoencoderKL, latent_dist mean and std)",
    .component = "vae",
    .config_size = sizeof(vae_config),
    .claims = claims_none,
    .config_parse = parse,
    .config_validate = validate,
    .config_to_json = to_json,
    .weight_spec = spec,
    .nsym = VAE_NSYM,
    .sym = {"batch", "h", "w"},
    .sym_doc = {"images encoded at once", "latent height (the image's / 2^(blocks - 1))",
                "latent width (the image's / 2^(blocks - 1))"},
    .n_in = 1,
    .n_out = 2,
    .in = {{"image", 4}},
    .out = {{"mean", 4}, {"std", 4}},
    .io_shapes = enc_io_shapes,
    .solve = enc_solve,
    .check = check,
    .example = example,
    .example_opts = example_opts,
    .example_input = enc_example_input,
    .build = enc_build,
};
