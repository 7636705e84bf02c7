/* flux.h - the Flux.1 transformer (diffusers FluxTransformer2DModel): its
 * config, the weights it expects, and its forward pass written once as code
 * that builds a graph (flux_forward.c).
 *
 *   latents [B, C, H, W] (C = in_channels / 4: the unpacked latent; the
 *   model packs its 2x2 patches itself, as FluxPipeline._pack_latents),
 *   encoder_hidden_states [B, T, joint_attention_dim] (T5's),
 *   pooled_projections [B, pooled_projection_dim] (CLIP-L's pooled output),
 *   timestep [B] (as FluxPipeline passes it: t / 1000 in [0, 1]),
 *   guidance [B] (the guidance-distilled models, guidance_embeds: dev; the
 *   raw scale) -> sample [B, C, H, W] (unpacked)
 *
 * The position ids are FluxPipeline's: the T text tokens at (0, 0, 0), the
 * image's (H/2) x (W/2) patches at (0, row, col), row-major; the rotary
 * table comes from them, a constant of the shape (kg_rope_table).
 *
 * Two tables: "flux" (guidance embedding: Flux.1-dev) and "flux-schnell"
 * (none: Flux.1-schnell), since their forwards take different inputs.
 * Symbols: batch, h_tok (H / 2), w_tok (W / 2), ctx_len (T). */
#ifndef KILN_FLUX_H
#define KILN_FLUX_H

#include "arch/arch.h"
#include "graph/graph.h"
#include "kiln.h"

extern const ka_arch ka_flux, ka_flux_schnell;

enum { FLUX_SYM_BATCH, FLUX_SYM_H, FLUX_SYM_W, FLUX_SYM_CTX, FLUX_NSYM };

#define FLUX_NORM_EPS 1e-6f  /* every LayerNorm and the q/k RMS norms */
#define FLUX_TIME_PROJ_DIM 256
#define FLUX_ROPE_THETA 10000.0f
#define FLUX_MAX_LAYERS 512
#define FLUX_MAX_TOKENS 65536 /* image patches, and text tokens */

typedef struct flux_config {
    int in_channels;  /* packed: 4 x the latent's channels */
    int out_channels; /* packed; null in config.json: in_channels */
    int num_layers, num_single_layers;
    int num_attention_heads, attention_head_dim;
    int joint_attention_dim, pooled_projection_dim;
    int axes_dims_rope[3];
    int guidance_embeds;
    int patch_size; /* 1: the checkpoints' (the 2x2 packing is the pipeline's) */
} flux_config;

/* diffusers' FluxTransformer2DModel defaults (Flux.1-dev's sizes but for
 * guidance_embeds, false as in diffusers) */
flux_config flux_config_defaults(void);
kiln_status flux_config_parse(const char *json, flux_config *cfg);
kiln_status flux_config_validate(const flux_config *cfg);
char *flux_config_to_json(const flux_config *cfg);
kiln_status flux_weight_spec(const flux_config *cfg, ka_spec **out, size_t *n);
/* A config from the tensors' shapes (a single file without config.json;
 * guided: the flux family's, with the guidance embedding), and the
 * renamer of Black Forest Labs' original names (flux_names.c) */
kiln_status flux_config_infer(const kc_checkpoint *c, flux_config *x, int guided);
extern const kc_renamer flux_renamer;
/* the latent's H and W (even, positive, within FLUX_MAX_TOKENS patches) */
kiln_status flux_check_latent(const flux_config *cfg, int64_t H, int64_t W);
/* Build the forward for symbol values s (FLUX_SYM_*); par NULL: one process
 * (tensor parallel: heads split, row-parallel outputs all-reduced; sequence
 * parallel: the image tokens split, Ulysses all-to-alls in the attention;
 * FSDP: each block's weights gathered before it). */
kiln_status flux_build_forward(const flux_config *cfg, kg_graph *g, const int64_t *s, const ka_par *par);
/* can this config run split this way (heads by tp, then by sp) */
kiln_status flux_check_parallel(const flux_config *cfg, int tp, int sp);

#endif
