/* test_backend_ops.c - every op of ops.def on every backend of this build,
 * from one table (as ggml's test-backend-ops): each row builds a small graph
 * around its op, and each backend runs it eager and planned (kg_fuse, then
 * the formats the backend wants: kg_plan_bf16), on its own memory (inputs
 * staged in, weights mapped or packed as its cache would hold them), with
 * every GEMM weight dtype it takes; the outputs against the reference
 * kernels' eager run. A row per op: adding an op to ops.def without one
 * fails here, and so does a backend that claims a format (kk_supports) no
 * row made it run. One backend is the check backend with half its slots
 * refused, so that those ops run on the host on copies (kg_runner), bit for
 * bit as on the check backend itself. And host code reading a check
 * backend's buffer behind its back dies. */
#include "base/base.h"
#include "compile/compile.h"
#include "dist/dist.h"
#include "graph/graph.h"
#include "kernels/kernels.h"
#include "test.h"

#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { B = 2, N = 12, D = 64, H = 4, V = 50, NB = 5 };

/* ---- weights: made once per name, seen by the backend under test as it wants them ---- */

enum { W_DATA, W_LINEAR, W_CONV };
typedef struct tw {
    char name[32];
    int ndim, kind;
    int64_t shape[4];
    float *host;      /* f32 row-major, noise by name */
    kk_weight kw;     /* the backend's view */
    void *dev_f32, *packed, *dev_packed;
} tw;
static tw g_w[64];
static int g_nw;
static const kk_backend *g_wbe; /* the backend the views are for */
static kiln_dtype g_wdt;        /* the dtype its GEMM weights are packed in */

static void weights_reset(const kk_backend *be, kiln_dtype wdt) {
    for (int i = 0; i < g_nw; i++) {
        tw *w = &g_w[i];
        kk_buf_unmap(g_wbe, w->dev_f32, NULL);
        kk_buf_unmap(g_wbe, w->dev_packed, NULL);
        kb_free_aligned(w->packed);
        free(w->host);
    }
    memset(g_w, 0, sizeof g_w);
    g_nw = 0;
    g_wbe = be;
    g_wdt = wdt;
}

static uint64_t name_seed(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    while (*s) h = (h ^ (uint8_t)*s++) * 1099511628211ULL;
    return h;
}

/* the views of w for g_wbe: GEMM weights packed where it packs (a
 * convolution's in the compute dtype, a linear's in g_wdt), mapped */
static void views_make(tw *w) {
    int64_t M = w->shape[0], K = 1;
    for (int d = 1; d < w->ndim; d++) K *= w->shape[d];
    int conv = w->kind == W_CONV;
    if (w->kind != W_DATA && kk_packs(g_wbe)) {
        kiln_dtype dt = conv && kk_dtype_is_quant(g_wdt) ? KILN_BF16 : g_wdt;
        const int64_t sh[4] = {M, conv ? w->shape[1] : K, conv ? w->shape[2] : 1, conv ? w->shape[3] : 1};
        char lay[40];
        size_t bytes = 0;
        CHECK_OK(kk_pack_layout(g_wbe, sh, conv, dt, lay, &bytes));
        w->packed = kb_alloc_aligned(bytes);
        CHECK_OK(kk_pack(g_wbe, w->host, sh, conv, dt, w->packed));
        w->dev_packed = kk_buf_map(g_wbe, w->packed, bytes);
        w->kw = (kk_weight){M, K, NULL, w->dev_packed, dt, kk_weight_scales(w->dev_packed, bytes, M, dt)};
    } else {
        w->dev_f32 = kk_buf_map(g_wbe, w->host, sizeof(float) * (size_t)(M * K));
        w->kw = (kk_weight){M, K, w->dev_f32, NULL, KILN_F32, NULL};
    }
}

static int resolve(void *user, const char *name, int *ndim, int64_t shape[4], const float **data, const kk_weight **kw) {
    (void)user;
    for (int i = 0; i < g_nw; i++)
        if (!strcmp(g_w[i].name, name)) {
            *ndim = g_w[i].ndim;
            memcpy(shape, g_w[i].shape, sizeof g_w[i].shape);
            *data = g_w[i].dev_f32;
            *kw = &g_w[i].kw;
            return 1;
        }
    return 0;
}

