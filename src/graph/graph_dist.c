/* graph_dist.c - the ops of parallel runs: shard, all-gather, all-to-all
 * (Ulysses), all-reduce and the FSDP weight gather. The model definition
 * places them (sd3_forward.c with a parallel context); every executor runs
 * them through ops.c's runner, which calls kg_run_dist_op and src/dist. Shapes are [B, N, D]. */
#include "base/base.h"
#include "dist/dist.h"
#include "graph/graph.h"

#include <stdlib.h>
#include <string.h>

static kg_id bad(kg_graph *g, const char *what, const kg_node *x, int dim, int parts) {
    if (g->status == KILN_OK)
        g->status = kb_fail(KILN_ERR_SHAPE, "%s: dimension %d of size %lld does not split into %d equal parts", what,
                            dim, (long long)(x && dim < x->ndim ? x->shape[dim] : -1), parts);
    return -1;
}

static int ok(const kg_graph *g, kg_id x) { return g->status == KILN_OK && x >= 0; }

kg_id kg_shard(kg_graph *g, kg_id x, int dim, int parts, int index) {
    if (!ok(g, x)) return -1;
    const kg_node *X = &g->nodes[x];
    if (X->ndim != 3 || dim < 1 || dim > 2 || parts < 1 || index < 0 || index >= parts || X->shape[dim] % parts)
        return bad(g, "shard", X, dim, parts);
    int64_t s[3] = {X->shape[0], X->shape[1], X->shape[2]};
    s[dim] /= parts;
    kg_id id = kg_push(g, KG_SHARD, 3, s, x, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = dim;
        g->nodes[id].iparam[1] = parts;
        g->nodes[id].iparam[2] = index;
    }
    return id;
}

kg_id kg_allgather(kg_graph *g, kg_id x, int dim, int group, int parts) {
    if (!ok(g, x)) return -1;
    const kg_node *X = &g->nodes[x];
    if (X->ndim != 3 || dim < 1 || dim > 2 || parts < 1) return bad(g, "allgather", X, dim, parts);
    int64_t s[3] = {X->shape[0], X->shape[1], X->shape[2]};
    s[dim] *= parts;
    kg_id id = kg_push(g, KG_ALLGATHER, 3, s, x, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = dim;
        g->nodes[id].iparam[1] = group;
        g->nodes[id].iparam[2] = parts;
    }
    return id;
}

kg_id kg_alltoall(kg_graph *g, kg_id x, int to_heads, int group, int parts) {
    if (!ok(g, x)) return -1;
    const kg_node *X = &g->nodes[x];
    int split = to_heads ? 2 : 1; /* the dimension that gets divided */
    if (X->ndim != 3 || parts < 1 || X->shape[split] % parts) return bad(g, "alltoall", X, split, parts);
    int64_t s[3] = {X->shape[0], X->shape[1], X->shape[2]};
    s[split] /= parts;
    s[3 - split] *= parts;
    kg_id id = kg_push(g, KG_ALLTOALL, 3, s, x, -1, -1);
    if (id >= 0) {
        g->nodes[id].iparam[0] = to_heads;
        g->nodes[id].iparam[1] = group;
        g->nodes[id].iparam[2] = parts;
    }
    return id;
}

kg_id kg_allreduce(kg_graph *g, kg_id x, int group) {
    if (!ok(g, x)) return -1;
    const kg_node *X = &g->nodes[x];
    kg_id id = kg_push(g, KG_ALLREDUCE, X->ndim, X->shape, x, -1, -1);
    if (id >= 0) g->nodes[id].iparam[1] = group;
    return id;
}

kg_id kg_fsdp_gather(kg_graph *g, kg_id x, int block) {
    if (!ok(g, x)) return -1;
    const kg_node *X = &g->nodes[x];
    kg_id id = kg_push(g, KG_FSDP_GATHER, X->ndim, X->shape, x, -1, -1);
    if (id >= 0) g->nodes[id].iparam[0] = block;
    return id;
}

/* ---- execution ------------------------------------------------------------------ */

/* x [B,N,D]: copy part j of dim (1 or 2) into dst [B, N', D'] laid out contiguously */
static void take_part(const float *x, float *dst, const int64_t *s, int dim, int parts, int j) {
    int64_t B = s[0], N = s[1], D = s[2];
    if (dim == 1) {
        int64_t n = N / parts;
        for (int64_t b = 0; b < B; b++)
            memcpy(dst + b * n * D, x + (b * N + (int64_t)j * n) * D, sizeof(float) * (size_t)(n * D));
    } else {
        int64_t d = D / parts;
        for (int64_t r = 0; r < B * N; r++) memcpy(dst + r * d, x + r * D + (int64_t)j * d, sizeof(float) * (size_t)d);
    }
}

