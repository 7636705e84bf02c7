/* ops.c - what each op of ops.def does: one function per op, run on a
 * kg_call by every executor (eager and planned through kg_exec_node,
 * compiled packages through their runtime table). Shapes come from the call
 * (the sources' at c->sh[s], the output's at c->sh[KG_Y]), so the same code
 * serves a concrete graph and a package's symbolic one. Every value is
 * read and written by the backend's slots (x->be): a runner only works out
 * shapes and parameters, so a backend whose memory the host cannot touch
 * runs every op. */
#include "base/base.h"
#include "graph/graph.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

static int64_t numel_of(const kg_call *c, int s) {
    int64_t e = 1;
    for (int i = 0; i < c->nd[s]; i++) e *= c->sh[s][i];
    return e;
}
static int64_t last_dim(const kg_call *c, int s) { return c->nd[s] ? c->sh[s][c->nd[s] - 1] : 1; }
#define F(k) ((const float *)c->src[k])
#define Y ((float *)c->y)
#define YS c->sh[KG_Y]

static void kg_run_linear(const kg_ctx *x, const kg_call *c) {
    const kk_backend *be = x->be;
    const kk_weight *w = c->src[1];
    int64_t M = last_dim(c, KG_Y), numel = numel_of(c, KG_Y), rows = numel / (M ? M : 1);
    const void *a = c->src[0];
    /* the second token segment of an attention's blocked output, after the first's ip[3] rows */
    if (c->ip[3]) a = (const uint16_t *)a + kk_blocked_elems(c->ip[3], last_dim(c, 0));
    if (c->ip[1]) /* res + gate * (x W^T + b), [B,N,M]; no gate: res + (x W^T + b) */
        be->linear_gate_add(a, c->fmt[0], w, F(2), F(3), c->src[4] ? F(4) + c->ip[2] : NULL,
                            c->src[4] ? c->sh[4][1] : 0, Y, YS[0], YS[1]);
    else if (c->fmt[0] || c->fmt[KG_Y])
        be->linear_io(a, c->fmt[0], w, F(2), c->y, c->fmt[KG_Y], rows, (int)c->ip[0]);
    else
        be->linear(a, w, F(2), Y, rows, (int)c->ip[0]);
}

static void kg_run_layernorm_modulate(const kg_ctx *x, const kg_call *c) {
    if (c->fmt[KG_Y])
        x->be->layernorm_modulate_bf16(F(0), F(1), F(2), c->y, YS[0], YS[1], YS[2], c->fp, c->fmt[KG_Y]);
    else
        x->be->layernorm_modulate(F(0), F(1), F(2), Y, YS[0], YS[1], YS[2], c->fp);
}

/* sources 0 and 1 and y as a binary op (numpy broadcasting), their shapes right-aligned to 4 dims */
static void binary(const kg_ctx *x, const kg_call *c, int op) {
    int64_t as[4], bs[4], ys[4];
    for (int d = 0; d < 4; d++) {
        int ia = d - (4 - c->nd[0]), ib = d - (4 - c->nd[1]), iy = d - (4 - c->nd[KG_Y]);
        as[d] = ia >= 0 ? c->sh[0][ia] : 1;
        bs[d] = ib >= 0 ? c->sh[1][ib] : 1;
        ys[d] = iy >= 0 ? c->sh[KG_Y][iy] : 1;
    }
    x->be->binary(op, F(0), as, F(1), bs, Y, ys);
}

static void kg_run_add(const kg_ctx *x, const kg_call *c) { binary(x, c, KK_BIN_ADD); }
static void kg_run_mul(const kg_ctx *x, const kg_call *c) { binary(x, c, KK_BIN_MUL); }

static void kg_run_silu(const kg_ctx *x, const kg_call *c) { x->be->silu(F(0), Y, numel_of(c, KG_Y)); }
static void kg_run_gelu_tanh(const kg_ctx *x, const kg_call *c) { x->be->gelu_tanh(F(0), Y, numel_of(c, KG_Y)); }

static void kg_run_gelu(const kg_ctx *x, const kg_call *c) { x->be->unary(KK_UN_GELU, F(0), Y, numel_of(c, KG_Y)); }
static void kg_run_quick_gelu(const kg_ctx *x, const kg_call *c) {
    x->be->unary(KK_UN_QUICK_GELU, F(0), Y, numel_of(c, KG_Y));
}

static void kg_run_gather(const kg_ctx *x, const kg_call *c) {
    x->be->gather_rows(F(0), c->sh[0][0], c->sh[0][1], F(1), numel_of(c, 1), Y);
}

static void kg_run_layernorm(const kg_ctx *x, const kg_call *c) {
    int64_t D = last_dim(c, KG_Y), rows = numel_of(c, KG_Y) / (D ? D : 1);
    x->be->layernorm(F(0), Y, rows, D, c->fp);
    if (c->src[1] || c->src[2]) x->be->affine_rows(Y, F(1), F(2), rows, D);
}

