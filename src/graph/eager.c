/* eager.c - run a graph one node at a time through a backend's kernels,
 * allocating each intermediate when made and freeing it after its last use.
 * kg_exec_node (one node, given its buffers, through its op's runner in
 * ops.c) is shared with the planned executor in src/compile/. */
#include "base/base.h"
#include "graph/graph.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* one node through its op's runner (ops.c): the same function every executor calls */
static void exec_node(const kg_graph *g, const kk_backend *be, const kg_node *n, float *const *buf, float *y) {
    kg_run_fn run = kg_runner(be, n->op);
    if (!run) return; /* inputs, weights, aliases: nothing to run */
    kg_call c;
    kg_call_of(g, n, buf, y, &c);
    const kg_ctx x = {be, g->dist};
    run(&x, &c);
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
        int gs = kg_ops[n->op].gemm_src;
        const kk_weight *kw = gs >= 0 && n->src[gs] >= 0 ? g->nodes[n->src[gs]].kw : NULL;
        if (on == 2 && kw && kw->M) { /* as a GEMM: rows x K -> M (a convolution's K: Cin kh kw) */
            snprintf(cat, sizeof cat, "op %s %lldx%lld->%lld", kg_op_name(n->op), (long long)(kg_numel(n) / kw->M),
                     (long long)kw->K, (long long)kw->M);
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

void kg_shape_consts(const kg_graph *g, const char *live, char *konst) {
    /* value[i]: node i's value depends on no input and no varying weight */
    char *value = konst;
    for (int i = 0; i < g->n; i++) {
        const kg_node *n = &g->nodes[i];
        int v = kg_is_weight(n) ? !n->varies : kg_ops[n->op].run && kg_ops[n->op].slot != KK_SLOT_HOST;
        int any = kg_is_weight(n), srcs = 0; /* an op of no sources (a rotary table) is one of the shape */
        for (int s = 0; s < KG_MAX_SRC; s++) srcs += n->src[s] >= 0;
        if (!srcs && v) any = 1;
        for (int s = 0; v && s < KG_MAX_SRC; s++)
            if (n->src[s] >= 0) {
                v = value[n->src[s]];
                any = 1;
            }
        value[i] = (char)(v && any);
    }
    for (int i = 0; i < g->n; i++)
        if (kg_is_weight(&g->nodes[i]) || !live[i]) konst[i] = 0;
    for (int o = 0; o < g->n_outputs; o++) konst[g->outputs[o]] = 0;
    /* and no constant reads one of those outputs (computed after it) */
    for (int i = 0; i < g->n; i++)
        for (int s = 0; konst[i] && s < KG_MAX_SRC; s++) {
            kg_id src = g->nodes[i].src[s];
            if (src >= 0 && !kg_is_weight(&g->nodes[src]) && !konst[src]) konst[i] = 0;
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
        if (kg_is_input(nd)) {
            buf[i] = (float *)inputs[nd->iparam[0]];
            continue;
        }
        if (kg_is_weight(nd)) {
            buf[i] = (float *)nd->data;
            continue;
        }
        /* bf16 buffers are half the size; kg_plan_bf16 never marks outputs */
        float *y = out_slot[i] >= 0 ? outputs[out_slot[i]] : kk_buf_alloc(be, kg_out_bytes(nd));
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
            const kg_node *sn = &g->nodes[src];
            if (!kg_is_input(sn) && !kg_is_weight(sn) && out_slot[src] < 0 && buf[src]) {
                kk_buf_free(be, buf[src]);
                buf[src] = NULL;
            }
        }
    }
    /* anything still owned (error paths, nodes without consumers) */
    for (int i = 0; i < n; i++) {
        const kg_node *nd = &g->nodes[i];
        if (buf[i] && !kg_is_input(nd) && !kg_is_weight(nd) && out_slot[i] < 0) kk_buf_free(be, buf[i]);
    }
    free(buf);
    free(last_use);
    free(out_slot);
    free(live);
    return st;
}
