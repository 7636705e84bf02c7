/* eager.c - run a graph one node at a time through a backend's kernels,
 * allocating each intermediate when made and freeing it after its last use.
 * kg_exec_node (one node, given its buffers) is shared with the planned
 * executor in src/compile/. */
#include "base/base.h"
#include "graph/graph.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void exec_node(const kg_graph *g, const kk_backend *be, const kg_node *n, float *const *buf, float *y) {
    const float *a = n->src[0] >= 0 ? buf[n->src[0]] : NULL;
    const float *b = n->src[1] >= 0 ? buf[n->src[1]] : NULL;
    const float *c = n->src[2] >= 0 ? buf[n->src[2]] : NULL;
    const kg_node *A = n->src[0] >= 0 ? &g->nodes[n->src[0]] : NULL;
    const int64_t *ip = n->iparam;
    int64_t numel = kg_numel(n);
    switch (n->op) {
    case KG_INPUT:
    case KG_WEIGHT:
    case KG_OP_COUNT:
        break;
    case KG_LINEAR: {
        int64_t M = n->shape[n->ndim - 1];
        (void)b;
        /* the second token segment of an attention's blocked output, after the first's ip[3] rows */
        if (ip[3]) a = (const float *)((const uint16_t *)a + kk_blocked_elems(ip[3], A->shape[A->ndim - 1]));
        if (ip[1]) /* res + gate * (x W^T + b), [B,N,M]; no gate: res + (x W^T + b) */
            be->linear_gate_add(a, A->out_bf16, g->nodes[n->src[1]].kw, c, buf[n->src[3]],
                                n->src[4] >= 0 ? buf[n->src[4]] + ip[2] : NULL,
                                n->src[4] >= 0 ? g->nodes[n->src[4]].shape[1] : 0, y, n->shape[0], n->shape[1]);
        else if (A->out_bf16 || n->out_bf16)
            be->linear_io(a, A->out_bf16, g->nodes[n->src[1]].kw, c, y, n->out_bf16, numel / (M ? M : 1), (int)ip[0]);
        else
            be->linear(a, g->nodes[n->src[1]].kw, c, y, numel / (M ? M : 1), (int)ip[0]);
        break;
    }
    case KG_LN_MODULATE:
        if (n->out_bf16)
            be->layernorm_modulate_bf16(a, b, c, (uint16_t *)y, n->shape[0], n->shape[1], n->shape[2], n->fparam,
                                        n->out_bf16);
        else
            be->layernorm_modulate(a, b, c, y, n->shape[0], n->shape[1], n->shape[2], n->fparam);
        break;
    case KG_ALIAS: break; /* never live: kg_fuse points its consumers at the producer */
    case KG_ADD: kk_add_bcast(a, b, y, numel, kg_numel(&g->nodes[n->src[1]])); break;
    case KG_SILU: be->silu(a, y, numel); break;
    case KG_GELU_TANH: be->gelu_tanh(a, y, numel); break;
    case KG_LAYERNORM: {
        int64_t D = n->shape[n->ndim - 1];
        be->layernorm(a, y, numel / (D ? D : 1), D, n->fparam);
        break;
    }
    case KG_RMSNORM_HEADS: {
        int64_t D = n->shape[n->ndim - 1], H = ip[0];
        be->rmsnorm_heads(a, b, y, numel / (D ? D : 1), H, D / H, n->fparam);
        break;
    }
    case KG_MODULATE:
        if (n->out_bf16) be->modulate_bf16(a, b, c, (uint16_t *)y, n->shape[0], n->shape[1], n->shape[2], n->out_bf16);
        else be->modulate(a, b, c, y, n->shape[0], n->shape[1], n->shape[2]);
        break;
    case KG_GATE_ADD: be->gate_add(a, b, c, y, n->shape[0], n->shape[1], n->shape[2]); break;
    case KG_SLICE_COLS: kk_slice_rows(a, y, n->shape[0], A->shape[1], ip[0], ip[1]); break;
    case KG_CONCAT_TOKENS: {
        int64_t D = n->shape[2];
        kk_concat_rows(a, A->shape[1] * D, b, g->nodes[n->src[1]].shape[1] * D, y, n->shape[0]);
        break;
    }
    case KG_SLICE_TOKENS: { /* bf16 rows (kg_plan_bf16: D even) move as pairs, in f32-sized units */
        int64_t D = n->out_bf16 ? n->shape[2] / 2 : n->shape[2];
        kk_slice_rows(a, y, n->shape[0], A->shape[1] * D, ip[0] * D, ip[1] * D);
        break;
    }
    case KG_ATTENTION: {
        const kg_node *K = &g->nodes[n->src[1]];
        if (K->out_bf16) /* q, k, v in bf16 rows (kg_plan_bf16); plain attention: one segment */
            be->attention_joint_bf16((const uint16_t *)a, (const uint16_t *)b, (const uint16_t *)c,
                                     ip[1] && n->src[3] >= 0 ? (const uint16_t *)buf[n->src[3]] : NULL,
                                     ip[1] ? (const uint16_t *)buf[n->src[4]] : NULL,
                                     ip[1] ? (const uint16_t *)buf[n->src[5]] : NULL, y, n->out_bf16, n->shape[0],
                                     A->shape[1], ip[1] ? g->nodes[n->src[4]].shape[1] : 0, ip[0], n->shape[2] / ip[0]);
        else if (ip[1]) /* joint: q, k, v of two token segments, read in place */
            be->attention_joint(a, b, c, n->src[3] >= 0 ? buf[n->src[3]] : NULL, buf[n->src[4]], buf[n->src[5]], y,
                                n->shape[0], A->shape[1], g->nodes[n->src[4]].shape[1], ip[0], n->shape[2] / ip[0]);
        else
            be->attention(a, b, c, y, n->shape[0], n->shape[1], K->shape[1], ip[0], n->shape[2] / ip[0]);
        break;
    }
    case KG_PATCHIFY: kk_patchify(a, y, A->shape[0], A->shape[1], A->shape[2], A->shape[3], ip[0]); break;
    case KG_UNPATCHIFY: kk_unpatchify(a, y, n->shape[0], ip[0], ip[1], ip[2], ip[3]); break;
    case KG_TIMESTEP_PROJ: kk_timestep_proj(a, y, n->shape[0], ip[0]); break;
    case KG_POS_CROP: kk_pos_crop(a, y, ip[0], ip[1], ip[2], n->shape[2]); break;
    case KG_SHARD:
    case KG_ALLGATHER:
    case KG_ALLTOALL:
    case KG_ALLREDUCE:
    case KG_FSDP_GATHER: kg_run_dist(g, n, a, y); break;
    }
}