static void kg_run_rmsnorm(const kg_ctx *x, const kg_call *c) {
    int64_t D = last_dim(c, KG_Y);
    x->be->rmsnorm_rows(F(0), F(1), Y, numel_of(c, KG_Y) / (D ? D : 1), D, c->fp);
}

static void kg_run_rmsnorm_heads(const kg_ctx *x, const kg_call *c) {
    int64_t D = last_dim(c, KG_Y), H = c->ip[0];
    x->be->rmsnorm_heads(F(0), F(1), Y, numel_of(c, KG_Y) / (D ? D : 1), H, D / H, c->fp);
}

static void kg_run_modulate(const kg_ctx *x, const kg_call *c) {
    if (c->fmt[KG_Y]) x->be->modulate_bf16(F(0), F(1), F(2), c->y, YS[0], YS[1], YS[2], c->fmt[KG_Y]);
    else x->be->modulate(F(0), F(1), F(2), Y, YS[0], YS[1], YS[2]);
}

static void kg_run_gate_add(const kg_ctx *x, const kg_call *c) {
    x->be->gate_add(F(0), F(1), F(2), Y, YS[0], YS[1], YS[2]);
}

static void kg_run_slice_cols(const kg_ctx *x, const kg_call *c) {
    x->be->slice_rows(F(0), Y, YS[0], c->sh[0][1], c->ip[0], c->ip[1]);
}

static void kg_run_concat_tokens(const kg_ctx *x, const kg_call *c) {
    int64_t D = YS[2];
    x->be->concat_rows(F(0), c->sh[0][1] * D, F(1), c->sh[1][1] * D, Y, YS[0]);
}

static void kg_run_slice_tokens(const kg_ctx *x, const kg_call *c) {
    /* bf16 rows (kg_plan_bf16: D even) move as pairs, in f32-sized units */
    int64_t D = c->fmt[KG_Y] ? YS[2] / 2 : YS[2];
    x->be->slice_rows(F(0), Y, YS[0], c->sh[0][1] * D, c->ip[0] * D, c->ip[1] * D);
}

/* x [outer, n, inner] by the axis of a call's source s */
static void around_axis(const kg_call *c, int s, int axis, int64_t *outer, int64_t *inner) {
    *outer = *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= c->sh[s][d];
    for (int d = axis + 1; d < c->nd[s]; d++) *inner *= c->sh[s][d];
}

static void kg_run_slice(const kg_ctx *x, const kg_call *c) {
    int64_t outer, inner, axis = c->ip[0];
    around_axis(c, 0, (int)axis, &outer, &inner);
    x->be->slice_rows(F(0), Y, outer, c->sh[0][axis] * inner, c->ip[1] * inner, c->ip[2] * inner);
}

static void kg_run_concat(const kg_ctx *x, const kg_call *c) {
    int64_t outer, inner, axis = c->ip[0];
    around_axis(c, 0, (int)axis, &outer, &inner);
    x->be->concat_rows(F(0), c->sh[0][axis] * inner, F(1), c->sh[1][axis] * inner, Y, outer);
}

static void kg_run_attention(const kg_ctx *x, const kg_call *c) {
    const kk_backend *be = x->be;
    int64_t H = c->ip[0], Dh = YS[2] / H;
    int joint = c->ip[1] != 0;
    if (!joint && (c->fp != 0 || c->ip[2] || c->ip[3])) { /* the general form */
        int64_t bs[4] = {1, 1, 1, 1};
        if (c->ip[2])
            for (int d = 0; d < 4; d++) bs[d] = d - (4 - c->nd[3]) >= 0 ? c->sh[3][d - (4 - c->nd[3])] : 1;
        float scale = c->fp != 0 ? c->fp : 1.0f / sqrtf((float)Dh);
        be->attention_ex(F(0), F(1), F(2), c->ip[2] ? F(3) : NULL, bs, Y, YS[0], YS[1], c->sh[1][1], H, Dh, scale,
                         (int)c->ip[3]);
        return;
    }
    const float *rope = F(KG_ATTN_ROPE); /* q and k rotated as the kernel loads them */
    if (c->fmt[1]) /* q, k, v in bf16 rows (kg_plan_bf16); plain attention: one segment */
        be->attention_joint_bf16(c->src[0], c->src[1], c->src[2], joint ? c->src[3] : NULL, joint ? c->src[4] : NULL,
                                 joint ? c->src[5] : NULL, c->y, c->fmt[KG_Y], YS[0], c->sh[0][1],
                                 joint ? c->sh[4][1] : 0, H, Dh, rope);
    else if (joint) /* joint: q, k, v of two token segments, read in place */
        be->attention_joint(F(0), F(1), F(2), F(3), F(4), F(5), Y, YS[0], c->sh[0][1], c->sh[4][1], H, Dh, rope);
    else
        be->attention(F(0), F(1), F(2), Y, YS[0], YS[1], c->sh[1][1], H, Dh, rope);
}

