/* quant.c - per-channel symmetric weight quantization (int8, fp8 E4M3). */
#include "tensor/quant.h"

#include "base/base.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int break_scales(void) {
    const char *e = getenv("KILN_TEST_BREAK_QUANT_SCALES");
    return e && *e && strcmp(e, "0");
}

kiln_status kt_quantize_rows(const float *w, int64_t M, int64_t K, kiln_dtype qt, void *q, float *scales) {
    if (qt != KILN_I8 && qt != KILN_F8_E4M3)
        return kb_fail(KILN_ERR_DTYPE, "cannot quantize weights to %s (I8 or F8_E4M3)", kiln_dtype_name(qt));
    const float qmax = qt == KILN_I8 ? 127.0f : KT_E4M3_MAX;
    int broken = break_scales();
    for (int64_t m = 0; m < M; m++) {
        const float *r = w + m * K;
        float amax = 0;
        for (int64_t k = 0; k < K; k++) {
            if (!isfinite(r[k])) return kb_fail(KILN_ERR_FORMAT, "weight row %lld holds %g: cannot quantize", (long long)m, r[k]);
            amax = fmaxf(amax, fabsf(r[k]));
        }
        float s = amax > 0 ? amax / qmax : 1.0f;
        if (qt == KILN_I8) {
            int8_t *o = (int8_t *)q + m * K;
            for (int64_t k = 0; k < K; k++) {
                float v = rintf(r[k] / s);
                o[k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
        } else {
            uint8_t *o = (uint8_t *)q + m * K;
            for (int64_t k = 0; k < K; k++) o[k] = kt_f32_to_e4m3(r[k] / s);
        }
        scales[m] = broken ? 4.0f * s : s;
    }
    return KILN_OK;
}

void kt_dequantize_rows(const void *q, const float *scales, int64_t M, int64_t K, kiln_dtype qt, float *w) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            float v = qt == KILN_I8 ? (float)((const int8_t *)q)[m * K + k] : kt_e4m3_to_f32(((const uint8_t *)q)[m * K + k]);
            w[m * K + k] = v * scales[m];
        }
}
