/* t5_config.c - T5Config (transformers) for the encoder: defaults, parsing
 * with every value checked, serialisation, and the weight list. */
#include "arch/t5/t5.h"
#include "base/base.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

t5_config t5_config_defaults(void) {
    /* T5Config.__init__'s defaults (t5-small; feed_forward_proj "relu") */
    return (t5_config){.vocab_size = 32128,
                       .d_model = 512,
                       .d_kv = 64,
                       .d_ff = 2048,
                       .num_layers = 6,
                       .num_heads = 8,
                       .num_buckets = 32,
                       .max_distance = 128,
                       .eps = 1e-6,
                       .gated = 0,
                       .act = T5_ACT_RELU};
}

/* transformers' ACT2FN name -> T5_ACT_*, -1 for one kiln does not run */
static int act_of(const char *name) {
    if (!strcmp(name, "relu")) return T5_ACT_RELU;
    if (!strcmp(name, "gelu_new") || !strcmp(name, "gelu_pytorch_tanh")) return T5_ACT_GELU_TANH;
    if (!strcmp(name, "gelu")) return T5_ACT_GELU;
    return -1;
}

static const char *act_name(int act) {
    return act == T5_ACT_RELU ? "relu" : act == T5_ACT_GELU ? "gelu" : "gelu_new";
}

/* T5Config: feed_forward_proj "ACT" or "gated-ACT" ("gated-gelu" means
 * gelu_new, the tanh approximation); dense_act_fn and is_gated_act, which
 * transformers writes beside it, must agree with it */
static kiln_status parse_ff(const cJSON *root, t5_config *c) {
    const cJSON *ff = cJSON_GetObjectItemCaseSensitive(root, "feed_forward_proj");
    if (ff && !cJSON_IsNull(ff)) {
        if (!cJSON_IsString(ff))
            return kb_fail(KILN_ERR_CONFIG, "config key \"feed_forward_proj\" must be a string such as \"gated-gelu\"");
        const char *s = ff->valuestring, *dash = strchr(s, '-');
        int gated = dash && !strncmp(s, "gated-", 6);
        const char *act = gated ? s + 6 : s;
        if ((dash && !gated) || strchr(act, '-') || act_of(act) < 0)
            return kb_fail(KILN_ERR_CONFIG, "config feed_forward_proj = \"%s\" is not \"ACT\" or \"gated-ACT\" with ACT "
                           "relu, gelu, gelu_new or gelu_pytorch_tanh", s);
        c->gated = gated;
        c->act = !strcmp(s, "gated-gelu") ? T5_ACT_GELU_TANH : act_of(act);
    }
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "is_gated_act");
    if (g && !cJSON_IsNull(g)) {
        if (!cJSON_IsBool(g)) return kb_fail(KILN_ERR_CONFIG, "config key \"is_gated_act\" must be true or false");
        if (cJSON_IsTrue(g) != c->gated)
            return kb_fail(KILN_ERR_CONFIG, "config is_gated_act = %s disagrees with feed_forward_proj (%s)",
                           cJSON_IsTrue(g) ? "true" : "false", c->gated ? "gated" : "not gated");
    }
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "dense_act_fn");
    if (a && !cJSON_IsNull(a)) {
        if (!cJSON_IsString(a) || act_of(a->valuestring) < 0)
            return kb_fail(KILN_ERR_CONFIG, "config dense_act_fn must be relu, gelu, gelu_new or gelu_pytorch_tanh");
        if (act_of(a->valuestring) != c->act)
            return kb_fail(KILN_ERR_CONFIG, "config dense_act_fn = \"%s\" disagrees with feed_forward_proj (%s)",
                           a->valuestring, act_name(c->act));
    }
    return KILN_OK;
}