static void kg_run_patchify(const kg_ctx *x, const kg_call *c) {
    x->be->patchify(F(0), Y, c->sh[0][0], c->sh[0][1], c->sh[0][2], c->sh[0][3], c->ip[0]);
}

static void kg_run_unpatchify(const kg_ctx *x, const kg_call *c) {
    x->be->unpatchify(F(0), Y, YS[0], c->ip[0], c->ip[1], c->ip[2], YS[1], (int)c->ip[3]);
}

static void kg_run_timestep_proj(const kg_ctx *x, const kg_call *c) {
    x->be->timestep_proj(F(0), Y, YS[0], c->ip[0], c->fp);
}

static void kg_run_rope_table(const kg_ctx *x, const kg_call *c) {
    int64_t axes[3] = {c->ip[3] & 0xffff, c->ip[3] >> 16, 0};
    axes[2] = YS[1] - axes[0] - axes[1];
    x->be->rope_table(Y, c->ip[0], c->ip[1], c->ip[2], axes, c->fp);
}

static void kg_run_rope(const kg_ctx *x, const kg_call *c) {
    int64_t H = c->ip[0];
    x->be->rope(F(0), F(1), Y, YS[0], YS[1], H, YS[2] / H);
}

static void kg_run_pos_crop(const kg_ctx *x, const kg_call *c) {
    x->be->pos_crop(F(0), Y, c->ip[0], c->ip[1], c->ip[2], YS[2]);
}

/* the collectives (graph_dist.c), [B,N,D] in and out */
static void kg_run_dist_node(const kg_ctx *x, const kg_call *c) {
    kg_run_dist_op(x->dist, c->op, c->ip, c->sh[0], c->sh[KG_Y], F(0), Y);
}

/* ---- the VAE's ops ---------------------------------------------------------- */

/* x [B,Cin,H,W] * w [Cout,Cin,kh,kw] (+ b) (+ src[3], a residual kg_fuse
 * folded in) -> [B,Cout,Ho,Wo] (ip[3] bit 0: both channels last; bit 1: x
 * upsampled 2x first, w sub-pixel) */
static void kg_run_conv2d(const kg_ctx *x, const kg_call *c) {
    const int64_t *xs = c->sh[0];
    kk_conv p = c->ip[3] & 1 ? (kk_conv){xs[0], xs[3], xs[1], xs[2], YS[3], c->sh[1][2], c->sh[1][3], YS[1], YS[2],
                                         c->ip[0], c->ip[1], c->ip[2], 1, c->ip[3] >> 1 & 1, c->fmt[0] == KK_FMT_BF16,
                                         F(3) != NULL, c->fmt[KG_Y] == KK_FMT_BF16}
                             : (kk_conv){xs[0], xs[1], xs[2], xs[3], YS[1], c->sh[1][2], c->sh[1][3], YS[2], YS[3],
                                         c->ip[0], c->ip[1], c->ip[2], 0, 0, 0, F(3) != NULL, 0};
    x->be->conv2d(F(0), (const kk_weight *)c->src[1], F(2), F(3), Y, &p); /* the weight: its GEMM view (ops.def) */
}

/* x [B,C,...] (ip[2]: [B,...,C]): every dim but the batch and the channels is one position axis */
static void kg_run_group_norm(const kg_ctx *x, const kg_call *c) {
    int nhwc = (int)c->ip[2];
    int64_t B = c->sh[0][0], C = nhwc ? last_dim(c, 0) : c->sh[0][1], BC = B * C, S = numel_of(c, KG_Y) / (BC ? BC : 1);
    x->be->group_norm(F(0), F(1), F(2), Y, B, C, S, c->ip[0], c->fp, (int)c->ip[1], nhwc, c->fmt[0] == KK_FMT_BF16,
                      c->fmt[KG_Y] == KK_FMT_BF16);
}

static void kg_run_upsample(const kg_ctx *x, const kg_call *c) {
    const int64_t *s = c->sh[0];
    if (c->ip[1]) x->be->upsample_nearest(F(0), Y, s[0], s[3], s[1], s[2], c->ip[0], 1);
    else x->be->upsample_nearest(F(0), Y, s[0], s[1], s[2], s[3], c->ip[0], 0);
}

static void kg_run_logvar_std(const kg_ctx *x, const kg_call *c) { x->be->logvar_std(F(0), Y, numel_of(c, KG_Y)); }

/* ---- the text encoders' ops ------------------------------------------------- */

