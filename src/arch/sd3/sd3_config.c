/* sd3_config.c - SD3Transformer2DModel config: defaults, parsing,
 * inference from shapes, validation, serialisation, and the weight list. */
#include "base/base.h"
#include "arch/sd3/sd3.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

kiln_config sd3_config_defaults(void) {
    kiln_config c = {
        .sample_size = 128,
        .patch_size = 2,
        .in_channels = 16,
        .out_channels = 16,
        .num_layers = 18,
        .attention_head_dim = 64,
        .num_attention_heads = 18,
        .joint_attention_dim = 4096,
        .caption_projection_dim = 1152,
        .pooled_projection_dim = 2048,
        .pos_embed_max_size = 96,
        .qk_norm_rms = 0,
        .dual_attention_mask = 0,
    };
    return c;
}

kiln_status sd3_config_parse(const char *json, kiln_config *cfg) {
    *cfg = sd3_config_defaults();
    cJSON *root = NULL;
    kiln_status st = ka_json_object(json, &root);
    if (st) return st;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
    if (cls && (!cJSON_IsString(cls) || strcmp(cls->valuestring, "SD3Transformer2DModel"))) {
        st = kb_fail(KILN_ERR_CONFIG, "config _class_name is %s, kiln runs SD3Transformer2DModel",
                     cJSON_IsString(cls) ? cls->valuestring : "not a string");
        goto done;
    }
    struct {
        const char *key;
        int *field;
    } keys[] = {
        {"sample_size", &cfg->sample_size},
        {"patch_size", &cfg->patch_size},
        {"in_channels", &cfg->in_channels},
        {"num_layers", &cfg->num_layers},
        {"attention_head_dim", &cfg->attention_head_dim},
        {"num_attention_heads", &cfg->num_attention_heads},
        {"joint_attention_dim", &cfg->joint_attention_dim},
        {"caption_projection_dim", &cfg->caption_projection_dim},
        {"pooled_projection_dim", &cfg->pooled_projection_dim},
        {"pos_embed_max_size", &cfg->pos_embed_max_size},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if ((st = ka_json_int(root, keys[i].key, keys[i].field, NULL))) goto done;
    int out_null = 0;
    if ((st = ka_json_int(root, "out_channels", &cfg->out_channels, &out_null))) goto done;
    if (out_null) cfg->out_channels = cfg->in_channels;

    const cJSON *qk = cJSON_GetObjectItemCaseSensitive(root, "qk_norm");
    if (qk && !cJSON_IsNull(qk)) {
        if (!cJSON_IsString(qk) || strcmp(qk->valuestring, "rms_norm")) {
            st = kb_fail(KILN_ERR_CONFIG, "config qk_norm must be null or \"rms_norm\"");
            goto done;
        }
        cfg->qk_norm_rms = 1;
    }
    const cJSON *dual = cJSON_GetObjectItemCaseSensitive(root, "dual_attention_layers");
    if (dual && !cJSON_IsNull(dual)) {
        if (!cJSON_IsArray(dual)) {
            st = kb_fail(KILN_ERR_CONFIG, "config dual_attention_layers must be a list of block indices");
            goto done;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, dual) {
            double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
            if (d != floor(d) || d < 0 || d >= cfg->num_layers || d >= SD3_MAX_LAYERS) {
                st = kb_fail(KILN_ERR_CONFIG,
                             "config dual_attention_layers holds %s, not a block index in [0, %d)",
                             cJSON_IsNumber(e) ? "an out-of-range value" : "a non-number",
                             cfg->num_layers);
                goto done;
            }
            cfg->dual_attention_mask |= 1ull << (int)d;
        }
    }
    st = sd3_config_validate(cfg);
done:
    cJSON_Delete(root);
    return st;
}

kiln_status sd3_config_validate(const kiln_config *c) {
    struct {
        const char *key;
        int v, lo, hi;
    } r[] = {
        {"sample_size", c->sample_size, 1, 1 << 16},
        {"patch_size", c->patch_size, 1, 64},
        {"in_channels", c->in_channels, 1, 1 << 12},
        {"out_channels", c->out_channels, 1, 1 << 12},
        {"num_layers", c->num_layers, 1, SD3_MAX_LAYERS},
        {"attention_head_dim", c->attention_head_dim, 1, 1 << 12},
        {"num_attention_heads", c->num_attention_heads, 1, 1 << 10},
        {"joint_attention_dim", c->joint_attention_dim, 1, 1 << 16},
        {"caption_projection_dim", c->caption_projection_dim, 1, 1 << 16},
        {"pooled_projection_dim", c->pooled_projection_dim, 1, 1 << 16},
        {"pos_embed_max_size", c->pos_embed_max_size, 1, 1 << 12},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return kb_fail(KILN_ERR_CONFIG, "config %s = %d is impossible (allowed %d..%d)",
                           r[i].key, r[i].v, r[i].lo, r[i].hi);
    int64_t inner = (int64_t)c->num_attention_heads * c->attention_head_dim;
    if (inner > (1 << 16))
        return kb_fail(KILN_ERR_CONFIG, "config num_attention_heads x attention_head_dim = %lld is too large",
                       (long long)inner);
    if (c->caption_projection_dim != inner)
        return kb_fail(KILN_ERR_CONFIG,
                       "config caption_projection_dim = %d must equal num_attention_heads x "
                       "attention_head_dim = %lld (the joint blocks share one width)",
                       c->caption_projection_dim, (long long)inner);
    if (c->num_layers < SD3_MAX_LAYERS && (c->dual_attention_mask >> c->num_layers))
        return kb_fail(KILN_ERR_CONFIG, "config dual_attention_layers names a block >= num_layers");
    return KILN_OK;
}

char *sd3_config_to_json(const kiln_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "_class_name", "SD3Transformer2DModel");
    cJSON_AddNumberToObject(o, "sample_size", c->sample_size);
    cJSON_AddNumberToObject(o, "patch_size", c->patch_size);
    cJSON_AddNumberToObject(o, "in_channels", c->in_channels);
    cJSON_AddNumberToObject(o, "num_layers", c->num_layers);
    cJSON_AddNumberToObject(o, "attention_head_dim", c->attention_head_dim);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "joint_attention_dim", c->joint_attention_dim);
    cJSON_AddNumberToObject(o, "caption_projection_dim", c->caption_projection_dim);
    cJSON_AddNumberToObject(o, "pooled_projection_dim", c->pooled_projection_dim);
    cJSON_AddNumberToObject(o, "out_channels", c->out_channels);
    cJSON_AddNumberToObject(o, "pos_embed_max_size", c->pos_embed_max_size);
    cJSON *dual = cJSON_AddArrayToObject(o, "dual_attention_layers");
    for (int i = 0; i < c->num_layers && dual; i++)
        if (c->dual_attention_mask >> i & 1) cJSON_AddItemToArray(dual, cJSON_CreateNumber(i));
    if (c->qk_norm_rms) cJSON_AddStringToObject(o, "qk_norm", "rms_norm");
    else cJSON_AddNullToObject(o, "qk_norm");
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

/* ---- inference from a single-file checkpoint ---------------------------- */

static const kc_tensor *need(const kc_checkpoint *c, const char *name, int ndim, kiln_status *st) {
    const kc_tensor *t = kc_find(c, name);
    if (*st) return NULL;
    if (!t) *st = kb_fail(KILN_ERR_MISSING, "%s: cannot infer the architecture: tensor %s is missing",
                          c->path, name);
    else if (t->ndim != ndim)
        *st = kb_fail(KILN_ERR_SHAPE, "%s: tensor %s has %d dims, expected %d", c->path, name,
                      t->ndim, ndim);
    return *st ? NULL : t;
}

kiln_status sd3_config_infer(const kc_checkpoint *c, kiln_config *cfg) {
    *cfg = sd3_config_defaults();
    kiln_status st = KILN_OK;
    const kc_tensor *pe = need(c, "pos_embed.proj.weight", 4, &st);
    const kc_tensor *tab = need(c, "pos_embed.pos_embed", 3, &st);
    const kc_tensor *ctx = need(c, "context_embedder.weight", 2, &st);
    const kc_tensor *pool = need(c, "time_text_embed.text_embedder.linear_1.weight", 2, &st);
    const kc_tensor *out = need(c, "proj_out.weight", 2, &st);
    if (st) return st;
    int64_t D = pe->shape[0], p = pe->shape[2];
    if (D % 64)
        return kb_fail(KILN_ERR_CONFIG,
                       "%s: width %lld is not a multiple of 64, so the number of attention heads "
                       "cannot be inferred; pass a config.json (--config)", c->path, (long long)D);
    cfg->attention_head_dim = 64; /* every SD3 / SD3.5 release uses 64 */
    cfg->num_attention_heads = (int)(D / 64);
    cfg->in_channels = (int)pe->shape[1];
    cfg->patch_size = (int)p;
    cfg->joint_attention_dim = (int)ctx->shape[1];
    cfg->caption_projection_dim = (int)ctx->shape[0];
    cfg->pooled_projection_dim = (int)pool->shape[1];
    cfg->out_channels = p > 0 ? (int)(out->shape[0] / (p * p)) : 0;
    int64_t m = (int64_t)llround(sqrt((double)tab->shape[1]));
    if (m * m != tab->shape[1])
        return kb_fail(KILN_ERR_SHAPE, "%s: pos_embed has %lld rows, not a square grid", c->path,
                       (long long)tab->shape[1]);
    cfg->pos_embed_max_size = (int)m;
    int layers = 0;
    for (size_t i = 0; i < c->n; i++) {
        const char *n = c->t[i].name;
        if (strncmp(n, "transformer_blocks.", 19)) continue;
        long b = strtol(n + 19, NULL, 10);
        if (b >= 0 && b < SD3_MAX_LAYERS && b + 1 > layers) layers = (int)b + 1;
        if (b >= 0 && b < SD3_MAX_LAYERS && strstr(n, ".attn2.to_q.weight"))
            cfg->dual_attention_mask |= 1ull << b;
    }
    cfg->num_layers = layers;
    cfg->qk_norm_rms = kc_find(c, "transformer_blocks.0.attn.norm_q.weight") != NULL;
    return sd3_config_validate(cfg);
}

/* ---- the expected weights ------------------------------------------------ */

typedef struct {
    ka_spec *s;
    size_t n, cap;
    kiln_status st;
} spec_list;

static void add(spec_list *l, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                const char *fmt, ...) KB_PRINTF(7, 8);
static void add(spec_list *l, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                const char *fmt, ...) {
    if (l->st) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 128;
        ka_spec *ns = realloc(l->s, cap * sizeof *ns);
        if (!ns) {
            l->st = kb_fail(KILN_ERR_NOMEM, "out of memory");
            return;
        }
        l->s = ns;
        l->cap = cap;
    }
    ka_spec *s = &l->s[l->n++];
    memset(s, 0, sizeof *s); /* every field the spec has, then the ones set here */
    s->linear = 0;
    s->split = KA_SPLIT_NONE;
    s->block = -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->shape[2] = d2;
    s->shape[3] = d3;
}