/* a weight of the graph: made (noise by name, views for the backend) the first time */
static kg_id Wt(kg_graph *g, const char *name, int kind, int nd, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    int i = 0;
    while (i < g_nw && strcmp(g_w[i].name, name)) i++;
    if (i == g_nw && g_nw < 64) {
        tw *w = &g_w[g_nw++];
        snprintf(w->name, sizeof w->name, "%s", name);
        w->ndim = nd, w->kind = kind;
        const int64_t s[4] = {s0, s1, s2, s3};
        size_t n = 1;
        for (int d = 0; d < nd; d++) w->shape[d] = s[d], n *= (size_t)s[d];
        w->host = malloc(sizeof(float) * n);
        kiln_noise(name_seed(name), w->host, n);
        for (size_t k = 0; k < n; k++) w->host[k] *= kind == W_DATA ? 1.0f : 0.2f;
        views_make(w);
    }
    return kg_weight(g, name);
}

#define IN(name, nd, ...) kg_input(g, name, nd, (int64_t[]){__VA_ARGS__})
#define LIN(name, out, in) Wt(g, name, W_LINEAR, 2, out, in, 0, 0)
#define VEC(name, n) Wt(g, name, W_DATA, 1, n, 0, 0, 0)
#define CONVW(name, co, ci, k) Wt(g, name, W_CONV, 4, co, ci, k, k)

/* ---- the rows: a graph around each op ------------------------------------------------ */

static kiln_status b_linear(kg_graph *g) {
    kg_id x = IN("x", 3, B, N, D), res = IN("res", 3, B, N, D), gate = IN("gate", 2, B, D);
    kg_id h = kg_gelu_tanh(g, kg_linear(g, x, LIN("l1.w", D, D), VEC("l1.b", D)));
    h = kg_linear(g, h, LIN("l2.w", D, D), -1);
    kg_mark_output(g, kg_gate_add(g, res, gate, kg_linear(g, h, LIN("l3.w", D, D), VEC("l3.b", D))));
    return g->status;
}
static kiln_status b_add(kg_graph *g) {
    kg_id x = IN("x", 3, B, N, D);
    kg_mark_output(g, kg_add(g, x, IN("u", 3, 1, N, 1)));
    kg_mark_output(g, kg_add(g, x, VEC("w", D)));
    return g->status;
}
static kiln_status b_mul(kg_graph *g) {
    kg_id x = IN("x", 3, B, N, D);
    kg_mark_output(g, kg_mul(g, x, IN("u", 3, 1, N, 1)));
    kg_mark_output(g, kg_mul(g, x, VEC("w", D)));
    return g->status;
}
static kiln_status b_silu(kg_graph *g) {
    kg_mark_output(g, kg_silu(g, IN("x", 3, B, N, D)));
    return g->status;
}
static kiln_status b_gelu_tanh(kg_graph *g) {
    kg_mark_output(g, kg_gelu_tanh(g, IN("x", 3, B, N, D)));
    return g->status;
}
static kiln_status b_gelu(kg_graph *g) {
    kg_mark_output(g, kg_gelu(g, IN("x", 3, B, N, D)));
    return g->status;
}
static kiln_status b_quick_gelu(kg_graph *g) {
    kg_mark_output(g, kg_quick_gelu(g, IN("x", 3, B, N, D)));
    return g->status;
}
static kiln_status b_relu(kg_graph *g) {
    kg_mark_output(g, kg_relu(g, IN("x", 3, B, N, D)));
    return g->status;
}
static kiln_status b_logvar_std(kg_graph *g) {
    kg_mark_output(g, kg_logvar_std(g, IN("x", 3, B, N, D)));
    return g->status;
}
static kiln_status b_gather(kg_graph *g) {
    kg_mark_output(g, kg_gather(g, Wt(g, "table", W_DATA, 2, V, D, 0, 0), IN("ids", 2, B, N)));
    return g->status;
}
static kiln_status b_layernorm(kg_graph *g) {
    kg_id x = IN("x", 3, B, N, D);
    kg_mark_output(g, kg_layernorm_affine(g, x, VEC("w", D), VEC("b", D), 1e-5f));
    kg_mark_output(g, kg_layernorm(g, x, 1e-6f));
    return g->status;
}
static kiln_status b_rmsnorm(kg_graph *g) {
    kg_id x = IN("x", 3, B, N, D);
    kg_mark_output(g, kg_rmsnorm(g, x, VEC("w", D), 1e-6f));
    kg_mark_output(g, kg_rmsnorm(g, x, -1, 1e-6f));
    return g->status;
}
static kiln_status b_rmsnorm_heads(kg_graph *g) {
    kg_mark_output(g, kg_rmsnorm_heads(g, IN("x", 3, B, N, D), VEC("w", D / H), H, 1e-6f));
    return g->status;
}
/* a modulate that a linear reads (bf16 where the backend's GEMM takes it) */
static kiln_status b_modulate(kg_graph *g) {
    kg_id m = kg_modulate(g, IN("x", 3, B, N, D), IN("shift", 2, B, D), IN("scale", 2, B, D));
    kg_mark_output(g, kg_linear(g, m, LIN("l.w", D, D), VEC("l.b", D)));
    return g->status;
}
/* layernorm then modulate: one op after kg_fuse */
static kiln_status b_ln_modulate(kg_graph *g) {
    kg_id m = kg_modulate(g, kg_layernorm(g, IN("x", 3, B, N, D), 1e-6f), IN("shift", 2, B, D), IN("scale", 2, B, D));
    kg_mark_output(g, kg_linear(g, m, LIN("l.w", D, D), VEC("l.b", D)));
    return g->status;
}
static kiln_status b_gate_add(kg_graph *g) {
    kg_mark_output(g, kg_gate_add(g, IN("res", 3, B, N, D), IN("gate", 2, B, D), IN("y", 3, B, N, D)));
    return g->status;
}
static kiln_status b_slice_cols(kg_graph *g) {
    kg_mark_output(g, kg_slice_cols(g, IN("x", 2, B, 3 * D), D, D));
    return g->status;
}
static kiln_status b_concat_tokens(kg_graph *g) {
    kg_mark_output(g, kg_concat_tokens(g, IN("a", 3, B, N, D), IN("b", 3, B, NB, D)));
    return g->status;
}
static kiln_status b_slice_tokens(kg_graph *g) {
    kg_mark_output(g, kg_slice_tokens(g, IN("x", 3, B, N, D), 3, 6));
    return g->status;
}
static kiln_status b_slice(kg_graph *g) {
    kg_id x = IN("x", 3, B, N, D);
    kg_mark_output(g, kg_slice(g, x, 2, 8, 16));
    kg_mark_output(g, kg_slice(g, x, 1, 2, 5));
    return g->status;
}
static kiln_status b_concat(kg_graph *g) {
    kg_mark_output(g, kg_concat(g, IN("a", 3, B, N, 16), IN("b", 3, B, N, 8), 2));
    kg_mark_output(g, kg_concat(g, IN("c", 3, B, 3, D), IN("d", 3, B, NB, D), 1));
    return g->status;
}
/* SD3's joint block: q, k, v of two token segments made by linears, one
 * attention over both, its output sliced back and read by linears; and the
 * general form (a scale, an additive bias, causal) */
