/* clip_config.c - CLIPTextConfig (transformers): defaults, parsing,
 * validation, serialisation, and the weight list of CLIPTextModel /
 * CLIPTextModelWithProjection. */
#include "arch/clip/clip.h"
#include "base/base.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

clip_config clip_config_defaults(void) {
    clip_config c = {
        .vocab_size = 49408,
        .hidden_size = 512,
        .intermediate_size = 2048,
        .projection_dim = 512,
        .num_hidden_layers = 12,
        .num_attention_heads = 8,
        .max_position_embeddings = 77,
        .hidden_act = CLIP_ACT_QUICK_GELU,
        .layer_norm_eps = 1e-5,
        .bos_token_id = 49406,
        .eos_token_id = 49407,
        .pad_token_id = 1,
        .with_projection = 1,
    };
    return c;
}

int clip_config_kind(const char *json) {
    cJSON *root = cJSON_Parse(json);
    int kind = -1;
    if (cJSON_IsObject(root)) {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
        if (ka_json_lists_arch(root, "CLIPTextModelWithProjection")) kind = 1;
        else if (ka_json_lists_arch(root, "CLIPTextModel")) kind = 0;
        else if (!cJSON_GetObjectItemCaseSensitive(root, "architectures") && cJSON_IsString(mt) &&
                 !strcmp(mt->valuestring, "clip_text_model"))
            kind = 0; /* what transformers' AutoModel makes of it */
    }
    cJSON_Delete(root);
    return kind;
}

kiln_status clip_config_parse(const char *json, clip_config *cfg) {
    *cfg = clip_config_defaults();
    cfg->with_projection = clip_config_kind(json) == 1;
    cJSON *root = NULL;
    kiln_status st = ka_json_object(json, &root);
    if (st) return st;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (mt && !cJSON_IsNull(mt) && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "clip_text_model"))) {
        st = kb_fail(KILN_ERR_CONFIG, "config model_type is %s, kiln reads a CLIP text tower's config "
                     "(model_type clip_text_model, as in a pipeline's text_encoder folder)",
                     cJSON_IsString(mt) ? mt->valuestring : "not a string");
        goto done;
    }
    struct {
        const char *key;
        int *field;
    } keys[] = {
        {"vocab_size", &cfg->vocab_size},
        {"hidden_size", &cfg->hidden_size},
        {"intermediate_size", &cfg->intermediate_size},
        {"projection_dim", &cfg->projection_dim},
        {"num_hidden_layers", &cfg->num_hidden_layers},
        {"num_attention_heads", &cfg->num_attention_heads},
        {"max_position_embeddings", &cfg->max_position_embeddings},
        {"bos_token_id", &cfg->bos_token_id},
        {"eos_token_id", &cfg->eos_token_id},
        {"pad_token_id", &cfg->pad_token_id},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if ((st = ka_json_int(root, keys[i].key, keys[i].field, NULL))) goto done;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act)) {
        if (cJSON_IsString(act) && !strcmp(act->valuestring, "quick_gelu")) cfg->hidden_act = CLIP_ACT_QUICK_GELU;
        else if (cJSON_IsString(act) && !strcmp(act->valuestring, "gelu")) cfg->hidden_act = CLIP_ACT_GELU;
        else {
            st = kb_fail(KILN_ERR_CONFIG, "config hidden_act is %s%s%s, kiln runs \"quick_gelu\" (CLIP-L) or \"gelu\" (CLIP-G)",
                         cJSON_IsString(act) ? "\"" : "", cJSON_IsString(act) ? act->valuestring : "not a string",
                         cJSON_IsString(act) ? "\"" : "");
            goto done;
        }
    }
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_eps");
    if (eps && !cJSON_IsNull(eps)) {
        if (!cJSON_IsNumber(eps)) {
            st = kb_fail(KILN_ERR_CONFIG, "config key \"layer_norm_eps\" must be a number");
            goto done;
        }
        cfg->layer_norm_eps = eps->valuedouble;
    }
    st = clip_config_validate(cfg);
done:
    cJSON_Delete(root);
    return st;
}

