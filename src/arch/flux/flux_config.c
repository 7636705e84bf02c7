/* flux_config.c - FluxTransformer2DModel's config.json: defaults, parsing
 * with every value checked, serialisation, and the weight list. */
#include "arch/flux/flux.h"
#include "base/base.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

flux_config flux_config_defaults(void) {
    return (flux_config){.in_channels = 64,
                         .out_channels = 64,
                         .num_layers = 19,
                         .num_single_layers = 38,
                         .num_attention_heads = 24,
                         .attention_head_dim = 128,
                         .joint_attention_dim = 4096,
                         .pooled_projection_dim = 768,
                         .axes_dims_rope = {16, 56, 56},
                         .guidance_embeds = 0,
                         .patch_size = 1};
}

kiln_status flux_config_parse(const char *json, flux_config *cfg) {
    *cfg = flux_config_defaults();
    cJSON *root = NULL;
    kiln_status st = ka_json_object(json, &root);
    if (st) return st;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
    if (cls && !(cJSON_IsString(cls) && !strcmp(cls->valuestring, "FluxTransformer2DModel"))) {
        st = kb_fail(KILN_ERR_CONFIG, "config _class_name is %s, the Flux family needs \"FluxTransformer2DModel\"",
                     cJSON_IsString(cls) ? cls->valuestring : "not a string");
        goto done;
    }
    int out_null = 0;
    ka_int_key keys[] = {
        {"in_channels", &cfg->in_channels},
        {"num_layers", &cfg->num_layers},
        {"num_single_layers", &cfg->num_single_layers},
        {"num_attention_heads", &cfg->num_attention_heads},
        {"attention_head_dim", &cfg->attention_head_dim},
        {"joint_attention_dim", &cfg->joint_attention_dim},
        {"pooled_projection_dim", &cfg->pooled_projection_dim},
        {"patch_size", &cfg->patch_size},
    };
    if ((st = ka_json_ints(root, keys, sizeof keys / sizeof *keys))) goto done;
    cfg->out_channels = -1;
    if ((st = ka_json_int(root, "out_channels", &cfg->out_channels, &out_null))) goto done;
    if (out_null) cfg->out_channels = cfg->in_channels;
    if ((st = ka_json_bool(root, "guidance_embeds", &cfg->guidance_embeds))) goto done;
    const cJSON *ax = cJSON_GetObjectItemCaseSensitive(root, "axes_dims_rope");
    if (ax && !cJSON_IsNull(ax)) {
        if (!cJSON_IsArray(ax) || cJSON_GetArraySize(ax) != 3) {
            st = kb_fail(KILN_ERR_CONFIG, "config key \"axes_dims_rope\" must be a list of 3 integers such as [16, 56, 56]");
            goto done;
        }
        for (int i = 0; i < 3; i++) {
            const cJSON *v = cJSON_GetArrayItem(ax, i);
            /* range before the cast: a double past int is undefined to convert */
            if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) <= 65536) || v->valuedouble != floor(v->valuedouble)) {
                st = kb_fail(KILN_ERR_CONFIG, "config axes_dims_rope[%d] must be an integer (at most 65536)", i);
                goto done;
            }
            cfg->axes_dims_rope[i] = (int)v->valuedouble;
        }
    }
    st = flux_config_validate(cfg);
done:
    cJSON_Delete(root);
    return st;
}