static void kg_run_select_token(const kg_ctx *x, const kg_call *c) {
    x->be->select_token(F(0), F(1), Y, c->sh[0][0], c->sh[0][1], c->sh[0][2], c->ip[0]);
}

/* ---- T5 ---------------------------------------------------------------------- */

static void kg_run_rel_pos_bias(const kg_ctx *x, const kg_call *c) {
    x->be->rel_pos_bias(F(0), c->sh[0][0], c->sh[0][1], YS[2], YS[3], c->ip[0], (int)c->ip[1], Y);
}

static void kg_run_relu(const kg_ctx *x, const kg_call *c) { x->be->unary(KK_UN_RELU, F(0), Y, numel_of(c, KG_Y)); }

static void kg_run_reshape(const kg_ctx *x, const kg_call *c) {
    x->be->copy(Y, F(0), sizeof(float) * (size_t)numel_of(c, KG_Y));
}

/* ---- an op a backend does not run: on the host, on copies --------------------- */

/* c's op on the host backend: every source copied out of the backend,
 * the output computed there and copied back (f32 values only: the planner
 * gives a backend bf16 formats only for ops it runs itself; a GEMM weight
 * is no value to copy, so an op reading one runs on its backend) */
static void kg_run_on_host(const kg_ctx *x, const kg_call *c) {
    const kg_op_info *op = &kg_ops[c->op];
    kg_call h = *c;
    void *tmp[KG_MAX_SRC + 1] = {0};
    int ok = 1;
    for (int s = 0; s <= KG_MAX_SRC && ok; s++) {
        const void *p = s == KG_Y ? c->y : c->src[s];
        if (!p) continue;
        size_t bytes = sizeof(float) * (size_t)numel_of(c, s);
        ok = s != op->gemm_src && c->fmt[s] == KK_FMT_F32 && (tmp[s] = kb_alloc_aligned(bytes ? bytes : 1));
        if (!ok) break;
        if (s != KG_Y) kk_copy_to_host(x->be, tmp[s], p, bytes);
        if (s == KG_Y) h.y = tmp[s];
        else h.src[s] = tmp[s];
    }
    if (ok) {
        const kg_ctx hx = {kk_host(), x->dist};
        op->run(&hx, &h);
        kk_copy_from_host(x->be, c->y, tmp[KG_Y], sizeof(float) * (size_t)numel_of(c, KG_Y));
    } else {
        kb_defer_failure(KILN_ERR_UNSUPPORTED, "%s: the %s backend does not run it, and it cannot run on the host in its "
                         "place (%s)", op->name, x->be->name, op->gemm_src >= 0 ? "it reads a GEMM weight" : "out of memory, or a bf16 format");
    }
    for (int s = 0; s <= KG_MAX_SRC; s++) kb_free_aligned(tmp[s]);
}

kg_run_fn kg_runner(const kk_backend *be, kg_op op) {
    if ((unsigned)op >= KG_OP_COUNT || !kg_ops[op].run) return NULL;
    return kk_supports(be, kg_ops[op].slot, KK_FMT_F32, NULL) ? kg_ops[op].run : kg_run_on_host;
}

const kg_op_info kg_ops[KG_OP_COUNT] = {
#define KG_OP(id, name, gemm_src, slot, run) [KG_##id] = {name, gemm_src, KK_SLOT_##slot, run},
#include "graph/ops.def"
#undef KG_OP
};

const char *kg_op_name(kg_op op) { return (unsigned)op < KG_OP_COUNT ? kg_ops[op].name : "?"; }

const char *kg_op_table_names(void) {
    static const char names[] =
#define KG_OP(id, name, gemm_src, slot, run) name ","
#include "graph/ops.def"
#undef KG_OP
        "";
    return names;
}

/* ---- a node's call ------------------------------------------------------------ */

void kg_call_of(const kg_graph *g, const kg_node *n, float *const *buf, void *y, kg_call *c) {
    memset(c, 0, sizeof *c);
    c->op = n->op;
    int gs = kg_ops[n->op].gemm_src;
    for (int s = 0; s < KG_MAX_SRC; s++) {
        kg_id id = n->src[s];
        if (id < 0) continue;
        const kg_node *p = &g->nodes[id];
        c->src[s] = s == gs ? (const void *)p->kw : (const void *)buf[id];
        c->nd[s] = p->ndim;
        c->fmt[s] = p->out_bf16;
        memcpy(c->sh[s], p->shape, sizeof c->sh[s]);
    }
    c->y = y;
    c->nd[KG_Y] = n->ndim;
    c->fmt[KG_Y] = n->out_bf16;
    memcpy(c->sh[KG_Y], n->shape, sizeof c->sh[KG_Y]);
    memcpy(c->ip, n->iparam, sizeof c->ip);
    c->fp = n->fparam;
}
