/* vae.h - diffusers' AutoencoderKL (the VAE of SD3, SD3.5 and Flux.1, and of
 * SD 1.x / SDXL): its config, the weights of a vae/ folder, and the
 * decoder's forward written once as code that builds a graph (family
 * "vae-decoder": latent [B, latent_channels, h, w] -> sample [B,
 * out_channels, h*f, w*f], f = 2^(number of blocks - 1)). */
#ifndef KILN_VAE_H
#define KILN_VAE_H

#include "arch/arch.h"
#include "graph/graph.h"
#include "kiln.h"

#define VAE_MAX_BLOCKS 8
#define VAE_EPS 1e-6f    /* every GroupNorm of the Encoder / Decoder (resnet_eps, norm_out) */
#define VAE_MAX_SIDE 4096 /* latent rows / columns a forward takes (32768 pixels at f = 8) */
#define VAE_MAX_BATCH 1024

/* AutoencoderKL's config.json (diffusers keys). */
typedef struct vae_config {
    int in_channels, out_channels, latent_channels;
    int n_blocks;                           /* len(block_out_channels) = len(down/up_block_types) */
    int block_out_channels[VAE_MAX_BLOCKS];
    int layers_per_block, norm_num_groups;
    int mid_block_add_attention;
    int use_quant_conv, use_post_quant_conv;
    int sample_size;
    double scaling_factor, shift_factor; /* shift_factor null: 0 (has_shift 0) */
    int has_shift;
} vae_config;

/* The families' tables (vae_arch.c): the decoder (built in: it claims
 * AutoencoderKL configs) and the encoder (image -> mean, std; not listed,
 * as both would claim the same config.json) */
extern const ka_arch ka_vae_decoder;
extern const ka_arch ka_vae_encoder;

/* The forward's symbols: batch, the latent's height and width. */
enum { VAE_SYM_BATCH, VAE_SYM_H, VAE_SYM_W, VAE_NSYM };

/* diffusers' defaults for keys missing from config.json */
vae_config vae_config_defaults(void);
/* Parse config.json text; refuses a _class_name other than AutoencoderKL,
 * block types other than the KL ones, activations other than SiLU. */
kiln_status vae_config_parse(const char *json, vae_config *cfg);
/* Reject impossible values with a message naming the key. */
kiln_status vae_config_validate(const vae_config *cfg);
/* Serialise as a diffusers config.json (malloc'd). */
char *vae_config_to_json(const vae_config *cfg);
/* Every tensor of an AutoencoderKL's file: the encoder's (which the decoder
 * family accepts and keeps, and does not read), quant_conv and
 * post_quant_conv as the config says, the decoder's. Caller frees *out. */
kiln_status vae_weight_spec(const vae_config *cfg, ka_spec **out, size_t *n);
/* The original LDM names (first_stage_model.*, a standalone LDM VAE file)
 * as diffusers' (vae_names.c). */
extern const kc_renamer vae_ldm_renamer;
/* A config from the tensors' shapes (diffusers names): blocks, channels,
 * layers, latent channels, quant convs, mid attention; norm_num_groups 32
 * (or the largest power of two below that divides every block), SD3's
 * scaling 1.5305 and shift 0.0609 when the latent has 16 channels. */
kiln_status vae_config_infer(const kc_checkpoint *c, vae_config *cfg);
/* The upsampling factor of the decoder: 2^(n_blocks - 1). */
int64_t vae_scale(const vae_config *cfg);
/* latent h, w and batch the decoder runs (messages name the dimension) */
kiln_status vae_check_latent(const vae_config *cfg, int64_t batch, int64_t h, int64_t w);
/* Build the decoder for latent [B, latent_channels, h, w] -> output 0,
 * sample [B, out_channels, h*f, w*f]. Input slot 0 is the latent. */
kiln_status vae_build_decoder(const vae_config *cfg, kg_graph *g, int64_t B, int64_t h, int64_t w);
/* image H, W (positive multiples of the scale) and batch the encoder runs */
kiln_status vae_check_image(const vae_config *cfg, int64_t batch, int64_t H, int64_t W);
/* Build the encoder for image [B, in_channels, H, W] (input slot 0, in
 * [-1, 1]) -> output 0 mean, output 1 std of latent_dist, each
 * [B, latent_channels, H/f, W/f] (no scaling or shift applied). */
kiln_status vae_build_encoder(const vae_config *cfg, kg_graph *g, int64_t B, int64_t H, int64_t W);

#endif
