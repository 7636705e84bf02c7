/* graph.c - graph builders with shape checks. */
#include "graph/graph.h"

#include "base/base.h"

#include <stdlib.h>
#include <string.h>

void kg_init(kg_graph *g, kg_resolver resolve, void *user) {
    memset(g, 0, sizeof *g);
    g->resolve = resolve;
    g->resolve_user = user;
}

void kg_free(kg_graph *g) {
    for (int i = 0; i < g->n; i++) free((char *)g->nodes[i].name);
    free(g->nodes);
    free(g->regions);
    memset(g, 0, sizeof *g);
}

int64_t kg_numel(const kg_node *n) {
    int64_t e = 1;
    for (int i = 0; i < n->ndim; i++) e *= n->shape[i];
    return e;
}

/* Set the sticky error (first one wins) and return -1. */
static kg_id fail(kg_graph *g, kiln_status code, const char *fmt, ...) KB_PRINTF(3, 4);
static kg_id fail(kg_graph *g, kiln_status code, const char *fmt, ...) {
    if (g->status == KILN_OK) {
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        g->status = kb_fail(code, "%s", buf);
    }
    return -1;
}

static kg_id push(kg_graph *g, kg_op op, int ndim, const int64_t *shape, kg_id a, kg_id b,
                  kg_id c) {
    if (g->status != KILN_OK) return -1;
    int64_t dims[4] = {0}; /* shape may point into g->nodes, which may move */
    for (int i = 0; i < ndim && i < 4; i++) dims[i] = shape[i];
    shape = dims;
    if (ndim < 0 || ndim > 4) return fail(g, KILN_ERR_SHAPE, "%s: %d dims", kg_op_name(op), ndim);
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 256;
        kg_node *nn = realloc(g->nodes, sizeof *nn * (size_t)cap);
        if (!nn) return fail(g, KILN_ERR_NOMEM, "out of memory building the graph");
        g->nodes = nn;
        g->cap = cap;
    }
    kg_node *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return fail(g, KILN_ERR_SHAPE, "%s: negative dimension", kg_op_name(op));
        n->shape[i] = shape[i];
    }
    n->src[0] = a;
    n->src[1] = b;
    n->src[2] = c;
    for (int s = 3; s < KG_MAX_SRC; s++) n->src[s] = -1;
    return g->n++;
}

kg_id kg_push(kg_graph *g, kg_op op, int ndim, const int64_t *shape, kg_id a, kg_id b, kg_id c) {
    return push(g, op, ndim, shape, a, b, c);
}

static const kg_node *node(const kg_graph *g, kg_id id) { return &g->nodes[id]; }

/* True when every id is valid; otherwise an earlier builder already failed. */
static int ok(const kg_graph *g, kg_id a, kg_id b, kg_id c) {
    return g->status == KILN_OK && a >= 0 && b >= -1 && c >= -1;
}

kg_id kg_input(kg_graph *g, const char *name, int ndim, const int64_t *shape) {
    kg_id id = push(g, KG_INPUT, ndim, shape, -1, -1, -1);
    if (id < 0) return -1;
    g->nodes[id].name = kb_strdup(name);
    g->nodes[id].iparam[0] = g->n_inputs++;
    return id;
}

kg_id kg_weight(kg_graph *g, const char *name) {
    if (g->status != KILN_OK) return -1;
    int ndim = 0;
    int64_t shape[4] = {0};
    const float *data = NULL;
    const kk_weight *kw = NULL;
    int found = g->resolve ? g->resolve(g->resolve_user, name, &ndim, shape, &data, &kw) : 0;
    if (!found) return fail(g, KILN_ERR_MISSING, "weight %s is not in the weight table", name);
    kg_id id = push(g, KG_WEIGHT, ndim, shape, -1, -1, -1);
    if (id < 0) return -1;
    g->nodes[id].name = kb_strdup(name);
    g->nodes[id].data = data;
    g->nodes[id].kw = kw;
    g->nodes[id].varies = found == 2;
    return id;
}

kg_id kg_linear_named(kg_graph *g, kg_id x, const char *name) {
    char w[160], b[160];
    snprintf(w, sizeof w, "%s.weight", name);
    snprintf(b, sizeof b, "%s.bias", name);
    return kg_linear(g, x, kg_weight(g, w), kg_weight(g, b));
}

kg_id kg_linear(kg_graph *g, kg_id x, kg_id w, kg_id b) {
    if (!ok(g, x, w, b) || w < 0) return -1;
    const kg_node *X = node(g, x), *W = node(g, w);
    int64_t K = X->shape[X->ndim - 1], M = W->shape[0], wk = 1;
    for (int i = 1; i < W->ndim; i++) wk *= W->shape[i];
    if (wk != K)
        return fail(g, KILN_ERR_SHAPE, "linear %s: input has %lld features, weight wants %lld",
                    W->name, (long long)K, (long long)wk);
    if (!W->kw || W->kw->M != M || W->kw->K != K)
        return fail(g, KILN_ERR_SHAPE, "linear %s: no kernel view of the weight", W->name);
    if (b >= 0 && (node(g, b)->ndim != 1 || node(g, b)->shape[0] != M))
        return fail(g, KILN_ERR_SHAPE, "linear %s: bias size does not match %lld outputs",
                    W->name, (long long)M);
    int64_t shape[4];
    memcpy(shape, X->shape, sizeof shape);
    shape[X->ndim - 1] = M;
    return push(g, KG_LINEAR, X->ndim, shape, x, w, b);
}

/* b broadcasts to a (numpy rules, right-aligned: each of b's dims 1 or a's) */
static int broadcasts(const kg_node *A, const kg_node *Bn) {
    if (Bn->ndim > A->ndim) return 0;
    for (int i = 1; i <= Bn->ndim; i++) {
        int64_t b = Bn->shape[Bn->ndim - i], a = A->shape[A->ndim - i];
        if (b != a && b != 1) return 0;
    }
    return 1;
}

static kg_id binary(kg_graph *g, kg_op op, kg_id a, kg_id b) {
    if (!ok(g, a, b, -1) || b < 0) return -1;
    const kg_node *A = node(g, a), *Bn = node(g, b);
    if (!broadcasts(A, Bn)) {
        char as[64], bs[64];
        kg_shape_str(A, as, sizeof as);
        kg_shape_str(Bn, bs, sizeof bs);
        return fail(g, KILN_ERR_SHAPE, "%s: %s does not broadcast to %s", kg_op_name(op), bs, as);
    }
    return push(g, op, A->ndim, A->shape, a, b, -1);
}

kg_id kg_add(kg_graph *g, kg_id a, kg_id b) { return binary(g, KG_ADD, a, b); }
kg_id kg_mul(kg_graph *g, kg_id a, kg_id b) { return binary(g, KG_MUL, a, b); }

void kg_shape_str(const kg_node *n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    len += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n->ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)n->shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

static kg_id unary(kg_graph *g, kg_op op, kg_id x) {
    if (!ok(g, x, -1, -1)) return -1;
    return push(g, op, node(g, x)->ndim, node(g, x)->shape, x, -1, -1);
}

kg_id kg_silu(kg_graph *g, kg_id x) { return unary(g, KG_SILU, x); }
kg_id kg_gelu(kg_graph *g, kg_id x) { return unary(g, KG_GELU, x); }
kg_id kg_quick_gelu(kg_graph *g, kg_id x) { return unary(g, KG_QUICK_GELU, x); }

