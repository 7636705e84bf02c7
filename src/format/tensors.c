/* tensors.c - the public API's tensor files (kiln_tensors_*): a safetensors
 * file read whole into f32 / i64 values, and written atomically, on top of
 * the validating reader and the atomic writer of safetensors.c. */
#include "base/base.h"
#include "format/safetensors.h"
#include "tensor/dtype.h"

#include <stdlib.h>
#include <string.h>

#define TS_ALIGN 64 /* each tensor's data in the block starts 64-byte aligned */

static size_t ts_round(size_t n) { return (n + TS_ALIGN - 1) & ~(size_t)(TS_ALIGN - 1); }

/* The dtype a stored dtype reads as: F32 for the floating types, I64 for the
 * integers and BOOL. */
static kiln_dtype ts_read_as(kiln_dtype t) {
    switch (t) {
    case KILN_F32: case KILN_F16: case KILN_BF16: case KILN_F64: case KILN_F8_E4M3: case KILN_F8_E5M2:
        return KILN_F32;
    case KILN_I8: case KILN_U8: case KILN_I16: case KILN_U16: case KILN_I32: case KILN_U32:
    case KILN_I64: case KILN_U64: case KILN_BOOL:
        return KILN_I64;
    default:
        return KILN_DTYPE_INVALID;
    }
}

/* n integers of dtype t (any alignment) to i64; U64 values above INT64_MAX
 * fail (named by the caller). */
static int ts_to_i64(kiln_dtype t, const uint8_t *p, int64_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case KILN_I8: out[i] = (int8_t)p[i]; break;
        case KILN_U8: case KILN_BOOL: out[i] = p[i]; break;
        case KILN_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); out[i] = v; break; }
        case KILN_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); out[i] = v; break; }
        case KILN_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); out[i] = v; break; }
        case KILN_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); out[i] = v; break; }
        case KILN_I64: memcpy(&out[i], p + 8 * i, 8); break;
        case KILN_U64: {
            uint64_t v;
            memcpy(&v, p + 8 * i, 8);
            if (v > (uint64_t)INT64_MAX) return 0;
            out[i] = (int64_t)v;
            break;
        }
        default: return 0;
        }
    }
    return 1;
}

kiln_status kiln_tensors_read(const char *path, kiln_tensor **out, size_t *n) {
    if (out) *out = NULL;
    if (n) *n = 0;
    if (!path || !out || !n)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_tensors_read: path, out and n are required");
    st_file *f = NULL;
    kiln_status st = st_open(path, &f);
    if (st) return st;
    size_t count = st_count(f);
    /* one block: the array, then the names, then each tensor's values */
    size_t total = ts_round(sizeof(kiln_tensor) * (count ? count : 1)), ok = 1;
    for (size_t i = 0; i < count && ok; i++) {
        const st_tensor *t = st_at(f, i);
        size_t el, bytes;
        int64_t ne = st_numel(t);
        kiln_dtype as = ts_read_as(t->dtype);
        if (as == KILN_DTYPE_INVALID) {
            st_close(f);
            return kb_fail(KILN_ERR_DTYPE, "%s: tensor %s is %s, which kiln_tensors_read cannot convert", path,
                           t->name, kiln_dtype_name(t->dtype));
        }
        el = kiln_dtype_size(as);
        ok = ne >= 0 && kb_mul_ok((size_t)ne, el, &bytes) && bytes < SIZE_MAX / 2 &&
             total < SIZE_MAX / 4 - ts_round(bytes) - ts_round(strlen(t->name) + 1);
        if (ok) total += ts_round(strlen(t->name) + 1) + ts_round(bytes);
    }
    if (!ok) {
        st_close(f);
        return kb_fail(KILN_ERR_NOMEM, "%s: the tensors' values do not fit in memory", path);
    }
    uint8_t *blk = kb_alloc_aligned(total);
    if (!blk) {
        st_close(f);
        return kb_wrap(KILN_ERR_NOMEM, "reading %s", path);
    }
    memset(blk, 0, ts_round(sizeof(kiln_tensor) * (count ? count : 1)));
    kiln_tensor *v = (kiln_tensor *)blk;
    size_t pos = ts_round(sizeof(kiln_tensor) * (count ? count : 1));
    for (size_t i = 0; i < count && !st; i++) {
        const st_tensor *t = st_at(f, i);
        size_t ne = (size_t)st_numel(t), nl = strlen(t->name) + 1;
        char *name = (char *)blk + pos;
        memcpy(name, t->name, nl);
        pos += ts_round(nl);
        void *data = blk + pos;
        kiln_dtype as = ts_read_as(t->dtype);
        pos += ts_round(ne * kiln_dtype_size(as));
        if (as == KILN_F32 && t->dtype == KILN_F64) {
            float *o = data;
            for (size_t k = 0; k < ne; k++) {
                double d;
                memcpy(&d, (const uint8_t *)t->data + 8 * k, 8);
                o[k] = (float)d;
            }
        } else if (as == KILN_F32) {
            st = kt_to_f32(t->dtype, t->data, data, ne);
        } else if (!ts_to_i64(t->dtype, t->data, data, ne)) {
            st = kb_fail(KILN_ERR_RANGE, "%s: tensor %s holds a U64 value above INT64_MAX", path, t->name);
        }
        v[i].name = name;
        v[i].dtype = as;
        v[i].ndim = t->ndim;
        memcpy(v[i].shape, t->shape, sizeof t->shape);
        v[i].data = data;
    }
    st_close(f);
    if (st) {
        kb_free_aligned(blk);
        return st;
    }
    *out = v;
    *n = count;
    return KILN_OK;
}

void kiln_tensors_free(kiln_tensor *t) { kb_free_aligned(t); }

const kiln_tensor *kiln_tensors_find(const kiln_tensor *t, size_t n, const char *name) {
    if (!t || !name) return NULL;
    for (size_t i = 0; i < n; i++)
        if (t[i].name && !strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

kiln_status kiln_tensors_write(const char *path, size_t n, const kiln_tensor *t) {
    if (!path || (n && !t))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_tensors_write: path%s is required", n && !t ? " and tensors" : "");
    st_tensor *s = kb_calloc(n ? n : 1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && !st; i++) {
        const char *nm = t[i].name ? t[i].name : "(no name)";
        size_t el = kiln_dtype_size(t[i].dtype), bytes = el;
        if (!t[i].name || !*t[i].name)
            st = kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor %zu has no name", path, i);
        else if (!el)
            st = kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor %s: unknown dtype %d", path, nm, (int)t[i].dtype);
        else if (t[i].ndim < 0 || t[i].ndim > KILN_MAX_DIMS)
            st = kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor %s: %d dimensions (0..%d allowed)", path, nm, t[i].ndim,
                         KILN_MAX_DIMS);
        for (int d = 0; !st && d < t[i].ndim; d++)
            if (t[i].shape[d] < 0 || !kb_mul_ok(bytes, (size_t)t[i].shape[d], &bytes))
                st = kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor %s: dimension %d is %lld (negative or too large)", path,
                             nm, d, (long long)t[i].shape[d]);
        if (st) break;
        s[i].name = t[i].name;
        s[i].dtype = t[i].dtype;
        s[i].ndim = t[i].ndim;
        memcpy(s[i].shape, t[i].shape, sizeof s[i].shape);
        s[i].data = t[i].data;
        s[i].nbytes = bytes;
    }
    const char *meta[] = {"producer", "kiln " KILN_VERSION};
    if (!st) st = st_write(path, s, n, meta, 1);
    free(s);
    return st;
}
