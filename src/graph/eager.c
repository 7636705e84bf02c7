/* eager.c - run a graph one node at a time through a backend's kernels.
 * The layout ops (patchify, slices, concat, position crop, timestep
 * projection) are plain data movement and live here, shared by every backend. */
#include "base/base.h"
#include "graph/graph.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* x [B,C,H,W] -> y [B,(H/p)(W/p),C*p*p], feature order (c, py, px) to match a
 * conv weight [D,C,p,p] read as [D, C*p*p]; token order row-major (h, w). */
static void patchify(const float *x, float *y, const int64_t *s, int64_t p) {
    int64_t B = s[0], C = s[1], H = s[2], W = s[3], h = H / p, w = W / p, F = C * p * p;
    for (int64_t b = 0; b < B; b++)
        for (int64_t ty = 0; ty < h; ty++)
            for (int64_t tx = 0; tx < w; tx++) {
                float *out = y + ((b * h + ty) * w + tx) * F;
                for (int64_t c = 0; c < C; c++)
                    for (int64_t py = 0; py < p; py++)
                        for (int64_t px = 0; px < p; px++)
                            *out++ = x[((b * C + c) * H + ty * p + py) * W + tx * p + px];
            }
}

/* x [B,h*w,p*p*C] (feature order py, px, c) -> y [B,C,h*p,w*p] */
static void unpatchify(const float *x, float *y, int64_t B, int64_t p, int64_t h, int64_t w,
                       int64_t C) {
    int64_t H = h * p, W = w * p;
    for (int64_t b = 0; b < B; b++)
        for (int64_t ty = 0; ty < h; ty++)
            for (int64_t tx = 0; tx < w; tx++) {
                const float *in = x + ((b * h + ty) * w + tx) * p * p * C;
                for (int64_t py = 0; py < p; py++)
                    for (int64_t px = 0; px < p; px++)
                        for (int64_t c = 0; c < C; c++)
                            y[((b * C + c) * H + ty * p + py) * W + tx * p + px] =
                                in[(py * p + px) * C + c];
            }
}

/* diffusers' get_timestep_embedding(flip_sin_to_cos=True, shift 0, max_period
 * 10000): [cos(t f_i), sin(t f_i)] with f_i = exp(-ln(10000) i / half). */
static void timestep_proj(const float *t, float *y, int64_t B, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < half; i++) {
            double f = exp(-log(10000.0) * (double)i / (double)half);
            double a = (double)t[b] * f;
            y[b * dim + i] = (float)cos(a);
            y[b * dim + half + i] = (float)sin(a);
        }
}

/* centre crop of an M x M table to h x w, as diffusers' cropped_pos_embed */
static void pos_crop(const float *table, float *y, int64_t M, int64_t h, int64_t w, int64_t D) {
    int64_t top = (M - h) / 2, left = (M - w) / 2;
    for (int64_t i = 0; i < h; i++)
        memcpy(y + i * w * D, table + ((top + i) * M + left) * D, sizeof(float) * (size_t)(w * D));
}