kg_id kg_gather(kg_graph *g, kg_id table, kg_id ids) {
    if (!ok(g, table, ids, -1) || ids < 0) return -1;
    const kg_node *T = node(g, table), *I = node(g, ids);
    if (T->ndim != 2 || I->ndim < 1 || I->ndim > 3) {
        char ts[64], is[64];
        kg_shape_str(T, ts, sizeof ts);
        kg_shape_str(I, is, sizeof is);
        return fail(g, KILN_ERR_SHAPE, "gather: table %s must be [V, D] and ids %s have 1 to 3 dims", ts, is);
    }
    int64_t shape[4] = {0};
    memcpy(shape, I->shape, sizeof(int64_t) * (size_t)I->ndim);
    shape[I->ndim] = T->shape[1];
    return push(g, KG_GATHER, I->ndim + 1, shape, table, ids, -1);
}
kg_id kg_gelu_tanh(kg_graph *g, kg_id x) { return unary(g, KG_GELU_TANH, x); }

kg_id kg_layernorm(kg_graph *g, kg_id x, float eps) { return kg_layernorm_affine(g, x, -1, -1, eps); }

/* w and b (each optional) are [D] of x's last dim */
static int is_row_vec(const kg_graph *g, kg_id v, int64_t D) {
    return v < 0 || (g->nodes[v].ndim == 1 && g->nodes[v].shape[0] == D);
}

kg_id kg_layernorm_affine(kg_graph *g, kg_id x, kg_id w, kg_id b, float eps) {
    if (!ok(g, x, w, b)) return -1;
    const kg_node *X = node(g, x);
    int64_t D = X->ndim ? X->shape[X->ndim - 1] : 0;
    if (!is_row_vec(g, w, D) || !is_row_vec(g, b, D))
        return fail(g, KILN_ERR_SHAPE, "layernorm: weight and bias must be [%lld], the input's last dimension", (long long)D);
    kg_id id = push(g, KG_LAYERNORM, X->ndim, X->shape, x, w, b);
    if (id >= 0) g->nodes[id].fparam = eps;
    return id;
}

kg_id kg_rmsnorm(kg_graph *g, kg_id x, kg_id w, float eps) {
    if (!ok(g, x, w, -1)) return -1;
    const kg_node *X = node(g, x);
    int64_t D = X->ndim ? X->shape[X->ndim - 1] : 0;
    if (!is_row_vec(g, w, D))
        return fail(g, KILN_ERR_SHAPE, "rmsnorm: weight must be [%lld], the input's last dimension", (long long)D);
    kg_id id = push(g, KG_RMSNORM, X->ndim, X->shape, x, w, -1);
    if (id >= 0) g->nodes[id].fparam = eps;
    return id;
}

kg_id kg_rmsnorm_heads(kg_graph *g, kg_id x, kg_id w, int heads, float eps) {
    if (!ok(g, x, w, -1) || w < 0) return -1;
    const kg_node *X = node(g, x), *W = node(g, w);
    if (heads <= 0 || X->shape[X->ndim - 1] % heads ||
        W->ndim != 1 || W->shape[0] != X->shape[X->ndim - 1] / heads)
        return fail(g, KILN_ERR_SHAPE, "rmsnorm %s: weight size does not match the head size",
                    W->name);
    kg_id id = push(g, KG_RMSNORM_HEADS, X->ndim, X->shape, x, w, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = heads;
        g->nodes[id].fparam = eps;
    }
    return id;
}

/* x [B,N,D] must pair with a per-batch vector [B,D] */
static int is_batch_vec(const kg_node *X, const kg_node *v) {
    return v->ndim == 2 && v->shape[0] == X->shape[0] && v->shape[1] == X->shape[2];
}

kg_id kg_modulate(kg_graph *g, kg_id x, kg_id shift, kg_id scale) {
    if (!ok(g, x, shift, scale) || shift < 0 || scale < 0) return -1;
    const kg_node *X = node(g, x);
    if (X->ndim != 3 || !is_batch_vec(X, node(g, shift)) || !is_batch_vec(X, node(g, scale)))
        return fail(g, KILN_ERR_SHAPE, "modulate: x must be [B,N,D] and shift, scale [B,D]");
    return push(g, KG_MODULATE, 3, X->shape, x, shift, scale);
}

kg_id kg_gate_add(kg_graph *g, kg_id res, kg_id gate, kg_id y) {
    if (!ok(g, res, gate, y) || gate < 0 || y < 0) return -1;
    const kg_node *R = node(g, res), *G = node(g, gate), *Y = node(g, y);
    if (R->ndim != 3 || Y->ndim != 3 || memcmp(R->shape, Y->shape, sizeof R->shape) ||
        !is_batch_vec(R, G))
        return fail(g, KILN_ERR_SHAPE, "gate_add: shapes do not match");
    return push(g, KG_GATE_ADD, 3, R->shape, res, gate, y);
}

kg_id kg_slice_cols(kg_graph *g, kg_id x, int64_t off, int64_t len) {
    if (!ok(g, x, -1, -1)) return -1;
    const kg_node *X = node(g, x);
    if (X->ndim != 2 || off < 0 || len < 0 || off + len > X->shape[1])
        return fail(g, KILN_ERR_SHAPE, "slice_cols: [%lld, %lld) outside %lld columns",
                    (long long)off, (long long)(off + len), (long long)X->shape[1]);
    int64_t shape[2] = {X->shape[0], len};
    kg_id id = push(g, KG_SLICE_COLS, 2, shape, x, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = off;
        g->nodes[id].iparam[1] = len;
    }
    return id;
}

kg_id kg_concat_tokens(kg_graph *g, kg_id a, kg_id b) {
    if (!ok(g, a, b, -1) || b < 0) return -1;
    const kg_node *A = node(g, a), *Bn = node(g, b);
    if (A->ndim != 3 || Bn->ndim != 3 || A->shape[0] != Bn->shape[0] || A->shape[2] != Bn->shape[2])
        return fail(g, KILN_ERR_SHAPE, "concat_tokens: shapes do not match");
    int64_t shape[3] = {A->shape[0], A->shape[1] + Bn->shape[1], A->shape[2]};
    return push(g, KG_CONCAT_TOKENS, 3, shape, a, b, -1);
}

kg_id kg_slice_tokens(kg_graph *g, kg_id x, int64_t off, int64_t len) {
    if (!ok(g, x, -1, -1)) return -1;
    const kg_node *X = node(g, x);
    if (X->ndim != 3 || off < 0 || len < 0 || off + len > X->shape[1])
        return fail(g, KILN_ERR_SHAPE, "slice_tokens: range outside the sequence");
    int64_t shape[3] = {X->shape[0], len, X->shape[2]};
    kg_id id = push(g, KG_SLICE_TOKENS, 3, shape, x, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = off;
        g->nodes[id].iparam[1] = len;
    }
    return id;
}

kg_id kg_slice(kg_graph *g, kg_id x, int axis, int64_t off, int64_t len) {
    if (!ok(g, x, -1, -1)) return -1;
    const kg_node *X = node(g, x);
    if (axis < 0 || axis >= X->ndim || off < 0 || len < 0 || off + len > X->shape[axis])
        return fail(g, KILN_ERR_SHAPE, "slice: [%lld, %lld) of axis %d outside its %lld", (long long)off,
                    (long long)(off + len), axis, (long long)(axis >= 0 && axis < X->ndim ? X->shape[axis] : -1));
    int64_t shape[4];
    memcpy(shape, X->shape, sizeof shape);
    shape[axis] = len;
    kg_id id = push(g, KG_SLICE, X->ndim, shape, x, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = axis;
        g->nodes[id].iparam[1] = off;
        g->nodes[id].iparam[2] = len;
    }
    return id;
}

