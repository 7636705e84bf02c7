/* golden_util.h - read a golden case's io.safetensors tensors as f32. */
#ifndef KILN_GOLDEN_UTIL_H
#define KILN_GOLDEN_UTIL_H

#include "format/safetensors.h"
#include "tensor/dtype.h"
#include "test.h"

/* A malloc'd f32 copy of tensor name (any float dtype), its element count in *n. */
static inline float *golden_tensor(const st_file *f, const char *name, size_t *n) {
    const st_tensor *t = st_find(f, name);
    if (!t) {
        fprintf(stderr, "golden tensor %s missing\n", name);
        exit(2);
    }
    size_t cnt = (size_t)st_numel(t);
    float *out = malloc(sizeof(float) * (cnt ? cnt : 1));
    if (!out || kt_to_f32(t->dtype, t->data, out, cnt) != KILN_OK) exit(2);
    if (n) *n = cnt;
    return out;
}

static inline const st_tensor *golden_info(const st_file *f, const char *name) {
    const st_tensor *t = st_find(f, name);
    if (!t) {
        fprintf(stderr, "golden tensor %s missing\n", name);
        exit(2);
    }
    return t;
}

static inline char *golden_path(const char *c, const char *file) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/goldens/%s%s%s", test_data_dir(), c, file ? "/" : "",
             file ? file : "");
    return buf[k];
}

#endif
