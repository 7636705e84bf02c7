/* flux_forward.c - the Flux.1 forward pass, written once as graph building.
 * It follows diffusers 0.42 FluxTransformer2DModel.forward (its
 * FluxTransformerBlock, FluxSingleTransformerBlock, FluxAttnProcessor and
 * FluxPosEmbed); names in the comments are diffusers' names. */
#include "arch/flux/flux.h"
#include "base/base.h"
#include "dist/dist.h"

#include <stdio.h>

typedef struct {
    kg_graph *g;
    const flux_config *c;
    int64_t D;
    int heads;    /* on this rank: all of them unless tensor parallel */
    kg_id rope;   /* the rotary table [T + N, Dh] */
    int64_t T, N; /* text and (all) image tokens */
    int64_t n;    /* this rank's image tokens (N / sp) */
    ka_par par;   /* factors 1 for a single process */
} fwd;

/* by diffusers name (fmt with %d = i): arch.c's builders */
static kg_id lin(fwd *f, kg_id x, const char *fmt, int i) { return ka_linear_fmt(f->g, x, fmt, i); }
static kg_id row_lin(fwd *f, kg_id x, const char *fmt, int i) { return ka_row_linear_fmt(f->g, &f->par, x, fmt, i); }
static kg_id weight(fwd *f, const char *fmt, int i) { return ka_weight_fmt(f->g, fmt, i); }

/* chunk k of width D from a modulation vector [B, n*D] */
static kg_id chunk(fwd *f, kg_id emb, int k) { return kg_slice_cols(f->g, emb, k * f->D, f->D); }

/* LayerNorm(elementwise_affine=False, eps 1e-6)(x) * (1 + scale) + shift */
static kg_id norm_mod(fwd *f, kg_id x, kg_id shift, kg_id scale) {
    return kg_modulate(f->g, kg_layernorm(f->g, x, FLUX_NORM_EPS), shift, scale);
}

/* to_q/to_k/to_v (prefix + names) of x, q and k RMS-normed per head */
static void qkv(fwd *f, kg_id x, const char *pre, int i, const char *const nm[5], kg_id out[3]) {
    char fmt[128];
    for (int k = 0; k < 3; k++) {
        snprintf(fmt, sizeof fmt, "%s.%s", pre, nm[k]);
        out[k] = lin(f, x, fmt, i);
    }
    for (int k = 0; k < 2; k++) {
        snprintf(fmt, sizeof fmt, "%s.%s.weight", pre, nm[3 + k]);
        out[k] = kg_rmsnorm_heads(f->g, out[k], weight(f, fmt, i), f->heads, FLUX_NORM_EPS);
    }
}

/* Joint attention of the text tokens' q, k, v txt[] [B,T,Dl] and this
 * rank's image tokens' img[] [B,n,Dl], text first, q and k rotated by the
 * position table; the text part of the output [B,T,Dl] in *o_txt, the image
 * part [B,n,Dl] returned. Sequence parallel (Ulysses): an all-to-all trades
 * this rank's image tokens of every head for every image token of its
 * heads, the text takes its slice of heads, and the outputs go back the same
 * way (the text's gathered). */
static kg_id attend(fwd *f, const kg_id txt[3], const kg_id img[3], kg_id *o_txt) {
    kg_graph *g = f->g;
    int sp = f->par.sp, h = f->heads / sp;
    kg_id j[3];
    for (int k = 0; k < 3; k++)
        j[k] = kg_concat_tokens(g, sp > 1 ? kg_shard(g, txt[k], 2, sp, f->par.sp_index) : txt[k],
                                sp > 1 ? kg_alltoall(g, img[k], 1, KD_SP, sp) : img[k]);
    kg_id o = kg_attention(g, kg_rope(g, j[0], f->rope, h), kg_rope(g, j[1], f->rope, h), j[2], h);
    kg_id ot = kg_slice_tokens(g, o, 0, f->T), oi = kg_slice_tokens(g, o, f->T, f->N);
    *o_txt = sp > 1 ? kg_allgather(g, ot, 2, KD_SP, sp) : ot;
    return sp > 1 ? kg_alltoall(g, oi, 0, KD_SP, sp) : oi;
}

/* FeedForward(gelu-approximate): net.2(gelu_tanh(net.0.proj(x))) */
static kg_id feed_forward(fwd *f, kg_id x, const char *ff, int i) {
    char fmt[96];
    snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s.net.0.proj", ff);
    kg_id h = kg_gelu_tanh(f->g, lin(f, x, fmt, i));
    snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s.net.2", ff);
    return row_lin(f, h, fmt, i);
}

/* FluxTransformerBlock: the image stream hs [B,N,D] and the text stream
 * *ctx [B,T,D], each with its own AdaLayerNormZero modulation (shift_msa,
 * scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp), one joint
 * attention */
