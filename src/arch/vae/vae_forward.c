/* vae_forward.c - AutoencoderKL's decoder and encoder, written once as
 * graph building. They follow diffusers 0.42 Decoder.forward and
 * Encoder.forward (autoencoders/vae.py) with ResnetBlock2D, UNetMidBlock2D,
 * UpDecoderBlock2D / DownEncoderBlock2D, the Attention of AttnProcessor2_0
 * and DiagonalGaussianDistribution; names in the comments are diffusers'
 * names so the two can be read side by side. Activations are channels
 * last, [B,H,W,C] (KG_NHWC: the convolutions' own layout, so no activation
 * is reordered around a convolution); the latent and image at either end
 * are diffusers' [B,C,H,W]. */
#include "arch/vae/vae.h"
#include "base/base.h"

#include <stdio.h>

typedef struct {
    kg_graph *g;
    const vae_config *c;
} dec;

static kg_id weight(dec *d, const char *base, const char *sfx) {
    char name[160];
    snprintf(name, sizeof name, "%s.%s", base, sfx);
    return kg_weight(d->g, name);
}

/* [B,C,H,W] -> [B,H,W,C] (patchify by 1 gives the tokens [B,H*W,C]) */
static kg_id to_nhwc(kg_graph *g, kg_id x) {
    if (g->status) return -1;
    const int64_t *s = g->nodes[x].shape;
    int64_t shape[4] = {s[0], s[2], s[3], s[1]};
    return kg_reshape(g, kg_patchify(g, x, 1), 4, shape);
}

/* [B,H,W,C] -> [B,C,H,W] */
static kg_id to_nchw(kg_graph *g, kg_id x) {
    if (g->status) return -1;
    int64_t B = g->nodes[x].shape[0], H = g->nodes[x].shape[1], W = g->nodes[x].shape[2], C = g->nodes[x].shape[3];
    return kg_unpatchify(g, kg_reshape(g, x, 3, (int64_t[]){B, H * W, C}), 1, H, W, C);
}

/* Conv2d by diffusers name (base.weight, base.bias); 3x3 convs pad 1 on
 * every side, 1x1 ones none */
static kg_id conv(dec *d, kg_id x, const char *base, int pad) {
    return kg_conv2d(d->g, x, weight(d, base, "weight"), weight(d, base, "bias"), 1, pad, pad, KG_NHWC);
}

/* GroupNorm(norm_num_groups, eps 1e-6, affine) by name, SiLU after when silu */
static kg_id norm(dec *d, kg_id x, const char *base, int silu) {
    return kg_group_norm(d->g, x, weight(d, base, "weight"), weight(d, base, "bias"), d->c->norm_num_groups, VAE_EPS,
                         silu, KG_NHWC);
}

/* ResnetBlock2D without a time embedding (output_scale_factor 1, dropout
 * off): conv2(silu(norm2(conv1(silu(norm1(x)))))) + shortcut(x), the
 * shortcut a 1x1 conv when the channel count changes */
static kg_id resnet(dec *d, kg_id x, const char *base) {
    char b[128];
    snprintf(b, sizeof b, "%s.norm1", base);
    kg_id h = norm(d, x, b, 1);
    snprintf(b, sizeof b, "%s.conv1", base);
    h = conv(d, h, b, 1);
    snprintf(b, sizeof b, "%s.norm2", base);
    h = norm(d, h, b, 1);
    snprintf(b, sizeof b, "%s.conv2", base);
    h = conv(d, h, b, 1);
    if (d->g->status) return -1;
    if (d->g->nodes[x].shape[3] != d->g->nodes[h].shape[3]) {
        snprintf(b, sizeof b, "%s.conv_shortcut", base);
        x = conv(d, x, b, 0);
    }
    return kg_add(d->g, x, h);
}

/* Attention (one head of every channel, residual_connection, rescale 1):
 * group_norm, then over the H*W positions as tokens [B, H*W, C]:
 * to_out.0(softmax(q k^T / sqrt(C)) v), back to [B, H, W, C], + x */
static kg_id attention(dec *d, kg_id x, const char *base) {
    kg_graph *g = d->g;
    char b[128];
    snprintf(b, sizeof b, "%s.group_norm", base);
    kg_id h = norm(d, x, b, 0);
    if (g->status) return -1;
    int64_t B = g->nodes[x].shape[0], H = g->nodes[x].shape[1], W = g->nodes[x].shape[2], C = g->nodes[x].shape[3];
    kg_id t = kg_reshape(g, h, 3, (int64_t[]){B, H * W, C}); /* [B,H,W,C] -> [B,H*W,C] */
    kg_id qkv[3];
    static const char *names[3] = {"to_q", "to_k", "to_v"};
    for (int i = 0; i < 3; i++) {
        snprintf(b, sizeof b, "%s.%s", base, names[i]);
        qkv[i] = kg_linear(g, t, weight(d, b, "weight"), weight(d, b, "bias"));
    }
    kg_id o = kg_attention(g, qkv[0], qkv[1], qkv[2], 1);
    snprintf(b, sizeof b, "%s.to_out.0", base);
    o = kg_linear(g, o, weight(d, b, "weight"), weight(d, b, "bias"));
    return kg_add(g, kg_reshape(g, o, 4, (int64_t[]){B, H, W, C}), x);
}

