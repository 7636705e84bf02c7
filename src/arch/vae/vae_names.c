/* vae_names.c - the original LDM names of an AutoencoderKL (a standalone
 * LDM VAE file, or first_stage_model.* inside an all-in-one SD3 checkpoint)
 * as diffusers names, the map diffusers' convert_ldm_vae_checkpoint makes:
 *
 *   {en,de}coder.conv_in / conv_out            -> the same
 *   {en,de}coder.norm_out                      -> {en,de}coder.conv_norm_out
 *   encoder.down.I.block.J.{norm1,conv1,...}   -> encoder.down_blocks.I.resnets.J.*
 *   encoder.down.I.downsample.conv             -> encoder.down_blocks.I.downsamplers.0.conv
 *   decoder.up.I.block.J / upsample.conv       -> decoder.up_blocks.(L-1-I).resnets.J / upsamplers.0.conv
 *                                                 (LDM counts up blocks from the smallest image, diffusers
 *                                                 in the order they run; L = number of up blocks)
 *   *.nin_shortcut                             -> *.conv_shortcut
 *   {en,de}coder.mid.block_1 / block_2         -> *.mid_block.resnets.0 / 1
 *   {en,de}coder.mid.attn_1.{norm,q,k,v,proj_out}
 *                                              -> *.mid_block.attentions.0.{group_norm,to_q,to_k,to_v,to_out.0}
 *                                                 (q, k, v, proj_out weights are 1x1 convs [C, C, 1, 1] in LDM,
 *                                                 diffusers' Linear [C, C]: same bytes, squeezed)
 *   quant_conv, post_quant_conv                -> the same
 *
 * Applied by the checkpoint layer as views (kc_renamer). */
#include "arch/vae/vae.h"
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_prefix[] = "first_stage_model.";

static const char *strip_prefix(const char *name) {
    return strncmp(name, k_prefix, sizeof k_prefix - 1) ? name : name + sizeof k_prefix - 1;
}

/* state[0]: the number of decoder up blocks (its up.I are reversed) */
static int detect(const char *const *names, size_t n, int64_t state[4]) {
    int found = 0;
    state[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = strip_prefix(names[i]);
        if (!strncmp(s, "decoder.mid.block_1.", 20) || !strncmp(s, "encoder.mid.block_1.", 20)) found = 1;
        if (!strncmp(s, "decoder.up.", 11)) {
            long b = strtol(s + 11, NULL, 10);
            if (b >= 0 && b < VAE_MAX_BLOCKS && b + 1 > state[0]) state[0] = b + 1;
        }
    }
    return found;
}

/* the tail of a resnet inside a block (norm1, conv1, norm2, conv2, nin_shortcut) */
static void resnet_tail(char *out, size_t cap, const char *base, const char *tail) {
    if (!strncmp(tail, "nin_shortcut", 12)) snprintf(out, cap, "%s.conv_shortcut%s", base, tail + 12);
    else snprintf(out, cap, "%s.%s", base, tail);
}

/* "I.rest": the index and what follows its dot; 0 when there is none */
static int index_of(const char *s, long *i, const char **rest) {
    char *end;
    *i = strtol(s, &end, 10);
    if (end == s || *end != '.' || *i < 0 || *i >= VAE_MAX_BLOCKS * 64) return 0;
    *rest = end + 1;
    return 1;
}

static int rename_vae(const int64_t state[4], const char *name, kc_rename *r) {
    const char *n = strip_prefix(name);
    char *to = r->to[0];
    size_t cap = sizeof r->to[0];
    r->n = 1;
    if (!strncmp(n, "quant_conv.", 11) || !strncmp(n, "post_quant_conv.", 16)) {
        snprintf(to, cap, "%s", n);
        return n != name; /* renamed only when a prefix was stripped */
    }
    const char *part = !strncmp(n, "encoder.", 8) ? "encoder" : !strncmp(n, "decoder.", 8) ? "decoder" : NULL;
    if (!part) return 0;
    const char *s = n + 8, *rest;
    long i, j;
    char base[112];
    if (!strncmp(s, "conv_in.", 8) || !strncmp(s, "conv_out.", 9)) {
        snprintf(to, cap, "%s.%s", part, s);
        return 1;
    }
    if (!strncmp(s, "norm_out.", 9)) {
        snprintf(to, cap, "%s.conv_norm_out.%s", part, s + 9);
        return 1;
    }
    if (!strncmp(s, "mid.", 4)) {
        s += 4;
        if (!strncmp(s, "block_1.", 8) || !strncmp(s, "block_2.", 8)) {
            snprintf(base, sizeof base, "%s.mid_block.resnets.%d", part, s[6] - '1');
            resnet_tail(to, cap, base, s + 8);
            return 1;
        }
        if (strncmp(s, "attn_1.", 7)) return 0;
        s += 7;
        static const struct {
            const char *from, *to;
        } attn[] = {{"norm.", "group_norm."}, {"q.", "to_q."}, {"k.", "to_k."}, {"v.", "to_v."}, {"proj_out.", "to_out.0."}};
        for (size_t k = 0; k < sizeof attn / sizeof attn[0]; k++) {
            size_t l = strlen(attn[k].from);
            if (strncmp(s, attn[k].from, l)) continue;
            snprintf(to, cap, "%s.mid_block.attentions.0.%s%s", part, attn[k].to, s + l);
            r->squeeze = k > 0; /* the 1x1 conv weights as the Linear's */
            return 1;
        }
        return 0;
    }
    int enc = part[0] == 'e';
    const char *blocks = enc ? "down." : "up.";
    size_t bl = strlen(blocks);
    if (strncmp(s, blocks, bl) || !index_of(s + bl, &i, &rest)) return 0;
    if (!enc) {
        if (i >= state[0]) return 0;
        i = state[0] - 1 - i; /* LDM's up.I is diffusers' up_blocks.(L-1-I) */
    }
    const char *kind = enc ? "down_blocks" : "up_blocks";
    if (!strncmp(rest, "block.", 6) && index_of(rest + 6, &j, &rest)) {
        snprintf(base, sizeof base, "%s.%s.%ld.resnets.%ld", part, kind, i, j);
        resnet_tail(to, cap, base, rest);
        return 1;
    }
    const char *sampler = enc ? "downsample.conv." : "upsample.conv.";
    size_t sl = strlen(sampler);
    if (!strncmp(rest, sampler, sl)) {
        snprintf(to, cap, "%s.%s.%ld.%s.0.conv.%s", part, kind, i, enc ? "downsamplers" : "upsamplers", rest + sl);
        return 1;
    }
    return 0;
}