static kiln_status b_attention(kg_graph *g) {
    kg_id xa = IN("xa", 3, B, N, D), xb = IN("xb", 3, B, NB, D);
    const char *names[2][3] = {{"qa.w", "ka.w", "va.w"}, {"qb.w", "kb.w", "vb.w"}};
    kg_id p[2][3];
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 3; k++) p[s][k] = kg_linear(g, s ? xb : xa, LIN(names[s][k], D, D), -1);
    kg_id o = kg_attention(g, kg_concat_tokens(g, p[0][0], p[1][0]), kg_concat_tokens(g, p[0][1], p[1][1]),
                           kg_concat_tokens(g, p[0][2], p[1][2]), H);
    kg_mark_output(g, kg_linear(g, kg_slice_tokens(g, o, 0, N), LIN("oa.w", D, D), -1));
    kg_mark_output(g, kg_linear(g, kg_slice_tokens(g, o, N, NB), LIN("ob.w", D, D), -1));
    kg_id x = IN("x", 3, B, N, D);
    kg_mark_output(g, kg_attention_ex(g, x, x, x, H, 0.3f, IN("bias", 4, B, 1, N, N), 1));
    return g->status;
}
static kiln_status b_patchify(kg_graph *g) {
    kg_mark_output(g, kg_patchify(g, IN("x", 4, B, 4, 8, 8), 2));
    return g->status;
}
static kiln_status b_unpatchify(kg_graph *g) {
    kg_mark_output(g, kg_unpatchify(g, IN("x", 3, B, 16, 16), 2, 4, 4, 4));
    kg_mark_output(g, kg_unpatchify_cfirst(g, IN("y", 3, B, 12, 16), 2, 3, 4, 4)); /* Flux's order */
    return g->status;
}
static kiln_status b_timestep_proj(kg_graph *g) {
    kg_mark_output(g, kg_timestep_proj(g, IN("t", 1, B), 32));
    kg_mark_output(g, kg_timestep_proj_scaled(g, IN("t", 1, B), 16, 1000.0f)); /* Flux's */
    return g->status;
}
/* the position table cropped to 3 x 4 (a shape constant), added to x */
static kiln_status b_pos_crop(kg_graph *g) {
    kg_id pos = kg_pos_crop(g, Wt(g, "pos", W_DATA, 3, 1, 64, D, 0), 8, 3, 4);
    kg_mark_output(g, kg_add(g, IN("x", 3, B, N, D), pos));
    return g->status;
}
/* Flux's rotary table (a shape constant) for 2 text and 2 x 3 image
 * tokens, applied to projected q of 2 heads of 8 */
