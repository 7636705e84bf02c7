/* sd3_forward.c - the MMDiT forward pass, written once as graph building.
 * It follows diffusers 0.31 SD3Transformer2DModel.forward; names in the
 * comments are diffusers' names so the two can be read side by side. */
#include "base/base.h"
#include "dist/dist.h"
#include "arch/sd3/sd3.h"

#include <stdio.h>

typedef struct {
    kg_graph *g;
    const kiln_config *c;
    int64_t D, heads; /* model width; heads on this rank (all of them unless tensor parallel) */
    ka_par par; /* factors 1 for a single process */
} fwd;

/* by diffusers name (fmt with %d = i): arch.c's builders */
static kg_id lin(fwd *f, kg_id x, const char *fmt, int i) { return ka_linear_fmt(f->g, x, fmt, i); }
static kg_id row_lin(fwd *f, kg_id x, const char *fmt, int i) { return ka_row_linear_fmt(f->g, &f->par, x, fmt, i); }
static kg_id weight(fwd *f, const char *fmt, int i) { return ka_weight_fmt(f->g, fmt, i); }

/* chunk k of width D from a modulation vector [B, n*D] */
static kg_id chunk(fwd *f, kg_id emb, int k) { return kg_slice_cols(f->g, emb, k * f->D, f->D); }

/* q, k, v of one stream [B,N,D], with optional RMS qk-norm per head */
static void qkv(fwd *f, kg_id x, int blk, const char *q, const char *k, const char *v,
                const char *nq, const char *nk, kg_id out[3]) {
    char fmt[96];
    out[0] = -1; /* q NULL: no queries asked of these tokens */
    if (q) {
        snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s", q);
        out[0] = lin(f, x, fmt, blk);
    }
    snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s", k);
    out[1] = lin(f, x, fmt, blk);
    snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s", v);
    out[2] = lin(f, x, fmt, blk);
    if (f->c->qk_norm_rms && q) {
        snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s.weight", nq);
        out[0] = kg_rmsnorm_heads(f->g, out[0], weight(f, fmt, blk), (int)f->heads, SD3_NORM_EPS);
    }
    if (f->c->qk_norm_rms) {
        snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s.weight", nk);
        out[1] = kg_rmsnorm_heads(f->g, out[1], weight(f, fmt, blk), (int)f->heads, SD3_NORM_EPS);
    }
}

/* FeedForward(gelu-approximate): net.2(gelu_tanh(net.0.proj(x))) */
static kg_id feed_forward(fwd *f, kg_id x, const char *ff, int blk) {
    char fmt[96];
    snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s.net.0.proj", ff);
    kg_id h = kg_gelu_tanh(f->g, lin(f, x, fmt, blk));
    snprintf(fmt, sizeof fmt, "transformer_blocks.%%d.%s.net.2", ff);
    return row_lin(f, h, fmt, blk);
}

/* Attention of image tokens q/k/v a[] with optional context tokens b[]
 * (b == NULL: image only). Sequence parallel (Ulysses): a[] hold this rank's
 * image tokens and every head; an all-to-all trades them for every token of
 * this rank's heads, the context takes its slice of heads, and the outputs
 * go back the same way. Returns the image part [B,n,Dl], and the context
 * part [B,T,Dl] in *o_ctx; o_ctx NULL (the last, context_pre_only block,
 * whose context output diffusers drops): the context tokens are keys and
 * values only, b[0] is not read (qkv made none), and no context output is
 * computed. */
static kg_id attend(fwd *f, const kg_id a[3], const kg_id *b, kg_id *o_ctx) {
    kg_graph *g = f->g;
    int sp = f->par.sp;
    kg_id q[3];
    for (int k = 0; k < 3; k++) {
        kg_id ai = sp > 1 ? kg_alltoall(g, a[k], 1, KD_SP, sp) : a[k];
        int joint = b && (k > 0 || o_ctx);
        q[k] = joint ? kg_concat_tokens(g, ai, sp > 1 ? kg_shard(g, b[k], 2, sp, f->par.sp_index) : b[k]) : ai;
    }
    kg_id o = kg_attention(g, q[0], q[1], q[2], (int)(f->heads / sp));
    if (g->status) return -1;
    int64_t n_all = g->nodes[a[0]].shape[1] * sp, n_tot = g->nodes[o].shape[1];
    if (b && o_ctx) {
        kg_id oc = kg_slice_tokens(g, o, n_all, n_tot - n_all);
        *o_ctx = sp > 1 ? kg_allgather(g, oc, 2, KD_SP, sp) : oc;
        o = kg_slice_tokens(g, o, 0, n_all);
    }
    return sp > 1 ? kg_alltoall(g, o, 0, KD_SP, sp) : o;
}

