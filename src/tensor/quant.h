/* quant.h - weight quantization at conversion time: per output channel
 * (row) symmetric scales, W[m,k] ~= q[m,k] * scales[m]. */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H

#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

/* W [M,K] f32 row-major -> q [M,K] in qt and scales [M]:
 *   I8:      scales[m] = max|W[m,:]| / 127, q = round(W / scale) in -127..127
 *   F8_E4M3: scales[m] = max|W[m,:]| / 448, q = e4m3(W / scale) (nearest even)
 * A zero row gets scale 1 (q = 0). Non-finite weights are an error naming the
 * row. Test hook: KILN_TEST_BREAK_QUANT_SCALES=1 stores every scale 4x too
 * large (a deliberately broken scheme for the quality gate's tests). */
kiln_status kt_quantize_rows(const float *w, int64_t M, int64_t K, kiln_dtype qt, void *q, float *scales);

/* The inverse: W [M,K] = q * scales[m] (exact in f32 for both types). */
void kt_dequantize_rows(const void *q, const float *scales, int64_t M, int64_t K, kiln_dtype qt, float *w);

#endif
