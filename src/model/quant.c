/* quant.c - which weights a quantization scheme touches, and its key tag.
 * The math lives below: src/tensor/quant.c (per-channel quantization) and
 * src/kernels/cpu/fast.c (packing, the quantized GEMMs). */
#include "base/base.h"
#include "cache/cache.h"
#include "kernels/kernels.h"
#include "model/model.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

const char *kiln_quant_name(kiln_quant q) {
    switch (q) {
    case KILN_QUANT_NONE: return "none";
    case KILN_QUANT_INT8: return "int8";
    case KILN_QUANT_FP8: return "fp8";
    }
    return "invalid";
}

kiln_status km_compute_set_quant(km_compute *cp, kiln_quant q, const char *layers) {
    cp->quant = KILN_QUANT_NONE;
    cp->quant_layers[0] = 0;
    cp->quant_default = 0;
    if (q == KILN_QUANT_NONE) return KILN_OK;
    if (q != KILN_QUANT_INT8 && q != KILN_QUANT_FP8)
        return kb_fail(KILN_ERR_INVALID_ARG, "quantization scheme %d is unknown (int8 or fp8)", (int)q);
    if (!kk_packs(cp->be))
        return kb_fail(KILN_ERR_UNSUPPORTED, "--quant %s needs the fast kernels: the %s kernels take f32 weights only",
                       kiln_quant_name(q), kk_backend_family(cp->be));
    if (layers && (!*layers || strlen(layers) >= sizeof cp->quant_layers))
        return kb_fail(KILN_ERR_INVALID_ARG, "quantized layer patterns \"%s\": give 1 to %zu characters", layers,
                       sizeof cp->quant_layers - 1);
    const char *why = kk_weight_dtype_error(cp->be, q == KILN_QUANT_INT8 ? KILN_I8 : KILN_F8_E4M3);
    if (why) return kb_fail(KILN_ERR_UNSUPPORTED, "--quant %s: %s", kiln_quant_name(q), why);
    cp->quant = q;
    cp->quant_default = !layers;
    snprintf(cp->quant_layers, sizeof cp->quant_layers, "%s", layers ? layers : "");
    return KILN_OK;
}

void km_compute_for_arch(km_compute *cp, const ka_arch *a) {
    if (cp->quant && cp->quant_default)
        snprintf(cp->quant_layers, sizeof cp->quant_layers, "%s", a->quant_layers ? a->quant_layers : "");
}

/* "a,b,!c": matched by a or b and not by c */
static int layer_selected(const char *patterns, const char *layer) {
    int hit = 0, out = 0;
    const char *p = patterns;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char pat[256];
        snprintf(pat, sizeof pat, "%.*s", (int)n, p);
        if (pat[0] == '!') out |= pat[1] && !fnmatch(pat + 1, layer, 0);
        else hit |= pat[0] && !fnmatch(pat, layer, 0);
        p += n + (e ? 1 : 0);
    }
    return hit && !out;
}

kiln_dtype km_pack_dtype(const km_compute *cp, const char *weight_name) {
    if (cp->quant == KILN_QUANT_NONE) return cp->dtype;
    char layer[128];
    size_t n = strlen(weight_name);
    if (n > 7 && !strcmp(weight_name + n - 7, ".weight")) n -= 7;
    snprintf(layer, sizeof layer, "%.*s", (int)n, weight_name);
    if (!layer_selected(cp->quant_layers, layer)) return cp->dtype;
    return cp->quant == KILN_QUANT_INT8 ? KILN_I8 : KILN_F8_E4M3;
}

kiln_dtype km_spec_dtype(const km_compute *cp, const ka_spec *s) {
    return s->keep_f32 ? KILN_F32 : km_pack_dtype(cp, s->name);
}

void km_quant_tag(const km_compute *cp, char *buf, size_t cap) {
    buf[0] = 0;
    if (cp->quant == KILN_QUANT_NONE) return;
    size_t len = (size_t)snprintf(buf, cap, "%s", kiln_quant_name(cp->quant));
    if (len < cap && !cp->quant_default)
        len += (size_t)snprintf(buf + len, cap - len, "-l%08llx",
                                (unsigned long long)(kcache_hash_bytes(cp->quant_layers, strlen(cp->quant_layers), 7) >> 32));
    const char *e = getenv("KILN_TEST_BREAK_QUANT_SCALES");
    if (len < cap && e && *e && strcmp(e, "0")) snprintf(buf + len, cap - len, "-brokenscales");
}
