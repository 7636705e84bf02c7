/* symbolic.c - symbolic dimensions by construction: build the graph from the
 * one model definition at the corners of the symbol ranges, fit each
 * dimension as a multilinear polynomial, and check the fit at more points.
 * A graph whose structure changes inside the ranges, or that ignores a
 * symbol declared dynamic, is an export error naming the symbol. */
#include "base/base.h"
#include "compile/compile.h"

#include <stdlib.h>
#include <string.h>

/* Two graphs have the same structure: ops, sources, names, flags, floats. */
static int same_structure(const kg_graph *a, const kg_graph *b, int *where) {
    if (a->n != b->n || a->n_outputs != b->n_outputs || a->n_regions != b->n_regions) {
        *where = -1;
        return 0;
    }
    for (int i = 0; i < a->n; i++) {
        const kg_node *x = &a->nodes[i], *y = &b->nodes[i];
        int same = x->op == y->op && x->ndim == y->ndim && x->fparam == y->fparam && x->out_bf16 == y->out_bf16 &&
                   !memcmp(x->src, y->src, sizeof x->src) && x->kw == y->kw && x->data == y->data &&
                   ((!x->name && !y->name) || (x->name && y->name && !strcmp(x->name, y->name)));
        if (!same) {
            *where = i;
            return 0;
        }
    }
    return 1;
}

/* the values at point s of every dimension and integer parameter */
static void read_values(const kg_graph *g, int64_t *out) {
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < 4; k++) {
            out[(size_t)i * 8 + (size_t)k] = k < g->nodes[i].ndim ? g->nodes[i].shape[k] : 0;
            out[(size_t)i * 8 + 4 + (size_t)k] = g->nodes[i].iparam[k];
        }
}

static kiln_status build_at(kx_build_fn build, void *user, const int64_t *s, kg_graph *g, const kx_sym *syms,
                            int nsym) {
    kiln_status st = build(user, s, g);
    if (!st) return KILN_OK;
    char at[160] = "";
    size_t len = 0;
    for (int i = 0; i < nsym; i++) {
        snprintf(at + len, sizeof at - len, "%s%s=%lld", i ? ", " : "", syms[i].name, (long long)s[i]);
        len = strlen(at);
    }
    return kb_wrap(st, "export: the graph cannot be built at %s (narrow the range)", at);
}

void kx_export_free(kx_export *x) {
    kg_free(&x->g);
    free(x->dim);
    free(x->ip);
    memset(x, 0, sizeof *x);
}