kg_id kg_concat(kg_graph *g, kg_id a, kg_id b, int axis) {
    if (!ok(g, a, b, -1) || b < 0) return -1;
    const kg_node *A = node(g, a), *Bn = node(g, b);
    int same = A->ndim == Bn->ndim && axis >= 0 && axis < A->ndim;
    for (int i = 0; same && i < A->ndim; i++) same = i == axis || A->shape[i] == Bn->shape[i];
    if (!same) {
        char as[64], bs[64];
        kg_shape_str(A, as, sizeof as);
        kg_shape_str(Bn, bs, sizeof bs);
        return fail(g, KILN_ERR_SHAPE, "concat: %s and %s differ outside axis %d", as, bs, axis);
    }
    int64_t shape[4];
    memcpy(shape, A->shape, sizeof shape);
    shape[axis] += Bn->shape[axis];
    kg_id id = push(g, KG_CONCAT, A->ndim, shape, a, b, -1);
    if (id >= 0) g->nodes[id].iparam[0] = axis;
    return id;
}

kg_id kg_attention(kg_graph *g, kg_id q, kg_id k, kg_id v, int heads) {
    if (!ok(g, q, k, v) || k < 0 || v < 0) return -1;
    const kg_node *Q = node(g, q), *K = node(g, k), *V = node(g, v);
    if (Q->ndim != 3 || K->ndim != 3 || memcmp(K->shape, V->shape, sizeof K->shape) ||
        Q->shape[0] != K->shape[0] || Q->shape[2] != K->shape[2] || heads <= 0 ||
        Q->shape[2] % heads)
        return fail(g, KILN_ERR_SHAPE, "attention: q, k, v shapes do not match");
    kg_id id = push(g, KG_ATTENTION, 3, Q->shape, q, k, v);
    if (id >= 0) g->nodes[id].iparam[0] = heads;
    return id;
}

kg_id kg_attention_ex(kg_graph *g, kg_id q, kg_id k, kg_id v, int heads, float scale, kg_id bias, int causal) {
    kg_id id = kg_attention(g, q, k, v, heads);
    if (id < 0) return -1;
    if (bias >= 0) {
        const kg_node *Bn = node(g, bias), *Q = node(g, q), *K = node(g, k);
        int64_t want[4] = {Q->shape[0], heads, Q->shape[1], K->shape[1]};
        int fits = Bn->ndim == 4;
        for (int d = 0; fits && d < 4; d++) fits = Bn->shape[d] == want[d] || (d < 2 && Bn->shape[d] == 1);
        if (!fits) {
            char bs[64];
            kg_shape_str(Bn, bs, sizeof bs);
            return fail(g, KILN_ERR_SHAPE, "attention: bias %s is not [%lld or 1, %d or 1, %lld, %lld]", bs,
                        (long long)want[0], heads, (long long)want[2], (long long)want[3]);
        }
        g->nodes[id].src[3] = bias;
        g->nodes[id].iparam[2] = 1;
    }
    g->nodes[id].fparam = scale;
    g->nodes[id].iparam[3] = causal != 0;
    return id;
}

/* an attention of the plain form (no scale, bias or mask): the fast kernels' */
static int plain_attention(const kg_node *n) {
    return n->op == KG_ATTENTION && n->fparam == 0 && !n->iparam[2] && !n->iparam[3];
}

kg_id kg_patchify(kg_graph *g, kg_id x, int p) {
    if (!ok(g, x, -1, -1)) return -1;
    const kg_node *X = node(g, x);
    if (X->ndim != 4 || p <= 0 || X->shape[2] % p || X->shape[3] % p)
        return fail(g, KILN_ERR_SHAPE, "patchify: latent %lldx%lld is not a multiple of patch %d",
                    (long long)X->shape[2], (long long)X->shape[3], p);
    int64_t shape[3] = {X->shape[0], (X->shape[2] / p) * (X->shape[3] / p),
                        X->shape[1] * p * p};
    kg_id id = push(g, KG_PATCHIFY, 3, shape, x, -1, -1);
    if (id >= 0) g->nodes[id].iparam[0] = p;
    return id;
}

static kg_id unpatchify(kg_graph *g, kg_id x, int p, int64_t h, int64_t w, int64_t c, int cfirst) {
    if (!ok(g, x, -1, -1)) return -1;
    const kg_node *X = node(g, x);
    if (X->ndim != 3 || X->shape[1] != h * w || X->shape[2] != (int64_t)p * p * c)
        return fail(g, KILN_ERR_SHAPE, "unpatchify: input does not hold %lldx%lld patches",
                    (long long)h, (long long)w);
    int64_t shape[4] = {X->shape[0], c, h * p, w * p};
    kg_id id = push(g, KG_UNPATCHIFY, 4, shape, x, -1, -1);
    if (id >= 0) {
        int64_t *ip = g->nodes[id].iparam;
        ip[0] = p;
        ip[1] = h;
        ip[2] = w;
        ip[3] = cfirst;
    }
    return id;
}

kg_id kg_unpatchify(kg_graph *g, kg_id x, int p, int64_t h, int64_t w, int64_t c) {
    return unpatchify(g, x, p, h, w, c, 0);
}

kg_id kg_unpatchify_cfirst(kg_graph *g, kg_id x, int p, int64_t h, int64_t w, int64_t c) {
    return unpatchify(g, x, p, h, w, c, 1);
}

kg_id kg_timestep_proj(kg_graph *g, kg_id t, int dim) { return kg_timestep_proj_scaled(g, t, dim, 1.0f); }

kg_id kg_timestep_proj_scaled(kg_graph *g, kg_id t, int dim, float scale) {
    if (!ok(g, t, -1, -1)) return -1;
    const kg_node *T = node(g, t);
    if (T->ndim != 1 || dim <= 0 || dim % 2)
        return fail(g, KILN_ERR_SHAPE, "timestep_proj: timestep must be [B], dim even");
    int64_t shape[2] = {T->shape[0], dim};
    kg_id id = push(g, KG_TIMESTEP_PROJ, 2, shape, t, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = dim;
        g->nodes[id].fparam = scale;
    }
    return id;
}

kg_id kg_rope_table(kg_graph *g, int64_t T, int64_t h, int64_t w, const int axes[3], float theta) {
    if (g->status != KILN_OK) return -1;
    for (int a = 0; a < 3; a++)
        if (axes[a] < 0 || axes[a] % 2 || axes[a] > 0xfffe)
            return fail(g, KILN_ERR_SHAPE, "rope_table: axis %d has %d channels (even, 0 to 65534)", a, axes[a]);
    if (T < 0 || h <= 0 || w <= 0 || !(theta > 0))
        return fail(g, KILN_ERR_SHAPE, "rope_table: %lld text tokens and %lldx%lld image tokens, theta %g",
                    (long long)T, (long long)h, (long long)w, (double)theta);
    int64_t shape[2] = {T + h * w, (int64_t)axes[0] + axes[1] + axes[2]};
    kg_id id = push(g, KG_ROPE_TABLE, 2, shape, -1, -1, -1);
    if (id >= 0) {
        int64_t *ip = g->nodes[id].iparam;
        ip[0] = T;
        ip[1] = h;
        ip[2] = w;
        ip[3] = (int64_t)axes[0] | (int64_t)axes[1] << 16;
        g->nodes[id].fparam = theta;
    }
    return id;
}

