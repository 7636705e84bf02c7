/* vae_config.c - AutoencoderKL's config: defaults, parsing, validation,
 * serialisation, and the weights of its file. */
#include "arch/vae/vae.h"
#include "base/base.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

vae_config vae_config_defaults(void) {
    vae_config c = {
        .in_channels = 3,
        .out_channels = 3,
        .latent_channels = 4,
        .n_blocks = 1,
        .block_out_channels = {64},
        .layers_per_block = 1,
        .norm_num_groups = 32,
        .mid_block_add_attention = 1,
        .use_quant_conv = 1,
        .use_post_quant_conv = 1,
        .sample_size = 32,
        .scaling_factor = 0.18215,
        .shift_factor = 0,
        .has_shift = 0,
    };
    return c;
}

/* every entry of a list of block types must be `want`; *n receives its length */
static kiln_status block_types(const cJSON *root, const char *key, const char *want, int *n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return KILN_OK;
    if (!cJSON_IsArray(v)) return kb_fail(KILN_ERR_CONFIG, "config key \"%s\" must be a list of block types", key);
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e) || strcmp(e->valuestring, want))
            return kb_fail(KILN_ERR_CONFIG, "config %s[%d] is %s, kiln's AutoencoderKL runs %s blocks only", key, k,
                           cJSON_IsString(e) ? e->valuestring : "not a string", want);
        k++;
    }
    *n = k;
    return KILN_OK;
}

kiln_status vae_config_parse(const char *json, vae_config *cfg) {
    *cfg = vae_config_defaults();
    cJSON *root = NULL;
    kiln_status st = ka_json_object(json, &root);
    if (st) return st;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
    if (!cJSON_IsString(cls) || strcmp(cls->valuestring, "AutoencoderKL")) {
        st = kb_fail(KILN_ERR_CONFIG, "config _class_name is %s, the VAE family runs AutoencoderKL",
                     cJSON_IsString(cls) ? cls->valuestring : "missing or not a string");
        goto done;
    }
    struct {
        const char *key;
        int *field;
    } ints[] = {
        {"in_channels", &cfg->in_channels},         {"out_channels", &cfg->out_channels},
        {"latent_channels", &cfg->latent_channels}, {"layers_per_block", &cfg->layers_per_block},
        {"norm_num_groups", &cfg->norm_num_groups},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if ((st = ka_json_int(root, ints[i].key, ints[i].field, NULL))) goto done;
    struct {
        const char *key;
        int *field;
    } bools[] = {{"use_quant_conv", &cfg->use_quant_conv},
                 {"use_post_quant_conv", &cfg->use_post_quant_conv},
                 {"mid_block_add_attention", &cfg->mid_block_add_attention}};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++)
        if ((st = ka_json_bool(root, bools[i].key, bools[i].field))) goto done;
    if ((st = ka_json_num(root, "scaling_factor", &cfg->scaling_factor, NULL))) goto done;
    if ((st = ka_json_num(root, "shift_factor", &cfg->shift_factor, &cfg->has_shift))) goto done;
    if (!cfg->has_shift) cfg->shift_factor = 0;
    /* sample_size (the training size, which no forward reads) may be a
     * pair [h, w] in some configs: then its first entry is kept */
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(root, "sample_size");
    if (cJSON_IsArray(ss) && cJSON_GetArraySize(ss) > 0) {
        cJSON *holder = cJSON_CreateObject();
        cJSON_AddItemReferenceToObject(holder, "sample_size", cJSON_GetArrayItem(ss, 0));
        st = ka_json_int(holder, "sample_size", &cfg->sample_size, NULL);
        cJSON_Delete(holder);
    } else {
        st = ka_json_int(root, "sample_size", &cfg->sample_size, NULL);
    }
    if (st) goto done;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "act_fn");
    if (act && !cJSON_IsNull(act) && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu"))) {
        st = kb_fail(KILN_ERR_CONFIG, "config act_fn is %s, kiln's AutoencoderKL runs silu",
                     cJSON_IsString(act) ? act->valuestring : "not a string");
        goto done;
    }
    const cJSON *boc = cJSON_GetObjectItemCaseSensitive(root, "block_out_channels");
    if (boc && !cJSON_IsNull(boc)) {
        int n = cJSON_IsArray(boc) ? cJSON_GetArraySize(boc) : -1;
        if (n < 1 || n > VAE_MAX_BLOCKS) {
            st = kb_fail(KILN_ERR_CONFIG, "config block_out_channels must be a list of 1 to %d channel counts",
                         VAE_MAX_BLOCKS);
            goto done;
        }
        for (int i = 0; i < n; i++) {
            const cJSON *e = cJSON_GetArrayItem(boc, i);
            double d = cJSON_IsNumber(e) ? e->valuedouble : NAN;
            if (!(d == floor(d)) || d < 1 || d > 1 << 14) {
                st = kb_fail(KILN_ERR_CONFIG, "config block_out_channels[%d] must be an integer in 1..%d", i, 1 << 14);
                goto done;
            }
            cfg->block_out_channels[i] = (int)d;
        }
        cfg->n_blocks = n;
    }
    int nd = cfg->n_blocks, nu = cfg->n_blocks;
    if ((st = block_types(root, "down_block_types", "DownEncoderBlock2D", &nd))) goto done;
    if ((st = block_types(root, "up_block_types", "UpDecoderBlock2D", &nu))) goto done;
    if (nd != cfg->n_blocks || nu != cfg->n_blocks) {
        st = kb_fail(KILN_ERR_CONFIG, "config has %d block_out_channels, %d down_block_types and %d up_block_types: "
                     "the three must have one entry per block", cfg->n_blocks, nd, nu);
        goto done;
    }
    st = vae_config_validate(cfg);
