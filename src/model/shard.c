/* shard.c - what one tensor-parallel rank holds of a model's weights (by
 * the split rules of the family's weight spec) and the slicing that makes
 * it from the full tensors; FSDP's byte ranges and block gathers
 * (docs/distributed.md). */
#include "base/base.h"
#include "model/model.h"

#include <string.h>

kiln_status km_shard_weight(km_weight *w, int split, int tp, int index, int64_t *n_params) {
    if (tp <= 1 || split == KA_SPLIT_NONE) return KILN_OK;
    if (!w->data || w->packed)
        return kb_fail(KILN_ERR_INVALID_ARG, "tensor parallel: %s must be sharded before it is packed", w->name);
    int64_t R = w->shape[0], C = w->ndim > 1 ? w->shape[1] : 1;
    if (split == KA_SPLIT_BIAS0) { /* added once: rank 0 keeps it */
        if (index) memset(w->data, 0, sizeof(float) * (size_t)R);
        return KILN_OK;
    }
    int cols = split == KA_SPLIT_COLS || split == KA_SPLIT_COLS_1_4;
    int64_t r = split == KA_SPLIT_ROWS ? R / tp : R, c = cols ? C / tp : C;
    if (split == KA_SPLIT_COLS_1_4 && (C % 5 || (C / 5) % tp))
        return kb_fail(KILN_ERR_SHAPE, "tensor parallel %d: %s's %lld columns are not [C/5 | 4C/5] blocks of %d", tp, w->name,
                       (long long)C, tp);
    float *d = kb_alloc_aligned(sizeof(float) * (size_t)(r * c));
    if (!d) return kb_fail(KILN_ERR_NOMEM, "out of memory sharding %s", w->name);
    for (int64_t y = 0; y < r; y++) {
        if (split == KA_SPLIT_COLS_1_4) { /* this rank's block of each part */
            int64_t a = C / 5 / tp, b = 4 * (C / 5) / tp;
            memcpy(d + y * c, w->data + y * C + (int64_t)index * a, sizeof(float) * (size_t)a);
            memcpy(d + y * c + a, w->data + y * C + C / 5 + (int64_t)index * b, sizeof(float) * (size_t)b);
            continue;
        }
        const float *src = split == KA_SPLIT_ROWS ? w->data + ((int64_t)index * r + y) * C
                                                  : w->data + y * C + (int64_t)index * c;
        memcpy(d + y * c, src, sizeof(float) * (size_t)c);
    }
    kb_free_aligned(w->data);
    if (n_params) *n_params -= R * C - r * c;
    w->data = d;
    w->shape[0] = r;
    if (w->ndim > 1) w->shape[1] = c;
    return KILN_OK;
}

/* ---- FSDP: block weights split into byte ranges, gathered per block ------------ */

#include "cache/cache.h"
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>

void km_fsdp_range(size_t full, int n, int j, size_t *off, size_t *len) {
    size_t chunk = (full + (size_t)n - 1) / (size_t)n;
    chunk = (chunk + 63) & ~(size_t)63; /* parts start 64-byte aligned */
    size_t a = chunk * (size_t)j, b = a + chunk;
    if (a > full) a = full;
    if (b > full) b = full;
    *off = a;
    *len = b - a;
}

