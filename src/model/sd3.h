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
    int split;  /* tensor parallel (sd3_shard_spec): SD3_SPLIT_* */
} sd3_spec;

/* How tensor parallel splits a weight: column-parallel linears (q, k, v, FF
 * in) keep a block of output rows, row-parallel ones (attention out, FF out)
 * a block of input columns; a row-parallel bias is added once, so rank 0's
 * shard holds it and the others hold zeros. Everything else is replicated. */
enum { SD3_SPLIT_NONE = 0, SD3_SPLIT_ROWS, SD3_SPLIT_COLS, SD3_SPLIT_BIAS0 };
/* Turn a full spec into the shapes one of tp ranks holds (sets split). */
void sd3_shard_spec(int tp, sd3_spec *spec, size_t n);

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

/* One rank's part of a parallel run (docs/distributed.md). The graph's
 * weights must be this rank's shard (sd3_shard_spec); the collective ops
 * (graph_dist.c) join the ranks. */
typedef struct sd3_parallel {
    int tp;            /* tensor parallel: heads and FF columns split, row-parallel outputs all-reduced */
    int sp, sp_index;  /* sequence parallel: image tokens split, attention by Ulysses all-to-all */
    int fsdp;          /* gather each block's weights before it runs */
} sd3_parallel;
/* The same graph for one rank; par NULL (or all factors 1) is sd3_build_forward. */
kiln_status sd3_build_forward_par(const kiln_config *cfg, kg_graph *g, int64_t B, int64_t H, int64_t W,
                                  int64_t T, const sd3_parallel *par);
/* Can this config run split this way? Messages name the factor and what it must divide. */
kiln_status sd3_check_parallel(const kiln_config *cfg, int tp, int sp);

#endif