/* inverse of take_part: src [B, N', D'] into part j of y [B,N,D] */
static void put_part(const float *src, float *y, const int64_t *s, int dim, int parts, int j) {
    int64_t B = s[0], N = s[1], D = s[2];
    if (dim == 1) {
        int64_t n = N / parts;
        for (int64_t b = 0; b < B; b++)
            memcpy(y + (b * N + (int64_t)j * n) * D, src + b * n * D, sizeof(float) * (size_t)(n * D));
    } else {
        int64_t d = D / parts;
        for (int64_t r = 0; r < B * N; r++) memcpy(y + r * D + (int64_t)j * d, src + r * d, sizeof(float) * (size_t)d);
    }
}

void kg_run_dist_op(const kg_dist *d, int op, const int64_t *ip, const int64_t *xs, const int64_t *ys, const float *x,
                    float *y) {
    const kd_mesh *m = d ? d->mesh : NULL;
    size_t numel = (size_t)(ys[0] * ys[1] * ys[2]), in_numel = (size_t)(xs[0] * xs[1] * xs[2]);
    double t0 = kb_now();
    switch ((kg_op)op) {
    case KG_SHARD:
        take_part(x, y, xs, (int)ip[0], (int)ip[1], (int)ip[2]);
        return;
    case KG_FSDP_GATHER:
        if (d && d->fsdp_gather) d->fsdp_gather(d->user, (int)ip[0]);
        memcpy(y, x, sizeof(float) * numel);
        kb_ledger_add("comm fsdp_gather", kb_now() - t0, NULL);
        return;
    case KG_ALLREDUCE:
        memcpy(y, x, sizeof(float) * numel);
        if (m) kd_allreduce_sum(m, (kd_group)ip[1], y, numel);
        kb_ledger_add("comm allreduce", kb_now() - t0, NULL);
        return;
    case KG_ALLGATHER: {
        int parts = (int)ip[2];
        float *tmp = parts > 1 ? kb_alloc_aligned(sizeof(float) * numel) : NULL;
        if (parts > 1 && !tmp) {
            kb_log(KILN_LOG_ERROR, "out of memory in an all-gather");
            abort();
        }
        if (parts <= 1 || !m) {
            memcpy(y, x, sizeof(float) * numel);
        } else {
            /* tmp [parts][B,n,D] from the members, then into place along dim */
            kd_allgather(m, (kd_group)ip[1], x, tmp, sizeof(float) * in_numel);
            for (int j = 0; j < parts; j++) put_part(tmp + (size_t)j * in_numel, y, ys, (int)ip[0], parts, j);
        }
        kb_free_aligned(tmp);
        kb_ledger_add("comm allgather", kb_now() - t0, NULL);
        return;
    }
    case KG_ALLTOALL: {
        int parts = (int)ip[2], to_heads = (int)ip[0];
        if (parts <= 1 || !m) {
            memcpy(y, x, sizeof(float) * numel);
            return;
        }
        float *sbuf = kb_alloc_aligned(sizeof(float) * numel), *rbuf = kb_alloc_aligned(sizeof(float) * numel);
        if (!sbuf || !rbuf) {
            kb_log(KILN_LOG_ERROR, "out of memory in an all-to-all");
            abort();
        }
        size_t blk = numel / (size_t)parts;
        /* to_heads: send my tokens' head block j to member j, receive member j's
         * tokens of my heads as token block j; the inverse swaps the roles */
        int sdim = to_heads ? 2 : 1, rdim = to_heads ? 1 : 2;
        for (int j = 0; j < parts; j++) take_part(x, sbuf + (size_t)j * blk, xs, sdim, parts, j);
        kd_alltoall(m, (kd_group)ip[1], sbuf, rbuf, sizeof(float) * blk);
        for (int j = 0; j < parts; j++) put_part(rbuf + (size_t)j * blk, y, ys, rdim, parts, j);
        kb_free_aligned(sbuf);
        kb_free_aligned(rbuf);
        kb_ledger_add("comm alltoall", kb_now() - t0, NULL);
        return;
    }
    default:
        return;
    }
}