static kg_id double_block(fwd *f, int i, kg_id hs, kg_id *ctx, kg_id silu_temb) {
    kg_graph *g = f->g;
    kg_id emb = lin(f, silu_temb, "transformer_blocks.%d.norm1.linear", i);
    kg_id cemb = lin(f, silu_temb, "transformer_blocks.%d.norm1_context.linear", i);
    kg_id x = norm_mod(f, hs, chunk(f, emb, 0), chunk(f, emb, 1));
    kg_id c = norm_mod(f, *ctx, chunk(f, cemb, 0), chunk(f, cemb, 1));

    static const char *const img[5] = {"to_q", "to_k", "to_v", "norm_q", "norm_k"};
    static const char *const txt[5] = {"add_q_proj", "add_k_proj", "add_v_proj", "norm_added_q", "norm_added_k"};
    kg_id a[3], b[3], o_txt;
    qkv(f, x, "transformer_blocks.%d.attn", i, img, a);
    qkv(f, c, "transformer_blocks.%d.attn", i, txt, b);
    kg_id o_img = attend(f, b, a, &o_txt);

    hs = kg_gate_add(g, hs, chunk(f, emb, 2), row_lin(f, o_img, "transformer_blocks.%d.attn.to_out.0", i));
    hs = kg_gate_add(g, hs, chunk(f, emb, 5),
                     feed_forward(f, norm_mod(f, hs, chunk(f, emb, 3), chunk(f, emb, 4)), "ff", i));
    kg_id e = kg_gate_add(g, *ctx, chunk(f, cemb, 2), row_lin(f, o_txt, "transformer_blocks.%d.attn.to_add_out", i));
    *ctx = kg_gate_add(g, e, chunk(f, cemb, 5),
                       feed_forward(f, norm_mod(f, e, chunk(f, cemb, 3), chunk(f, cemb, 4)), "ff_context", i));
    return hs;
}

/* FluxSingleTransformerBlock over the joined sequence x [B, T+n, D] (the
 * text, then this rank's image tokens): AdaLayerNormZeroSingle (shift,
 * scale, gate), attention and a GELU-tanh MLP side by side, one output
 * linear over [attention, MLP] */
static kg_id single_block(fwd *f, int j, kg_id x, kg_id silu_temb) {
    kg_graph *g = f->g;
    kg_id emb = lin(f, silu_temb, "single_transformer_blocks.%d.norm.linear", j);
    kg_id n = norm_mod(f, x, chunk(f, emb, 0), chunk(f, emb, 1));
    static const char *const nm[5] = {"to_q", "to_k", "to_v", "norm_q", "norm_k"};
    kg_id q[3], t[3], im[3], o;
    qkv(f, n, "single_transformer_blocks.%d.attn", j, nm, q);
    if (f->par.sp > 1) { /* the text and image parts go their own ways in the attention */
        for (int k = 0; k < 3; k++) t[k] = kg_slice_tokens(g, q[k], 0, f->T), im[k] = kg_slice_tokens(g, q[k], f->T, f->n);
        kg_id ot, oi = attend(f, t, im, &ot);
        o = kg_concat_tokens(g, ot, oi);
    } else { /* one sequence: attention over it as it is */
        int h = f->heads;
        o = kg_attention(g, kg_rope(g, q[0], f->rope, h), kg_rope(g, q[1], f->rope, h), q[2], h);
    }
    kg_id mlp = kg_gelu_tanh(g, lin(f, n, "single_transformer_blocks.%d.proj_mlp", j));
    kg_id y = row_lin(f, kg_concat(g, o, mlp, 2), "single_transformer_blocks.%d.proj_out", j);
    return kg_gate_add(g, x, chunk(f, emb, 2), y);
}

kiln_status flux_check_parallel(const flux_config *c, int tp, int sp) {
    if (tp < 1 || sp < 1) return kb_fail(KILN_ERR_INVALID_ARG, "parallel factors must be at least 1 (tp %d, sp %d)", tp, sp);
    if (c->num_attention_heads % tp)
        return kb_fail(KILN_ERR_INVALID_ARG, "tensor parallel %d does not divide the model's %d attention heads "
                       "(num_attention_heads)", tp, c->num_attention_heads);
    if ((c->num_attention_heads / tp) % sp)
        return kb_fail(KILN_ERR_INVALID_ARG, "sequence parallel %d (Ulysses: heads split across the ranks) does not "
                       "divide the %d attention heads per tensor-parallel rank", sp, c->num_attention_heads / tp);
    return KILN_OK;
}

