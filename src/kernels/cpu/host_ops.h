/* host_ops.h - the ops every CPU backend runs the same way, on host
 * memory: data movement and the elementwise forms of layout.c, listed once
 * for the backends' tables (ref.c, fast.c). */
#ifndef KILN_HOST_OPS_H
#define KILN_HOST_OPS_H

#include "kernels/kernels.h"

/* bytes from src to dst in host memory (the copy slot: a reshape) */
void kk_host_copy(void *dst, const void *src, size_t bytes);

#define KK_HOST_OPS                                                                                                    \
    .binary = kk_binary, .gather_rows = kk_gather_rows, .affine_rows = kk_affine_rows,                                \
    .rmsnorm_rows = kk_rmsnorm_rows, .slice_rows = kk_slice_rows, .concat_rows = kk_concat_rows,                      \
    .patchify = kk_patchify, .unpatchify = kk_unpatchify, .timestep_proj = kk_timestep_proj, .pos_crop = kk_pos_crop, \
    .rope_table = kk_rope_table, .rope = kk_rope,                                                                   \
    .upsample_nearest = kk_upsample_nearest, .logvar_std = kk_logvar_std, .select_token = kk_select_token,          \
    .rel_pos_bias = kk_rel_pos_bias, .copy = kk_host_copy

#endif
