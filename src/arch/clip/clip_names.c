/* clip_names.c - CLIP text encoders as checkpoints name them: transformers
 * 5.25 saves a CLIPTextModel's tensors without the text_model. prefix
 * (embeddings.*, encoder.layers.*, final_layer_norm.*), which transformers
 * reads either way; clip_renamer gives them the prefix kiln's weight spec
 * (and every earlier file) has. Parser code: no graph, no kernels. */
#include "arch/clip/clip.h"

#include <stdio.h>
#include <string.h>

static const char *const k_roots[3] = {"embeddings.", "encoder.layers.", "final_layer_norm."};

/* no name under text_model. and the token table, a layer and the final norm without it */
static int detect(const char *const *names, size_t n, int64_t state[4]) {
    (void)state;
    int prefixed = 0, table = 0, layer = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        prefixed |= !strncmp(names[i], "text_model.", 11);
        table |= !strcmp(names[i], "embeddings.token_embedding.weight");
        layer |= !strncmp(names[i], "encoder.layers.", 15);
        norm |= !strcmp(names[i], "final_layer_norm.weight");
    }
    return !prefixed && table && layer && norm;
}

static int rename_one(const int64_t state[4], const char *name, kc_rename *r) {
    (void)state;
    for (int k = 0; k < 3; k++)
        if (!strncmp(name, k_roots[k], strlen(k_roots[k]))) {
            r->n = 1;
            if (snprintf(r->to[0], sizeof r->to[0], "text_model.%s", name) >= (int)sizeof r->to[0]) return 0;
            return 1;
        }
    return 0; /* text_projection.weight and the like: as they are */
}

const kc_renamer clip_renamer = {"clip-unprefixed", detect, rename_one};
