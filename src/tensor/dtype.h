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

/* fp8 (OCP 8-bit floats). E4M3 ("e4m3fn"): bias 7, no Inf, NaN = S.1111.111,
 * largest finite 448, smallest subnormal 2^-9. E5M2: bias 15, IEEE-like with
 * Inf and NaN, largest finite 57344, smallest subnormal 2^-16 (the top byte
 * of an f16). Decoding is exact. Encoding rounds to nearest even, keeps the
 * sign of zero, and saturates: finite values beyond the largest finite give
 * +-largest finite; Inf gives +-448 in E4M3 (it has no Inf) and stays Inf in
 * E5M2; NaN gives NaN (E4M3 0x7f, E5M2 quiet 0x7e, sign kept). */
float kt_e4m3_to_f32(uint8_t b);
uint8_t kt_f32_to_e4m3(float f);
float kt_e5m2_to_f32(uint8_t b);
uint8_t kt_f32_to_e5m2(float f);
#define KT_E4M3_MAX 448.0f
#define KT_E5M2_MAX 57344.0f

/* "F32" -> KILN_F32; KILN_DTYPE_INVALID when unknown. */
kiln_dtype kt_dtype_from_name(const char *name);
/* 1 when kiln can turn this dtype into f32 compute values (F32, F16, BF16). */
int kt_dtype_is_float_source(kiln_dtype t);

/* n elements of src (any alignment) to f32 (F32, F16, BF16, F8_E4M3,
 * F8_E5M2). DTYPE error for other types. */
kiln_status kt_to_f32(kiln_dtype src, const void *in, float *out, size_t n);
/* n f32 values to dst (F32, F16, BF16, F8_E4M3, F8_E5M2; fp8 saturates). */
kiln_status kt_from_f32(kiln_dtype dst, const float *in, void *out, size_t n);

/* ---- finite numbers (finite.c) ---------------------------------------------
 * The index of the first NaN or Inf in x[0..n), or n when every value is
 * finite. One pass that the compiler vectorizes (an add and an OR on the
 * exponent field; finite.c says why that finds exactly NaN and Inf); the
 * index is searched for only when that pass finds one. 35-55 GB/s here:
 * at most 0.2% of even a 2-layer toy model's forward (bench_finite). */
size_t kt_find_nonfinite(const float *x, size_t n);
/* "NaN", "+Inf" or "-Inf" for a value kt_find_nonfinite found. */
const char *kt_nonfinite_name(float v);
/* KILN_OK when x[0..n) is finite; else KILN_ERR_NONFINITE with the message
 * "<what> holds NaN at index 17 (the first value that is not finite)". */
kiln_status kt_check_finite(const char *what, const float *x, size_t n);

#endif
