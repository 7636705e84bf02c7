/* t5_arch.c - the T5 encoder family's architecture table: its config
 * (transformers' T5Config), weights, named input (input_ids) and output
 * (last_hidden_state) with their symbols (batch, tokens), and the graph
 * builder (t5_forward.c). */
#include "arch/t5/t5.h"
#include "base/base.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* transformers' T5EncoderModel: "architectures" names it (with model_type
 * t5 where the config says one); a T5ForConditionalGeneration checkpoint
 * holds a decoder this family does not run */
static int claims(const char *json) {
    cJSON *root = cJSON_Parse(json);
    int yes = 0;
    if (cJSON_IsObject(root)) {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
        yes = ka_json_lists_arch(root, "T5EncoderModel");
        if (mt && !(cJSON_IsString(mt) && !strcmp(mt->valuestring, "t5"))) yes = 0;
    }
    cJSON_Delete(root);
    return yes;
}

/* transformers ties T5EncoderModel's encoder.embed_tokens to shared and
 * saves shared.weight; a file that holds the encoder's copy alone (saved
 * untied) names the same table encoder.embed_tokens.weight; one that holds
 * both (some all-in-one files' t5xxl) has the tied copy left out.
 * state[0]: shared.weight is there too */
static int detect_embed(const char *const *names, size_t n, int64_t state[4]) {
    int embed = 0, shared = 0, block = 0;
    for (size_t i = 0; i < n; i++) {
        embed |= !strcmp(names[i], "encoder.embed_tokens.weight");
        shared |= !strcmp(names[i], "shared.weight");
        block |= !strncmp(names[i], "encoder.block.", 14);
    }
    state[0] = shared;
    return embed && block;
}

static int rename_embed(const int64_t state[4], const char *name, kc_rename *r) {
    if (strcmp(name, "encoder.embed_tokens.weight")) return 0;
    r->n = 1;
    r->drop = state[0] != 0;
    snprintf(r->to[0], sizeof r->to[0], "shared.weight");
    return 1;
}

/* A config from the tensors' shapes (an encoder inside an all-in-one file):
 * vocabulary and width from shared, heads and buckets from block 0's
 * relative_attention_bias [buckets, heads], d_kv = q's rows / heads, d_ff,
 * layers, gated when wi_0 is there; what no shape holds as T5 v1.1 (SD3's
 * T5-XXL) has it: gated-gelu (gelu_new), max distance 128, eps 1e-6. */
