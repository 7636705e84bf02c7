/* spec.c - building a family's weight list (arch.h: ka_spec_add, ka_numel),
 * apart from the family table (arch.c) so that the config parsers and their
 * weight specs link without it (tests/fuzz). */
#include "arch/arch.h"
#include "base/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ka_spec *ka_spec_add(ka_spec **s, size_t *n, size_t *cap, int ndim, const int64_t *shape, const char *fmt, ...) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        ka_spec *ns = realloc(*s, c * sizeof *ns);
        if (!ns) return NULL;
        *s = ns;
        *cap = c;
    }
    ka_spec *e = &(*s)[(*n)++];
    memset(e, 0, sizeof *e);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    e->ndim = ndim;
    for (int d = 0; d < ndim && d < 4; d++) e->shape[d] = shape[d];
    e->block = -1;
    return e;
}

size_t ka_numel(int ndim, const int64_t *shape) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0 || !kb_mul_ok(n, (size_t)shape[d], &n)) return 0;
    return n;
}

void ka_stored_shape(const ka_spec *s, int64_t out[4]) {
    for (int d = 0; d < 4; d++) out[d] = d < s->ndim ? s->shape[d] : 0;
    if (s->up2 && s->ndim == 4) out[0] *= 4, out[2] = 2, out[3] = 2;
}
