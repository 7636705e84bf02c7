/* sd3.h - the SD3 / SD3.5 MMDiT backbone (diffusers' SD3Transformer2DModel):
 * its config, the weights it expects, and its forward pass written once as
 * code that builds a graph. */
#ifndef KILN_SD3_H
#define KILN_SD3_H

#include "format/checkpoint.h"
#include "graph/graph.h"
#include "kiln.h"

#define SD3_TIME_PROJ_DIM 256 /* diffusers' Timesteps(num_channels=256) */
#define SD3_NORM_EPS 1e-6f    /* every LayerNorm and RMSNorm in the block */
#define SD3_MAX_LAYERS 64     /* dual_attention_mask is 64 bits */

/* One expected weight: diffusers name and exact shape. */
typedef struct sd3_spec {
    char name[112];
    int ndim;
    int64_t shape[4];
    int linear; /* the W of a linear layer (packed for the fast GEMM) */
} sd3_spec;

/* diffusers' defaults for keys missing from config.json */
kiln_config sd3_config_defaults(void);
/* Parse config.json text; missing keys take diffusers' defaults. */
kiln_status sd3_config_parse(const char *json, kiln_config *cfg);
/* Infer the architecture from tensor shapes (single-file checkpoints). */
kiln_status sd3_config_infer(const kc_checkpoint *c, kiln_config *cfg);
/* Reject impossible values with a message naming the key. */
kiln_status sd3_config_validate(const kiln_config *cfg);
/* Serialise as a diffusers config.json (malloc'd). */
char *sd3_config_to_json(const kiln_config *cfg);

/* The weights a config needs, in a stable order. Caller frees *out. */
kiln_status sd3_weight_spec(const kiln_config *cfg, sd3_spec **out, size_t *n);

/* Latent size checks shared by every entry point: H, W multiples of the
 * patch and the patch grid inside pos_embed_max_size. */
kiln_status sd3_check_latent(const kiln_config *cfg, int64_t height, int64_t width);

/* Build the forward graph for hidden [B,C,H,W], context [B,T,J], pooled
 * [B,P], timestep [B] -> output 0: sample [B,out_channels,H,W]. Inputs get
 * slots 0..3 in that order. The graph's resolver supplies the weights. */
kiln_status sd3_build_forward(const kiln_config *cfg, kg_graph *g, int64_t B, int64_t H,
                              int64_t W, int64_t T);

#endif