static kiln_status b_rope_table(kg_graph *g) {
    kg_id t = kg_rope_table(g, 2, 2, 3, (int[]){2, 2, 4}, 10000.0f);
    kg_mark_output(g, kg_add(g, IN("x", 2, 8, 8), t));
    return g->status;
}
static kiln_status b_rope(kg_graph *g) {
    kg_id t = kg_rope_table(g, 2, 2, 3, (int[]){2, 2, 4}, 10000.0f);
    kg_id q = kg_linear(g, IN("x", 3, B, 8, D), LIN("q.w", 16, D), -1);
    kg_mark_output(g, kg_rope(g, q, t, 2));
    return g->status;
}
static kiln_status b_shard(kg_graph *g) {
    kg_mark_output(g, kg_shard(g, IN("x", 3, B, N, D), 1, 2, 1));
    kg_mark_output(g, kg_shard(g, IN("y", 3, B, N, D), 2, 4, 2));
    return g->status;
}
/* one process: the collectives over groups of one */
static kiln_status b_allgather(kg_graph *g) {
    kg_mark_output(g, kg_allgather(g, IN("x", 3, B, N, D), 1, KD_SP, 1));
    return g->status;
}
static kiln_status b_alltoall(kg_graph *g) {
    kg_mark_output(g, kg_alltoall(g, IN("x", 3, B, N, D), 1, KD_SP, 1));
    return g->status;
}
static kiln_status b_allreduce(kg_graph *g) {
    kg_mark_output(g, kg_allreduce(g, IN("x", 3, B, N, D), KD_TP));
    return g->status;
}
static kiln_status b_fsdp_gather(kg_graph *g) {
    kg_mark_output(g, kg_fsdp_gather(g, IN("x", 3, B, N, D), 0));
    return g->status;
}
/* the VAE's channels-last convolutions: a group norm only convolutions
 * read, a convolution another convolution and a group norm read (both in
 * bf16 rows where the backend takes them), a residual add, an upsample
 * folded into its conv, a strided conv; and one channels first */
static kiln_status b_conv2d(kg_graph *g) {
    kg_id x = IN("x", 4, B, 4, 8, 8);
    kg_id xl = kg_reshape(g, kg_patchify(g, x, 1), 4, (int64_t[]){B, 8, 8, 4});
    kg_id a = kg_group_norm(g, xl, VEC("gn.w", 4), VEC("gn.b", 4), 2, 1e-6f, 1, KG_NHWC);
    kg_id c1 = kg_conv2d(g, a, CONVW("c1.w", 16, 4, 3), VEC("c1.b", 16), 1, 1, 1, KG_NHWC);
    kg_id c2 = kg_conv2d(g, c1, CONVW("c2.w", 16, 16, 3), VEC("c2.b", 16), 1, 1, 1, KG_NHWC);
    kg_id n1 = kg_group_norm(g, c1, -1, -1, 4, 1e-6f, 1, KG_NHWC);
    kg_id r = kg_add(g, kg_conv2d(g, n1, CONVW("c3.w", 16, 16, 3), -1, 1, 1, 1, KG_NHWC), c2);
    kg_id up = kg_conv2d_up2(g, r, Wt(g, "up.w", W_CONV, 4, 4 * 8, 16, 2, 2), VEC("up.b", 8));
    kg_mark_output(g, kg_conv2d(g, up, CONVW("s.w", 8, 8, 3), -1, 2, 0, 1, KG_NHWC));
    kg_mark_output(g, kg_conv2d(g, x, CONVW("n.w", 8, 4, 3), VEC("n.b", 8), 1, 1, 1, KG_NCHW));
    return g->status;
}
static kiln_status b_group_norm(kg_graph *g) {
    kg_id x = IN("x", 4, B, 8, 4, 4);
    kg_mark_output(g, kg_group_norm(g, x, VEC("w", 8), VEC("b", 8), 2, 1e-5f, 0, KG_NCHW));
    kg_mark_output(g, kg_group_norm(g, x, -1, -1, 4, 1e-6f, 1, KG_NHWC));
    return g->status;
}
static kiln_status b_upsample(kg_graph *g) {
    kg_id x = IN("x", 4, B, 4, 4, 4);
    kg_mark_output(g, kg_upsample_nearest(g, x, 2, KG_NCHW));
    kg_mark_output(g, kg_upsample_nearest(g, x, 2, KG_NHWC));
    return g->status;
}
static kiln_status b_select_token(kg_graph *g) {
    kg_id x = IN("x", 3, B, N, D), ids = IN("ids", 2, B, N);
    kg_mark_output(g, kg_select_token(g, x, ids, -1));
    kg_mark_output(g, kg_select_token(g, x, ids, 7));
    return g->status;
}
/* T5's position bias (a shape constant), added to x */
static kiln_status b_rel_pos_bias(kg_graph *g) {
    kg_id t = Wt(g, "table", W_DATA, 2, 32, H, 0, 0);
    kg_mark_output(g, kg_add(g, IN("x", 4, B, H, N, N), kg_rel_pos_bias(g, t, N, N, 128, 1)));
    kg_mark_output(g, kg_add(g, IN("y", 4, 1, H, N, N), kg_rel_pos_bias(g, t, N, N, 40, 0)));
    return g->status;
}
static kiln_status b_reshape(kg_graph *g) {
    kg_mark_output(g, kg_reshape(g, IN("x", 3, B, N, D), 3, (int64_t[]){B, 2 * N, D / 2}));
    return g->status;
}