static kiln_status infer(const kc_checkpoint *c, void *cfg) {
    t5_config *x = cfg;
    *x = t5_config_defaults();
    const char *names[4] = {"shared.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                            "encoder.block.0.layer.0.SelfAttention.q.weight", "encoder.block.0.layer.1.DenseReluDense.wo.weight"};
    const kc_tensor *t[4];
    for (int i = 0; i < 4; i++) {
        if (!(t[i] = kc_find(c, names[i])))
            return kb_fail(KILN_ERR_MISSING, "%s: cannot infer a T5 encoder's config: tensor %s is missing", c->path, names[i]);
        if (t[i]->ndim != 2) return kb_fail(KILN_ERR_SHAPE, "%s: tensor %s is not 2-D", c->path, names[i]);
    }
    const kc_tensor *wi0 = kc_find(c, "encoder.block.0.layer.1.DenseReluDense.wi_0.weight");
    int layers = 0;
    for (size_t i = 0; i < c->n; i++) {
        const char *n = c->t[i].name;
        if (strncmp(n, "encoder.block.", 14)) continue;
        long b = strtol(n + 14, NULL, 10);
        if (b >= 0 && b < T5_MAX_LAYERS && b + 1 > layers) layers = (int)b + 1;
    }
    int64_t heads = t[1]->shape[1], inner = t[2]->shape[0];
    if (heads < 1 || inner % heads)
        return kb_fail(KILN_ERR_SHAPE, "%s: q has %lld rows, not a multiple of the %lld heads of relative_attention_bias",
                       c->path, (long long)inner, (long long)heads);
    x->vocab_size = (int)t[0]->shape[0];
    x->d_model = (int)t[0]->shape[1];
    x->num_heads = (int)heads;
    x->num_buckets = (int)t[1]->shape[0];
    x->d_kv = (int)(inner / heads);
    x->d_ff = (int)t[3]->shape[1];
    x->num_layers = layers;
    x->gated = wi0 != NULL;
    x->act = wi0 ? T5_ACT_GELU_TANH : T5_ACT_RELU;
    x->max_distance = 128;
    x->eps = 1e-6;
    return t5_config_validate(x);
}

static const kc_renamer t5_renamer = {"t5-embed-tokens", detect_embed, rename_embed};

static kiln_status parse(const char *json, void *cfg) { return t5_config_parse(json, cfg); }
static kiln_status validate(const void *cfg) { return t5_config_validate(cfg); }
static char *to_json(const void *cfg) { return t5_config_to_json(cfg); }
static kiln_status spec(const void *cfg, ka_spec **out, size_t *n) { return t5_weight_spec(cfg, out, n); }

static void io_shapes(const void *cfg, const int64_t *s, int64_t in[][4], int64_t out[][4]) {
    const t5_config *c = cfg;
    int64_t B = s[T5_SYM_BATCH], T = s[T5_SYM_TOKENS];
    int64_t i0[4] = {B, T}, o0[4] = {B, T, c->d_model};
    memcpy(in[0], i0, sizeof i0);
    memcpy(out[0], o0, sizeof o0);
}

static kiln_status check(const void *cfg, const int64_t *s) {
    (void)cfg;
    if (s[T5_SYM_BATCH] < 1 || s[T5_SYM_BATCH] > T5_MAX_BATCH)
        return kb_fail(KILN_ERR_SHAPE, "t5: batch (input_ids dimension 0) is %lld, allowed 1..%d",
                       (long long)s[T5_SYM_BATCH], T5_MAX_BATCH);
    if (s[T5_SYM_TOKENS] < 1 || s[T5_SYM_TOKENS] > T5_MAX_TOKENS)
        return kb_fail(KILN_ERR_SHAPE, "t5: tokens (input_ids dimension 1) is %lld, allowed 1..%d",
                       (long long)s[T5_SYM_TOKENS], T5_MAX_TOKENS);
    return KILN_OK;
}

static kiln_status solve(const void *cfg, const int64_t (*in)[4], int64_t *s) {
    s[T5_SYM_BATCH] = in[0][0];
    s[T5_SYM_TOKENS] = in[0][1];
    return check(cfg, s);
}

/* one prompt of SD3's 256 tokens (max_sequence_length) */
static void example(const void *cfg, int64_t *s) {
    (void)cfg;
    s[T5_SYM_BATCH] = 1;
    s[T5_SYM_TOKENS] = 256;
}

/* kiln_compile_opts' context_len is the token count (the tokenizer's
 * padded length: 256 for SD3, 512 for Flux-dev); height and width mean
 * nothing to a text encoder */
static kiln_status example_opts(const void *cfg, const kiln_compile_opts *o, int64_t *s) {
    if (o->height || o->width)
        return kb_fail(KILN_ERR_INVALID_ARG, "compile: the T5 encoder takes no latent height or width (its symbols: "
                       "batch, tokens)");
    if (o->context_len) s[T5_SYM_TOKENS] = o->context_len;
    kiln_status st = check(cfg, s);
    return st ? kb_wrap(st, "compile: the example request") : KILN_OK;
}

/* token ids spread over the vocabulary, then </s> (1) and padding (0) */
static void example_input(const void *cfg, int k, float *x, size_t n) {
    const t5_config *c = cfg;
    (void)k;
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u + 7u) % (uint64_t)c->vocab_size);
    if (n > 2 && c->vocab_size > 1) x[n - 2] = 1, x[n - 1] = 0;
}

static kiln_status build(const void *cfg, kg_graph *g, const int64_t *s, const ka_par *par) {
    return t5_build_forward(cfg, g, s[T5_SYM_BATCH], s[T5_SYM_TOKENS], par);
}

const ka_arch ka_t5 = {
    .name = "t5",
    .title = "T5 encoder (transformers T5EncoderModel)",
    .component = "text_encoder_3",
    .weights_file = "model.safetensors",
    .config_size = sizeof(t5_config),
    .claims = claims,
    .config_parse = parse,
    .config_validate = validate,
    .config_to_json = to_json,
    .config_infer = infer,
    .weight_spec = spec,
    .renamer = &t5_renamer,
    /* the blocks' linears but q and k: T5 does not scale q k^T, so their
     * errors reach the softmax undamped (t5-tiny, int8: all seven 5.4e-2
     * relative L2, without q and k 3.0e-2; q and k are 2 of 7 linears, 17%
     * of T5-XXL's block weights); the embedding and the position bias are
     * tables, not linears */
    .quant_layers = "encoder.block.*,!*.SelfAttention.q,!*.SelfAttention.k",
    .seed_tensor = NULL,
    .nsym = T5_NSYM,
    .sym = {"batch", "tokens"},
    .sym_doc = {"prompts (2 with a negative prompt)", "tokens per prompt, the tokenizer's padded length (256 for SD3, "
                "512 for Flux-dev)"},
    .n_in = 1,
    .n_out = 1,
    .in = {{"input_ids", 2}},
    .out = {{"last_hidden_state", 3}},
    .io_shapes = io_shapes,
    .solve = solve,
    .check = check,
    .example = example,
    .example_opts = example_opts,
    .example_input = example_input,
    .check_parallel = NULL,
    .build = build,
};
