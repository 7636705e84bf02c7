/* expr.c - dimensions as polynomials in the symbols (compile.h): evaluate,
 * print, and solve the symbols from actual input shapes with every guard.
 * Apart from symbolic.c's export, so that the package manifest's parser and
 * its fuzz harness link without the graph and the kernels. */
#include "base/base.h"
#include "compile/compile.h"

#include <stdio.h>
#include <string.h>

int64_t kx_eval(const kx_expr *e, const int64_t *s) {
    int64_t v = 0;
    for (int m = 0; m < KX_NMONO; m++) {
        if (!e->c[m]) continue;
        int64_t t = e->c[m];
        for (int i = 0; i < KX_MAX_SYMS; i++)
            if (m >> i & 1) t *= s[i];
        v += t;
    }
    return v;
}

int kx_is_const(const kx_expr *e) {
    for (int m = 1; m < KX_NMONO; m++)
        if (e->c[m]) return 0;
    return 1;
}

void kx_expr_str(const kx_expr *e, const kx_sym *syms, int nsym, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int m = KX_NMONO - 1; m >= 0; m--) { /* highest monomials first: "h*w+333" */
        int64_t c = e->c[m];
        if (!c || len >= cap) continue;
        const char *sign = c < 0 ? "-" : len ? "+" : "";
        /* the magnitude as unsigned: -INT64_MIN does not fit an int64_t */
        unsigned long long a = c < 0 ? 0ULL - (unsigned long long)c : (unsigned long long)c;
        if (!m) {
            snprintf(buf + len, cap - len, "%s%llu", sign, a);
        } else {
            snprintf(buf + len, cap - len, "%s", sign);
            len = strlen(buf);
            if (a != 1) snprintf(buf + len, cap - len, "%llu*", a);
            len = strlen(buf);
            int first = 1;
            for (int i = 0; i < nsym; i++)
                if (m >> i & 1) {
                    snprintf(buf + len, cap - len, "%s%s", first ? "" : "*", syms[i].name);
                    len = strlen(buf);
                    first = 0;
                }
        }
        len = strlen(buf);
    }
    if (!len) snprintf(buf, cap, "0");
}

kiln_status kx_solve(const kx_sym *syms, int nsym, const kx_iospec *in, int n_in, const int64_t (*shape)[4],
                     int64_t *s) {
    int known[KX_MAX_SYMS] = {0};
    const char *from[KX_MAX_SYMS] = {0};
    for (int i = 0; i < nsym; i++)
        if (syms[i].lo == syms[i].hi) {
            s[i] = syms[i].lo;
            known[i] = 1;
        }
    /* dimensions linear in one symbol determine it: v = c0 + c1 * s */
    for (int a = 0; a < n_in; a++)
        for (int d = 0; d < in[a].ndim; d++) {
            const kx_expr *e = &in[a].dim[d];
            int mono = 0, nm = 0;
            for (int m = 1; m < KX_NMONO; m++)
                if (e->c[m]) mono = m, nm++;
            if (nm != 1 || __builtin_popcount((unsigned)mono) != 1) continue;
            int i = __builtin_ctz((unsigned)mono);
            if (i >= nsym) continue;
            int64_t v = shape[a][d], c0 = e->c[0], c1 = e->c[mono], vc;
            char es[64];
            kx_expr_str(e, syms, nsym, es, sizeof es);
            /* a caller's dimension near INT64_MAX, or c1 = -1 with INT64_MIN, must not overflow */
            if (__builtin_sub_overflow(v, c0, &vc) || (c1 == -1 && vc == INT64_MIN))
                return kb_fail(KILN_ERR_RANGE, "%s dimension %d is %lld, which is not of the form %s", in[a].name, d,
                               (long long)v, es);
            if (vc % c1)
                return kb_fail(KILN_ERR_RANGE, "%s dimension %d is %lld, which is not of the form %s (a multiple of %lld)",
                               in[a].name, d, (long long)v, es, (long long)c1);
            int64_t x = vc / c1;
            if (known[i] && s[i] != x) {
                if (syms[i].lo == syms[i].hi)
                    return kb_fail(KILN_ERR_RANGE, "%s dimension %d is %lld, the package is fixed at %s = %lld (%s = %lld)",
                                   in[a].name, d, (long long)v, syms[i].name, (long long)s[i], es,
                                   (long long)kx_eval(e, s));
                return kb_fail(KILN_ERR_RANGE, "%s is %lld from %s but %lld from %s dimension %d: shared dimensions differ",
                               syms[i].name, (long long)s[i], from[i], (long long)x, in[a].name, d);
            }
            if (x < syms[i].lo || x > syms[i].hi)
                return kb_fail(KILN_ERR_RANGE, "%s = %lld (from %s dimension %d) is outside the package's range [%lld, %lld]",
                               syms[i].name, (long long)x, in[a].name, d, (long long)syms[i].lo, (long long)syms[i].hi);
            s[i] = x;
            known[i] = 1;
            from[i] = in[a].name;
        }
    for (int i = 0; i < nsym; i++)
        if (!known[i])
            return kb_fail(KILN_ERR_SHAPE, "%s cannot be read from any input's shape", syms[i].name);
    /* every dimension (static ones included) must now match */
    for (int a = 0; a < n_in; a++)
        for (int d = 0; d < in[a].ndim; d++) {
            int64_t want = kx_eval(&in[a].dim[d], s);
            if (want != shape[a][d]) {
                char es[64], num[32];
                kx_expr_str(&in[a].dim[d], syms, nsym, es, sizeof es);
                snprintf(num, sizeof num, "%lld", (long long)want);
                /* a static dimension prints as its value: "needs 333", not "needs 333 = 333" */
                if (!strcmp(es, num))
                    return kb_fail(KILN_ERR_RANGE, "%s dimension %d is %lld, the package needs %lld (a static "
                                   "dimension: compiled for that value only)", in[a].name, d, (long long)shape[a][d],
                                   (long long)want);
                return kb_fail(KILN_ERR_RANGE, "%s dimension %d is %lld, the package needs %s = %lld", in[a].name, d,
                               (long long)shape[a][d], es, (long long)want);
            }
        }
    return KILN_OK;
}
