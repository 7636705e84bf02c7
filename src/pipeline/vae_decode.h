/* vae_decode.h - the tile arithmetic of diffusers' AutoencoderKL.tiled_decode
 * and its seam blends, exposed for tests/test_vae_tiled.c; the calls are in
 * include/kiln.h ("the VAE: latents to pictures and back"). */
#ifndef KILN_VAE_DECODE_H
#define KILN_VAE_DECODE_H

#include "arch/vae/vae.h"
#include "kiln.h"

/* diffusers' numbers for a tile of tile_sample pixels (tile_overlap_factor 0.25):
 *   tile_latent = int(tile_sample / 2^(blocks - 1))   latent rows a tile decodes
 *   overlap     = int(tile_latent * 0.75)             latent step between tiles
 *   blend       = int(tile_sample * 0.25)             pixel rows blended at a seam
 *   row_limit   = tile_sample - blend                 pixel rows a tile keeps */
typedef struct {
    int64_t tile_sample, tile_latent, overlap, blend, row_limit;
} kv_tiling;

/* tile_sample must be a positive multiple of 4 f (then overlap * f ==
 * row_limit and the tiles cover the image exactly); KILN_ERR_INVALID_ARG
 * otherwise, naming the size and the multiple. */
kiln_status kv_tiling_for(const vae_config *c, int64_t tile_sample, kv_tiling *t);

/* blend_v(a, b, extent): a [BC, ah, w] is the tile above b [BC, bh, w]:
 *   e = min(ah, bh, extent); for y < e:
 *   b[:, y, :] = a[:, ah - e + y, :] * (1 - y / e) + b[:, y, :] * (y / e)
 * (the weights double as in Python, each product in f32 as torch's). */
void kv_blend_v(const float *a, int64_t ah, float *b, int64_t bh, int64_t BC, int64_t w, int64_t extent);
/* blend_h(a, b, extent): a [BC, h, aw] left of b [BC, h, bw], over columns */
void kv_blend_h(const float *a, int64_t aw, float *b, int64_t bw, int64_t BC, int64_t h, int64_t extent);

/* The estimate behind kiln_vae_decode_bytes, from the config alone. */
uint64_t kv_decode_bytes(const vae_config *c, int64_t B, int64_t h, int64_t w);

#endif
