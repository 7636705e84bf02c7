/* clip_arch.c - the CLIP text encoder's architecture table "clip":
 * CLIPTextModelWithProjection (SD3's text_encoder and text_encoder_2) and
 * CLIPTextModel (Flux.1's text_encoder), told apart by "architectures".
 * One input, input_ids [batch, tokens] (the ids as f32 values), symbols
 * batch and tokens (1 to max_position_embeddings; the pipelines pad to
 * 77); the outputs as transformers names them (clip_outputs). */
#include "arch/clip/clip.h"
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

static int claims(const char *json) { return clip_config_kind(json) >= 0; }
static kiln_status parse(const char *json, void *cfg) { return clip_config_parse(json, cfg); }
static int outputs(const void *cfg, ka_io *out, char (*names)[48]) { return clip_outputs(cfg, out, names); }
static kiln_status validate(const void *cfg) { return clip_config_validate(cfg); }
static char *to_json(const void *cfg) { return clip_config_to_json(cfg); }
static kiln_status spec(const void *cfg, ka_spec **out, size_t *n) { return clip_weight_spec(cfg, out, n); }

static kiln_status infer(const kc_checkpoint *c, void *cfg) { return clip_config_infer(c, cfg); }

/* in the order of clip_outputs; out has room for KA_MAX_OUT */
static void io_shapes(const void *cfg, const int64_t *s, int64_t in[][4], int64_t out[][4]) {
    const clip_config *c = cfg;
    int64_t B = s[CLIP_SYM_BATCH], T = s[CLIP_SYM_TOKENS], D = c->hidden_size;
    int64_t ids[4] = {B, T}, state[4] = {B, T, D}, pooled[4] = {B, D}, proj[4] = {B, c->projection_dim};
    memcpy(in[0], ids, sizeof ids);
    int n = 0;
    memcpy(out[n++], state, sizeof state);
    memcpy(out[n++], state, sizeof state);
    memcpy(out[n++], pooled, sizeof pooled);
    if (c->with_projection) memcpy(out[n++], proj, sizeof proj);
    for (int i = 0; i <= c->num_hidden_layers && n < KA_MAX_OUT; i++) memcpy(out[n++], state, sizeof state);
}

/* the largest batch: far beyond real use, small enough that no size made
 * from it overflows */
#define CLIP_MAX_BATCH 65536

static kiln_status check(const void *cfg, const int64_t *s) {
    const clip_config *c = cfg;
    if (s[CLIP_SYM_BATCH] < 1 || s[CLIP_SYM_BATCH] > CLIP_MAX_BATCH)
        return kb_fail(KILN_ERR_SHAPE, "input_ids dimension 0 (batch) is %lld, the model takes 1 to %d",
                       (long long)s[CLIP_SYM_BATCH], CLIP_MAX_BATCH);
    if (s[CLIP_SYM_TOKENS] < 1 || s[CLIP_SYM_TOKENS] > c->max_position_embeddings)
        return kb_fail(KILN_ERR_SHAPE, "input_ids dimension 1 (tokens) is %lld, the model takes 1 to %d "
                       "(max_position_embeddings)", (long long)s[CLIP_SYM_TOKENS], c->max_position_embeddings);
    return KILN_OK;
}

static kiln_status solve(const void *cfg, const int64_t (*in)[4], int64_t *s) {
    s[CLIP_SYM_BATCH] = in[0][0];
    s[CLIP_SYM_TOKENS] = in[0][1];
    return check(cfg, s);
}

/* one prompt at the pipelines' length (77: every position) */
static void example(const void *cfg, int64_t *s) {
    const clip_config *c = cfg;
    s[CLIP_SYM_BATCH] = 1;
    s[CLIP_SYM_TOKENS] = c->max_position_embeddings;
}

/* kiln_compile_opts' context_len is the token count */
static kiln_status example_opts(const void *cfg, const kiln_compile_opts *o, int64_t *s) {
    if (o->context_len) s[CLIP_SYM_TOKENS] = o->context_len;
    kiln_status st = check(cfg, s);
    return st;
}

/* an id of the vocabulary: id itself when it is one, else 0 */
static int64_t in_vocab(const clip_config *c, int64_t id) { return id >= 0 && id < c->vocab_size ? id : 0; }

/* a prompt's shape, deterministic: bos, ids of the vocabulary, then eos
 * padding over the second half of each row */
static void example_input(const void *cfg, int k, float *x, size_t n) {
    const clip_config *c = cfg;
    (void)k;
    int64_t T = c->max_position_embeddings;
    for (size_t i = 0; i < n; i++) {
        int64_t t = (int64_t)(i % (size_t)T);
        uint64_t h = ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ULL;
        x[i] = (float)(t == 0 ? in_vocab(c, c->bos_token_id) : t > T / 2 ? in_vocab(c, c->eos_token_id)
                                                                        : (int64_t)((h >> 40) % (uint64_t)c->vocab_size));
    }
}

static kiln_status build(const void *cfg, kg_graph *g, const int64_t *s, const ka_par *par) {
    if (par && (par->tp > 1 || par->sp > 1 || par->fsdp))
        return kb_fail(KILN_ERR_UNSUPPORTED, "the CLIP text encoder runs in one process (no tensor, sequence or FSDP split)");
    return clip_build_forward(cfg, g, s[CLIP_SYM_BATCH], s[CLIP_SYM_TOKENS]);
}

/* the encoder layers' linears; the projection stays unquantized */
#define CLIP_QUANT_LAYERS "text_model.encoder.layers.*"

const ka_arch ka_clip = {
    .name = "clip",
    .title = "CLIP text encoder (transformers CLIPTextModel, CLIPTextModelWithProjection)",
    .component = "text_encoder",
    .weights_file = "model.safetensors",
    .config_size = sizeof(clip_config),
    .claims = claims,
    .config_parse = parse,
    .config_validate = validate,
    .config_to_json = to_json,
    .config_infer = infer,
    .weight_spec = spec,
    .renamer = &clip_renamer,
    .quant_layers = CLIP_QUANT_LAYERS,
    .nsym = CLIP_NSYM,
    .sym = {"batch", "tokens"},
    .sym_doc = {"prompts", "token ids per prompt (1 to max_position_embeddings; the pipelines pad to 77)"},
    .n_in = 1,
    .n_out = 3, /* every config's first three; clip_outputs gives them all */
    .in = {{"input_ids", 2}},
    .out = {{"last_hidden_state", 3}, {"hidden_states_penultimate", 3}, {"pooler_output", 2}},
    .outputs = outputs,
    .io_shapes = io_shapes,
    .solve = solve,
    .check = check,
    .example = example,
    .example_opts = example_opts,
    .example_input = example_input,
    .build = build,
};
