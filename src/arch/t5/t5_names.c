/* t5_names.c - T5 encoders as checkpoints name them: the embedding saved
 * under encoder.embed_tokens (t5_renamer), and a config inferred from the
 * shapes (an all-in-one file's t5xxl, which has no config.json). Parser
 * code: no graph, no kernels (the fuzz harnesses link it). */
#include "arch/t5/t5.h"
#include "base/base.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
kiln_status t5_config_infer(const kc_checkpoint *c, t5_config *x) {
    *x = t5_config_defaults();
    const char *names[4] = {"shared.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                            "encoder.block.0.layer.0.SelfAttention.q.weight", "encoder.block.0.layer.1.DenseReluDense.wo.weight"};
    const kc_tensor *t[4];
    for (int i = 0; i < 4; i++) {
        if (!(t[i] = kc_find(c, names[i])))
            return kb_fail(KILN_ERR_MISSING, "%s: cannot infer a T5 encoder's config: tensor %s is missing", c->path, names[i]);
        if (t[i]->ndim != 2) return kb_fail(KILN_ERR_SHAPE, "%s: tensor %s is not 2-D", c->path, names[i]);
        if (t[i]->shape[0] > INT_MAX || t[i]->shape[1] > INT_MAX) /* a config's sizes are ints */
            return kb_fail(KILN_ERR_SHAPE, "%s: tensor %s has a dimension past 2^31", c->path, names[i]);
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

const kc_renamer t5_renamer = {"t5-embed-tokens", detect_embed, rename_embed};