kg_id kg_rope(kg_graph *g, kg_id x, kg_id table, int heads) {
    if (!ok(g, x, table, -1)) return -1;
    const kg_node *X = node(g, x), *Tb = node(g, table);
    if (X->ndim != 3 || heads <= 0 || X->shape[2] % heads || Tb->ndim != 2 || Tb->shape[0] != X->shape[1] ||
        Tb->shape[1] * heads != X->shape[2] || Tb->shape[1] % 2)
        return fail(g, KILN_ERR_SHAPE, "rope: x must be [B,N,%d*Dh] and the table [N,Dh] with Dh even", heads);
    kg_id id = push(g, KG_ROPE, 3, X->shape, x, table, -1);
    if (id >= 0) g->nodes[id].iparam[0] = heads;
    return id;
}

kg_id kg_pos_crop(kg_graph *g, kg_id table, int64_t max, int64_t h, int64_t w) {
    if (!ok(g, table, -1, -1)) return -1;
    const kg_node *Tn = node(g, table);
    if (Tn->ndim != 3 || Tn->shape[0] != 1 || Tn->shape[1] != max * max)
        return fail(g, KILN_ERR_SHAPE, "pos_crop: table is not [1, %lld, D]", (long long)(max * max));
    if (h <= 0 || w <= 0 || h > max || w > max)
        return fail(g, KILN_ERR_RANGE,
                    "latent of %lldx%lld patches does not fit the position table of %lldx%lld "
                    "(pos_embed_max_size)", (long long)h, (long long)w, (long long)max,
                    (long long)max);
    int64_t shape[3] = {1, h * w, Tn->shape[2]};
    kg_id id = push(g, KG_POS_CROP, 3, shape, table, -1, -1);
    if (id >= 0) {
        int64_t *ip = g->nodes[id].iparam;
        ip[0] = max;
        ip[1] = h;
        ip[2] = w;
    }
    return id;
}

void kg_output(kg_graph *g, kg_id x, const char *name) {
    if (!ok(g, x, -1, -1)) return;
    if (g->n_outputs >= KG_MAX_OUTPUTS) {
        fail(g, KILN_ERR_INVALID_ARG, "too many graph outputs");
        return;
    }
    if (!name || !*name || strlen(name) >= sizeof g->output_names[0]) {
        fail(g, KILN_ERR_INVALID_ARG, "a graph output needs a name of 1 to %zu characters", sizeof g->output_names[0] - 1);
        return;
    }
    snprintf(g->output_names[g->n_outputs], sizeof g->output_names[0], "%s", name);
    g->outputs[g->n_outputs++] = x;
}

void kg_mark_output(kg_graph *g, kg_id x) {
    char name[16];
    snprintf(name, sizeof name, "out%d", g->n_outputs);
    kg_output(g, x, name);
}

void kg_region_begin(kg_graph *g, int layer) {
    if (g->status) return;
    kg_region *r = realloc(g->regions, sizeof *r * (size_t)(g->n_regions + 1));
    if (!r) {
        fail(g, KILN_ERR_NOMEM, "out of memory building the graph");
        return;
    }
    g->regions = r;
    r[g->n_regions++] = (kg_region){g->n, -1, layer};
}

void kg_region_end(kg_graph *g) {
    if (g->status || !g->n_regions || g->regions[g->n_regions - 1].end >= 0) return;
    g->regions[g->n_regions - 1].end = g->n;
}

/* ---- fusion --------------------------------------------------------------------- */

/* node i folded into its producer p: consumers and outputs read p */
static void alias_to(kg_graph *g, kg_id i, kg_id p) {
    for (int j = i + 1; j < g->n; j++)
        for (int s = 0; s < KG_MAX_SRC; s++)
            if (g->nodes[j].src[s] == i) g->nodes[j].src[s] = p;
    for (int o = 0; o < g->n_outputs; o++)
        if (g->outputs[o] == i) g->outputs[o] = p;
}

/* 1 when node i is a weight, or made from one weight by ops of one source
 * each (a crop of the position table, this rank's shard of it) */
static int from_weights(const kg_graph *g, kg_id i) {
    for (;;) {
        const kg_node *n = &g->nodes[i];
        if (n->op == KG_WEIGHT) return 1;
        if (n->op == KG_INPUT || n->src[0] < 0) return 0;
        for (int s = 1; s < KG_MAX_SRC; s++)
            if (n->src[s] >= 0) return 0;
        i = n->src[0];
    }
}