typedef struct row {
    kg_op op;
    kiln_status (*build)(kg_graph *g); /* NULL: the op is never run (not_run says why) */
    double tol16;                      /* against the reference on a bf16 backend (f32 ones: 1e-5) */
    int quant;                         /* its GEMMs also on quantized weights where the backend has them */
    const char *not_run;
} row;

static const row k_rows[] = {
    {KG_INPUT, NULL, 0, 0, "bound to the forward's buffers, never run"},
    {KG_WEIGHT, NULL, 0, 0, "bound to the model's mapped weights, never run"},
    {KG_LINEAR, b_linear, 2e-2, 1, NULL},
    {KG_ADD, b_add, 0, 0, NULL},
    {KG_MUL, b_mul, 0, 0, NULL},
    {KG_SILU, b_silu, 1e-6, 0, NULL},
    {KG_GELU_TANH, b_gelu_tanh, 1e-6, 0, NULL},
    {KG_GELU, b_gelu, 1e-6, 0, NULL},
    {KG_QUICK_GELU, b_quick_gelu, 1e-6, 0, NULL},
    {KG_GATHER, b_gather, 0, 0, NULL},
    {KG_LAYERNORM, b_layernorm, 1e-6, 0, NULL},
    {KG_RMSNORM, b_rmsnorm, 1e-6, 0, NULL},
    {KG_RMSNORM_HEADS, b_rmsnorm_heads, 1e-6, 0, NULL},
    {KG_MODULATE, b_modulate, 2e-2, 0, NULL},
    {KG_GATE_ADD, b_gate_add, 1e-6, 0, NULL},
    {KG_SLICE_COLS, b_slice_cols, 0, 0, NULL},
    {KG_CONCAT_TOKENS, b_concat_tokens, 0, 0, NULL},
    {KG_SLICE_TOKENS, b_slice_tokens, 0, 0, NULL},
    {KG_SLICE, b_slice, 0, 0, NULL},
    {KG_CONCAT, b_concat, 0, 0, NULL},
    {KG_ATTENTION, b_attention, 3e-2, 0, NULL},
    {KG_PATCHIFY, b_patchify, 0, 0, NULL},
    {KG_UNPATCHIFY, b_unpatchify, 0, 0, NULL},
    {KG_TIMESTEP_PROJ, b_timestep_proj, 1e-6, 0, NULL},
    {KG_POS_CROP, b_pos_crop, 0, 0, NULL},
    {KG_ROPE_TABLE, b_rope_table, 0, 0, NULL},
    {KG_ROPE, b_rope, 2e-2, 0, NULL},
    {KG_LN_MODULATE, b_ln_modulate, 2e-2, 0, NULL},
    {KG_ALIAS, NULL, 0, 0, "folded into its producer by kg_fuse, never run"},
    {KG_SHARD, b_shard, 0, 0, NULL},
    {KG_ALLGATHER, b_allgather, 0, 0, NULL},
    {KG_ALLTOALL, b_alltoall, 0, 0, NULL},
    {KG_ALLREDUCE, b_allreduce, 0, 0, NULL},
    {KG_FSDP_GATHER, b_fsdp_gather, 0, 0, NULL},
    {KG_CONV2D, b_conv2d, 2e-2, 0, NULL},
    {KG_GROUP_NORM, b_group_norm, 1e-6, 0, NULL},
    {KG_UPSAMPLE, b_upsample, 0, 0, NULL},
    {KG_LOGVAR_STD, b_logvar_std, 1e-6, 0, NULL},
    {KG_SELECT_TOKEN, b_select_token, 0, 0, NULL},
    {KG_REL_POS_BIAS, b_rel_pos_bias, 0, 0, NULL},
    {KG_RELU, b_relu, 0, 0, NULL},
    {KG_RESHAPE, b_reshape, 0, 0, NULL},
};
enum { NROWS = sizeof k_rows / sizeof k_rows[0] };