kiln_status t5_config_parse(const char *json, t5_config *cfg) {
    *cfg = t5_config_defaults();
    cJSON *root = NULL;
    kiln_status st = ka_json_object(json, &root);
    if (st) return st;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "t5"))) {
        st = kb_fail(KILN_ERR_CONFIG, "config model_type is %s, the T5 encoder needs \"t5\"",
                     cJSON_IsString(mt) ? mt->valuestring : "not a string");
        goto done;
    }
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (ar && !cJSON_IsNull(ar)) {
        if (!ka_json_lists_arch(root, "T5EncoderModel")) {
            st = kb_fail(KILN_ERR_CONFIG, "config architectures does not name T5EncoderModel");
            goto done;
        }
    }
    struct {
        const char *key;
        int *field;
    } keys[] = {
        {"vocab_size", &cfg->vocab_size},
        {"d_model", &cfg->d_model},
        {"d_kv", &cfg->d_kv},
        {"d_ff", &cfg->d_ff},
        {"num_layers", &cfg->num_layers},
        {"num_heads", &cfg->num_heads},
        {"relative_attention_num_buckets", &cfg->num_buckets},
        {"relative_attention_max_distance", &cfg->max_distance},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if ((st = ka_json_int(root, keys[i].key, keys[i].field, NULL))) goto done;
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    if (eps && !cJSON_IsNull(eps)) {
        if (!cJSON_IsNumber(eps)) {
            st = kb_fail(KILN_ERR_CONFIG, "config key \"layer_norm_epsilon\" must be a number");
            goto done;
        }
        cfg->eps = eps->valuedouble;
    }
    if ((st = parse_ff(root, cfg))) goto done;
    st = t5_config_validate(cfg);
done:
    cJSON_Delete(root);
    return st;
}

