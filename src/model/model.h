/* model.h - what a kiln_model holds: the config and the f32 compute weights
 * by diffusers name (sorted), plus what `kiln info` reports. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "format/checkpoint.h"
#include "kiln.h"
#include "model/sd3.h"

struct kk_backend;

typedef struct km_weight {
    char *name;
    int ndim;
    int64_t shape[4];
    kiln_dtype src_dtype; /* as stored in the checkpoint */
    float *data;          /* f32, 64-byte aligned, owned */
} km_weight;

struct kiln_model {
    kiln_config cfg;
    km_weight *w; /* sorted by name */
    size_t nw;
    kiln_model_info info;
    char layout[32];
    const struct kk_backend *backend;
};

const km_weight *km_find(const kiln_model *m, const char *name);
/* kg_resolver over the model's weights (user = the model) */
int km_resolve(void *user, const char *name, int *ndim, int64_t shape[4], const float **data);
/* Convert every spec'd tensor of c to f32 weights of m. */
kiln_status km_load_weights(kiln_model *m, const kc_checkpoint *c, const sd3_spec *spec, size_t ns);

#endif
