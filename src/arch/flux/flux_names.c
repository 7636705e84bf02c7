/* flux_names.c - the original Flux.1 single-file names (Black Forest Labs'
 * flux1-dev.safetensors and flux1-schnell.safetensors, keys bare or under
 * model.diffusion_model. / diffusion_model. as ComfyUI saves them) as
 * diffusers names, the way diffusers' convert_flux_to_diffusers does it:
 * renamed, the fused qkv split in three, a single block's linear1 split into
 * q, k, v and the MLP's input (1:1:1:4), the final modulation's (shift,
 * scale) halves swapped to (scale, shift). The checkpoint layer applies it
 * as views (kc_renamer); nothing is copied. */
#include "arch/flux/flux.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *strip_prefix(const char *name) {
    static const char *const pre[2] = {"model.diffusion_model.", "diffusion_model."};
    for (int i = 0; i < 2; i++)
        if (!strncmp(name, pre[i], strlen(pre[i]))) return name + strlen(pre[i]);
    return name;
}

/* whole-name renames outside the blocks (stems: .weight / .bias follow) */
static const struct {
    const char *from, *to;
    int swap;
} k_top[] = {
    {"img_in", "x_embedder", 0},
    {"txt_in", "context_embedder", 0},
    {"time_in.in_layer", "time_text_embed.timestep_embedder.linear_1", 0},
    {"time_in.out_layer", "time_text_embed.timestep_embedder.linear_2", 0},
    {"guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1", 0},
    {"guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2", 0},
    {"vector_in.in_layer", "time_text_embed.text_embedder.linear_1", 0},
    {"vector_in.out_layer", "time_text_embed.text_embedder.linear_2", 0},
    {"final_layer.linear", "proj_out", 0},
    {"final_layer.adaLN_modulation.1", "norm_out.linear", 1},
};

/* renames inside double_blocks.N. (the full tail, suffix included) */
static const struct {
    const char *from, *to;
} k_double[] = {
    {"img_mod.lin.weight", "norm1.linear.weight"},
    {"img_mod.lin.bias", "norm1.linear.bias"},
    {"txt_mod.lin.weight", "norm1_context.linear.weight"},
    {"txt_mod.lin.bias", "norm1_context.linear.bias"},
    {"img_attn.norm.query_norm.scale", "attn.norm_q.weight"},
    {"img_attn.norm.key_norm.scale", "attn.norm_k.weight"},
    {"txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"},
    {"txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"},
    {"img_attn.proj.weight", "attn.to_out.0.weight"},
    {"img_attn.proj.bias", "attn.to_out.0.bias"},
    {"txt_attn.proj.weight", "attn.to_add_out.weight"},
    {"txt_attn.proj.bias", "attn.to_add_out.bias"},
    {"img_mlp.0.weight", "ff.net.0.proj.weight"},
    {"img_mlp.0.bias", "ff.net.0.proj.bias"},
    {"img_mlp.2.weight", "ff.net.2.weight"},
    {"img_mlp.2.bias", "ff.net.2.bias"},
    {"txt_mlp.0.weight", "ff_context.net.0.proj.weight"},
    {"txt_mlp.0.bias", "ff_context.net.0.proj.bias"},
    {"txt_mlp.2.weight", "ff_context.net.2.weight"},
    {"txt_mlp.2.bias", "ff_context.net.2.bias"},
};

/* renames inside single_blocks.N. */
static const struct {
    const char *from, *to;
} k_single[] = {
    {"modulation.lin.weight", "norm.linear.weight"},
    {"modulation.lin.bias", "norm.linear.bias"},
    {"norm.query_norm.scale", "attn.norm_q.weight"},
    {"norm.key_norm.scale", "attn.norm_k.weight"},
    {"linear2.weight", "proj_out.weight"},
    {"linear2.bias", "proj_out.bias"},
};

static int detect(const char *const *names, size_t n, int64_t state[4]) {
    (void)state;
    for (size_t i = 0; i < n; i++) {
        const char *s = strip_prefix(names[i]);
        if (!strncmp(s, "double_blocks.", 14) || !strncmp(s, "single_blocks.", 14) || !strcmp(s, "img_in.weight"))
            return 1;
    }
    return 0;
}

/* "N.tail" after a block prefix: the index and the tail, 0 when not */
static int block_of(const char *s, long *b, const char **tail) {
    char *end;
    *b = strtol(s, &end, 10);
    if (end == s || *end != '.' || *b < 0) return 0;
    *tail = end + 1;
    return 1;
}

static int rename_flux(const int64_t state[4], const char *name, kc_rename *r) {
    (void)state;
    const char *n = strip_prefix(name), *tail;
    long b;
    for (size_t k = 0; k < sizeof k_top / sizeof k_top[0]; k++) {
        size_t len = strlen(k_top[k].from);
        if (strncmp(n, k_top[k].from, len) || (strcmp(n + len, ".weight") && strcmp(n + len, ".bias"))) continue;
        r->n = 1;
        snprintf(r->to[0], sizeof r->to[0], "%s%s", k_top[k].to, n + len);
        r->swap = k_top[k].swap;
        return 1;
    }
    if (!strncmp(n, "double_blocks.", 14) && block_of(n + 14, &b, &tail)) {
        static const char *const img[3] = {"attn.to_q", "attn.to_k", "attn.to_v"},
                                 *txt[3] = {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
        for (int side = 0; side < 2; side++) {
            const char *stem = side ? "txt_attn.qkv." : "img_attn.qkv.";
            if (strncmp(tail, stem, 13)) continue;
            const char *suffix = tail + 13;
            if (strcmp(suffix, "weight") && strcmp(suffix, "bias")) return 0;
            r->n = 3;
            for (int i = 0; i < 3; i++)
                snprintf(r->to[i], sizeof r->to[i], "transformer_blocks.%ld.%s.%s", b, side ? txt[i] : img[i], suffix);
            return 1;
        }
        for (size_t k = 0; k < sizeof k_double / sizeof k_double[0]; k++)
            if (!strcmp(tail, k_double[k].from)) {
                r->n = 1;
                snprintf(r->to[0], sizeof r->to[0], "transformer_blocks.%ld.%s", b, k_double[k].to);
                return 1;
            }
        return 0;
    }
    if (!strncmp(n, "single_blocks.", 14) && block_of(n + 14, &b, &tail)) {
        if (!strcmp(tail, "linear1.weight") || !strcmp(tail, "linear1.bias")) {
            static const char *const parts[4] = {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"};
            r->n = 4;
            for (int i = 0; i < 4; i++) {
                snprintf(r->to[i], sizeof r->to[i], "single_transformer_blocks.%ld.%s.%s", b, parts[i], tail + 8);
                r->ratio[i] = i < 3 ? 1 : 4; /* q, k, v of D rows each, the MLP's input of 4 D (mlp_ratio 4) */
            }
            return 1;
        }
        for (size_t k = 0; k < sizeof k_single / sizeof k_single[0]; k++)
            if (!strcmp(tail, k_single[k].from)) {
                r->n = 1;
                snprintf(r->to[0], sizeof r->to[0], "single_transformer_blocks.%ld.%s", b, k_single[k].to);
                return 1;
            }
    }
    return 0; /* unknown: listed as unexpected */
}

const kc_renamer flux_renamer = {"flux-single-file", detect, rename_flux};
