/* shard.c - what one tensor-parallel rank holds of the SD3 weights, and the
 * slicing that makes it from the full tensors (docs/distributed.md). */
#include "base/base.h"
#include "model/model.h"

#include <string.h>

/* the part of a block weight's name after "transformer_blocks.<i>." */
static const char *block_part(const char *name) {
    if (strncmp(name, "transformer_blocks.", 19)) return NULL;
    const char *dot = strchr(name + 19, '.');
    return dot ? dot + 1 : NULL;
}

static int split_of(const char *name) {
    static const char *rows[] = {"attn.to_q.",       "attn.to_k.",       "attn.to_v.",       "attn.add_q_proj.",
                                 "attn.add_k_proj.", "attn.add_v_proj.", "attn2.to_q.",      "attn2.to_k.",
                                 "attn2.to_v.",      "ff.net.0.proj.",   "ff_context.net.0.proj."};
    static const char *cols[] = {"attn.to_out.0.", "attn.to_add_out.", "attn2.to_out.0.", "ff.net.2.",
                                 "ff_context.net.2."};
    const char *p = block_part(name);
    if (!p) return SD3_SPLIT_NONE;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (!strncmp(p, rows[i], strlen(rows[i]))) return SD3_SPLIT_ROWS;
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        if (!strncmp(p, cols[i], strlen(cols[i])))
            return !strcmp(p + strlen(cols[i]), "bias") ? SD3_SPLIT_BIAS0 : SD3_SPLIT_COLS;
    return SD3_SPLIT_NONE;
}

void sd3_shard_spec(int tp, sd3_spec *spec, size_t n) {
    for (size_t i = 0; i < n; i++) {
        spec[i].split = tp > 1 ? split_of(spec[i].name) : SD3_SPLIT_NONE;
        if (spec[i].split == SD3_SPLIT_ROWS) spec[i].shape[0] /= tp;
        if (spec[i].split == SD3_SPLIT_COLS) spec[i].shape[1] /= tp;
    }
}

kiln_status km_shard_tp(kiln_model *m, int tp, int index) {
    if (tp <= 1) return KILN_OK;
    kiln_status st = sd3_check_parallel(&m->cfg, tp, 1);
    if (st) return st;
    for (size_t i = 0; i < m->nw; i++) {
        km_weight *w = &m->w[i];
        int split = split_of(w->name);
        if (split == SD3_SPLIT_NONE) continue;
        if (!w->data || w->packed)
            return kb_fail(KILN_ERR_INVALID_ARG, "tensor parallel: %s must be sharded before it is packed", w->name);
        int64_t R = w->shape[0], C = w->ndim > 1 ? w->shape[1] : 1;
        if (split == SD3_SPLIT_BIAS0) { /* added once: rank 0 keeps it */
            if (index) memset(w->data, 0, sizeof(float) * (size_t)R);
            continue;
        }
        int64_t r = split == SD3_SPLIT_ROWS ? R / tp : R, c = split == SD3_SPLIT_COLS ? C / tp : C;
        float *d = kb_alloc_aligned(sizeof(float) * (size_t)(r * c));
        if (!d) return kb_fail(KILN_ERR_NOMEM, "out of memory sharding %s", w->name);
        for (int64_t y = 0; y < r; y++) {
            const float *src = split == SD3_SPLIT_ROWS ? w->data + ((int64_t)index * r + y) * C
                                                       : w->data + y * C + (int64_t)index * c;
            memcpy(d + y * c, src, sizeof(float) * (size_t)c);
        }
        kb_free_aligned(w->data);
        m->info.n_params -= R * C - r * c;
        w->data = d;
        w->shape[0] = r;
        if (w->ndim > 1) w->shape[1] = c;
        w->kw.M = r;
        w->kw.K = c;
        w->kw.f32 = d;
    }
    return KILN_OK;
}