void kg_fuse(kg_graph *g) {
    if (g->status) return;
    int *uses = calloc((size_t)g->n, sizeof *uses);
    if (!uses) return; /* fusion is an optimisation: skip it */
    for (int i = 0; i < g->n; i++)
        for (int s = 0; s < KG_MAX_SRC; s++)
            if (g->nodes[i].src[s] >= 0) uses[g->nodes[i].src[s]]++;
    for (int o = 0; o < g->n_outputs; o++) uses[g->outputs[o]] += 2; /* outputs keep their own buffer */
    for (int i = 0; i < g->n; i++) {
        kg_node *n = &g->nodes[i];
        kg_id s0 = n->src[0];
        if (s0 < 0 || uses[s0] != 1) continue;
        kg_node *p = &g->nodes[s0];
        if (n->op == KG_GELU_TANH && p->op == KG_LINEAR && p->iparam[0] == KK_ACT_NONE) {
            p->iparam[0] = KK_ACT_GELU_TANH;
            n->op = KG_ALIAS;
            /* consumers read the linear directly; the alias is left dead */
            alias_to(g, i, s0);
        } else if (n->op == KG_MODULATE && p->op == KG_LAYERNORM && p->src[1] < 0 && p->src[2] < 0) {
            n->op = KG_LN_MODULATE;
            n->fparam = p->fparam;
            n->src[0] = p->src[0];
            uses[s0] = 0; /* the layernorm has no consumer left: executors skip it */
        }
    }
    /* the rotations of an attention's q and k by one table (Flux's RoPE),
     * when nothing else reads them: the attention rotates them as its kernel
     * loads them (src[KG_ATTN_ROPE]), no pass of their own; the concatenations
     * before them then fold in below */
    for (int i = 0; i < g->n; i++) {
        kg_node *n = &g->nodes[i];
        if (!plain_attention(n) || n->iparam[1] || n->src[KG_ATTN_ROPE] >= 0) continue;
        kg_id q = n->src[0], k = n->src[1];
        const kg_node *Q = &g->nodes[q], *K = &g->nodes[k];
        if (Q->op != KG_ROPE || K->op != KG_ROPE || uses[q] != 1 || uses[k] != 1 || Q->src[1] != K->src[1] ||
            Q->iparam[0] != n->iparam[0] || K->iparam[0] != n->iparam[0])
            continue;
        n->src[0] = Q->src[0];
        n->src[1] = K->src[0];
        n->src[KG_ATTN_ROPE] = Q->src[1];
        uses[q] = uses[k] = 0; /* no consumer left: executors skip the rotations */
        uses[Q->src[1]]--;
    }
    /* the concatenations of two token streams (image, context) into an
     * attention's k and v, and q, when nothing else reads them: the attention
     * reads both segments in place (attention_joint), no copy is made. q may
     * be the first stream alone (the last block's context is dropped, so only
     * the image tokens ask): then src[3] is -1 */
    for (int i = 0; i < g->n; i++) {
        kg_node *n = &g->nodes[i];
        if (!plain_attention(n) || n->iparam[1]) continue;
        const kg_node *k = &g->nodes[n->src[1]];
        int q_joint = g->nodes[n->src[0]].op == KG_CONCAT_TOKENS, ok = k->op == KG_CONCAT_TOKENS;
        for (int s = q_joint ? 0 : 1; s < 3 && ok; s++) {
            const kg_node *c = &g->nodes[n->src[s]];
            ok = c->op == KG_CONCAT_TOKENS && uses[n->src[s]] == 1 && !c->out_bf16 &&
                 g->nodes[c->src[0]].shape[1] == g->nodes[k->src[0]].shape[1] &&
                 g->nodes[c->src[1]].shape[1] == g->nodes[k->src[1]].shape[1];
        }
        if (!ok || (!q_joint && n->shape[1] != g->nodes[k->src[0]].shape[1])) continue;
        kg_id seg[6] = {n->src[0], -1, -1, -1, -1, -1};
        for (int s = q_joint ? 0 : 1; s < 3; s++) {
            seg[s] = g->nodes[n->src[s]].src[0];
            seg[s + 3] = g->nodes[n->src[s]].src[1];
            uses[n->src[s]] = 0; /* no consumer left: executors skip the concat */
        }
        for (int s = 0; s < 6; s++) n->src[s] = seg[s];
        n->iparam[1] = 1;
    }
    /* gate_add (res + gate * y) into the epilogue of the linear making y, when
     * y has no other consumer and res and gate exist before that linear runs:
     * the linear then writes the residual stream itself (one pass less) */
    for (int i = 0; i < g->n; i++) {
        kg_node *n = &g->nodes[i];
        kg_id y = n->src[2], gate = n->src[1];
        if (n->op != KG_GATE_ADD || y < 0 || uses[y] != 1) continue;
        kg_node *l = &g->nodes[y];
        /* the gate is a slice of the modulation [B,E]: read it in place */
        int64_t off = 0;
        if (g->nodes[gate].op == KG_SLICE_COLS) {
            off = g->nodes[gate].iparam[0];
            gate = g->nodes[gate].src[0];
        }
        if (l->op != KG_LINEAR || l->iparam[0] != KK_ACT_NONE || l->iparam[1] || l->ndim != 3 ||
            n->src[0] >= y || gate >= y || g->nodes[gate].ndim != 2)
            continue;
        l->iparam[1] = 1;
        l->iparam[2] = off;
        l->src[3] = n->src[0];
        l->src[4] = gate;
        n->op = KG_ALIAS;
        alias_to(g, i, y);
    }
    /* an add of a linear's output [B,N,M] and a table [1,N,M] made from the
     * weights alone (the position embedding after the patch embedding: the
     * same whatever the batch, so the graph's structure does not change with
     * it) likewise, with no gate: the epilogue adds the table as it writes */
    for (int i = 0; i < g->n; i++) {
        kg_node *n = &g->nodes[i];
        if (n->op != KG_ADD) continue;
        kg_id y = n->src[0], res = n->src[1];
        kg_node *l = &g->nodes[y];
        if (l->op != KG_LINEAR || uses[y] != 1 || l->iparam[0] != KK_ACT_NONE || l->iparam[1] || l->ndim != 3 ||
            res >= y || !from_weights(g, res) || g->nodes[res].ndim != 3 || g->nodes[res].shape[0] != 1 ||
            g->nodes[res].shape[1] != l->shape[1] || g->nodes[res].shape[2] != l->shape[2])
            continue;
        l->iparam[1] = 1;
        l->iparam[2] = 0;
        l->src[3] = res;
        l->src[4] = -1;
        n->op = KG_ALIAS;
        alias_to(g, i, y);
    }
    /* a resnet's add of two tensors of one shape, one of them a channels-last
     * convolution (not an up2) nothing else reads and made after the other:
     * the convolution adds the other as it writes (src[3], the kernel's
     * residual) */
    for (int i = 0; i < g->n; i++) {
        kg_node *n = &g->nodes[i];
        if (n->op != KG_ADD || n->ndim != 4) continue;
        kg_id a = n->src[0], b = n->src[1];
        kg_id c = a > b ? a : b, r = a > b ? b : a; /* the later one folds the earlier one in */
        kg_node *cv = &g->nodes[c];
        if (r < 0 || cv->op != KG_CONV2D || uses[c] != 1 || cv->iparam[3] != 1 || cv->src[3] >= 0 ||
            memcmp(cv->shape, n->shape, sizeof n->shape) || g->nodes[r].ndim != 4 ||
            memcmp(g->nodes[r].shape, n->shape, sizeof n->shape))
            continue;
        cv->src[3] = r;
        n->op = KG_ALIAS;
        alias_to(g, i, c);
    }
    free(uses);
}

/* what the planner asks the backend (kk_supports): a linear's GEMM reading
 * and writing bf16 rows, or the blocked layout, on its weight; a
 * convolution reading and writing channels-last bf16 rows on its weight */
static int linear_takes(const kk_backend *be, const kg_graph *g, const kg_node *n, int fmt) {
    return n->op == KG_LINEAR && kk_supports(be, KK_SLOT_LINEAR, fmt, g->nodes[n->src[1]].kw);
}
static int conv_takes_bf16(const kk_backend *be, const kg_graph *g, const kg_node *n) {
    return n->op == KG_CONV2D && kk_supports(be, KK_SLOT_CONV2D, KK_FMT_BF16, g->nodes[n->src[1]].kw);
}

/* node i has live readers, and every one is a linear on bf16-capable
 * weights taking it as its input or (slices set) a token slice of an even
 * width (moved as pairs of bf16 values) whose readers are all such linears;
 * and i is no output */
static int read_by_bf16_gemms(const kg_graph *g, const kk_backend *be, const char *live, int i, int slices) {
    int found = 0;
    for (int o = 0; o < g->n_outputs; o++)
        if (g->outputs[o] == i) return 0;
    for (int j = i + 1; j < g->n; j++) {
        const kg_node *c = &g->nodes[j];
        for (int s = 0; live[j] && s < KG_MAX_SRC; s++) {
            if (c->src[s] != i) continue;
            found = 1;
            if (s == 0 && linear_takes(be, g, c, KK_FMT_BF16)) continue;
            if (!(slices && c->op == KG_SLICE_TOKENS && s == 0 && c->shape[2] % 2 == 0 &&
                  kk_supports(be, KK_SLOT_SLICE_ROWS, KK_FMT_BF16, NULL) && read_by_bf16_gemms(g, be, live, j, 0)))
                return 0;
        }
    }
    return found;
}

/* The live readers of node i (after the node itself) that are linears
 * reading it as x on weights whose GEMM reads the blocked layout as it is;
 * 1 when every live reader is one */
static int read_by_blocked_gemms(const kg_graph *g, const kk_backend *be, const char *live, int i) {
    for (int j = i + 1; j < g->n; j++) {
        const kg_node *c = &g->nodes[j];
        for (int s = 0; live[j] && s < KG_MAX_SRC; s++)
            if (c->src[s] == i && !(s == 0 && linear_takes(be, g, c, KK_FMT_BLOCKED))) return 0;
    }
    return 1;
}

/* An attention whose output only bf16 GEMMs read (kg_plan_bf16 made it bf16
 * rows), directly or through token slices, goes blocked by token segment
 * (attention_joint_bf16) where every one of those GEMMs reads blocked input
 * and each slice is one whole segment (the image or the context tokens):
 * each GEMM then reads its segment in place, iparam[3] the rows before it
 * (0, or B*Na for the second), and the slices, read by nothing, are not run
 * (no copy, no packing pass in the GEMMs) */