done:
    cJSON_Delete(root);
    return st;
}

kiln_status vae_config_validate(const vae_config *c) {
    struct {
        const char *key;
        int v, lo, hi;
    } r[] = {
        {"in_channels", c->in_channels, 1, 64},
        {"out_channels", c->out_channels, 1, 64},
        {"latent_channels", c->latent_channels, 1, 1 << 10},
        {"layers_per_block", c->layers_per_block, 1, 64},
        {"norm_num_groups", c->norm_num_groups, 1, 1 << 12},
        {"number of blocks (block_out_channels)", c->n_blocks, 1, VAE_MAX_BLOCKS},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return kb_fail(KILN_ERR_CONFIG, "config %s = %d is impossible (allowed %d..%d)", r[i].key, r[i].v, r[i].lo,
                           r[i].hi);
    for (int i = 0; i < c->n_blocks; i++) {
        int ch = c->block_out_channels[i];
        if (ch < 1 || ch > 1 << 14)
            return kb_fail(KILN_ERR_CONFIG, "config block_out_channels[%d] = %d is impossible (allowed 1..%d)", i, ch,
                           1 << 14);
        if (ch % c->norm_num_groups)
            return kb_fail(KILN_ERR_CONFIG, "config block_out_channels[%d] = %d is not a multiple of norm_num_groups = %d "
                           "(GroupNorm splits the channels into equal groups)", i, ch, c->norm_num_groups);
    }
    if (!isfinite(c->scaling_factor) || c->scaling_factor == 0)
        return kb_fail(KILN_ERR_CONFIG, "config scaling_factor = %g is impossible (latents are divided by it)",
                       c->scaling_factor);
    if (!isfinite(c->shift_factor)) return kb_fail(KILN_ERR_CONFIG, "config shift_factor must be finite");
    return KILN_OK;
}

char *vae_config_to_json(const vae_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "_class_name", "AutoencoderKL");
    cJSON_AddStringToObject(o, "act_fn", "silu");
    cJSON_AddNumberToObject(o, "in_channels", c->in_channels);
    cJSON_AddNumberToObject(o, "out_channels", c->out_channels);
    cJSON_AddNumberToObject(o, "latent_channels", c->latent_channels);
    cJSON *boc = cJSON_AddArrayToObject(o, "block_out_channels");
    cJSON *down = cJSON_AddArrayToObject(o, "down_block_types");
    cJSON *up = cJSON_AddArrayToObject(o, "up_block_types");
    for (int i = 0; i < c->n_blocks && boc && down && up; i++) {
        cJSON_AddItemToArray(boc, cJSON_CreateNumber(c->block_out_channels[i]));
        cJSON_AddItemToArray(down, cJSON_CreateString("DownEncoderBlock2D"));
        cJSON_AddItemToArray(up, cJSON_CreateString("UpDecoderBlock2D"));
    }
    cJSON_AddNumberToObject(o, "layers_per_block", c->layers_per_block);
    cJSON_AddNumberToObject(o, "norm_num_groups", c->norm_num_groups);
    cJSON_AddNumberToObject(o, "sample_size", c->sample_size);
    ka_json_add_num(o, "scaling_factor", c->scaling_factor);
    if (c->has_shift) ka_json_add_num(o, "shift_factor", c->shift_factor);
    else cJSON_AddNullToObject(o, "shift_factor");
    cJSON_AddBoolToObject(o, "mid_block_add_attention", c->mid_block_add_attention);
    cJSON_AddBoolToObject(o, "use_quant_conv", c->use_quant_conv);
    cJSON_AddBoolToObject(o, "use_post_quant_conv", c->use_post_quant_conv);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

int64_t vae_scale(const vae_config *c) { return (int64_t)1 << (c->n_blocks - 1); }

/* ---- the weights -------------------------------------------------------------- */

typedef struct {
    ka_spec *s;
    size_t n, cap;
    kiln_status st;
} spec_list;

static void add(spec_list *l, int linear, int ndim, const int64_t *shape, const char *fmt, ...) KB_PRINTF(5, 6);
static void add(spec_list *l, int linear, int ndim, const int64_t *shape, const char *fmt, ...) {
    if (l->st) return;
    char name[112];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    ka_spec *e = ka_spec_add(&l->s, &l->n, &l->cap, ndim, shape, "%s", name);
    if (!e) l->st = kb_fail(KILN_ERR_NOMEM, "out of memory listing the VAE's weights");
    else e->linear = linear;
}

/* Conv2d(cin, cout, k): weight [cout, cin, k, k], packed at conversion in
 * the fast convolution's layout (ka_spec.conv; f32 row-major for the
 * reference), bias [cout] */
static void conv(spec_list *l, const char *base, int64_t cin, int64_t cout, int64_t k) {
    add(l, 0, 4, (int64_t[]){cout, cin, k, k}, "%s.weight", base);
    if (!l->st) l->s[l->n - 1].conv = 1;
    add(l, 0, 1, (int64_t[]){cout}, "%s.bias", base);
}

/* a Conv2d that stays f32 in a bf16 model (ka_spec.keep_f32): the
 * convolutions that read the latent or the image, so those are not rounded
 * to bf16 (a 1024x1024 decode: 9.5e-3 against f32 instead of 9.9e-3; the
 * convolution is tiny: 16 or 3 input channels) */
static void conv_f32(spec_list *l, const char *base, int64_t cin, int64_t cout, int64_t k) {
    conv(l, base, cin, cout, k);
    if (!l->st) l->s[l->n - 2].keep_f32 = 1;
}

static void norm(spec_list *l, const char *base, int64_t ch) {
    add(l, 0, 1, (int64_t[]){ch}, "%s.weight", base);
    add(l, 0, 1, (int64_t[]){ch}, "%s.bias", base);
}

/* Linear(ch, ch): packed for the fast GEMM */
static void linear(spec_list *l, const char *base, int64_t ch) {
    add(l, 1, 2, (int64_t[]){ch, ch}, "%s.weight", base);
    add(l, 0, 1, (int64_t[]){ch}, "%s.bias", base);
}

/* ResnetBlock2D(cin, cout), no time embedding */
static void resnet(spec_list *l, const char *base, int64_t cin, int64_t cout) {
    char b[112];
    snprintf(b, sizeof b, "%s.norm1", base);
    norm(l, b, cin);
    snprintf(b, sizeof b, "%s.conv1", base);
    conv(l, b, cin, cout, 3);
    snprintf(b, sizeof b, "%s.norm2", base);
    norm(l, b, cout);
    snprintf(b, sizeof b, "%s.conv2", base);
    conv(l, b, cout, cout, 3);
    if (cin != cout) {
        snprintf(b, sizeof b, "%s.conv_shortcut", base);
        conv(l, b, cin, cout, 1);
    }
}

/* UNetMidBlock2D: resnet, attention (group norm, q, k, v, out), resnet */
static void mid_block(spec_list *l, const char *part, int64_t ch, int attn) {
    char b[112];
    snprintf(b, sizeof b, "%s.mid_block.resnets.0", part);
    resnet(l, b, ch, ch);
    if (attn) {
        static const char *lin[] = {"to_q", "to_k", "to_v", "to_out.0"};
        snprintf(b, sizeof b, "%s.mid_block.attentions.0.group_norm", part);
        norm(l, b, ch);
        for (int i = 0; i < 4; i++) {
            snprintf(b, sizeof b, "%s.mid_block.attentions.0.%s", part, lin[i]);
            linear(l, b, ch);
        }
    }
    snprintf(b, sizeof b, "%s.mid_block.resnets.1", part);
    resnet(l, b, ch, ch);
}

kiln_status vae_weight_spec(const vae_config *c, ka_spec **out, size_t *n) {
    spec_list l = {0};
    const int *boc = c->block_out_channels;
    int nb = c->n_blocks, L = c->latent_channels;
    char b[112];
    /* Encoder: conv_in, down blocks (resnets, a stride-2 conv but the last),
     * mid block, norm_out, conv_out to mean and log-variance (2 L) */
    conv_f32(&l, "encoder.conv_in", c->in_channels, boc[0], 3);
    for (int i = 0, cin = boc[0]; i < nb; i++) {
        for (int j = 0; j < c->layers_per_block; j++) {
            snprintf(b, sizeof b, "encoder.down_blocks.%d.resnets.%d", i, j);
            resnet(&l, b, j ? boc[i] : cin, boc[i]);
        }
        if (i < nb - 1) {
            snprintf(b, sizeof b, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            conv(&l, b, boc[i], boc[i], 3);
        }
        cin = boc[i];
    }
    mid_block(&l, "encoder", boc[nb - 1], c->mid_block_add_attention);
    norm(&l, "encoder.conv_norm_out", boc[nb - 1]);
    conv(&l, "encoder.conv_out", boc[nb - 1], 2 * L, 3);
    if (c->use_quant_conv) conv(&l, "quant_conv", 2 * L, 2 * L, 1);
    if (c->use_post_quant_conv) conv_f32(&l, "post_quant_conv", L, L, 1);
    /* Decoder: conv_in, mid block, up blocks over the reversed channels
     * (layers_per_block + 1 resnets, a nearest upsample + conv but the
     * last), norm_out, conv_out */
    conv_f32(&l, "decoder.conv_in", L, boc[nb - 1], 3);
    mid_block(&l, "decoder", boc[nb - 1], c->mid_block_add_attention);
    for (int i = 0, cin = boc[nb - 1]; i < nb; i++) {
        int cout = boc[nb - 1 - i];
        for (int j = 0; j <= c->layers_per_block; j++) {
            snprintf(b, sizeof b, "decoder.up_blocks.%d.resnets.%d", i, j);
            resnet(&l, b, j ? cout : cin, cout);
        }
        if (i < nb - 1) {
            snprintf(b, sizeof b, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            conv(&l, b, cout, cout, 3);
            if (!l.st) l.s[l.n - 2].up2 = 1; /* folded with its upsample (vae_forward.c: kg_conv2d_up2) */
        }
        cin = cout;
    }
    norm(&l, "decoder.conv_norm_out", boc[0]);
    conv(&l, "decoder.conv_out", boc[0], c->out_channels, 3);
    if (l.st) {
        free(l.s);
        return l.st;
    }
    *out = l.s;
    *n = l.n;
    return KILN_OK;
}

kiln_status vae_check_latent(const vae_config *c, int64_t batch, int64_t h, int64_t w) {
    (void)c;
    if (batch < 1 || batch > VAE_MAX_BATCH)
        return kb_fail(KILN_ERR_SHAPE, "VAE batch %lld is outside 1..%d", (long long)batch, VAE_MAX_BATCH);
    if (h < 1 || w < 1 || h > VAE_MAX_SIDE || w > VAE_MAX_SIDE)
        return kb_fail(KILN_ERR_SHAPE, "VAE latent %lldx%lld (height x width): each side must be in 1..%d", (long long)h,
                       (long long)w, VAE_MAX_SIDE);
    return KILN_OK;
}
