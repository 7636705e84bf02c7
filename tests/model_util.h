/* model_util.h - deterministic inputs of one backbone call, for the tests
 * that run a model through its execution chain (test_compile,
 * test_package_trust). */
#ifndef KILN_MODEL_UTIL_H
#define KILN_MODEL_UTIL_H

#include "kiln.h"

#include <stdint.h>
#include <stdlib.h>

/* the call, its four input buffers, and the output's floats */
typedef struct inputs {
    kiln_forward_args a;
    float *buf[4];
    size_t n_out;
} inputs;

static inline void make_inputs(const kiln_model *m, int B, int H, int W, int T, uint64_t seed, inputs *in) {
    const kiln_config *c = kiln_model_config(m);
    size_t n[4] = {(size_t)B * c->in_channels * H * W, (size_t)B * T * c->joint_attention_dim,
                   (size_t)B * c->pooled_projection_dim, (size_t)B};
    for (int k = 0; k < 4; k++) {
        in->buf[k] = malloc(sizeof(float) * n[k]);
        for (size_t i = 0; i < n[k]; i++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            in->buf[k][i] = k == 3 ? 300.0f + 100.0f * (float)i : (float)((double)(seed >> 40) / (1 << 24) * 2 - 1);
        }
    }
    in->a = (kiln_forward_args){B, H, W, T, in->buf[0], in->buf[1], in->buf[2], in->buf[3]};
    in->n_out = (size_t)B * c->out_channels * H * W;
}

static inline void free_inputs(inputs *in) {
    for (int k = 0; k < 4; k++) free(in->buf[k]);
}

#endif