static void attention_blocked(kg_graph *g, const kk_backend *be, const char *live, int i) {
    kg_node *n = &g->nodes[i];
    int joint = n->iparam[1] != 0;
    int64_t B = n->shape[0], na = joint ? g->nodes[n->src[0]].shape[1] : n->shape[1];
    int64_t nb = joint && n->src[3] >= 0 ? g->nodes[n->src[3]].shape[1] : 0;
    /* (read_by_bf16_gemms: every reader is a linear or a token slice, reading it as its first source) */
    for (int j = i + 1; j < g->n; j++) {
        const kg_node *c = &g->nodes[j];
        if (!live[j] || c->src[0] != i) continue;
        if (c->op == KG_SLICE_TOKENS) {
            int whole = (c->iparam[0] == 0 && c->iparam[1] == na) || (nb && c->iparam[0] == na && c->iparam[1] == nb);
            if (!whole || !read_by_blocked_gemms(g, be, live, j)) return;
        } else if (nb || !linear_takes(be, g, c, KK_FMT_BLOCKED)) { /* with two segments, read whole: rows */
            return;
        }
    }
    for (int j = i + 1; j < g->n; j++) {
        const kg_node *c = &g->nodes[j];
        if (!live[j] || c->op != KG_SLICE_TOKENS || c->src[0] != i) continue;
        for (int k = j + 1; k < g->n; k++)
            if (live[k] && g->nodes[k].src[0] == j) {
                g->nodes[k].src[0] = i;
                g->nodes[k].iparam[3] = c->iparam[0] ? B * na : 0;
            }
    }
    n->out_bf16 = KK_FMT_BLOCKED;
}

/* A channels-last convolution's output (no residual folded in, on weights
 * the backend's convolution takes bf16 with, no output of the graph) goes in bf16 rows where a
 * convolution reads it as x (on such weights, not an up2), which would round
 * it to bf16 anyway, and every other live reader is a channels-last group
 * norm: the norm's statistics then read the rounded values. That is an
 * up2's output feeding a resnet with a shortcut conv (the decoder's largest
 * tensors, half the bytes). An output only norms read stays f32: rounding
 * every resnet's first conv output so moved a 1024x1024 decode's error
 * against f32 from 9.4e-3 to 1.1e-2 (docs/PERFORMANCE.md). */
static int conv_read_as_bf16(const kg_graph *g, const kk_backend *be, const char *live, int i) {
    const kg_node *n = &g->nodes[i];
    if (!live[i] || !conv_takes_bf16(be, g, n) || !(n->iparam[3] & 1) || n->src[3] >= 0)
        return 0;
    for (int o = 0; o < g->n_outputs; o++)
        if (g->outputs[o] == i) return 0;
    int conv = 0;
    for (int j = i + 1; j < g->n; j++) {
        const kg_node *c = &g->nodes[j];
        for (int s = 0; live[j] && s < KG_MAX_SRC; s++) {
            if (c->src[s] != i) continue;
            if (s == 0 && c->iparam[3] == 1 && conv_takes_bf16(be, g, c)) conv = 1;
            else if (!(c->op == KG_GROUP_NORM && s == 0 && c->iparam[2])) return 0;
        }
    }
    return conv;
}

void kg_plan_bf16(kg_graph *g, const kk_backend *be) {
    if (g->status || g->n < 1 || !kk_supports(be, KK_SLOT_LINEAR, KK_FMT_BF16, NULL) ||
        !kk_supports(be, KK_SLOT_LAYERNORM_MODULATE, KK_FMT_BF16, NULL) || !kk_supports(be, KK_SLOT_MODULATE, KK_FMT_BF16, NULL))
        return;
    size_t nn = (size_t)g->n;
    /* ok[i]: every consumer so far is a linear reading i as its input, on weights its GEMM reads bf16 with */
    char *ok = malloc(nn), *used = calloc(nn, 1), *live = malloc(nn);
    int *last = malloc(sizeof(int) * nn);
    if (!ok || !used || !live || !last) {
        free(ok);
        free(used);
        free(live);
        free(last);
        return;
    }
    /* only live consumers count: the nodes kg_fuse folded away (a GELU
     * aliased to its linear) still name their old sources */
    kg_liveness(g, live, last);
    memset(ok, 1, nn);
    for (int o = 0; o < g->n_outputs; o++) ok[g->outputs[o]] = 0;
    for (int i = 0; i < g->n; i++) {
        const kg_node *n = &g->nodes[i];
        if (!live[i]) continue;
        for (int s = 0; s < KG_MAX_SRC; s++) {
            kg_id src = n->src[s];
            if (src < 0) continue;
            used[src] = 1;
            if (!(s == 0 && linear_takes(be, g, n, KK_FMT_BF16))) ok[src] = 0;
        }
    }
    for (int i = 0; i < g->n; i++) {
        kg_node *n = &g->nodes[i];
        int producer = n->op == KG_LINEAR || n->op == KG_LN_MODULATE || n->op == KG_MODULATE;
        if (producer && used[i] && ok[i]) n->out_bf16 = KK_FMT_BF16;
        /* a linear producing bf16 needs bf16-capable weights itself, and one
         * writing the residual stream (a gate_add folded in) stays f32 */
        if (n->op == KG_LINEAR && n->out_bf16 && (!linear_takes(be, g, n, KK_FMT_BF16) || n->iparam[1]))
            n->out_bf16 = KK_FMT_F32;
    }
    /* blocked where every consumer's GEMM reads that layout as it is (and a
     * linear producer's GEMM writes it), so no GEMM packs its input */
    int blocked = kk_supports(be, KK_SLOT_LINEAR, KK_FMT_BLOCKED, NULL);
    if (blocked) {
        memset(ok, 1, nn);
        for (int i = 0; i < g->n; i++) {
            const kg_node *n = &g->nodes[i];
            if (live[i] && n->op == KG_LINEAR && n->src[0] >= 0 && !linear_takes(be, g, n, KK_FMT_BLOCKED)) ok[n->src[0]] = 0;
        }
        for (int i = 0; i < g->n; i++) {
            kg_node *n = &g->nodes[i];
            int slot = kg_ops[n->op].slot;
            if (n->out_bf16 && ok[i] && (n->op == KG_LINEAR ? linear_takes(be, g, n, KK_FMT_BLOCKED)
                                                           : kk_supports(be, slot, KK_FMT_BLOCKED, NULL)))
                n->out_bf16 = KK_FMT_BLOCKED;
        }
    }
    /* q, k and v as bf16 rows where an attention is the only reader of all of
     * them and linears make them all: the attention packs them as they are */
    if (kk_supports(be, KK_SLOT_ATTENTION, KK_FMT_BF16, NULL)) {
        memset(used, 0, nn); /* readers: 0, 1, or 2 for more */
        for (int i = 0; i < g->n; i++)
            for (int s = 0; live[i] && s < KG_MAX_SRC; s++)
                if (g->nodes[i].src[s] >= 0 && used[g->nodes[i].src[s]] < 2) used[g->nodes[i].src[s]]++;
        for (int o = 0; o < g->n_outputs; o++) used[g->outputs[o]] = 2;
        for (int i = 0; i < g->n; i++) {
            const kg_node *n = &g->nodes[i];
            if (!live[i] || !plain_attention(n)) continue;
            int all = 1, ns = n->iparam[1] ? 6 : 3;
            for (int s = 0; s < ns && all; s++) {
                kg_id src = n->src[s];
                if (src < 0) continue; /* a joint attention's absent second query segment */
                const kg_node *p = &g->nodes[src];
                all = used[src] == 1 && !p->iparam[1] && linear_takes(be, g, p, KK_FMT_BF16);
            }
            for (int s = 0; s < ns && all; s++)
                if (n->src[s] >= 0) g->nodes[n->src[s]].out_bf16 = KK_FMT_BF16;
        }
        /* and such an attention's output in bf16 rows too where only bf16
         * GEMMs read it, directly or through token slices, which then pass
         * bf16 rows on */
        for (int i = 0; i < g->n; i++) {
            kg_node *n = &g->nodes[i];
            if (!live[i] || !plain_attention(n) || g->nodes[n->src[1]].out_bf16 != KK_FMT_BF16 ||
                !read_by_bf16_gemms(g, be, live, i, 1))
                continue;
            n->out_bf16 = KK_FMT_BF16;
            for (int j = i + 1; j < g->n; j++)
                if (live[j] && g->nodes[j].op == KG_SLICE_TOKENS && g->nodes[j].src[0] == i) g->nodes[j].out_bf16 = KK_FMT_BF16;
            if (blocked && kk_supports(be, KK_SLOT_ATTENTION, KK_FMT_BLOCKED, NULL)) attention_blocked(g, be, live, i);
        }
    }
    /* a channels-last group norm in bf16 rows where only convolutions read
     * it (as x, on weights the backend's convolution takes bf16 with, not an up2): they would
     * round it to bf16 first anyway (the VAE's norm + SiLU before each conv) */
    if (kk_supports(be, KK_SLOT_CONV2D, KK_FMT_BF16, NULL) && kk_supports(be, KK_SLOT_GROUP_NORM, KK_FMT_BF16, NULL)) {
        memset(ok, 1, nn);
        for (int o = 0; o < g->n_outputs; o++) ok[g->outputs[o]] = 0;
        for (int i = 0; i < g->n; i++) {
            const kg_node *n = &g->nodes[i];
            for (int s = 0; live[i] && s < KG_MAX_SRC; s++) {
                kg_id src = n->src[s];
                if (src >= 0 && !(s == 0 && n->iparam[3] == 1 && conv_takes_bf16(be, g, n)))
                    ok[src] = 0;
            }
        }
        for (int i = 0; i < g->n; i++) {
            kg_node *n = &g->nodes[i];
            if (live[i] && ok[i] && n->op == KG_GROUP_NORM && n->iparam[2]) n->out_bf16 = KK_FMT_BF16;
        }
        for (int i = 0; i < g->n; i++)
            if (conv_read_as_bf16(g, be, live, i)) g->nodes[i].out_bf16 = KK_FMT_BF16;
    }
    free(ok);
    free(used);
    free(live);
    free(last);
}

