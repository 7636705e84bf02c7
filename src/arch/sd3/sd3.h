/* sd3.h - the SD3 / SD3.5 MMDiT backbone (diffusers' SD3Transformer2DModel):
 * its config, the weights it expects, and its forward pass written once as
 * code that builds a graph. */
#ifndef KILN_SD3_H
#define KILN_SD3_H

#include "arch/arch.h"
#include "format/checkpoint.h"
#include "graph/graph.h"
#include "kiln.h"

#define SD3_TIME_PROJ_DIM 256 /* diffusers' Timesteps(num_channels=256) */
#define SD3_NORM_EPS 1e-6f    /* every LayerNorm and RMSNorm in the block */
#define SD3_MAX_LAYERS 64     /* dual_attention_mask is 64 bits */

/* The family's table (sd3_arch.c) and its original single-file names (sd3_names.c). */
extern const ka_arch ka_sd3;
extern const kc_renamer sd3_renamer;

/* The forward's symbols: batch, the latent's patch grid, context tokens. */
enum { SD3_SYM_BATCH, SD3_SYM_H, SD3_SYM_W, SD3_SYM_CTX, SD3_NSYM };

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

/* The weights a config needs, in a stable order, with each one's tensor
 * parallel split and FSDP block. Caller frees *out. */
kiln_status sd3_weight_spec(const kiln_config *cfg, ka_spec **out, size_t *n);

/* Latent size checks shared by every entry point: H, W multiples of the
 * patch and the patch grid inside pos_embed_max_size. */
kiln_status sd3_check_latent(const kiln_config *cfg, int64_t height, int64_t width);

/* Build the forward graph for hidden [B,C,H,W], context [B,T,J], pooled
 * [B,P], timestep [B] -> output 0: sample [B,out_channels,H,W]. Inputs get
 * slots 0..3 in that order. The graph's resolver supplies the weights. */
kiln_status sd3_build_forward(const kiln_config *cfg, kg_graph *g, int64_t B, int64_t H,
                              int64_t W, int64_t T);

/* One rank's part of a parallel run (docs/distributed.md): tensor parallel
 * splits heads and FF columns and all-reduces row-parallel outputs;
 * sequence parallel splits the image tokens, attention by Ulysses
 * all-to-all; FSDP gathers each block's weights. The graph's weights must
 * be this rank's shard (ka_shard_spec); the collective ops (graph_dist.c)
 * join the ranks. */
/* The same graph for one rank; par NULL (or all factors 1) is sd3_build_forward. */
kiln_status sd3_build_forward_par(const kiln_config *cfg, kg_graph *g, int64_t B, int64_t H, int64_t W,
                                  int64_t T, const ka_par *par);
/* Can this config run split this way? Messages name the factor and what it must divide. */
kiln_status sd3_check_parallel(const kiln_config *cfg, int tp, int sp);

#endif