/* ---- running a row ---------------------------------------------------------------- */

/* an input's values: ids in range, timesteps, else noise */
static void input_values(const char *name, float *v, size_t n, uint64_t seed) {
    kiln_noise(seed, v, n);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(name, "ids")) v[i] = (float)((size_t)(fabsf(v[i]) * 1000) % (i % 7 == 3 ? 8 : V));
        if (!strcmp(name, "t")) v[i] = fabsf(v[i]) * 500;
    }
}

typedef struct result {
    int n;
    float *out[8];
    size_t numel[8];
    int ops; /* nodes of the row's op that ran */
} result;

static void result_free(result *r) {
    for (int k = 0; k < r->n; k++) free(r->out[k]);
    memset(r, 0, sizeof *r);
}

/* the formats each slot ran in on a backend: [slot][fmt] */
static char g_seen[KK_SLOT_COUNT][3];


/* row r on be (its GEMM weights packed in wdt), eager or planned; outputs to the host */
static kiln_status run_row(const row *r, const kk_backend *be, kiln_dtype wdt, int planned, result *res) {
    memset(res, 0, sizeof *res);
    weights_reset(be, wdt);
    kg_graph g;
    kg_init(&g, resolve, NULL);
    kiln_status st = r->build(&g);
    if (!st && planned) {
        kg_fuse(&g);
        kg_plan_bf16(&g, be);
    }
    if (st) {
        kg_free(&g);
        return st;
    }
    char *live = malloc((size_t)g.n + 1);
    int *last = malloc(sizeof(int) * ((size_t)g.n + 1));
    kg_liveness(&g, live, last);
    for (int i = 0; i < g.n; i++) {
        const kg_node *n = &g.nodes[i];
        if (!live[i]) continue;
        res->ops += n->op == r->op;
        if (n->out_bf16) g_seen[kg_ops[n->op].slot][n->out_bf16] = 1;
        for (int s = 0; s < KG_MAX_SRC; s++)
            if (n->src[s] >= 0 && g.nodes[n->src[s]].out_bf16) g_seen[kg_ops[n->op].slot][g.nodes[n->src[s]].out_bf16] = 1;
    }
    free(live), free(last);
    /* the inputs, staged into the backend as a forward stages them */
    float *in[8] = {0}, *dout[8] = {0};
    const float *din[8] = {0};
    for (int i = 0; i < g.n; i++) {
        const kg_node *n = &g.nodes[i];
        if (n->op != KG_INPUT) continue;
        size_t cnt = (size_t)kg_numel(n);
        int slot = (int)n->iparam[0];
        in[slot] = malloc(sizeof(float) * cnt);
        input_values(n->name, in[slot], cnt, 100 + (uint64_t)slot);
        float *d = kk_buf_alloc(be, sizeof(float) * cnt);
        kk_copy_from_host(be, d, in[slot], sizeof(float) * cnt);
        din[slot] = d;
    }
    res->n = g.n_outputs;
    for (int o = 0; o < g.n_outputs; o++) {
        res->numel[o] = (size_t)kg_numel(&g.nodes[g.outputs[o]]);
        dout[o] = kk_buf_alloc(be, sizeof(float) * res->numel[o]);
        res->out[o] = calloc(res->numel[o], sizeof(float));
    }
    kb_run run;
    kb_run *outer = kb_run_begin(&run);
    if (planned) {
        kx_plan plan;
        st = kx_plan_graph(&g, &plan);
        void *arena = st ? NULL : kk_buf_alloc(be, plan.arena_bytes + 64);
        if (!st) st = kx_run_planned(&g, &plan, be, arena, NULL, din, dout);
        kk_buf_free(be, arena);
        kx_plan_free(&plan);
    } else {
        st = kg_run_eager(&g, be, din, dout);
    }
    kb_run_end(outer);
    if (!st) st = kb_run_status(&run);
    for (int o = 0; o < g.n_outputs; o++) {
        if (!st) kk_copy_to_host(be, res->out[o], dout[o], sizeof(float) * res->numel[o]);
        kk_buf_free(be, dout[o]);
    }
    for (int k = 0; k < 8; k++) {
        free(in[k]);
        kk_buf_free(be, (void *)din[k]);
    }
    kg_free(&g);
    weights_reset(be, wdt);
    return st;
}

