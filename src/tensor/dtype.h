/* dtype.h - element types and exact conversions to and from f32.
 * f16 and bf16 conversions round to nearest even, keep NaN (quieted, payload
 * kept where it fits), Inf and signed zero, and handle subnormals exactly. */
#ifndef KILN_DTYPE_H
#define KILN_DTYPE_H

#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

float kt_f16_to_f32(uint16_t h);
uint16_t kt_f32_to_f16(float f);
float kt_bf16_to_f32(uint16_t b);
uint16_t kt_f32_to_bf16(float f);

/* "F32" -> KILN_F32; KILN_DTYPE_INVALID when unknown. */
kiln_dtype kt_dtype_from_name(const char *name);
/* 1 when kiln can turn this dtype into f32 compute values (F32, F16, BF16). */
int kt_dtype_is_float_source(kiln_dtype t);

/* n elements of src (any alignment) to f32. DTYPE error for other types. */
kiln_status kt_to_f32(kiln_dtype src, const void *in, float *out, size_t n);
/* n f32 values to dst (F32, F16, BF16). */
kiln_status kt_from_f32(kiln_dtype dst, const float *in, void *out, size_t n);

#endif