size_t kg_out_bytes(const kg_node *n) {
    int64_t numel = kg_numel(n), K = n->ndim ? n->shape[n->ndim - 1] : 1;
    /* the format's size is the backend's rule; an attention's output may hold two token segments */
    return kk_act_bytes(n->out_bf16, K ? numel / K : 0, K, n->op == KG_ATTENTION ? 2 : 1);
}

/* ---- the VAE's ops ------------------------------------------------------------ */

/* what a conv builder's messages name: x's and w's shapes, w's name */
typedef struct {
    const kg_node *X, *Wn;
    char xs[64], ws[64];
    const char *name;
} conv_of;

static int conv_args(kg_graph *g, kg_id x, kg_id w, kg_id b, conv_of *a) {
    if (!ok(g, x, w, b) || w < 0) return 0;
    a->X = node(g, x);
    a->Wn = node(g, w);
    kg_shape_str(a->X, a->xs, sizeof a->xs);
    kg_shape_str(a->Wn, a->ws, sizeof a->ws);
    a->name = a->Wn->name ? a->Wn->name : "(an input)";
    return 1;
}

/* a CONV2D node of shape, its iparam stride, pads and layout flags (ops.def) */
static kg_id push_conv(kg_graph *g, const int64_t *shape, kg_id x, kg_id w, kg_id b, int stride, int pad_lo, int pad_hi,
                       int flags) {
    kg_id id = push(g, KG_CONV2D, 4, shape, x, w, b);
    if (id >= 0) {
        int64_t *ip = g->nodes[id].iparam;
        ip[0] = stride, ip[1] = pad_lo, ip[2] = pad_hi, ip[3] = flags;
    }
    return id;
}

kg_id kg_conv2d(kg_graph *g, kg_id x, kg_id w, kg_id b, int stride, int pad_lo, int pad_hi, int layout) {
    conv_of a;
    if (!conv_args(g, x, w, b, &a)) return -1;
    const kg_node *X = a.X, *Wn = a.Wn;
    const char *xs = a.xs, *ws = a.ws, *name = a.name;
    int nhwc = layout == KG_NHWC, cd = nhwc ? 3 : 1, hd = nhwc ? 1 : 2; /* the channel and height dims */
    if (X->ndim != 4 || Wn->ndim != 4 || Wn->shape[1] != X->shape[cd] || (layout != KG_NCHW && !nhwc))
        return fail(g, KILN_ERR_SHAPE, "conv2d %s: input %s and weight %s are not %s and [Cout, Cin, kh, kw]", name, xs, ws,
                    nhwc ? "[B, H, W, Cin]" : "[B, Cin, H, W]");
    if (stride < 1 || pad_lo < 0 || pad_hi < 0 || Wn->shape[2] < 1 || Wn->shape[3] < 1)
        return fail(g, KILN_ERR_SHAPE, "conv2d %s: stride %d must be positive, padding %d, %d not negative", name,
                    stride, pad_lo, pad_hi);
    int64_t Hp = X->shape[hd] + pad_lo + pad_hi, Wp = X->shape[hd + 1] + pad_lo + pad_hi;
    if (Hp < Wn->shape[2] || Wp < Wn->shape[3])
        return fail(g, KILN_ERR_SHAPE, "conv2d %s: input %s padded by %d, %d is smaller than the kernel %s", name, xs,
                    pad_lo, pad_hi, ws);
    if (b >= 0 && (node(g, b)->ndim != 1 || node(g, b)->shape[0] != Wn->shape[0]))
        return fail(g, KILN_ERR_SHAPE, "conv2d %s: the bias must be [%lld]", name, (long long)Wn->shape[0]);
    /* the kernels read the weight through its GEMM view (f32 or packed at conversion) */
    if (!Wn->kw || Wn->kw->M != Wn->shape[0] || Wn->kw->K != Wn->shape[1] * Wn->shape[2] * Wn->shape[3])
        return fail(g, KILN_ERR_SHAPE, "conv2d %s: the weight %s has no kernel view (a model weight [Cout, Cin, kh, kw] is needed)",
                    name, ws);
    int64_t Ho = (Hp - Wn->shape[2]) / stride + 1, Wo = (Wp - Wn->shape[3]) / stride + 1;
    int64_t shape[4] = {X->shape[0], Wn->shape[0], Ho, Wo};
    if (nhwc) shape[1] = Ho, shape[2] = Wo, shape[3] = Wn->shape[0];
    return push_conv(g, shape, x, w, b, stride, pad_lo, pad_hi, nhwc);
}