kiln_status flux_build_forward(const flux_config *c, kg_graph *g, const int64_t *s, const ka_par *par) {
    int64_t B = s[FLUX_SYM_BATCH], h = s[FLUX_SYM_H], w = s[FLUX_SYM_W], T = s[FLUX_SYM_CTX];
    kiln_status st = flux_check_latent(c, 2 * h, 2 * w);
    if (st) return st;
    if (B <= 0 || T <= 0 || T > FLUX_MAX_TOKENS)
        return kb_fail(KILN_ERR_SHAPE, "flux: batch (%lld) and context length (%lld) must be positive (context at most %d)",
                       (long long)B, (long long)T, FLUX_MAX_TOKENS);
    int fsdp = par && par->fsdp;
    int64_t C = c->in_channels / 4;
    fwd f = {g, c, (int64_t)c->num_attention_heads * c->attention_head_dim, c->num_attention_heads, -1, T, h * w, h * w,
             {1, 1, 0, 0}};
    if (par) f.par = *par;
    if (f.par.tp < 1) f.par.tp = 1;
    if (f.par.sp < 1) f.par.sp = 1;
    if ((st = flux_check_parallel(c, f.par.tp, f.par.sp))) return st;
    f.heads /= f.par.tp;
    int sp = f.par.sp;
    if (f.N % sp)
        return kb_fail(KILN_ERR_SHAPE, "sequence parallel %d: the %lldx%lld latent has %lld image tokens (2x2 patches), "
                       "which do not split into %d equal parts", sp, (long long)(2 * h), (long long)(2 * w),
                       (long long)f.N, sp);
    f.n = f.N / sp;

    kg_id x = kg_input(g, "latents", 4, (int64_t[]){B, C, 2 * h, 2 * w});
    kg_id ctx = kg_input(g, "encoder_hidden_states", 3, (int64_t[]){B, T, c->joint_attention_dim});
    kg_id pooled = kg_input(g, "pooled_projections", 2, (int64_t[]){B, c->pooled_projection_dim});
    kg_id t = kg_input(g, "timestep", 1, (int64_t[]){B});
    kg_id gd = c->guidance_embeds ? kg_input(g, "guidance", 1, (int64_t[]){B}) : -1;

    /* _pack_latents (2x2 patches, features c, py, px) then x_embedder;
     * sequence parallel keeps this rank's image tokens from here to the output */
    kg_id patches = kg_patchify(g, x, 2);
    if (sp > 1) patches = kg_shard(g, patches, 1, sp, f.par.sp_index);
    kg_id hs = lin(&f, patches, "x_embedder", 0);

    /* time_text_embed: timestep_embedder(time_proj(1000 t)) [+ guidance_embedder(time_proj(1000 g))]
     * + text_embedder(pooled) */
    kg_id te = lin(&f, kg_silu(g, lin(&f, kg_timestep_proj_scaled(g, t, FLUX_TIME_PROJ_DIM, 1000.0f),
                                      "time_text_embed.timestep_embedder.linear_1", 0)),
                   "time_text_embed.timestep_embedder.linear_2", 0);
    if (c->guidance_embeds) {
        kg_id ge = lin(&f, kg_silu(g, lin(&f, kg_timestep_proj_scaled(g, gd, FLUX_TIME_PROJ_DIM, 1000.0f),
                                          "time_text_embed.guidance_embedder.linear_1", 0)),
                       "time_text_embed.guidance_embedder.linear_2", 0);
        te = kg_add(g, te, ge);
    }
    kg_id pe = lin(&f, kg_silu(g, lin(&f, pooled, "time_text_embed.text_embedder.linear_1", 0)),
                   "time_text_embed.text_embedder.linear_2", 0);
    kg_id silu_temb = kg_silu(g, kg_add(g, te, pe)); /* every modulation linear reads SiLU(temb) */

    ctx = lin(&f, ctx, "context_embedder", 0);
    /* FluxPosEmbed of cat(txt_ids, img_ids): a constant of the shape */
    f.rope = kg_rope_table(g, T, h, w, c->axes_dims_rope, FLUX_ROPE_THETA);

    for (int i = 0; i < c->num_layers; i++) {
        kg_region_begin(g, i);
        if (fsdp) hs = kg_fsdp_gather(g, hs, i);
        hs = double_block(&f, i, hs, &ctx, silu_temb);
        kg_region_end(g);
    }
    hs = kg_concat_tokens(g, ctx, hs);
    for (int j = 0; j < c->num_single_layers; j++) {
        kg_region_begin(g, c->num_layers + j);
        if (fsdp) hs = kg_fsdp_gather(g, hs, c->num_layers + j);
        hs = single_block(&f, j, hs, silu_temb);
        kg_region_end(g);
    }
    hs = kg_slice_tokens(g, hs, T, f.n);

    /* norm_out: AdaLayerNormContinuous, chunks (scale, shift) */
    kg_id emb = lin(&f, silu_temb, "norm_out.linear", 0);
    hs = norm_mod(&f, hs, chunk(&f, emb, 1), chunk(&f, emb, 0));
    hs = lin(&f, hs, "proj_out", 0);
    if (sp > 1) hs = kg_allgather(g, hs, 1, KD_SP, sp);
    kg_output(g, kg_unpatchify_cfirst(g, hs, 2, h, w, c->out_channels / 4), "sample");
    return g->status;
}