/* Linear(in, out): weight [out, in] and bias [out] */
static void add_linear(spec_list *l, const char *name, int64_t in, int64_t out) {
    add(l, 2, out, in, 0, 0, "%s.weight", name);
    if (!l->st) l->s[l->n - 1].linear = 1;
    add(l, 1, out, 0, 0, 0, "%s.bias", name);
}

/* Tensor parallel (Megatron style): column-parallel linears (q, k, v, FF
 * in) keep a block of output rows, row-parallel ones (attention out, FF
 * out) a block of input columns and rank 0 keeps their bias. part: the
 * name after "transformer_blocks.<i>." */
static int split_of(const char *part) {
    static const char *rows[] = {"attn.to_q.",       "attn.to_k.",       "attn.to_v.",       "attn.add_q_proj.",
                                 "attn.add_k_proj.", "attn.add_v_proj.", "attn2.to_q.",      "attn2.to_k.",
                                 "attn2.to_v.",      "ff.net.0.proj.",   "ff_context.net.0.proj."};
    static const char *cols[] = {"attn.to_out.0.", "attn.to_add_out.", "attn2.to_out.0.", "ff.net.2.",
                                 "ff_context.net.2."};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (!strncmp(part, rows[i], strlen(rows[i]))) return KA_SPLIT_ROWS;
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        if (!strncmp(part, cols[i], strlen(cols[i])))
            return !strcmp(part + strlen(cols[i]), "bias") ? KA_SPLIT_BIAS0 : KA_SPLIT_COLS;
    return KA_SPLIT_NONE;
}

