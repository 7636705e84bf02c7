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

static kiln_status infer(const kc_checkpoint *c, void *cfg) { return t5_config_infer(c, cfg); }

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
    return st;
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