kiln_status km_fsdp_map(km_weight *w, const ka_spec *s, const kcache_entry *e, size_t i, km_compute cp) {
    const kcache_tensor *t = &e->t[i];
    int64_t numel = 1;
    for (int d = 0; d < s->ndim; d++) numel *= s->shape[d];
    /* the whole weight as the kernels consume it: packed linears, else f32 */
    char layout[40] = "rowmajor";
    size_t full = sizeof(float) * (size_t)numel;
    int packed = s->linear && kk_packs(cp.be);
    if (packed) {
        const int64_t sh[4] = {s->shape[0], numel / s->shape[0], 1, 1};
        kiln_status st = kk_pack_layout(cp.be, sh, 0, s->keep_f32 ? KILN_F32 : cp.dtype, layout, &full);
        if (st) return st;
    }
    size_t off, len;
    km_fsdp_range(full, cp.fsdp, cp.fsdp_index, &off, &len);
    char want[48];
    snprintf(want, sizeof want, "fsdp%dof%d", cp.fsdp_index, cp.fsdp);
    if (strcmp(t->name, s->name) || t->dtype != KILN_U8 || t->ndim != 1 || strcmp(t->layout, want) ||
        t->nbytes != len)
        return kb_fail(KILN_ERR_CORRUPT, "cache %s: tensor %zu is %s %s %s of %zu bytes, this rank needs %s U8 %s of %zu",
                       e->path, i, t->name, kiln_dtype_name(t->dtype), t->layout, t->nbytes, s->name, want, len);
    memset(w, 0, sizeof *w);
    if (!(w->name = kb_strdup(t->name))) return KILN_ERR_NOMEM;
    w->ndim = s->ndim;
    memcpy(w->shape, s->shape, sizeof w->shape);
    kiln_dtype dt = s->keep_f32 ? KILN_F32 : cp.dtype;
    w->src_dtype = packed ? dt : KILN_F32;
    snprintf(w->layout, sizeof w->layout, "%s", layout);
    w->fsdp = 1;
    w->block = s->block;
    w->part = t->data;
    w->part_bytes = t->nbytes;
    w->full_bytes = full;
    if (packed) {
        w->packed_bytes = full;
        w->packed_dtype = dt; /* FSDP with a quantized backbone is refused at load */
    }
    return KILN_OK;
}

/* offset of each FSDP weight inside the workspace: blocks share it (at:
 * one running offset per block) */
static size_t ws_offsets(kiln_model *m, size_t *off, size_t *at) {
    size_t need = 0;
    for (size_t i = 0; i < m->nw; i++) {
        km_weight *w = &m->w[i];
        if (!w->fsdp) continue;
        off[i] = at[w->block];
        at[w->block] += (w->full_bytes + 63) & ~(size_t)63;
        if (at[w->block] > need) need = at[w->block];
    }
    return need;
}

kiln_status km_fsdp_finish(kiln_model *m) {
    int nb = 0;
    for (size_t i = 0; i < m->nw; i++)
        if (m->w[i].fsdp && m->w[i].block + 1 > nb) nb = m->w[i].block + 1;
    size_t *off = kb_calloc(m->nw ? m->nw : 1, sizeof *off), *at = kb_calloc((size_t)nb + 1, sizeof *at);
    if (!off || !at) {
        free(off);
        free(at);
        return KILN_ERR_NOMEM;
    }
    size_t need = ws_offsets(m, off, at);
    free(at);
    m->fsdp_ws = kb_alloc_aligned(need ? need : 64);
    if (!m->fsdp_ws) {
        free(off);
        return kb_fail(KILN_ERR_NOMEM, "out of memory for the FSDP block workspace (%zu bytes)", need);
    }
    for (size_t i = 0; i < m->nw; i++) {
        km_weight *w = &m->w[i];
        if (!w->fsdp) continue;
        uint8_t *p = (uint8_t *)m->fsdp_ws + off[i];
        if (w->packed_bytes) w->packed = p;
        else w->data = (float *)p;
    }
    free(off);
    return KILN_OK;
}

void km_fsdp_gather(void *user, int block) {
    kiln_model *m = user;
    int n = m->mesh->size[KD_FSDP];
    size_t counts[64];
    if (n > 64) {
        kb_log(KILN_LOG_ERROR, "FSDP over %d ranks: at most 64", n);
        abort();
    }
    for (size_t i = 0; i < m->nw; i++) {
        km_weight *w = &m->w[i];
        if (!w->fsdp || w->block != block) continue;
        for (int j = 0; j < n; j++) {
            size_t o;
            km_fsdp_range(w->full_bytes, n, j, &o, &counts[j]);
        }
        void *host = w->packed ? (void *)w->packed : (void *)w->data;
        kd_allgatherv(m->mesh, KD_FSDP, w->part, w->part_bytes, host, counts);
        /* a backend with memory of its own: its copy of the gathered weight */
        void *dev = w->packed ? w->dev_packed : w->dev_f32;
        if (dev) kk_copy_from_host(m->backend, dev, host, w->full_bytes);
    }
}