kiln_status t5_config_validate(const t5_config *c) {
    struct {
        const char *key;
        int v, lo, hi;
    } r[] = {
        {"vocab_size", c->vocab_size, 1, T5_MAX_VOCAB},
        {"d_model", c->d_model, 1, 1 << 16},
        {"d_kv", c->d_kv, 1, 1 << 12},
        {"d_ff", c->d_ff, 1, 1 << 18},
        {"num_layers", c->num_layers, 1, T5_MAX_LAYERS},
        {"num_heads", c->num_heads, 1, 1 << 10},
        {"relative_attention_num_buckets", c->num_buckets, 4, 1 << 12},
        {"relative_attention_max_distance", c->max_distance, 1, 1 << 20},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return kb_fail(KILN_ERR_CONFIG, "config %s = %d is impossible (allowed %d..%d)", r[i].key, r[i].v, r[i].lo,
                           r[i].hi);
    int64_t inner = (int64_t)c->num_heads * c->d_kv;
    if (inner > (1 << 16))
        return kb_fail(KILN_ERR_CONFIG, "config num_heads x d_kv = %lld is too large (at most 65536)", (long long)inner);
    /* the bidirectional buckets: half per direction, max_exact = a quarter
     * with one bucket each; the log-spaced rest reaches max_distance */
    int max_exact = c->num_buckets / 4;
    if (c->max_distance <= max_exact)
        return kb_fail(KILN_ERR_CONFIG, "config relative_attention_max_distance = %d must exceed "
                       "relative_attention_num_buckets / 4 = %d (the exact buckets)", c->max_distance, max_exact);
    if (!(c->eps > 0 && c->eps < 1))
        return kb_fail(KILN_ERR_CONFIG, "config layer_norm_epsilon = %g is impossible (between 0 and 1)", c->eps);
    if (c->act != T5_ACT_RELU && c->act != T5_ACT_GELU_TANH && c->act != T5_ACT_GELU)
        return kb_fail(KILN_ERR_CONFIG, "config feed_forward_proj names an unknown activation");
    return KILN_OK;
}

char *t5_config_to_json(const t5_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *ar = cJSON_AddArrayToObject(o, "architectures");
    if (ar) cJSON_AddItemToArray(ar, cJSON_CreateString("T5EncoderModel"));
    cJSON_AddStringToObject(o, "model_type", "t5");
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "d_model", c->d_model);
    cJSON_AddNumberToObject(o, "d_kv", c->d_kv);
    cJSON_AddNumberToObject(o, "d_ff", c->d_ff);
    cJSON_AddNumberToObject(o, "num_layers", c->num_layers);
    cJSON_AddNumberToObject(o, "num_heads", c->num_heads);
    cJSON_AddNumberToObject(o, "relative_attention_num_buckets", c->num_buckets);
    cJSON_AddNumberToObject(o, "relative_attention_max_distance", c->max_distance);
    ka_json_add_num(o, "layer_norm_epsilon", c->eps);
    char ff[32];
    /* "gated-gelu" is transformers' spelling of gated gelu_new (a gated
     * exact gelu has no spelling, and parse never makes one) */
    snprintf(ff, sizeof ff, "%s%s", c->gated ? "gated-" : "",
             c->gated && c->act == T5_ACT_GELU_TANH ? "gelu" : act_name(c->act));
    cJSON_AddStringToObject(o, "feed_forward_proj", ff);
    cJSON_AddStringToObject(o, "dense_act_fn", act_name(c->act));
    cJSON_AddBoolToObject(o, "is_gated_act", c->gated);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

/* ---- the weights ---------------------------------------------------------- */

kiln_status t5_weight_spec(const t5_config *c, ka_spec **out, size_t *n) {
    ka_spec *s = NULL;
    size_t ns = 0, cap = 0;
    int64_t D = c->d_model, inner = (int64_t)c->num_heads * c->d_kv, F = c->d_ff;
    int ok = 1;
#define ADD(nd, lin, blk, ...)                                                                          \
    do {                                                                                                \
        ka_spec *e = ka_spec_add(&s, &ns, &cap, nd, shape, __VA_ARGS__);                                \
        if (!e) ok = 0;                                                                                 \
        else {                                                                                          \
            e->linear = lin;                                                                            \
            e->block = blk;                                                                             \
        }                                                                                               \
    } while (0)
    {
        /* the token embedding, a gather table: transformers ties the
         * encoder's embed_tokens to shared and saves shared.weight */
        int64_t shape[2] = {c->vocab_size, D};
        ADD(2, 0, -1, "shared.weight");
    }
    for (int i = 0; i < c->num_layers && ok; i++) {
        const char *att = "encoder.block.%d.layer.0.SelfAttention";
        const char *qkv[3] = {"q", "k", "v"};
        for (int k = 0; k < 3; k++) {
            int64_t shape[2] = {inner, D};
            char fmt[96];
            snprintf(fmt, sizeof fmt, "%s.%s.weight", att, qkv[k]);
            ADD(2, 1, i, fmt, i);
            /* T5 does not scale q k^T: q and k rounded to bf16 (from f16 weights)
             * move the attention logits by ~1e-2 relative; they stay f32 */
            if (ok && k < 2) s[ns - 1].keep_f32 = 1;
        }
        {
            int64_t shape[2] = {D, inner};
            ADD(2, 1, i, "encoder.block.%d.layer.0.SelfAttention.o.weight", i);
        }
        if (i == 0) {
            /* only block 0 has it (has_relative_attention_bias); every block
             * uses it, so it belongs to none (the bias is made before block 0) */
            int64_t shape[2] = {c->num_buckets, c->num_heads};
            ADD(2, 0, -1, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
        }
        {
            int64_t shape[1] = {D};
            ADD(1, 0, i, "encoder.block.%d.layer.0.layer_norm.weight", i);
        }
        if (c->gated) {
            int64_t shape[2] = {F, D};
            ADD(2, 1, i, "encoder.block.%d.layer.1.DenseReluDense.wi_0.weight", i);
            ADD(2, 1, i, "encoder.block.%d.layer.1.DenseReluDense.wi_1.weight", i);
        } else {
            int64_t shape[2] = {F, D};
            ADD(2, 1, i, "encoder.block.%d.layer.1.DenseReluDense.wi.weight", i);
        }
        {
            int64_t shape[2] = {D, F};
            ADD(2, 1, i, "encoder.block.%d.layer.1.DenseReluDense.wo.weight", i);
        }
        {
            int64_t shape[1] = {D};
            ADD(1, 0, i, "encoder.block.%d.layer.1.layer_norm.weight", i);
        }
    }
    {
        int64_t shape[1] = {D};
        ADD(1, 0, -1, "encoder.final_layer_norm.weight");
    }
#undef ADD
    if (!ok) {
        free(s);
        return kb_fail(KILN_ERR_NOMEM, "t5: out of memory listing the weights");
    }
    *out = s;
    *n = ns;
    return KILN_OK;
}
