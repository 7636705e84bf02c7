/* sd3_names.c - the original SD3 single-file names (sd3_medium.safetensors:
 * model.diffusion_model.joint_blocks.N.x_block.attn.qkv ...) as diffusers
 * names, the way diffusers' convert_sd3_to_diffusers does it: renamed, fused
 * qkv split in three, (shift, scale) modulation halves swapped to
 * (scale, shift). The checkpoint layer applies it as views (kc_renamer). */
#include "arch/sd3/sd3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_prefix[] = "model.diffusion_model.";

/* whole-name renames outside the joint blocks; swap = (shift, scale) -> (scale, shift) */
static const struct {
    const char *from, *to;
    int swap;
} k_top[] = {
    {"x_embedder.proj.weight", "pos_embed.proj.weight", 0},
    {"x_embedder.proj.bias", "pos_embed.proj.bias", 0},
    {"pos_embed", "pos_embed.pos_embed", 0},
    {"t_embedder.mlp.0.weight", "time_text_embed.timestep_embedder.linear_1.weight", 0},
    {"t_embedder.mlp.0.bias", "time_text_embed.timestep_embedder.linear_1.bias", 0},
    {"t_embedder.mlp.2.weight", "time_text_embed.timestep_embedder.linear_2.weight", 0},
    {"t_embedder.mlp.2.bias", "time_text_embed.timestep_embedder.linear_2.bias", 0},
    {"y_embedder.mlp.0.weight", "time_text_embed.text_embedder.linear_1.weight", 0},
    {"y_embedder.mlp.0.bias", "time_text_embed.text_embedder.linear_1.bias", 0},
    {"y_embedder.mlp.2.weight", "time_text_embed.text_embedder.linear_2.weight", 0},
    {"y_embedder.mlp.2.bias", "time_text_embed.text_embedder.linear_2.bias", 0},
    {"context_embedder.weight", "context_embedder.weight", 0},
    {"context_embedder.bias", "context_embedder.bias", 0},
    {"final_layer.linear.weight", "proj_out.weight", 0},
    {"final_layer.linear.bias", "proj_out.bias", 0},
    {"final_layer.adaLN_modulation.1.weight", "norm_out.linear.weight", 1},
    {"final_layer.adaLN_modulation.1.bias", "norm_out.linear.bias", 1},
};

/* suffix renames inside joint_blocks.N. */
static const struct {
    const char *from, *to;
} k_block[] = {
    {"x_block.attn.proj", "attn.to_out.0"},
    {"context_block.attn.proj", "attn.to_add_out"},
    {"x_block.attn.ln_q", "attn.norm_q"},
    {"x_block.attn.ln_k", "attn.norm_k"},
    {"context_block.attn.ln_q", "attn.norm_added_q"},
    {"context_block.attn.ln_k", "attn.norm_added_k"},
    {"x_block.attn2.proj", "attn2.to_out.0"},
    {"x_block.attn2.ln_q", "attn2.norm_q"},
    {"x_block.attn2.ln_k", "attn2.norm_k"},
    {"x_block.mlp.fc1", "ff.net.0.proj"},
    {"x_block.mlp.fc2", "ff.net.2"},
    {"context_block.mlp.fc1", "ff_context.net.0.proj"},
    {"context_block.mlp.fc2", "ff_context.net.2"},
    {"x_block.adaLN_modulation.1", "norm1.linear"},
    {"context_block.adaLN_modulation.1", "norm1_context.linear"},
};

/* fused q, k, v inside joint_blocks.N., split in three */
static const struct {
    const char *from;
    const char *to[3];
} k_qkv[] = {
    {"x_block.attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
    {"context_block.attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
    {"x_block.attn2.qkv", {"attn2.to_q", "attn2.to_k", "attn2.to_v"}},
};

static const char *strip_prefix(const char *name) {
    return strncmp(name, k_prefix, sizeof k_prefix - 1) ? name : name + sizeof k_prefix - 1;
}

/* state[0]: the last joint block's index (its context modulation is swapped) */
static int detect(const char *const *names, size_t n, int64_t state[4]) {
    int found = 0;
    state[0] = -1;
    for (size_t i = 0; i < n; i++) {
        const char *s = strip_prefix(names[i]);
        if (!strcmp(s, "x_embedder.proj.weight")) found = 1;
        if (!strncmp(s, "joint_blocks.", 13)) {
            long b = strtol(s + 13, NULL, 10);
            found = 1;
            if (b > state[0]) state[0] = b;
        }
    }
    return found;
}

static int rename_sd3(const int64_t state[4], const char *name, kc_rename *r) {
    const char *n = strip_prefix(name);
    for (size_t k = 0; k < sizeof k_top / sizeof k_top[0]; k++)
        if (!strcmp(n, k_top[k].from)) {
            r->n = 1;
            snprintf(r->to[0], sizeof r->to[0], "%s", k_top[k].to);
            r->swap = k_top[k].swap;
            return 1;
        }
    if (strncmp(n, "joint_blocks.", 13)) return 0; /* unknown: listed as unexpected */
    const char *rest = n + 13;
    char *end;
    long b = strtol(rest, &end, 10);
    if (end == rest || *end != '.') return 0;
    const char *tail = end + 1; /* e.g. x_block.attn.qkv.weight */
    const char *dot = strrchr(tail, '.');
    size_t stem = dot ? (size_t)(dot - tail) : strlen(tail);
    const char *suffix = dot ? dot : "";
    for (size_t k = 0; k < sizeof k_qkv / sizeof k_qkv[0]; k++) {
        if (strlen(k_qkv[k].from) != stem || strncmp(tail, k_qkv[k].from, stem)) continue;
        r->n = 3;
        for (int i = 0; i < 3; i++)
            snprintf(r->to[i], sizeof r->to[i], "transformer_blocks.%ld.%s%s", b, k_qkv[k].to[i], suffix);
        return 1;
    }
    for (size_t k = 0; k < sizeof k_block / sizeof k_block[0]; k++) {
        if (strlen(k_block[k].from) != stem || strncmp(tail, k_block[k].from, stem)) continue;
        r->n = 1;
        snprintf(r->to[0], sizeof r->to[0], "transformer_blocks.%ld.%s%s", b, k_block[k].to, suffix);
        /* diffusers swaps the last block's context modulation (pre-only) */
        r->swap = b == state[0] && !strcmp(k_block[k].to, "norm1_context.linear");
        return 1;
    }
    return 0;
}

const kc_renamer sd3_renamer = {"sd3-single-file", detect, rename_sd3};