/* ---- the backends: every registered one, and the check backend with half its slots refused ---- */

static int partial_supports(int slot, int fmt, const kk_weight *w) {
    (void)w;
    /* every other slot runs on the host; the GEMM slots, whose weights are no values to copy, here */
    return fmt == KK_FMT_F32 && (slot % 2 == 0 || slot == KK_SLOT_LINEAR || slot == KK_SLOT_CONV2D);
}

typedef struct target {
    const char *label;
    const kk_backend *be;
    kiln_dtype wdt; /* GEMM weights packed in */
} target;

TEST(every_op_has_a_row) {
    for (int op = 0; op < KG_OP_COUNT; op++) {
        int found = 0;
        for (int r = 0; r < NROWS; r++) found += k_rows[r].op == (kg_op)op;
        CHECK_MSG(found == 1, "op %s has %d rows in tests/test_backend_ops.c (one wanted)", kg_op_name((kg_op)op), found);
    }
    for (int r = 0; r < NROWS; r++) {
        int runs = kg_ops[k_rows[r].op].run != NULL, graph = k_rows[r].build != NULL;
        CHECK_MSG(runs == graph && graph == !k_rows[r].not_run,
                  "row %s: a graph wanted exactly for an op executors run, and a reason for one they never run",
                  kg_op_name(k_rows[r].op));
    }
}

TEST(every_op_on_every_backend) {
    kk_backend partial = *kk_backend_get("check", KILN_F32);
    partial.name = "check-partial";
    partial.supports = partial_supports;
    CHECK(kg_runner(&partial, KG_GELU_TANH) != kg_ops[KG_GELU_TANH].run && kg_runner(&partial, KG_SILU) == kg_ops[KG_SILU].run);
    target t[8];
    int nt = 0;
    t[nt++] = (target){"reference", kk_backend_get("reference", KILN_F32), KILN_F32};
    t[nt++] = (target){"check", kk_backend_get("check", KILN_F32), KILN_F32};
    t[nt++] = (target){"check, half its slots on the host", &partial, KILN_F32};
    if (kk_backend_get("cpu", KILN_F32)) t[nt++] = (target){"cpu f32", kk_backend_get("cpu", KILN_F32), KILN_F32};
    const kk_backend *bf = kk_backend_get("cpu", KILN_BF16);
    if (bf) {
        t[nt++] = (target){"cpu bf16", bf, KILN_BF16};
        if (!kk_weight_dtype_error(bf, KILN_I8)) t[nt++] = (target){"cpu bf16, int8 weights", bf, KILN_I8};
        if (!kk_weight_dtype_error(bf, KILN_F8_E4M3)) t[nt++] = (target){"cpu bf16, fp8 weights", bf, KILN_F8_E4M3};
    } else {
        fprintf(stderr, "  no bf16 CPU backend on this machine (class %s): its rows skipped\n", kiln_cpu_class(0));
    }
    for (int k = 0; k < nt; k++) {
        memset(g_seen, 0, sizeof g_seen);
        int quant = kk_dtype_is_quant(t[k].wdt), ran = 0;
        double worst = 0;
        const char *worst_op = "";
        for (int ri = 0; ri < NROWS; ri++) {
            const row *r = &k_rows[ri];
            if (!r->build || (quant && !r->quant)) continue;
            result want, check_ref;
            CHECK_OK(run_row(r, kk_reference(), KILN_F32, 0, &want));
            int ops = 0;
            for (int planned = 0; planned < 2; planned++) {
                result got;
                kiln_status st = run_row(r, t[k].be, t[k].wdt, planned, &got);
                CHECK_MSG(st == KILN_OK, "%s on %s (%s): %s", kg_op_name(r->op), t[k].label, planned ? "planned" : "eager",
                          kiln_last_error());
                ops += got.ops;
                double tol = quant ? 8e-2 : t[k].wdt == KILN_BF16 ? (r->tol16 > 0 ? r->tol16 : 1e-6) : 1e-5;
                for (int o = 0; !st && o < got.n && o < want.n; o++) {
                    double e = rel_l2(got.out[o], want.out[o], got.numel[o]);
                    if (e > worst) worst = e, worst_op = kg_op_name(r->op);
                    CHECK_MSG(got.numel[o] == want.numel[o] && e <= tol,
                              "%s on %s (%s), output %d: relative L2 %.3g against the reference (at most %.1g)",
                              kg_op_name(r->op), t[k].label, planned ? "planned" : "eager", o, e, tol);
                }
                /* the check backend and its host fallbacks run the reference kernels: the same bits */
                if (!st && t[k].be->name && !strncmp(t[k].be->name, "check", 5)) {
                    CHECK_OK(run_row(r, kk_reference(), KILN_F32, planned, &check_ref));
                    for (int o = 0; o < got.n; o++)
                        CHECK_MSG(!memcmp(got.out[o], check_ref.out[o], sizeof(float) * got.numel[o]),
                                  "%s on %s (%s), output %d: not bit for bit the reference kernels'", kg_op_name(r->op),
                                  t[k].label, planned ? "planned" : "eager", o);
                    result_free(&check_ref);
                }
                result_free(&got);
            }
            CHECK_MSG(ops > 0, "row %s ran no %s node on %s", kg_op_name(r->op), kg_op_name(r->op), t[k].label);
            result_free(&want);
            ran++;
        }
        /* every format the backend says it runs, some row made it run (with
         * the compute dtype's weights: the quantized ones run the GEMM rows) */
        char formats[512] = "";
        for (int s = 0; s < KK_SLOT_COUNT; s++)
            for (int f = KK_FMT_BF16; f <= KK_FMT_BLOCKED; f++) {
                if (!kk_supports(t[k].be, s, f, NULL)) continue;
                snprintf(formats + strlen(formats), sizeof formats - strlen(formats), " %s:%s", kk_slot_name(s),
                         f == KK_FMT_BF16 ? "bf16" : "blocked");
                CHECK_MSG(quant || g_seen[s][f], "%s runs %s in %s (supports), but no row made it", t[k].label,
                          kk_slot_name(s), f == KK_FMT_BF16 ? "bf16 rows" : "blocked rows");
            }
        fprintf(stderr, "  %-36s %2d rows, worst relative L2 %.2g (%s); formats beyond f32:%s\n", t[k].label, ran, worst,
                worst_op, *formats ? formats : " none");
    }
}

