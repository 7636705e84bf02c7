/* plan.c - memory planning from tensor lifetimes, and the in-process
 * planned executor that runs a graph inside one arena (no allocation per
 * node, no compiler needed). */
#define _GNU_SOURCE
#include "base/base.h"
#include "compile/compile.h"

#include <stdio.h>
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
    char *live = malloc((size_t)n + 1), *konst = malloc((size_t)n + 1);
    int *last = malloc(sizeof(int) * ((size_t)n + 1));
    interval *iv = malloc(sizeof *iv * ((size_t)n + 1));
    p->place = calloc((size_t)n + 1, sizeof *p->place);
    p->weights = malloc(sizeof *p->weights * ((size_t)n + 1));
    p->n = n;
    if (!live || !konst || !last || !iv || !p->place || !p->weights) {
        free(live);
        free(konst);
        free(last);
        free(iv);
        kx_plan_free(p);
        return kb_fail(KILN_ERR_NOMEM, "plan: out of memory");
    }
    kg_liveness(g, live, last);
    kg_shape_consts(g, live, konst);
    int ni = 0;
    for (int i = 0; i < n; i++) {
        const kg_node *nd = &g->nodes[i];
        if (!live[i]) continue;
        if (konst[i]) { /* kept between forwards: an area of their own */
            p->place[i] = (kx_place){KX_CONST, (int64_t)p->const_bytes};
            p->const_bytes += (kg_out_bytes(nd) + 63) & ~(size_t)63;
        } else if (kg_is_input(nd)) {
            p->place[i] = (kx_place){KX_INPUT, nd->iparam[0]};
        } else if (kg_is_weight(nd)) {
            p->place[i] = (kx_place){KX_WEIGHT, p->n_weights};
            p->weights[p->n_weights++] = i;
        } else {
            p->place[i] = (kx_place){KX_ARENA, 0};
            iv[ni++] = (interval){i, i, last[i], (kg_out_bytes(nd) + 63) & ~(size_t)63};
        }
    }
    free(konst);
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

void kx_consts_free(kx_consts *c, const kk_backend *be) {
    kk_buf_free(be, c->buf);
    free(c->sig);
    memset(c, 0, sizeof *c);
}

/* the constants' signature: each one's op, shape, parameters and format,
 * and what it reads (a weight's data and view, another constant's place) */
static char *consts_sig(const kg_graph *g, const kx_plan *p, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    fprintf(f, "%zu;", p->const_bytes);
    for (int i = 0; i < g->n; i++) {
        if (p->place[i].kind != KX_CONST) continue;
        const kg_node *n = &g->nodes[i];
        fprintf(f, "%d %d %d %lld %lld %lld %lld %lld %lld %lld %lld %a %d", i, (int)n->op, n->ndim, (long long)n->shape[0],
                (long long)n->shape[1], (long long)n->shape[2], (long long)n->shape[3], (long long)n->iparam[0],
                (long long)n->iparam[1], (long long)n->iparam[2], (long long)n->iparam[3], (double)n->fparam, n->out_bf16);
        for (int s = 0; s < KG_MAX_SRC; s++) {
            kg_id src = n->src[s];
            if (src < 0) continue;
            const kg_node *m = &g->nodes[src];
            if (kg_is_weight(m)) fprintf(f, " w%p,%p", (const void *)m->data, (const void *)m->kw);
            else fprintf(f, " c%lld", (long long)p->place[src].at);
        }
        fputc(';', f);
    }
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* the constants into c (buf[i] of each set), computed unless c holds them */
static kiln_status consts_ready(const kg_graph *g, const kx_plan *p, const kk_backend *be, kx_consts *c, float **buf) {
    if (!p->const_bytes) return KILN_OK;
    size_t len = 0;
    char *sig = consts_sig(g, p, &len);
    if (!sig) return kb_fail(KILN_ERR_NOMEM, "out of memory running the plan");
    int same = c->buf && c->sig && len == c->sig_len && !memcmp(sig, c->sig, len);
    if (!same && c->bytes < p->const_bytes) {
        kx_consts_free(c, be);
        if (!(c->buf = kk_buf_alloc(be, p->const_bytes))) {
            free(sig);
            return kb_fail(KILN_ERR_NOMEM, "cannot allocate %zu bytes for the shape constants", p->const_bytes);
        }
        c->bytes = p->const_bytes;
    }
    for (int i = 0; i < g->n; i++)
        if (p->place[i].kind == KX_CONST) buf[i] = (float *)((char *)c->buf + p->place[i].at);
    if (same) {
        free(sig);
        return KILN_OK;
    }
    free(c->sig);
    c->sig = NULL; /* (not valid until computed) */
    for (int i = 0; i < g->n; i++)
        if (p->place[i].kind == KX_CONST) kg_exec_node(g, be, &g->nodes[i], buf, buf[i]);
    c->sig = sig;
    c->sig_len = len;
    return KILN_OK;
}

kiln_status kx_run_planned(const kg_graph *g, const kx_plan *p, const kk_backend *be, void *arena, kx_consts *consts,
                           const float *const *inputs, float *const *outputs) {
    if (g->status) return kb_fail(g->status, "graph has an error: %s", kiln_last_error());
    float **buf = calloc((size_t)g->n + 1, sizeof *buf);
    if (!buf) return kb_fail(KILN_ERR_NOMEM, "out of memory running the plan");
    for (int i = 0; i < g->n; i++) {
        const kx_place *pl = &p->place[i];
        switch (pl->kind) {
        case KX_NONE: break;
        case KX_CONST: break; /* consts_ready */
        case KX_ARENA: buf[i] = (float *)((char *)arena + pl->at); break;
        case KX_INPUT: buf[i] = (float *)inputs[pl->at]; break;
        case KX_OUTPUT: buf[i] = outputs[pl->at]; break;
        case KX_WEIGHT: buf[i] = (float *)g->nodes[i].data; break;
        }
    }
    kx_consts once = {0};
    kiln_status st = consts_ready(g, p, be, consts ? consts : &once, buf);
    for (int i = 0; !st && i < g->n; i++)
        if (p->place[i].kind == KX_ARENA || p->place[i].kind == KX_OUTPUT) kg_exec_node(g, be, &g->nodes[i], buf, buf[i]);
    kx_consts_free(&once, be);
    free(buf);
    return st;
}
