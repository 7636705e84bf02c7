/* gemm_amx.h - kiln's own bf16 GEMM on AMX tiles (gemm_amx.c), on weights
 * packed once into the tile layout (the "amx32" layout of the weight cache),
 * and the AMX set-up shared with the fused attention (attn_amx.c). */
#ifndef KILN_GEMM_AMX_H
#define KILN_GEMM_AMX_H

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/epilogue.h"

#include <stddef.h>
#include <stdint.h>


/* The amx32 layout of W [N outputs, K inputs]: panels of 32 outputs, each
 * [K/32 steps][2 tiles of 16 outputs][16 input pairs][16 outputs x 2] bf16,
 * N and K zero-padded to multiples of 32. Its size in bytes: */
size_t kk_amx_packed_bytes(int64_t N, int64_t K);
/* Pack W [N,K] f32 row-major (rounded to bf16, nearest even) into out. */
void kk_amx_pack(const float *w, int64_t N, int64_t K, uint16_t *out);
/* W [N,K] f32 back from the packed layout. */
void kk_amx_unpack(const uint16_t *packed, int64_t N, int64_t K, float *out);

/* The bytes of the work buffer of kk_amx_linear on `threads` threads (x
 * packed, and the sums of each thread's work item when K is long). */
size_t kk_amx_work_bytes(int64_t rows, int64_t K, int threads);
/* y [rows,N] = the epilogue of x [rows,K] . W^T, bf16 products with f32
 * accumulation; x_fmt / y_fmt are KK_FMT_* (kernels.h): x f32 (rounded to
 * bf16 here), bf16 rows, or bf16 blocked - this GEMM's own operand layout,
 * read with no packing pass; y likewise (f32 with res); on `threads`
 * threads; work holds kk_amx_work_bytes(rows, K, threads). Returns 0 (and
 * does nothing) where it does not apply: no AMX, or no work buffer. */
int kk_amx_linear(const void *x, int x_fmt, const uint16_t *packed, int64_t N, int64_t K, const kk_amx_epilogue *e,
                  void *y, int y_fmt, int64_t rows, int threads, uint16_t *work);

/* The s8 products (AMX-INT8): W [N,K] s8 in panels of 32 outputs, per step
 * of 64 inputs two tiles of 16 input quads x 16 outputs x 4, N and K
 * zero-padded (to 32 and 64). Its size, and packing from / to row-major s8: */
size_t kk_amx_s8_packed_bytes(int64_t N, int64_t K);
void kk_amx_s8_pack(const int8_t *q, int64_t N, int64_t K, int8_t *out);
void kk_amx_s8_unpack(const int8_t *packed, int64_t N, int64_t K, int8_t *out);
/* y = the epilogue of (xq [rows,K] . Wq^T) * xs [rows] (s8 x s8, int32 sums;
 * e->scales are W's channel scales); work as for kk_amx_linear. */
int kk_amx_linear_s8(const int8_t *xq, const float *xs, const int8_t *packed, int64_t N, int64_t K,
                     const kk_amx_epilogue *e, void *y, int y_fmt, int64_t rows, int threads, void *work);

/* ---- shared by the AMX kernels (gemm_amx.c, attn_amx.c) ---- */
#include "kernels/cpu/simd.h"

/* the LDTILECFG operand (palette 1) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kk_tile_config;

#endif