/* ---- the check backend's memory is not the host's ---------------------------------- */

static void exit_42(int sig) {
    (void)sig;
    _exit(42);
}

/* in a child: fn, with SIGSEGV and SIGABRT turned into exit codes 42 (so a
 * sanitizer's own handler reports nothing first); its exit status */
static int in_child(void (*fn)(void *), void *arg, int sig) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = exit_42;
        sigaction(sig, &sa, NULL);
        if (!freopen("/dev/null", "w", stderr)) _exit(3); /* (the check backend's report of what it caught) */
        fn(arg);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void read_directly(void *p) {
    volatile float v = ((float *)p)[3];
    (void)v;
}
static void write_directly(void *p) { ((volatile float *)p)[5] = 1.0f; }
static void host_array_to_a_slot(void *p) {
    float host[16] = {0};
    kk_backend_get("check", KILN_F32)->silu(host, p, 16);
}

TEST(host_code_touching_a_check_buffer_dies) {
    const kk_backend *chk = kk_backend_get("check", KILN_F32);
    float *buf = kk_buf_alloc(chk, 16 * sizeof(float));
    CHECK(buf != NULL && !kk_host_memory(chk));
    CHECK_MSG(in_child(read_directly, buf, SIGSEGV) == 42, "reading a check buffer directly did not fault");
    CHECK_MSG(in_child(write_directly, buf, SIGSEGV) == 42, "writing a check buffer directly did not fault");
    CHECK_MSG(in_child(host_array_to_a_slot, buf, SIGABRT) == 42, "a slot took host memory for a backend buffer");
    /* through the interface, the same memory works */
    float h[16], back[16];
    for (int i = 0; i < 16; i++) h[i] = (float)i - 8;
    float *y = kk_buf_alloc(chk, sizeof h);
    kk_copy_from_host(chk, buf, h, sizeof h);
    chk->silu(buf, y, 16);
    kk_copy_to_host(chk, back, y, sizeof back);
    for (int i = 0; i < 16; i++) CHECK(fabsf(back[i] - h[i] / (1.0f + expf(-h[i]))) < 1e-6f);
    kk_buf_free(chk, y);
    kk_buf_free(chk, buf);
}

int main(void) {
    RUN(every_op_has_a_row);
    RUN(host_code_touching_a_check_buffer_dies);
    RUN(every_op_on_every_backend);
    weights_reset(NULL, KILN_F32);
    return TEST_SUMMARY();
}