kiln_status flux_config_validate(const flux_config *c) {
    struct {
        const char *key;
        int v, lo, hi;
    } r[] = {
        {"in_channels", c->in_channels, 4, 1 << 12},
        {"out_channels", c->out_channels, 4, 1 << 12},
        {"num_layers", c->num_layers, 0, FLUX_MAX_LAYERS},
        {"num_single_layers", c->num_single_layers, 0, FLUX_MAX_LAYERS},
        {"num_attention_heads", c->num_attention_heads, 1, 1 << 10},
        {"attention_head_dim", c->attention_head_dim, 2, 1 << 12},
        {"joint_attention_dim", c->joint_attention_dim, 1, 1 << 16},
        {"pooled_projection_dim", c->pooled_projection_dim, 1, 1 << 16},
        {"patch_size", c->patch_size, 1, 1},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return kb_fail(KILN_ERR_CONFIG, "config %s = %d is impossible (allowed %d..%d)", r[i].key, r[i].v, r[i].lo,
                           r[i].hi);
    if (c->in_channels % 4 || c->out_channels != c->in_channels)
        return kb_fail(KILN_ERR_CONFIG, "config in_channels = %d and out_channels = %d: kiln runs Flux with out_channels "
                       "equal to in_channels, a multiple of 4 (2x2 packed latent patches)", c->in_channels, c->out_channels);
    int64_t D = (int64_t)c->num_attention_heads * c->attention_head_dim;
    if (D > (1 << 16))
        return kb_fail(KILN_ERR_CONFIG, "config num_attention_heads x attention_head_dim = %lld is too large (at most 65536)",
                       (long long)D);
    if (c->num_layers + c->num_single_layers < 1)
        return kb_fail(KILN_ERR_CONFIG, "config num_layers + num_single_layers = 0: the model has no blocks");
    int sum = 0;
    for (int i = 0; i < 3; i++) {
        if (c->axes_dims_rope[i] < 0 || c->axes_dims_rope[i] % 2)
            return kb_fail(KILN_ERR_CONFIG, "config axes_dims_rope[%d] = %d must be even and not negative", i,
                           c->axes_dims_rope[i]);
        sum += c->axes_dims_rope[i];
    }
    if (sum != c->attention_head_dim)
        return kb_fail(KILN_ERR_CONFIG, "config axes_dims_rope sum to %d, attention_head_dim is %d (they must agree)", sum,
                       c->attention_head_dim);
    return KILN_OK;
}

char *flux_config_to_json(const flux_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "_class_name", "FluxTransformer2DModel");
    cJSON_AddNumberToObject(o, "in_channels", c->in_channels);
    cJSON_AddNumberToObject(o, "out_channels", c->out_channels);
    cJSON_AddNumberToObject(o, "num_layers", c->num_layers);
    cJSON_AddNumberToObject(o, "num_single_layers", c->num_single_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "attention_head_dim", c->attention_head_dim);
    cJSON_AddNumberToObject(o, "joint_attention_dim", c->joint_attention_dim);
    cJSON_AddNumberToObject(o, "pooled_projection_dim", c->pooled_projection_dim);
    cJSON_AddNumberToObject(o, "patch_size", c->patch_size);
    cJSON *ax = cJSON_AddArrayToObject(o, "axes_dims_rope");
    for (int i = 0; ax && i < 3; i++) cJSON_AddItemToArray(ax, cJSON_CreateNumber(c->axes_dims_rope[i]));
    cJSON_AddBoolToObject(o, "guidance_embeds", c->guidance_embeds);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

kiln_status flux_check_latent(const flux_config *c, int64_t H, int64_t W) {
    (void)c;
    if (H <= 0 || W <= 0 || H % 2 || W % 2)
        return kb_fail(KILN_ERR_SHAPE, "flux: the latent is %lldx%lld; its height and width must be even and positive "
                       "(2x2 patches; an image side a multiple of 16)", (long long)H, (long long)W);
    if ((H / 2) * (W / 2) > FLUX_MAX_TOKENS)
        return kb_fail(KILN_ERR_SHAPE, "flux: the %lldx%lld latent has %lld image tokens, at most %d", (long long)H,
                       (long long)W, (long long)((H / 2) * (W / 2)), FLUX_MAX_TOKENS);
    return KILN_OK;
}

/* ---- the weights ---------------------------------------------------------- */

typedef struct {
    ka_spec *s;
    size_t n, cap;
    int ok;
} list;

/* how tensor parallel splits a linear: replicated, column-parallel (output
 * rows), row-parallel (input columns, the bias on rank 0), row-parallel over
 * [attention | MLP] (a single block's proj_out) */
enum { REP, COL, ROW, ROW_1_4 };

/* a linear's weight [M, K] and bias [M] */
static void lin_split(list *l, int block, int split, int64_t M, int64_t K, const char *fmt, int i) {
    static const int ws[4] = {KA_SPLIT_NONE, KA_SPLIT_ROWS, KA_SPLIT_COLS, KA_SPLIT_COLS_1_4},
                     bs[4] = {KA_SPLIT_NONE, KA_SPLIT_ROWS, KA_SPLIT_BIAS0, KA_SPLIT_BIAS0};
    char base[112];
    snprintf(base, sizeof base, fmt, i);
    ka_spec *w = ka_spec_add(&l->s, &l->n, &l->cap, 2, (int64_t[]){M, K}, "%s.weight", base);
    if (w) w->linear = 1, w->block = block, w->split = ws[split];
    ka_spec *b = ka_spec_add(&l->s, &l->n, &l->cap, 1, (int64_t[]){M}, "%s.bias", base);
    if (b) b->block = block, b->split = bs[split];
    if (!w || !b) l->ok = 0;
}

static void lin(list *l, int block, int64_t M, int64_t K, const char *fmt, int i) { lin_split(l, block, REP, M, K, fmt, i); }

static void vec(list *l, int block, int64_t n, const char *fmt, int i) {
    ka_spec *e = ka_spec_add(&l->s, &l->n, &l->cap, 1, (int64_t[]){n}, fmt, i);
    if (e) e->block = block;
    else l->ok = 0;
}

kiln_status flux_weight_spec(const flux_config *c, ka_spec **out, size_t *n) {
    list l = {NULL, 0, 0, 1};
    int64_t D = (int64_t)c->num_attention_heads * c->attention_head_dim, Dh = c->attention_head_dim, F = 4 * D;
    lin(&l, -1, D, c->in_channels, "x_embedder", 0);
    lin(&l, -1, D, c->joint_attention_dim, "context_embedder", 0);
    lin(&l, -1, D, FLUX_TIME_PROJ_DIM, "time_text_embed.timestep_embedder.linear_1", 0);
    lin(&l, -1, D, D, "time_text_embed.timestep_embedder.linear_2", 0);
    if (c->guidance_embeds) {
        lin(&l, -1, D, FLUX_TIME_PROJ_DIM, "time_text_embed.guidance_embedder.linear_1", 0);
        lin(&l, -1, D, D, "time_text_embed.guidance_embedder.linear_2", 0);
    }
    lin(&l, -1, D, c->pooled_projection_dim, "time_text_embed.text_embedder.linear_1", 0);
    lin(&l, -1, D, D, "time_text_embed.text_embedder.linear_2", 0);
    for (int i = 0; i < c->num_layers && l.ok; i++) {
        lin(&l, i, 6 * D, D, "transformer_blocks.%d.norm1.linear", i);
        lin(&l, i, 6 * D, D, "transformer_blocks.%d.norm1_context.linear", i);
        const char *proj[6] = {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"};
        for (int k = 0; k < 6; k++) {
            char fmt[80];
            snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.attn.%s", proj[k]);
            lin_split(&l, i, COL, D, D, fmt, i);
        }
        const char *norms[4] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (int k = 0; k < 4; k++) {
            char fmt[80];
            snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.attn.%s.weight", norms[k]);
            vec(&l, i, Dh, fmt, i);
        }
        lin_split(&l, i, ROW, D, D, "transformer_blocks.%d.attn.to_out.0", i);
        lin_split(&l, i, ROW, D, D, "transformer_blocks.%d.attn.to_add_out", i);
        lin_split(&l, i, COL, F, D, "transformer_blocks.%d.ff.net.0.proj", i);
        lin_split(&l, i, ROW, D, F, "transformer_blocks.%d.ff.net.2", i);
        lin_split(&l, i, COL, F, D, "transformer_blocks.%d.ff_context.net.0.proj", i);
        lin_split(&l, i, ROW, D, F, "transformer_blocks.%d.ff_context.net.2", i);
    }
    for (int j = 0; j < c->num_single_layers && l.ok; j++) {
        int blk = c->num_layers + j;
        lin(&l, blk, 3 * D, D, "single_transformer_blocks.%d.norm.linear", j);
        lin_split(&l, blk, COL, D, D, "single_transformer_blocks.%d.attn.to_q", j);
        lin_split(&l, blk, COL, D, D, "single_transformer_blocks.%d.attn.to_k", j);
        lin_split(&l, blk, COL, D, D, "single_transformer_blocks.%d.attn.to_v", j);
        vec(&l, blk, Dh, "single_transformer_blocks.%d.attn.norm_q.weight", j);
        vec(&l, blk, Dh, "single_transformer_blocks.%d.attn.norm_k.weight", j);
        lin_split(&l, blk, COL, F, D, "single_transformer_blocks.%d.proj_mlp", j);
        lin_split(&l, blk, ROW_1_4, D, D + F, "single_transformer_blocks.%d.proj_out", j);
    }
    lin(&l, -1, 2 * D, D, "norm_out.linear", 0);
    lin(&l, -1, c->out_channels, D, "proj_out", 0);
    if (!l.ok) {
        free(l.s);
        return kb_fail(KILN_ERR_NOMEM, "flux: out of memory listing the weights");
    }
    *out = l.s;
    *n = l.n;
    return KILN_OK;
}

/* ---- a config from the tensors (a single file without config.json) ------------ */

static const kc_tensor *shape2(const kc_checkpoint *c, const char *name) {
    const kc_tensor *t = kc_find(c, name);
    return t && t->ndim == 2 ? t : NULL;
}

kiln_status flux_config_infer(const kc_checkpoint *c, flux_config *x, int guided) {
    *x = flux_config_defaults();
    const kc_tensor *xe = shape2(c, "x_embedder.weight"), *ce = shape2(c, "context_embedder.weight"),
                    *te = shape2(c, "time_text_embed.text_embedder.linear_1.weight"), *po = shape2(c, "proj_out.weight");
    if (!xe || !ce || !te || !po)
        return kb_fail(KILN_ERR_CONFIG, "%s: no Flux transformer here (x_embedder, context_embedder, the text embedder and "
                       "proj_out as [out, in] matrices)", c->path);
    int has_guidance = kc_find(c, "time_text_embed.guidance_embedder.linear_1.weight") != NULL;
    if (has_guidance != guided)
        return kb_fail(KILN_ERR_CONFIG, "%s: %s a guidance embedding (guidance_in): the %s family's", c->path,
                       has_guidance ? "has" : "has no", has_guidance ? "flux" : "flux-schnell");
    const kc_tensor *all[4] = {xe, ce, te, po};
    for (int k = 0; k < 4; k++)
        if (all[k]->shape[0] > (1 << 20) || all[k]->shape[1] > (1 << 20))
            return kb_fail(KILN_ERR_CONFIG, "%s: %s is [%lld, %lld]: no Flux transformer is that wide", c->path, all[k]->name,
                           (long long)all[k]->shape[0], (long long)all[k]->shape[1]);
    int64_t D = xe->shape[0];
    int layers = 0, singles = 0;
    char name[128];
    for (;;) {
        snprintf(name, sizeof name, "transformer_blocks.%d.norm1.linear.weight", layers);
        if (!kc_find(c, name) || layers >= FLUX_MAX_LAYERS) break;
        layers++;
    }
    for (;;) {
        snprintf(name, sizeof name, "single_transformer_blocks.%d.norm.linear.weight", singles);
        if (!kc_find(c, name) || singles >= FLUX_MAX_LAYERS) break;
        singles++;
    }
    const kc_tensor *nq = kc_find(c, layers ? "transformer_blocks.0.attn.norm_q.weight" : "single_transformer_blocks.0.attn.norm_q.weight");
    if (!nq || nq->ndim != 1 || nq->shape[0] < 2 || D % nq->shape[0])
        return kb_fail(KILN_ERR_CONFIG, "%s: the q norm's scale does not give a head width that divides %lld", c->path,
                       (long long)D);
    int64_t Dh = nq->shape[0];
    if (Dh != 128)
        return kb_fail(KILN_ERR_CONFIG, "%s: heads of %lld: the rotary axes cannot be read from the tensors (Flux.1's "
                       "are 16, 56, 56 for heads of 128); give its config.json (--config)", c->path, (long long)Dh);
    x->in_channels = (int)xe->shape[1];
    x->out_channels = (int)po->shape[0];
    x->joint_attention_dim = (int)ce->shape[1];
    x->pooled_projection_dim = (int)te->shape[1];
    x->num_layers = layers;
    x->num_single_layers = singles;
    x->attention_head_dim = (int)Dh;
    x->num_attention_heads = (int)(D / Dh);
    x->guidance_embeds = guided;
    return flux_config_validate(x);
}