/* UNetMidBlock2D: resnets[0], attentions[0] (mid_block_add_attention), resnets[1] */
static kg_id mid_block(dec *d, kg_id x, const char *part) {
    char b[64];
    snprintf(b, sizeof b, "%s.mid_block.resnets.0", part);
    x = resnet(d, x, b);
    snprintf(b, sizeof b, "%s.mid_block.attentions.0", part);
    if (d->c->mid_block_add_attention) x = attention(d, x, b);
    snprintf(b, sizeof b, "%s.mid_block.resnets.1", part);
    return resnet(d, x, b);
}

kiln_status vae_build_decoder(const vae_config *c, kg_graph *g, int64_t B, int64_t h, int64_t w) {
    kiln_status st = vae_check_latent(c, B, h, w);
    if (st) return st;
    dec d = {g, c};
    char b[128];
    kg_id z = to_nhwc(g, kg_input(g, "latent", 4, (int64_t[]){B, c->latent_channels, h, w}));
    if (c->use_post_quant_conv) z = conv(&d, z, "post_quant_conv", 0);
    kg_id x = conv(&d, z, "decoder.conv_in", 1);

    x = mid_block(&d, x, "decoder");

    /* up_blocks: layers_per_block + 1 resnets each, then Upsample2D
     * (interpolate nearest x2, conv) in every block but the last */
    for (int i = 0; i < c->n_blocks; i++) {
        for (int j = 0; j <= c->layers_per_block; j++) {
            snprintf(b, sizeof b, "decoder.up_blocks.%d.resnets.%d", i, j);
            x = resnet(&d, x, b);
        }
        if (i < c->n_blocks - 1) {
            /* in one op, the weight stored in its sub-pixel form (ka_spec.up2) */
            snprintf(b, sizeof b, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            x = kg_conv2d_up2(g, x, weight(&d, b, "weight"), weight(&d, b, "bias"));
        }
    }

    /* conv_norm_out, conv_act (SiLU), conv_out */
    x = norm(&d, x, "decoder.conv_norm_out", 1);
    x = conv(&d, x, "decoder.conv_out", 1);
    kg_output(g, to_nchw(g, x), "sample");
    return g->status;
}

kiln_status vae_check_image(const vae_config *c, int64_t batch, int64_t H, int64_t W) {
    int64_t f = vae_scale(c);
    if (H % f || W % f || H < f || W < f)
        return kb_fail(KILN_ERR_SHAPE, "VAE image %lldx%lld (height x width): each side must be a positive multiple of "
                       "%lld (the encoder halves it %d times)", (long long)H, (long long)W, (long long)f, c->n_blocks - 1);
    return vae_check_latent(c, batch, H / f, W / f);
}

kiln_status vae_build_encoder(const vae_config *c, kg_graph *g, int64_t B, int64_t H, int64_t W) {
    kiln_status st = vae_check_image(c, B, H, W);
    if (st) return st;
    dec d = {g, c};
    char b[128];
    int L = c->latent_channels;
    kg_id x = to_nhwc(g, kg_input(g, "image", 4, (int64_t[]){B, c->in_channels, H, W}));
    x = conv(&d, x, "encoder.conv_in", 1);

    /* down_blocks: layers_per_block resnets each, then Downsample2D in every
     * block but the last: F.pad (0, 1, 0, 1) (a zero column on the right, a
     * zero row at the bottom), conv 3x3 stride 2 */
    for (int i = 0; i < c->n_blocks; i++) {
        for (int j = 0; j < c->layers_per_block; j++) {
            snprintf(b, sizeof b, "encoder.down_blocks.%d.resnets.%d", i, j);
            x = resnet(&d, x, b);
        }
        if (i < c->n_blocks - 1) {
            snprintf(b, sizeof b, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            x = kg_conv2d(g, x, weight(&d, b, "weight"), weight(&d, b, "bias"), 2, 0, 1, KG_NHWC);
        }
    }
    x = mid_block(&d, x, "encoder");

    /* conv_norm_out, conv_act (SiLU), conv_out to 2 L moments; quant_conv */
    x = norm(&d, x, "encoder.conv_norm_out", 1);
    x = conv(&d, x, "encoder.conv_out", 1);
    if (c->use_quant_conv) x = conv(&d, x, "quant_conv", 0);

    /* DiagonalGaussianDistribution: mean, logvar = moments.chunk(2, dim 1);
     * std = exp(0.5 * clamp(logvar, -30, 20)) */
    x = to_nchw(g, x);
    kg_output(g, kg_slice(g, x, 1, 0, L), "mean");
    kg_output(g, kg_logvar_std(g, kg_slice(g, x, 1, L, L)), "std");
    return g->status;
}