/* JointTransformerBlock; returns the new image stream, updates *ctx
 * (unchanged for the last, context_pre_only block). */
static kg_id joint_block(fwd *f, int i, kg_id hs, kg_id *ctx, kg_id silu_temb) {
    kg_graph *g = f->g;
    int last = i == f->c->num_layers - 1, dual = (int)(f->c->dual_attention_mask >> i & 1);
    if (f->par.fsdp) hs = kg_fsdp_gather(g, hs, i); /* this block's weights, gathered from the shards */

    /* norm1: AdaLayerNormZero (6 chunks) or SD35AdaLayerNormZeroX (9):
     * shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp[, shift_msa2, scale_msa2, gate_msa2] */
    kg_id emb = lin(f, silu_temb, "transformer_blocks.%d.norm1.linear", i);
    kg_id norm_hs = kg_layernorm(g, hs, SD3_NORM_EPS);
    kg_id x = kg_modulate(g, norm_hs, chunk(f, emb, 0), chunk(f, emb, 1));

    /* norm1_context: AdaLayerNormZero, or AdaLayerNormContinuous (scale, shift) when pre-only */
    kg_id cemb = lin(f, silu_temb, "transformer_blocks.%d.norm1_context.linear", i);
    kg_id norm_ctx = kg_layernorm(g, *ctx, SD3_NORM_EPS);
    kg_id c = last ? kg_modulate(g, norm_ctx, chunk(f, cemb, 1), chunk(f, cemb, 0))
                   : kg_modulate(g, norm_ctx, chunk(f, cemb, 0), chunk(f, cemb, 1));

    /* JointAttnProcessor2_0: image tokens first, then context tokens */
    kg_id a[3], b[3];
    qkv(f, x, i, "attn.to_q", "attn.to_k", "attn.to_v", "attn.norm_q", "attn.norm_k", a);
    /* the last block's context output is dropped (as diffusers drops it): its tokens are keys and values only */
    qkv(f, c, i, last ? NULL : "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.norm_added_q",
        "attn.norm_added_k", b);
    kg_id o_ctx = -1;
    kg_id o_img = row_lin(f, attend(f, a, b, last ? NULL : &o_ctx), "transformer_blocks.%d.attn.to_out.0", i);
    hs = kg_gate_add(g, hs, chunk(f, emb, 2), o_img);

    if (dual) { /* attn2: self-attention on the image stream only */
        kg_id x2 = kg_modulate(g, norm_hs, chunk(f, emb, 6), chunk(f, emb, 7));
        kg_id q2[3];
        qkv(f, x2, i, "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.norm_q", "attn2.norm_k", q2);
        kg_id o2 = attend(f, q2, NULL, NULL);
        hs = kg_gate_add(g, hs, chunk(f, emb, 8), row_lin(f, o2, "transformer_blocks.%d.attn2.to_out.0", i));
    }

    kg_id n2 = kg_modulate(g, kg_layernorm(g, hs, SD3_NORM_EPS), chunk(f, emb, 3), chunk(f, emb, 4));
    hs = kg_gate_add(g, hs, chunk(f, emb, 5), feed_forward(f, n2, "ff", i));

    if (!last) {
        kg_id e = kg_gate_add(g, *ctx, chunk(f, cemb, 2), row_lin(f, o_ctx, "transformer_blocks.%d.attn.to_add_out", i));
        kg_id n2c = kg_modulate(g, kg_layernorm(g, e, SD3_NORM_EPS), chunk(f, cemb, 3), chunk(f, cemb, 4));
        *ctx = kg_gate_add(g, e, chunk(f, cemb, 5), feed_forward(f, n2c, "ff_context", i));
    }
    return hs;
}

kiln_status sd3_check_parallel(const kiln_config *c, int tp, int sp) {
    if (tp < 1 || sp < 1) return kb_fail(KILN_ERR_INVALID_ARG, "parallel factors must be at least 1 (tp %d, sp %d)", tp, sp);
    if (c->num_attention_heads % tp)
        return kb_fail(KILN_ERR_INVALID_ARG, "tensor parallel %d does not divide the model's %d attention heads "
                       "(num_attention_heads)", tp, c->num_attention_heads);
    if ((c->num_attention_heads / tp) % sp)
        return kb_fail(KILN_ERR_INVALID_ARG, "sequence parallel %d (Ulysses: heads split across the ranks) does not "
                       "divide the %d attention heads per tensor-parallel rank", sp, c->num_attention_heads / tp);
    return KILN_OK;
}