void kg_exec_node(const kg_graph *g, const kk_backend *be, const kg_node *n, float *const *buf, float *y) {
    /* KILN_PROFILE=1: time every op kind into the ledger (--timings prints
     * it); 2: linears apart by shape, rows x K -> N */
    static int profile = -1;
    int on = __atomic_load_n(&profile, __ATOMIC_RELAXED);
    if (on < 0) {
        const char *pe = getenv("KILN_PROFILE");
        on = pe && *pe && strcmp(pe, "0") ? (strcmp(pe, "2") ? 1 : 2) : 0;
        __atomic_store_n(&profile, on, __ATOMIC_RELAXED);
    }
    double t0 = on ? kb_now() : 0;
    exec_node(g, be, n, buf, y);
    if (on) {
        char cat[48];
        if (on == 2 && n->op == KG_LINEAR) {
            const kg_node *x = &g->nodes[n->src[0]]; /* K from the input: a conv weight has more dimensions */
            int64_t N = n->shape[n->ndim - 1], rows = 1;
            for (int d = 0; d < n->ndim - 1; d++) rows *= n->shape[d];
            snprintf(cat, sizeof cat, "op linear %lldx%lld->%lld", (long long)rows, (long long)x->shape[x->ndim - 1],
                     (long long)N);
        } else
            snprintf(cat, sizeof cat, "op %s", kg_op_name(n->op));
        kb_ledger_add(cat, kb_now() - t0, NULL);
    }
}