kiln_status kx_export_graph(kx_build_fn build, void *user, const kx_sym *syms, int nsym, kx_export *out) {
    memset(out, 0, sizeof *out);
    if (nsym < 0 || nsym > KX_MAX_SYMS) return kb_fail(KILN_ERR_INVALID_ARG, "export: %d symbols (at most %d)", nsym, KX_MAX_SYMS);
    int dyn[KX_MAX_SYMS], nd = 0;
    for (int i = 0; i < nsym; i++) {
        if (syms[i].lo < 1 || syms[i].hi < syms[i].lo)
            return kb_fail(KILN_ERR_RANGE, "export: %s range [%lld, %lld] is empty or not positive", syms[i].name,
                           (long long)syms[i].lo, (long long)syms[i].hi);
        if (syms[i].hi > syms[i].lo) dyn[nd++] = i;
    }
    out->nsym = nsym;
    memcpy(out->sym, syms, sizeof *syms * (size_t)nsym);

    /* corners: dynamic symbol j at lo (bit clear) or lo + 1 (bit set) */
    int ncorner = 1 << nd;
    kg_graph *g = calloc((size_t)ncorner, sizeof *g);
    int64_t **val = calloc((size_t)ncorner, sizeof *val);
    kiln_status st = g && val ? KILN_OK : kb_fail(KILN_ERR_NOMEM, "export: out of memory");
    int64_t s[KX_MAX_SYMS] = {0};
    for (int m = 0; !st && m < ncorner; m++) {
        for (int i = 0; i < nsym; i++) s[i] = syms[i].lo;
        for (int j = 0; j < nd; j++) s[dyn[j]] += m >> j & 1;
        st = build_at(build, user, s, &g[m], syms, nsym);
        if (!st && !(val[m] = malloc(sizeof(int64_t) * 8 * (size_t)g[m].n))) st = kb_fail(KILN_ERR_NOMEM, "export: out of memory");
        if (!st) read_values(&g[m], val[m]);
        int where;
        if (!st && m && !same_structure(&g[0], &g[m], &where))
            st = kb_fail(KILN_ERR_SHAPE, "export: the graph's structure changes with %s (node %d); it cannot be dynamic",
                         syms[dyn[__builtin_ctz((unsigned)m)]].name, where);
    }
    int n = st ? 0 : g[0].n;
    if (!st && (!(out->dim = calloc((size_t)n ? (size_t)n : 1, sizeof *out->dim)) ||
                !(out->ip = calloc((size_t)n ? (size_t)n : 1, sizeof *out->ip))))
        st = kb_fail(KILN_ERR_NOMEM, "export: out of memory");
    /* Moebius inversion gives coefficients in the basis prod (s_j - lo_j);
     * expand to plain monomials prod s_i */
    int uses[KX_MAX_SYMS] = {0};
    for (int i = 0; !st && i < n; i++)
        for (int k = 0; k < 8; k++) {
            int64_t off[KX_NMONO] = {0};
            for (int S = 0; S < ncorner; S++)
                for (int T = S;; T = (T - 1) & S) {
                    int sign = __builtin_popcount((unsigned)(S & ~T)) & 1 ? -1 : 1;
                    off[S] += sign * val[T][(size_t)i * 8 + (size_t)k];
                    if (!T) break;
                }
            kx_expr e = {{0}};
            for (int S = 0; S < ncorner; S++) {
                if (!off[S]) continue;
                for (int T = S;; T = (T - 1) & S) { /* prod_{j in S}(s_j - lo_j) = sum_T prod_{T} s * prod_{S\T} (-lo) */
                    int64_t c = off[S];
                    int mono = 0;
                    for (int j = 0; j < nd; j++) {
                        if (!(S >> j & 1)) continue;
                        if (T >> j & 1) mono |= 1 << dyn[j];
                        else c *= -syms[dyn[j]].lo;
                    }
                    e.c[mono] += c;
                    if (!T) break;
                }
                for (int j = 0; j < nd; j++)
                    if (S >> j & 1) uses[j] = 1;
            }
            if (k < 4) out->dim[i][k] = e;
            else out->ip[i][k - 4] = e;
        }
    for (int j = 0; !st && j < nd; j++)
        if (!uses[j])
            st = kb_fail(KILN_ERR_SHAPE, "export: %s is declared dynamic but the graph does not depend on it "
                                         "(it would be silently specialized); declare it static", syms[dyn[j]].name);

    /* the largest shape sizes the arena; it and a few interior points must
     * match the fit exactly (and be buildable: the position table bound) */
    for (int trial = 0; !st && trial < 3 && nd; trial++) {
        for (int i = 0; i < nsym; i++) {
            int64_t span = syms[i].hi - syms[i].lo;
            s[i] = trial == 0 ? syms[i].hi : syms[i].lo + (span * (trial == 1 ? 2 : 1) + i) / 3 % (span + 1);
        }
        kg_graph t;
        st = build_at(build, user, s, &t, syms, nsym);
        int where = -1;
        if (!st && !same_structure(&g[0], &t, &where))
            st = kb_fail(KILN_ERR_SHAPE, "export: the graph's structure differs inside the ranges (node %d)", where);
        for (int i = 0; !st && i < n; i++)
            for (int k = 0; k < 8; k++) {
                int64_t want = k < 4 ? (k < t.nodes[i].ndim ? t.nodes[i].shape[k] : 0) : t.nodes[i].iparam[k - 4];
                int64_t got = kx_eval(k < 4 ? &out->dim[i][k] : &out->ip[i][k - 4], s);
                if (want != got) {
                    st = kb_fail(KILN_ERR_SHAPE, "export: node %d (%s) has a dimension that is not a polynomial in the "
                                 "symbols (%lld, fitted %lld)", i, kg_op_name(t.nodes[i].op), (long long)want, (long long)got);
                    break;
                }
            }
        if (!st && trial == 0) {
            out->g = t; /* keep the largest graph */
            memset(&t, 0, sizeof t);
        }
        kg_free(&t);
    }
    if (!st && !nd) { /* all static: the one graph is the largest */
        out->g = g[0];
        memset(&g[0], 0, sizeof g[0]);
    }
    for (int m = 0; m < ncorner && g; m++) kg_free(&g[m]);
    for (int m = 0; m < ncorner && val; m++) free(val[m]);
    free(g);
    free(val);
    if (st) kx_export_free(out);
    return st;
}
