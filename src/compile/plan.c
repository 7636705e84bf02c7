/* plan.c - memory planning from tensor lifetimes, and the in-process
 * planned executor that runs a graph inside one arena (no allocation per
 * node, no compiler needed). */
#include "base/base.h"
#include "compile/compile.h"

#include <stdlib.h>
#include <string.h>

void kx_plan_free(kx_plan *p) {
    free(p->place);
    free(p->weights);
    memset(p, 0, sizeof *p);
}

typedef struct {
    int id, first, last;
    size_t bytes;
} interval;

static int by_size_desc(const void *a, const void *b) {
    const interval *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return x->id - y->id;
}

kiln_status kx_plan_graph(const kg_graph *g, kx_plan *p) {
    memset(p, 0, sizeof *p);
    if (g->status) return kb_fail(g->status, "plan: the graph has an error");
    int n = g->n;
    char *live = malloc((size_t)n + 1);
    int *last = malloc(sizeof(int) * ((size_t)n + 1));
    interval *iv = malloc(sizeof *iv * ((size_t)n + 1));
    p->place = calloc((size_t)n + 1, sizeof *p->place);
    p->weights = malloc(sizeof *p->weights * ((size_t)n + 1));
    p->n = n;
    if (!live || !last || !iv || !p->place || !p->weights) {
        free(live);
        free(last);
        free(iv);
        kx_plan_free(p);
        return kb_fail(KILN_ERR_NOMEM, "plan: out of memory");
    }
    kg_liveness(g, live, last);
    int ni = 0;
    for (int i = 0; i < n; i++) {
        const kg_node *nd = &g->nodes[i];
        if (!live[i]) continue;
        if (nd->op == KG_INPUT) {
            p->place[i] = (kx_place){KX_INPUT, nd->iparam[0]};
        } else if (nd->op == KG_WEIGHT) {
            p->place[i] = (kx_place){KX_WEIGHT, p->n_weights};
            p->weights[p->n_weights++] = i;
        } else {
            p->place[i] = (kx_place){KX_ARENA, 0};
            iv[ni++] = (interval){i, i, last[i], (kg_out_bytes(nd) + 63) & ~(size_t)63};
        }
    }
    for (int o = 0; o < g->n_outputs; o++) p->place[g->outputs[o]] = (kx_place){KX_OUTPUT, o};
    /* greedy by size: each buffer goes at the lowest offset free of every
     * placed buffer whose lifetime overlaps (a node's output may not share
     * memory with its own inputs, hence the closed intervals) */
    qsort(iv, (size_t)ni, sizeof *iv, by_size_desc);
    int *placed = malloc(sizeof(int) * ((size_t)ni + 1));
    size_t *off = malloc(sizeof(size_t) * ((size_t)ni + 1));
    if (!placed || !off) {
        free(placed);
        free(off);
        free(live);
        free(last);
        free(iv);
        kx_plan_free(p);
        return kb_fail(KILN_ERR_NOMEM, "plan: out of memory");
    }
    int np = 0;
    for (int a = 0; a < ni; a++) {
        if (p->place[iv[a].id].kind == KX_OUTPUT) continue;
        size_t at = 0;
        for (int again = 1; again;) { /* bump past every conflict until none is left */
            again = 0;
            for (int b = 0; b < np; b++) {
                const interval *o = &iv[placed[b]];
                if (o->last < iv[a].first || iv[a].last < o->first) continue;
                size_t lo = off[b], hi = off[b] + o->bytes;
                if (at < hi && lo < at + iv[a].bytes) {
                    at = hi;
                    again = 1;
                }
            }
        }
        placed[np] = a;
        off[np++] = at;
        p->place[iv[a].id].at = (int64_t)at;
        if (at + iv[a].bytes > p->arena_bytes) p->arena_bytes = at + iv[a].bytes;
    }
    free(placed);
    free(off);
    free(live);
    free(last);
    free(iv);
    return KILN_OK;
}

kiln_status kx_run_planned(const kg_graph *g, const kx_plan *p, const kk_backend *be, void *arena,
                           float *const *fixed, const float *const *inputs, float *const *outputs) {
    if (g->status) return kb_fail(g->status, "graph has an error: %s", kiln_last_error());
    float **buf = calloc((size_t)g->n + 1, sizeof *buf);
    if (!buf) return kb_fail(KILN_ERR_NOMEM, "out of memory running the plan");
    for (int i = 0; i < g->n; i++) {
        const kx_place *pl = &p->place[i];
        switch (pl->kind) {
        case KX_NONE: break;
        case KX_ARENA: buf[i] = (float *)((char *)arena + pl->at); break;
        case KX_INPUT: buf[i] = (float *)inputs[pl->at]; break;
        case KX_OUTPUT: buf[i] = outputs[pl->at]; break;
        case KX_WEIGHT: buf[i] = (float *)g->nodes[i].data; break;
        }
        if (fixed && fixed[i] && pl->kind == KX_ARENA) buf[i] = fixed[i];
    }
    for (int i = 0; i < g->n; i++)
        if ((p->place[i].kind == KX_ARENA && !(fixed && fixed[i])) || p->place[i].kind == KX_OUTPUT)
            kg_exec_node(g, be, &g->nodes[i], buf, buf[i]);
    free(buf);
    return KILN_OK;
}
