/* conv.h - the fast CPU backend's VAE kernels (conv.c): the conv2d and
 * group_norm slots of kk_fast's backends (kernels.h has their contracts). */
#ifndef KILN_CONV_H
#define KILN_CONV_H

#include "kernels/kernels.h"

/* conv2d slot: oneDNN's convolution in f32, or in bf16 (x and w rounded to
 * bf16, f32 sums and y); w f32 row-major or packed by kk_fast_conv_pack
 * (kernels.h); the reference's loops where oneDNN declines */
void kk_fast_conv2d_f32(const float *x, const kk_weight *w, const float *b, const float *res, float *y, const kk_conv *p);
void kk_fast_conv2d_bf16(const float *x, const kk_weight *w, const float *b, const float *res, float *y, const kk_conv *p);
/* whether the bf16 backend's convolution reads and writes bf16 rows on w (supports(CONV2D, BF16, w)): w packed bf16 */
int kk_fast_conv_bf16_io(const kk_weight *w);
/* group_norm slot: x [B,C,S] (nhwc: [B,S,C]) over G groups, statistics in double */
void kk_fast_group_norm(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t C, int64_t S,
                        int64_t G, float eps, int silu, int nhwc, int x_bf16, int y_bf16);

#endif