kiln_status clip_config_validate(const clip_config *c) {
    struct {
        const char *key;
        int v, lo, hi;
    } r[] = {
        {"vocab_size", c->vocab_size, 1, CLIP_MAX_VOCAB},
        {"hidden_size", c->hidden_size, 1, 1 << 16},
        {"intermediate_size", c->intermediate_size, 1, 1 << 18},
        {"projection_dim", c->projection_dim, 1, 1 << 16},
        {"num_hidden_layers", c->num_hidden_layers, 1, CLIP_MAX_LAYERS}, /* each layer's state is an output */
        {"num_attention_heads", c->num_attention_heads, 1, 1 << 10},
        {"max_position_embeddings", c->max_position_embeddings, 1, 1 << 16},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return kb_fail(KILN_ERR_CONFIG, "config %s = %d is impossible (allowed %d..%d)", r[i].key, r[i].v, r[i].lo,
                           r[i].hi);
    if (c->hidden_size % c->num_attention_heads)
        return kb_fail(KILN_ERR_CONFIG, "config hidden_size = %d is not a multiple of num_attention_heads = %d",
                       c->hidden_size, c->num_attention_heads);
    if (c->hidden_act != CLIP_ACT_QUICK_GELU && c->hidden_act != CLIP_ACT_GELU)
        return kb_fail(KILN_ERR_CONFIG, "config hidden_act must be quick_gelu or gelu");
    if (!(c->layer_norm_eps > 0 && c->layer_norm_eps < 1))
        return kb_fail(KILN_ERR_CONFIG, "config layer_norm_eps = %g is impossible (a positive number below 1)",
                       c->layer_norm_eps);
    /* eos 2 is transformers' legacy pooling (the largest id); any other
     * must be an id some input can hold */
    if (c->eos_token_id != 2 && (c->eos_token_id < 0 || c->eos_token_id >= c->vocab_size))
        return kb_fail(KILN_ERR_CONFIG, "config eos_token_id = %d is outside the vocabulary (0..%d, vocab_size %d)",
                       c->eos_token_id, c->vocab_size - 1, c->vocab_size);
    return KILN_OK;
}

char *clip_config_to_json(const clip_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    if (arch) cJSON_AddItemToArray(arch, cJSON_CreateString(c->with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel"));
    cJSON_AddStringToObject(o, "model_type", "clip_text_model");
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(o, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(o, "projection_dim", c->projection_dim);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddStringToObject(o, "hidden_act", c->hidden_act == CLIP_ACT_GELU ? "gelu" : "quick_gelu");
    ka_json_add_num(o, "layer_norm_eps", c->layer_norm_eps);
    cJSON_AddNumberToObject(o, "bos_token_id", c->bos_token_id);
    cJSON_AddNumberToObject(o, "eos_token_id", c->eos_token_id);
    cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

/* ---- the expected weights ------------------------------------------------ */

typedef struct {
    ka_spec *s;
    size_t n, cap;
    int oom;
} spec_list;

static void add(spec_list *l, int linear, int ndim, int64_t d0, int64_t d1, const char *name) {
    if (l->oom) return;
    ka_spec *e = ka_spec_add(&l->s, &l->n, &l->cap, ndim, (int64_t[]){d0, d1}, "%s", name);
    if (!e) {
        l->oom = 1;
        return;
    }
    e->linear = linear;
}

/* Linear(in, out): weight [out, in] (packed, quantizable) and bias [out] */
static void add_linear(spec_list *l, const char *name, int64_t in, int64_t out, int bias) {
    char n[128];
    snprintf(n, sizeof n, "%s.weight", name);
    add(l, 1, 2, out, in, n);
    if (!bias) return;
    snprintf(n, sizeof n, "%s.bias", name);
    add(l, 0, 1, out, 0, n);
}

/* LayerNorm(D): weight [D], bias [D] */
static void add_norm(spec_list *l, const char *name, int64_t D) {
    char n[128];
    snprintf(n, sizeof n, "%s.weight", name);
    add(l, 0, 1, D, 0, n);
    snprintf(n, sizeof n, "%s.bias", name);
    add(l, 0, 1, D, 0, n);
}

kiln_status clip_weight_spec(const clip_config *c, ka_spec **out, size_t *n) {
    spec_list l = {0};
    int64_t D = c->hidden_size, F = c->intermediate_size;
    /* the token embedding is a gather table, not a linear: rows by id, f32 */
    add(&l, 0, 2, c->vocab_size, D, "text_model.embeddings.token_embedding.weight");
    add(&l, 0, 2, c->max_position_embeddings, D, "text_model.embeddings.position_embedding.weight");
    for (int i = 0; i < c->num_hidden_layers; i++) {
        char b[48], name[96];
        snprintf(b, sizeof b, "text_model.encoder.layers.%d", i);
#define LIN(sfx, in, o)                                       \
    do {                                                      \
        snprintf(name, sizeof name, "%s.%s", b, sfx);         \
        add_linear(&l, name, in, o, 1);                       \
    } while (0)
        snprintf(name, sizeof name, "%s.layer_norm1", b);
        add_norm(&l, name, D);
        LIN("self_attn.q_proj", D, D);
        LIN("self_attn.k_proj", D, D);
        LIN("self_attn.v_proj", D, D);
        LIN("self_attn.out_proj", D, D);
        snprintf(name, sizeof name, "%s.layer_norm2", b);
        add_norm(&l, name, D);
        LIN("mlp.fc1", D, F);
        LIN("mlp.fc2", F, D);
#undef LIN
    }
    add_norm(&l, "text_model.final_layer_norm", D);
    if (c->with_projection) add_linear(&l, "text_projection", D, c->projection_dim, 0); /* no bias */
    if (l.oom) {
        free(l.s);
        return kb_fail(KILN_ERR_NOMEM, "out of memory listing the CLIP weights");
    }
    *out = l.s;
    *n = l.n;
    return KILN_OK;
}

/* A config from the tensors' shapes (a text encoder inside an all-in-one
 * file, transformers' names): vocabulary, width, positions, layers, MLP
 * width, projection from the shapes; what no shape holds as SD3's CLIPs have
 * it: heads of width 64 (one head when the width is no multiple of 64),
 * quick_gelu but for a 1280 wide model (CLIP-G: exact gelu), eps 1e-5,
 * bos 0 / eos 2 / pad 1 (the configs' legacy ids: pooling at the largest id). */
kiln_status clip_config_infer(const kc_checkpoint *c, clip_config *x) {
    *x = clip_config_defaults();
    const kc_tensor *tok = kc_find(c, "text_model.embeddings.token_embedding.weight"),
                    *pos = kc_find(c, "text_model.embeddings.position_embedding.weight"),
                    *fc1 = kc_find(c, "text_model.encoder.layers.0.mlp.fc1.weight"),
                    *proj = kc_find(c, "text_projection.weight");
    const char *miss = !tok ? "text_model.embeddings.token_embedding.weight"
                       : !pos ? "text_model.embeddings.position_embedding.weight"
                       : !fc1 ? "text_model.encoder.layers.0.mlp.fc1.weight" : NULL;
    if (miss) return kb_fail(KILN_ERR_MISSING, "%s: cannot infer a CLIP text model's config: tensor %s is missing", c->path, miss);
    if (tok->ndim != 2 || pos->ndim != 2 || fc1->ndim != 2 || (proj && proj->ndim != 2))
        return kb_fail(KILN_ERR_SHAPE, "%s: a CLIP embedding, MLP or projection weight is not 2-D", c->path);
    const kc_tensor *dims[4] = {tok, pos, fc1, proj};
    for (int k = 0; k < 4; k++) /* a config's sizes are ints: a larger dimension is no CLIP's */
        if (dims[k] && (dims[k]->shape[0] > INT_MAX || dims[k]->shape[1] > INT_MAX))
            return kb_fail(KILN_ERR_SHAPE, "%s: tensor %s has a dimension past 2^31", c->path, dims[k]->name);
    int layers = 0;
    for (size_t i = 0; i < c->n; i++) {
        const char *n = c->t[i].name;
        if (strncmp(n, "text_model.encoder.layers.", 26)) continue;
        long b = strtol(n + 26, NULL, 10);
        if (b >= 0 && b < CLIP_MAX_LAYERS && b + 1 > layers) layers = (int)b + 1;
    }
    int64_t D = tok->shape[1];
    x->vocab_size = (int)tok->shape[0];
    x->hidden_size = (int)D;
    x->max_position_embeddings = (int)pos->shape[0];
    x->intermediate_size = (int)fc1->shape[0];
    x->num_hidden_layers = layers;
    x->num_attention_heads = D % 64 ? 1 : (int)(D / 64);
    x->with_projection = proj != NULL;
    x->projection_dim = proj ? (int)proj->shape[0] : (int)D;
    x->hidden_act = D == 1280 ? CLIP_ACT_GELU : CLIP_ACT_QUICK_GELU;
    x->layer_norm_eps = 1e-5;
    x->bos_token_id = 0;
    x->eos_token_id = 2;
    x->pad_token_id = 1;
    return clip_config_validate(x);
}