kiln_status sd3_build_forward(const kiln_config *c, kg_graph *g, int64_t B, int64_t H, int64_t W,
                              int64_t T) {
    return sd3_build_forward_par(c, g, B, H, W, T, NULL);
}

kiln_status sd3_build_forward_par(const kiln_config *c, kg_graph *g, int64_t B, int64_t H, int64_t W,
                                  int64_t T, const ka_par *par) {
    kiln_status st = sd3_check_latent(c, H, W);
    if (st) return st;
    if (B <= 0 || T <= 0)
        return kb_fail(KILN_ERR_SHAPE, "batch (%lld) and context length (%lld) must be positive",
                       (long long)B, (long long)T);
    fwd f = {g, c, (int64_t)c->num_attention_heads * c->attention_head_dim, c->num_attention_heads,
             {1, 1, 0, 0}};
    if (par) f.par = *par;
    if (f.par.tp < 1) f.par.tp = 1;
    if (f.par.sp < 1) f.par.sp = 1;
    if ((st = sd3_check_parallel(c, f.par.tp, f.par.sp))) return st;
    f.heads /= f.par.tp;
    int p = c->patch_size, sp = f.par.sp;
    int64_t hp = H / p, wp = W / p;
    if ((hp * wp) % sp)
        return kb_fail(KILN_ERR_SHAPE, "sequence parallel %d: the %lldx%lld latent has %lld image tokens (patch %d), "
                       "which do not split into %d equal parts", sp, (long long)H, (long long)W,
                       (long long)(hp * wp), p, sp);

    kg_id x = kg_input(g, "hidden_states", 4, (int64_t[]){B, c->in_channels, H, W});
    kg_id ctx = kg_input(g, "encoder_hidden_states", 3, (int64_t[]){B, T, c->joint_attention_dim});
    kg_id pooled = kg_input(g, "pooled_projections", 2, (int64_t[]){B, c->pooled_projection_dim});
    kg_id t = kg_input(g, "timestep", 1, (int64_t[]){B});

    /* pos_embed: PatchEmbed conv as patchify + linear, plus the cropped table;
     * sequence parallel keeps this rank's tokens from here to the output */
    kg_id patches = kg_patchify(g, x, p);
    kg_id pos = kg_pos_crop(g, kg_weight(g, "pos_embed.pos_embed"), c->pos_embed_max_size, hp, wp);
    if (sp > 1) {
        patches = kg_shard(g, patches, 1, sp, f.par.sp_index);
        pos = kg_shard(g, pos, 1, sp, f.par.sp_index);
    }
    kg_id hs = kg_linear(g, patches, kg_weight(g, "pos_embed.proj.weight"), kg_weight(g, "pos_embed.proj.bias"));
    hs = kg_add(g, hs, pos);

    /* time_text_embed: timestep_embedder(time_proj(t)) + text_embedder(pooled) */
    kg_id te = kg_timestep_proj(g, t, SD3_TIME_PROJ_DIM);
    te = lin(&f, kg_silu(g, lin(&f, te, "time_text_embed.timestep_embedder.linear_1", 0)),
             "time_text_embed.timestep_embedder.linear_2", 0);
    kg_id pe = lin(&f, kg_silu(g, lin(&f, pooled, "time_text_embed.text_embedder.linear_1", 0)),
                   "time_text_embed.text_embedder.linear_2", 0);
    kg_id temb = kg_add(g, te, pe);
    /* every modulation linear starts with SiLU(temb): compute it once */
    kg_id silu_temb = kg_silu(g, temb);

    ctx = lin(&f, ctx, "context_embedder", 0);
    for (int i = 0; i < c->num_layers; i++) { /* a region: compiled once per distinct block kind */
        kg_region_begin(g, i);
        hs = joint_block(&f, i, hs, &ctx, silu_temb);
        kg_region_end(g);
    }

    /* norm_out: AdaLayerNormContinuous, chunks (scale, shift) */
    kg_id emb = lin(&f, silu_temb, "norm_out.linear", 0);
    hs = kg_modulate(g, kg_layernorm(g, hs, SD3_NORM_EPS), chunk(&f, emb, 1), chunk(&f, emb, 0));
    hs = lin(&f, hs, "proj_out", 0);
    if (sp > 1) hs = kg_allgather(g, hs, 1, KD_SP, sp);
    kg_output(g, kg_unpatchify(g, hs, p, hp, wp, c->out_channels), "sample");
    return g->status;
}