static void run_node(const kg_graph *g, const kk_backend *be, const kg_node *n, float **buf,
                     float *y) {
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
        if (A->out_bf16 || n->out_bf16)
            be->linear_io(a, A->out_bf16, g->nodes[n->src[1]].kw, c, y, n->out_bf16, numel / (M ? M : 1), (int)ip[0]);
        else
            be->linear(a, g->nodes[n->src[1]].kw, c, y, numel / (M ? M : 1), (int)ip[0]);
        break;
    }
    case KG_LN_MODULATE:
        if (n->out_bf16)
            be->layernorm_modulate_bf16(a, b, c, (uint16_t *)y, n->shape[0], n->shape[1], n->shape[2], n->fparam);
        else
            be->layernorm_modulate(a, b, c, y, n->shape[0], n->shape[1], n->shape[2], n->fparam);
        break;
    case KG_ALIAS: break; /* never live: kg_fuse points its consumers at the producer */
    case KG_ADD: {
        int64_t nb = kg_numel(&g->nodes[n->src[1]]);
        for (int64_t i = 0; i < numel; i++) y[i] = a[i] + b[i % nb];
        break;
    }
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
        if (n->out_bf16) be->modulate_bf16(a, b, c, (uint16_t *)y, n->shape[0], n->shape[1], n->shape[2]);
        else be->modulate(a, b, c, y, n->shape[0], n->shape[1], n->shape[2]);
        break;
    case KG_GATE_ADD: be->gate_add(a, b, c, y, n->shape[0], n->shape[1], n->shape[2]); break;
    case KG_SLICE_COLS:
        for (int64_t r = 0; r < n->shape[0]; r++)
            memcpy(y + r * ip[1], a + r * A->shape[1] + ip[0], sizeof(float) * (size_t)ip[1]);
        break;
    case KG_CONCAT_TOKENS: {
        const kg_node *Bn = &g->nodes[n->src[1]];
        int64_t D = n->shape[2], n1 = A->shape[1] * D, n2 = Bn->shape[1] * D;
        for (int64_t r = 0; r < n->shape[0]; r++) {
            memcpy(y + r * (n1 + n2), a + r * n1, sizeof(float) * (size_t)n1);
            memcpy(y + r * (n1 + n2) + n1, b + r * n2, sizeof(float) * (size_t)n2);
        }
        break;
    }
    case KG_SLICE_TOKENS: {
        int64_t D = n->shape[2];
        for (int64_t r = 0; r < n->shape[0]; r++)
            memcpy(y + r * ip[1] * D, a + (r * A->shape[1] + ip[0]) * D,
                   sizeof(float) * (size_t)(ip[1] * D));
        break;
    }
    case KG_ATTENTION: {
        const kg_node *K = &g->nodes[n->src[1]];
        be->attention(a, b, c, y, n->shape[0], n->shape[1], K->shape[1], ip[0],
                      n->shape[2] / ip[0]);
        break;
    }
    case KG_PATCHIFY: patchify(a, y, A->shape, ip[0]); break;
    case KG_UNPATCHIFY: unpatchify(a, y, n->shape[0], ip[0], ip[1], ip[2], ip[3]); break;
    case KG_TIMESTEP_PROJ: timestep_proj(a, y, n->shape[0], ip[0]); break;
    case KG_POS_CROP: pos_crop(a, y, ip[0], ip[1], ip[2], n->shape[2]); break;
    case KG_SHARD:
    case KG_ALLGATHER:
    case KG_ALLTOALL:
    case KG_ALLREDUCE:
    case KG_FSDP_GATHER: kg_run_dist(g, n, a, y); break;
    }
}

kiln_status kg_run_eager(const kg_graph *g, const kk_backend *be, const float *const *inputs,
                         float *const *outputs) {
    if (g->status != KILN_OK) return kb_fail(g->status, "graph has an error: %s", kiln_last_error());
    int n = g->n;
    float **buf = calloc((size_t)n, sizeof *buf);
    int *last_use = malloc(sizeof(int) * (size_t)n);
    int *out_slot = malloc(sizeof(int) * (size_t)n);
    if (!buf || !last_use || !out_slot) {
        free(buf);
        free(last_use);
        free(out_slot);
        return kb_fail(KILN_ERR_NOMEM, "out of memory running the graph");
    }
    /* a node no live node consumes (folded away by kg_fuse) is skipped;
     * walk backwards from the outputs */
    char *live = calloc((size_t)n, 1);
    if (!live) {
        free(buf);
        free(last_use);
        free(out_slot);
        return kb_fail(KILN_ERR_NOMEM, "out of memory running the graph");
    }
    for (int o = 0; o < g->n_outputs; o++) live[g->outputs[o]] = 1;
    for (int i = n - 1; i >= 0; i--)
        if (live[i])
            for (int s = 0; s < 3; s++)
                if (g->nodes[i].src[s] >= 0) live[g->nodes[i].src[s]] = 1;
    for (int i = 0; i < n; i++) {
        last_use[i] = i;
        out_slot[i] = -1;
        if (!live[i]) continue;
        for (int s = 0; s < 3; s++)
            if (g->nodes[i].src[s] >= 0) last_use[g->nodes[i].src[s]] = i;
    }
    for (int o = 0; o < g->n_outputs; o++) out_slot[g->outputs[o]] = o;

    /* KILN_PROFILE=1: time every op kind into the ledger (--timings prints it) */
    const char *pe = getenv("KILN_PROFILE");
    int profile = pe && *pe && strcmp(pe, "0");
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
        size_t esz = nd->out_bf16 ? 2 : sizeof(float);
        float *y = out_slot[i] >= 0 ? outputs[out_slot[i]] : kb_alloc_aligned(esz * (size_t)kg_numel(nd));
        if (!y) {
            st = KILN_ERR_NOMEM;
            break;
        }
        buf[i] = y;
        double t0 = profile ? kb_now() : 0;
        run_node(g, be, nd, buf, y);
        if (profile) {
            char cat[48];
            snprintf(cat, sizeof cat, "op %s", kg_op_name(nd->op));
            kb_ledger_add(cat, kb_now() - t0, NULL);
        }
        /* free sources whose last consumer this was */
        for (int s = 0; s < 3; s++) {
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
