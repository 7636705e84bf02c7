/* backend.c - the backends of this build by name, and a backend through its
 * slots with kk_backend's defaults (kernels.h): memory, copies, mappings,
 * which ops it runs, and the weights it wants. Everything above
 * src/kernels/ reaches a backend through these functions and its slots,
 * never a CPU kernel by name. */
#include "base/base.h"
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

const kk_backend *kk_check(void); /* kernels/check/check.c */

/* ---- the registry ------------------------------------------------------------- */

const kk_backend *kk_backend_get(const char *name, kiln_dtype dt) {
    if (!name || !strcmp(name, "cpu")) return kk_fast(dt);
    if (dt != KILN_F32) return NULL; /* the reference kernels compute in f32 only */
    if (!strcmp(name, "reference")) return kk_reference();
    if (!strcmp(name, "check")) return kk_check();
    return NULL;
}

const char *kk_backend_names(void) { return "cpu, reference, check"; }

const char *kiln_backends(void) { return kk_backend_names(); }

int kiln_backend_known(const char *name) {
    return name && (!strcmp(name, "cpu") || kk_backend_get(name, KILN_F32) || kk_backend_get(name, KILN_BF16));
}

const char *kk_backend_family(const kk_backend *be) {
    if (be == kk_reference()) return "reference";
    if (be == kk_check()) return "check";
    return "cpu";
}

const kk_backend *kk_host(void) { return kk_reference(); }

/* ---- memory ------------------------------------------------------------------- */

void *kk_buf_alloc(const kk_backend *be, size_t bytes) {
    return kk_host_memory(be) ? kb_alloc_aligned(bytes) : be->alloc(bytes);
}

void kk_buf_free(const kk_backend *be, void *p) {
    if (kk_host_memory(be)) kb_free_aligned(p);
    else if (p) be->free(p);
}

void kk_copy_to_host(const kk_backend *be, void *host, const void *buf, size_t bytes) {
    if (!bytes) return;
    if (kk_host_memory(be)) memcpy(host, buf, bytes);
    else be->to_host(host, buf, bytes);
}

void kk_copy_from_host(const kk_backend *be, void *buf, const void *host, size_t bytes) {
    if (!bytes) return;
    if (kk_host_memory(be)) memcpy(buf, host, bytes);
    else be->from_host(buf, host, bytes);
}

void *kk_buf_map(const kk_backend *be, const void *host, size_t bytes) {
    if (!host) return NULL;
    return kk_host_memory(be) ? (void *)host : be->map(host, bytes);
}

void kk_buf_unmap(const kk_backend *be, void *buf, const void *host) {
    if (buf && buf != host && !kk_host_memory(be)) be->unmap(buf);
}

const char *kk_slot_name(int slot) {
    static const char *const names[KK_SLOT_COUNT] = {
        "host", "linear", "silu", "gelu_tanh", "layernorm", "layernorm_modulate", "rmsnorm_heads", "modulate",
        "gate_add", "attention", "conv2d", "group_norm", "unary", "binary", "gather_rows", "affine_rows",
        "rmsnorm_rows", "slice_rows", "concat_rows", "patchify", "unpatchify", "timestep_proj", "pos_crop", "rope",
        "upsample_nearest", "logvar_std", "select_token", "rel_pos_bias", "copy"};
    return slot >= 0 && slot < KK_SLOT_COUNT ? names[slot] : "?";
}

/* ---- weights ------------------------------------------------------------------ */

int kk_packs(const kk_backend *be) { return be->pack_layout != NULL; }

kiln_status kk_pack_layout(const kk_backend *be, const int64_t sh[4], int conv, kiln_dtype dt, char layout[40],
                           size_t *bytes) {
    if (be->pack_layout) return be->pack_layout(sh, conv, dt, layout, bytes);
    int64_t n = sh[0] * sh[1] * (conv ? sh[2] * sh[3] : 1);
    snprintf(layout, 40, "rowmajor");
    *bytes = sizeof(float) * (size_t)n;
    return dt == KILN_F32 ? KILN_OK
                          : kb_fail(KILN_ERR_UNSUPPORTED, "the %s backend takes f32 weights only, not %s", be->name,
                                    kiln_dtype_name(dt));
}

kiln_status kk_pack(const kk_backend *be, const float *w, const int64_t sh[4], int conv, kiln_dtype dt, void *out) {
    if (be->pack) return be->pack(w, sh, conv, dt, out);
    char layout[40];
    size_t bytes;
    kiln_status st = kk_pack_layout(be, sh, conv, dt, layout, &bytes);
    if (!st) memcpy(out, w, bytes);
    return st;
}

const char *kk_weights_tag(const kk_backend *be) { return be->weights_tag ? be->weights_tag() : ""; }

const char *kk_weight_dtype_error(const kk_backend *be, kiln_dtype dt) {
    static _Thread_local char msg[160];
    if (be->weight_dtype_error) return be->weight_dtype_error(dt);
    if (dt == KILN_F32) return NULL;
    snprintf(msg, sizeof msg, "the %s backend takes f32 weights only", be->name);
    return msg;
}

int kk_has_feature(const kk_backend *be, const char *feature) { return be && be->has_feature && be->has_feature(feature); }

const float *kk_weight_scales(const void *packed, size_t bytes, int64_t M, kiln_dtype dt) {
    if (!packed || !kk_dtype_is_quant(dt) || bytes < sizeof(float) * (size_t)M) return NULL;
    return (const float *)((const char *)packed + bytes - sizeof(float) * (size_t)M);
}