const kc_renamer vae_ldm_renamer = {"ldm-vae", detect, rename_vae};

/* ---- inference from the tensors' shapes (diffusers names) --------------------- */

static const kc_tensor *need(const kc_checkpoint *c, const char *name, int ndim, kiln_status *st) {
    if (*st) return NULL;
    const kc_tensor *t = kc_find(c, name);
    if (!t) *st = kb_fail(KILN_ERR_MISSING, "%s: cannot infer the VAE's config: tensor %s is missing", c->path, name);
    else if (t->ndim != ndim)
        *st = kb_fail(KILN_ERR_SHAPE, "%s: tensor %s has %d dims, expected %d", c->path, name, t->ndim, ndim);
    return *st ? NULL : t;
}

static int count_index(const kc_checkpoint *c, const char *fmt_prefix, size_t pl) {
    int n = 0;
    for (size_t i = 0; i < c->n; i++) {
        const char *s = c->t[i].name;
        if (strncmp(s, fmt_prefix, pl)) continue;
        long b = strtol(s + pl, NULL, 10);
        if (b >= 0 && b < 1024 && b + 1 > n) n = (int)b + 1;
    }
    return n;
}

kiln_status vae_config_infer(const kc_checkpoint *c, vae_config *cfg) {
    *cfg = vae_config_defaults();
    kiln_status st = KILN_OK;
    const kc_tensor *ein = need(c, "encoder.conv_in.weight", 4, &st);
    const kc_tensor *din = need(c, "decoder.conv_in.weight", 4, &st);
    const kc_tensor *dout = need(c, "decoder.conv_out.weight", 4, &st);
    if (st) return st;
    int nb = count_index(c, "encoder.down_blocks.", 20);
    if (nb < 1 || nb > VAE_MAX_BLOCKS)
        return kb_fail(KILN_ERR_SHAPE, "%s: %d encoder down blocks (1 to %d)", c->path, nb, VAE_MAX_BLOCKS);
    cfg->n_blocks = nb;
    for (int i = 0; i < nb; i++) {
        char name[112];
        snprintf(name, sizeof name, "encoder.down_blocks.%d.resnets.0.conv1.weight", i);
        const kc_tensor *t = need(c, name, 4, &st);
        if (st) return st;
        cfg->block_out_channels[i] = (int)t->shape[0];
    }
    char pre[64];
    snprintf(pre, sizeof pre, "encoder.down_blocks.0.resnets.");
    cfg->layers_per_block = count_index(c, pre, strlen(pre));
    cfg->in_channels = (int)ein->shape[1];
    cfg->latent_channels = (int)din->shape[1];
    cfg->out_channels = (int)dout->shape[0];
    cfg->use_quant_conv = kc_find(c, "quant_conv.weight") != NULL;
    cfg->use_post_quant_conv = kc_find(c, "post_quant_conv.weight") != NULL;
    cfg->mid_block_add_attention = kc_find(c, "decoder.mid_block.attentions.0.to_q.weight") != NULL;
    /* GroupNorm's groups are in no shape: 32 (every released AutoencoderKL),
     * else the largest power of two below it that divides every block */
    int g = 32;
    while (g > 1) {
        int ok = 1;
        for (int i = 0; i < nb; i++) ok &= cfg->block_out_channels[i] % g == 0;
        if (ok) break;
        g /= 2;
    }
    cfg->norm_num_groups = g;
    /* SD3's VAE (16 latent channels): its scaling and shift; else SD 1.x's */
    cfg->sample_size = 1024;
    if (cfg->latent_channels == 16) {
        cfg->scaling_factor = 1.5305;
        cfg->shift_factor = 0.0609;
        cfg->has_shift = 1;
    }
    return vae_config_validate(cfg);
}