void kg_liveness(const kg_graph *g, char *live, int *last_use) {
    /* a node no live node consumes (folded away by kg_fuse) is skipped;
     * walk backwards from the outputs */
    memset(live, 0, (size_t)g->n);
    for (int o = 0; o < g->n_outputs; o++) live[g->outputs[o]] = 1;
    for (int i = g->n - 1; i >= 0; i--)
        if (live[i])
            for (int s = 0; s < KG_MAX_SRC; s++)
                if (g->nodes[i].src[s] >= 0) live[g->nodes[i].src[s]] = 1;
    for (int i = 0; i < g->n; i++) {
        last_use[i] = i;
        if (!live[i]) continue;
        for (int s = 0; s < KG_MAX_SRC; s++)
            if (g->nodes[i].src[s] >= 0) last_use[g->nodes[i].src[s]] = i;
    }
}

kiln_status kg_run_eager(const kg_graph *g, const kk_backend *be, const float *const *inputs,
                         float *const *outputs) {
    if (g->status != KILN_OK) return kb_fail(g->status, "graph has an error: %s", kiln_last_error());
    int n = g->n;
    float **buf = calloc((size_t)n, sizeof *buf);
    int *last_use = malloc(sizeof(int) * (size_t)n);
    int *out_slot = malloc(sizeof(int) * (size_t)n);
    char *live = malloc((size_t)n);
    if (!buf || !last_use || !out_slot || !live) {
        free(buf);
        free(last_use);
        free(out_slot);
        free(live);
        return kb_fail(KILN_ERR_NOMEM, "out of memory running the graph");
    }
    kg_liveness(g, live, last_use);
    for (int i = 0; i < n; i++) out_slot[i] = -1;
    for (int o = 0; o < g->n_outputs; o++) out_slot[g->outputs[o]] = o;

    kiln_status st = KILN_OK;
    for (int i = 0; i < n && st == KILN_OK; i++) {
        const kg_node *nd = &g->nodes[i];
        if (!live[i]) continue;
        if (nd->op == KG_INPUT) {
            buf[i] = (float *)inputs[nd->iparam[0]];
            continue;
        }
        if (nd->op == KG_WEIGHT) {
            buf[i] = (float *)nd->data;
            continue;
        }
        /* bf16 buffers are half the size; kg_plan_bf16 never marks outputs */
        float *y = out_slot[i] >= 0 ? outputs[out_slot[i]] : kb_alloc_aligned(kg_out_bytes(nd));
        if (!y) {
            st = KILN_ERR_NOMEM;
            break;
        }
        buf[i] = y;
        kg_exec_node(g, be, nd, buf, y);
        /* free sources whose last consumer this was */
        for (int s = 0; s < KG_MAX_SRC; s++) {
            kg_id src = nd->src[s];
            if (src < 0 || last_use[src] != i) continue;
            kg_op sop = g->nodes[src].op;
            if (sop != KG_INPUT && sop != KG_WEIGHT && out_slot[src] < 0 && buf[src]) {
                kb_free_aligned(buf[src]);
                buf[src] = NULL;
            }
        }
    }
    /* anything still owned (error paths, nodes without consumers) */
    for (int i = 0; i < n; i++) {
        kg_op op = g->nodes[i].op;
        if (buf[i] && op != KG_INPUT && op != KG_WEIGHT && out_slot[i] < 0) kb_free_aligned(buf[i]);
    }
    free(buf);
    free(last_use);
    free(out_slot);
    free(live);
    return st;
}