kg_id kg_conv2d_up2(kg_graph *g, kg_id x, kg_id w, kg_id b) {
    conv_of a;
    if (!conv_args(g, x, w, b, &a)) return -1;
    const kg_node *X = a.X, *Wn = a.Wn;
    const char *xs = a.xs, *ws = a.ws, *name = a.name;
    if (X->ndim != 4 || Wn->ndim != 4 || Wn->shape[1] != X->shape[3] || Wn->shape[0] % 4 || Wn->shape[2] != 2 ||
        Wn->shape[3] != 2)
        return fail(g, KILN_ERR_SHAPE, "conv2d_up2 %s: input %s and weight %s are not [B, H, W, Cin] and a sub-pixel "
                    "[4 Cout, Cin, 2, 2]", name, xs, ws);
    int64_t Co = Wn->shape[0] / 4;
    if (b >= 0 && (node(g, b)->ndim != 1 || node(g, b)->shape[0] != Co))
        return fail(g, KILN_ERR_SHAPE, "conv2d_up2 %s: the bias must be [%lld]", name, (long long)Co);
    if (!Wn->kw || Wn->kw->M != Wn->shape[0] || Wn->kw->K != Wn->shape[1] * 4)
        return fail(g, KILN_ERR_SHAPE, "conv2d_up2 %s: the weight %s has no kernel view", name, ws);
    /* channels last (1) and up2 (2) */
    return push_conv(g, (int64_t[]){X->shape[0], 2 * X->shape[1], 2 * X->shape[2], Co}, x, w, b, 1, 1, 1, 3);
}

kg_id kg_group_norm(kg_graph *g, kg_id x, kg_id w, kg_id b, int groups, float eps, int silu, int layout) {
    if (!ok(g, x, w, b)) return -1;
    const kg_node *X = node(g, x);
    char xs[64];
    kg_shape_str(X, xs, sizeof xs);
    int nhwc = layout == KG_NHWC, cd = nhwc ? X->ndim - 1 : 1;
    if (X->ndim < 2 || groups < 1 || X->shape[cd] % groups || (layout != KG_NCHW && !nhwc))
        return fail(g, KILN_ERR_SHAPE, "group_norm: input %s is not %s with C a multiple of %d groups", xs,
                    nhwc ? "[B, ..., C]" : "[B, C, ...]", groups);
    int64_t C = X->shape[cd];
    if (!is_row_vec(g, w, C) || !is_row_vec(g, b, C))
        return fail(g, KILN_ERR_SHAPE, "group_norm: weight and bias must be [%lld], the input's channels", (long long)C);
    kg_id id = push(g, KG_GROUP_NORM, X->ndim, X->shape, x, w, b);
    if (id >= 0) {
        g->nodes[id].iparam[0] = groups;
        g->nodes[id].iparam[1] = silu != 0;
        g->nodes[id].iparam[2] = nhwc;
        g->nodes[id].fparam = eps;
    }
    return id;
}

kg_id kg_upsample_nearest(kg_graph *g, kg_id x, int f, int layout) {
    if (!ok(g, x, -1, -1)) return -1;
    const kg_node *X = node(g, x);
    char xs[64];
    kg_shape_str(X, xs, sizeof xs);
    int nhwc = layout == KG_NHWC, hd = nhwc ? 1 : 2;
    if (X->ndim != 4 || f < 1 || (layout != KG_NCHW && !nhwc))
        return fail(g, KILN_ERR_SHAPE, "upsample_nearest: input %s is not %s or factor %d is not positive", xs,
                    nhwc ? "[B, H, W, C]" : "[B, C, H, W]", f);
    int64_t shape[4] = {X->shape[0], X->shape[1], X->shape[2], X->shape[3]};
    shape[hd] *= f;
    shape[hd + 1] *= f;
    kg_id id = push(g, KG_UPSAMPLE, 4, shape, x, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = f;
        g->nodes[id].iparam[1] = nhwc;
    }
    return id;
}

kg_id kg_logvar_std(kg_graph *g, kg_id x) { return unary(g, KG_LOGVAR_STD, x); }

kg_id kg_select_token(kg_graph *g, kg_id x, kg_id ids, int64_t eos) {
    if (!ok(g, x, ids, -1) || ids < 0) return -1;
    const kg_node *X = node(g, x), *I = node(g, ids);
    if (X->ndim != 3 || I->ndim != 2 || I->shape[0] != X->shape[0] || I->shape[1] != X->shape[1]) {
        char xs[64], is[64];
        kg_shape_str(X, xs, sizeof xs);
        kg_shape_str(I, is, sizeof is);
        return fail(g, KILN_ERR_SHAPE, "select_token: x %s must be [B, T, D] and ids %s [B, T]", xs, is);
    }
    kg_id id = push(g, KG_SELECT_TOKEN, 2, (int64_t[]){X->shape[0], X->shape[2]}, x, ids, -1);
    if (id >= 0) g->nodes[id].iparam[0] = eos < 0 ? -1 : eos;
    return id;
}

/* ---- T5 ---------------------------------------------------------------------- */

kg_id kg_rel_pos_bias(kg_graph *g, kg_id table, int64_t nq, int64_t nk, int64_t max_distance, int bidirectional) {
    if (!ok(g, table, -1, -1)) return -1;
    const kg_node *T = node(g, table);
    if (T->ndim != 2 || T->shape[0] < 1 || T->shape[1] < 1) {
        char ts[64];
        kg_shape_str(T, ts, sizeof ts);
        return fail(g, KILN_ERR_SHAPE, "rel_pos_bias: table %s must be [num_buckets, heads]", ts);
    }
    /* the buckets' formula divides by max_exact and by log(max_distance / max_exact) */
    int64_t nb = T->shape[0], max_exact = (bidirectional ? nb / 2 : nb) / 2;
    if (max_exact < 1 || max_distance <= max_exact)
        return fail(g, KILN_ERR_SHAPE, "rel_pos_bias: %lld buckets%s and max distance %lld: needs at least %d buckets "
                    "and a max distance above %lld", (long long)nb, bidirectional ? " (bidirectional)" : "",
                    (long long)max_distance, bidirectional ? 4 : 2, (long long)(max_exact > 1 ? max_exact : 1));
    if (nq < 1 || nk < 1)
        return fail(g, KILN_ERR_SHAPE, "rel_pos_bias: %lld queries and %lld keys (both must be positive)", (long long)nq,
                    (long long)nk);
    int64_t shape[4] = {1, T->shape[1], nq, nk};
    kg_id id = push(g, KG_REL_POS_BIAS, 4, shape, table, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = max_distance;
        g->nodes[id].iparam[1] = bidirectional != 0;
    }
    return id;
}

kg_id kg_relu(kg_graph *g, kg_id x) { return unary(g, KG_RELU, x); }

kg_id kg_reshape(kg_graph *g, kg_id x, int ndim, const int64_t *shape) {
    if (!ok(g, x, -1, -1)) return -1;
    const kg_node *X = node(g, x);
    if (ndim < 1 || ndim > 4) return fail(g, KILN_ERR_SHAPE, "reshape: %d dims (a tensor has 1 to 4)", ndim);
    int64_t n = 1, m = 1;
    for (int d = 0; d < X->ndim; d++) n *= X->shape[d];
    for (int d = 0; d < ndim; d++) m = shape[d] < 0 || m < 0 ? -1 : m * shape[d];
    if (m != n) {
        char xs[64];
        kg_shape_str(X, xs, sizeof xs);
        return fail(g, KILN_ERR_SHAPE, "reshape: input %s into %d dims of another count (%lld values, not %lld)", xs, ndim,
                    (long long)m, (long long)n);
    }
    return push(g, KG_RESHAPE, ndim, shape, x, -1, -1);
}