kiln_status sd3_weight_spec(const kiln_config *c, ka_spec **out, size_t *n) {
    spec_list l = {0};
    int64_t D = (int64_t)c->num_attention_heads * c->attention_head_dim, Dh = c->attention_head_dim;
    int64_t p = c->patch_size, M = c->pos_embed_max_size;
    char b[64];
    add(&l, 4, D, c->in_channels, p, p, "pos_embed.proj.weight"); /* the patch conv, as a linear */
    if (!l.st) l.s[l.n - 1].linear = 1;
    add(&l, 1, D, 0, 0, 0, "pos_embed.proj.bias");
    add(&l, 3, 1, M * M, D, 0, "pos_embed.pos_embed");
    add_linear(&l, "time_text_embed.timestep_embedder.linear_1", SD3_TIME_PROJ_DIM, D);
    add_linear(&l, "time_text_embed.timestep_embedder.linear_2", D, D);
    add_linear(&l, "time_text_embed.text_embedder.linear_1", c->pooled_projection_dim, D);
    add_linear(&l, "time_text_embed.text_embedder.linear_2", D, D);
    add_linear(&l, "context_embedder", c->joint_attention_dim, c->caption_projection_dim);
    for (int i = 0; i < c->num_layers; i++) {
        int last = i == c->num_layers - 1, dual = (int)(c->dual_attention_mask >> i & 1);
        char name[112];
#define L(sfx, in, o)                                                 \
    do {                                                              \
        snprintf(name, sizeof name, "%s.%s", b, sfx);                 \
        add_linear(&l, name, in, o);                                  \
    } while (0)
#define NORM(sfx) add(&l, 1, Dh, 0, 0, 0, "%s.%s.weight", b, sfx)
        snprintf(b, sizeof b, "transformer_blocks.%d", i);
        L("norm1.linear", D, (dual ? 9 : 6) * D);
        L("norm1_context.linear", D, (last ? 2 : 6) * D);
        L("attn.to_q", D, D);
        L("attn.to_k", D, D);
        L("attn.to_v", D, D);
        L("attn.add_q_proj", D, D);
        L("attn.add_k_proj", D, D);
        L("attn.add_v_proj", D, D);
        L("attn.to_out.0", D, D);
        if (!last) L("attn.to_add_out", D, D);
        if (c->qk_norm_rms) {
            NORM("attn.norm_q");
            NORM("attn.norm_k");
            NORM("attn.norm_added_q");
            NORM("attn.norm_added_k");
        }
        if (dual) {
            L("attn2.to_q", D, D);
            L("attn2.to_k", D, D);
            L("attn2.to_v", D, D);
            L("attn2.to_out.0", D, D);
            if (c->qk_norm_rms) {
                NORM("attn2.norm_q");
                NORM("attn2.norm_k");
            }
        }
        L("ff.net.0.proj", D, 4 * D);
        L("ff.net.2", 4 * D, D);
        if (!last) {
            L("ff_context.net.0.proj", D, 4 * D);
            L("ff_context.net.2", 4 * D, D);
        }
#undef L
#undef NORM
    }
    add_linear(&l, "norm_out.linear", D, 2 * D);
    add_linear(&l, "proj_out", D, p * p * c->out_channels);
    if (l.st) {
        free(l.s);
        return l.st;
    }
    /* each block's weights: one FSDP block, split by the rules above */
    for (size_t i = 0; i < l.n; i++) {
        ka_spec *s = &l.s[i];
        if (strncmp(s->name, "transformer_blocks.", 19)) continue;
        char *end;
        long b = strtol(s->name + 19, &end, 10);
        if (end == s->name + 19 || *end != '.' || b < 0 || b >= SD3_MAX_LAYERS) continue;
        s->block = (int)b;
        s->split = split_of(end + 1);
    }
    *out = l.s;
    *n = l.n;
    return KILN_OK;
}

kiln_status sd3_check_latent(const kiln_config *c, int64_t H, int64_t W) {
    int p = c->patch_size;
    if (H <= 0 || W <= 0 || H % p || W % p)
        return kb_fail(KILN_ERR_SHAPE, "latent %lldx%lld: height and width must be positive multiples "
                       "of the patch size %d", (long long)H, (long long)W, p);
    if (H / p > c->pos_embed_max_size || W / p > c->pos_embed_max_size)
        return kb_fail(KILN_ERR_RANGE,
                       "latent %lldx%lld is %lldx%lld patches, larger than the position table "
                       "(pos_embed_max_size %d, so at most %d latent rows/columns)",
                       (long long)H, (long long)W, (long long)(H / p), (long long)(W / p),
                       c->pos_embed_max_size, c->pos_embed_max_size * p);
    return KILN_OK;
}
