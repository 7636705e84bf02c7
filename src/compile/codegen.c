/* codegen.c - C source for an exported, planned graph.
 *
 * The generated file is self-contained (no kiln headers): it declares the
 * runtime table kx_rt from the one X-macro in compile.h and exports
 *   int kiln_pkg_abi(void);
 *   const char *kiln_pkg_digest(void);   (the manifest's plan, see package.c)
 *   int kiln_pkg_consts(const kx_rt *rt, const int64_t *S, void *const *P);
 *   int kiln_pkg_forward(const kx_rt *rt, const int64_t *S, void *const *P);
 * S holds the symbol values, P[i] node i's buffer (bound by the host from
 * the manifest's placements: arena offsets, inputs, outputs, weights, the
 * shape constants' area). kiln_pkg_consts computes the shape constants
 * (kg_shape_consts), which the host calls when the symbols change;
 * kiln_pkg_forward runs every other node.
 * Every kernel call passes its sizes as expressions in S, so one shared
 * object serves every shape in the ranges. Regional code emits one function
 * per distinct block kind and calls it for each layer with a table mapping
 * the block's local node numbers to the layer's nodes. */
#include "base/base.h"
#include "compile/compile.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct sb {
    char *s;
    size_t len, cap;
    int oom;
} sb;

static void out(sb *b, const char *fmt, ...) KB_PRINTF(2, 3);
static void out(sb *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 1 << 16) + (size_t)n;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* an expression in S as C: "(4LL*S[1])" */
static void expr_c(sb *b, const kx_expr *e) {
    if (kx_is_const(e)) {
        out(b, "%lldLL", (long long)e->c[0]);
        return;
    }
    out(b, "(");
    int first = 1;
    for (int m = 0; m < KX_NMONO; m++) {
        if (!e->c[m]) continue;
        out(b, "%s%lldLL", first ? "" : "+", (long long)e->c[m]);
        for (int i = 0; i < KX_MAX_SYMS; i++)
            if (m >> i & 1) out(b, "*S[%d]", i);
        first = 0;
    }
    out(b, ")");
}

/* How node ids become pointers in the code being emitted. */
typedef struct refs {
    const int *local; /* global id -> local index (block mode), or NULL (P[id]) */
} refs;

static void ref(sb *b, const refs *r, kg_id id) {
    if (id < 0) out(b, "0"); /* an absent source (a joint attention's queries of one segment) */
    else if (r->local) out(b, "P[m[%d]]", r->local[id]);
    else out(b, "P[%d]", id);
}

static void dim(sb *b, const kx_export *x, kg_id id, int k) { expr_c(b, &x->dim[id][k]); }
static void ipar(sb *b, const kx_export *x, kg_id id, int k) { expr_c(b, &x->ip[id][k]); }

/* One node as a call of its op's runner through the runtime table
 * (ops.def, ops.c): the same kg_call the eager and planned executors make,
 * with every shape and parameter an expression in S. The op's meaning lives
 * only in its runner; this function knows none. */
static void emit_node(sb *b, const kx_export *x, kg_id i, const refs *r) {
    const kg_node *n = &x->g.nodes[i];
    out(b, "    /* %d %s */ {\n        const kg_call c = {.op = %d, .src = {", i, kg_op_name(n->op), (int)n->op);
    for (int s = 0; s < KG_MAX_SRC; s++) {
        if (s) out(b, ", ");
        ref(b, r, n->src[s]);
    }
    out(b, "}, .y = "), ref(b, r, i), out(b, ",\n            .sh = {");
    for (int s = 0; s <= KG_MAX_SRC; s++) {
        kg_id id = s < KG_MAX_SRC ? n->src[s] : i;
        out(b, "%s{", s ? ", " : "");
        for (int k = 0; k < 4; k++) {
            if (k) out(b, ", ");
            if (id >= 0 && k < x->g.nodes[id].ndim) dim(b, x, id, k);
            else out(b, "0");
        }
        out(b, "}");
    }
    out(b, "},\n            .nd = {");
    for (int s = 0; s <= KG_MAX_SRC; s++) {
        kg_id id = s < KG_MAX_SRC ? n->src[s] : i;
        out(b, "%s%d", s ? ", " : "", id >= 0 ? x->g.nodes[id].ndim : 0);
    }
    out(b, "}, .fmt = {");
    for (int s = 0; s <= KG_MAX_SRC; s++) {
        kg_id id = s < KG_MAX_SRC ? n->src[s] : i;
        out(b, "%s%d", s ? ", " : "", id >= 0 ? x->g.nodes[id].out_bf16 : 0);
    }
    out(b, "},\n            .ip = {");
    for (int k = 0; k < 4; k++) {
        if (k) out(b, ", ");
        ipar(b, x, i, k);
    }
    out(b, "}, .fp = %af};\n        rt->run[%d](rt->ctx, &c);\n    }\n", (double)n->fparam, (int)n->op);
}

static int runs(const kx_plan *p, kg_id i) { return p->place[i].kind == KX_ARENA || p->place[i].kind == KX_OUTPUT; }

/* A region's structure as text: two regions with the same signature
 * compile to the same function. Local numbers: internal nodes 0..len-1,
 * then external sources in order of first use (filled into ext). */
static char *signature(const kx_export *x, const kx_plan *p, const kg_region *rg, kg_id *ext, int *n_ext) {
    sb b = {0};
    *n_ext = 0;
    char es[96];
    for (int i = rg->start; i < rg->end; i++) {
        const kg_node *n = &x->g.nodes[i];
        out(&b, "%s %d %d %a|", kg_op_name(n->op), (int)p->place[i].kind, n->out_bf16, (double)n->fparam);
        if (kg_is_weight(n)) out(&b, "w%d%d ", n->kw != NULL, n->data != NULL);
        for (int k = 0; k < 8; k++) {
            kx_expr_str(k < 4 ? &x->dim[i][k] : &x->ip[i][k - 4], x->sym, x->nsym, es, sizeof es);
            out(&b, "%s,", es);
        }
        for (int s = 0; s < KG_MAX_SRC; s++) {
            kg_id src = n->src[s];
            if (src < 0) out(&b, "-");
            else if (src >= rg->start) out(&b, "i%d", src - rg->start);
            else {
                int e = 0;
                while (e < *n_ext && ext[e] != src) e++;
                if (e == *n_ext) ext[(*n_ext)++] = src;
                out(&b, "e%d:", e);
                for (int k = 0; k < 4; k++) { /* an external's dims appear in the code */
                    kx_expr_str(&x->dim[src][k], x->sym, x->nsym, es, sizeof es);
                    out(&b, "%s,", es);
                }
                out(&b, "%d", x->g.nodes[src].out_bf16);
            }
            out(&b, " ");
        }
        out(&b, "\n");
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s ? b.s : kb_strdup("");
}

#define KX_CALL_DECL(type, name, dims) "    " #type " " #name #dims ";\n"

kiln_status kx_codegen(const kx_export *x, const kx_plan *p, int regional, const char *digest, char **src, int *n_kinds) {
    *src = NULL;
    *n_kinds = 0;
    const kg_graph *g = &x->g;
    sb b = {0};
    out(&b, "/* Generated by kiln: the planned graph (%d nodes, %s). Do not edit. */\n", g->n,
        regional ? "regional" : "whole graph");
    /* the call and the runtime table, declared from the same definitions as the host's (graph.h, compile.h) */
    out(&b, "#include <stdint.h>\n\n#define KG_MAX_SRC %d\nstruct kg_ctx;\ntypedef struct kg_call {\n%s} kg_call;\n", KG_MAX_SRC,
        KG_CALL_FIELDS(KX_CALL_DECL));
    out(&b, "typedef struct kx_rt {\n    int abi;\n    const struct kg_ctx *ctx;\n"
            "    void (*run[%d])(const struct kg_ctx *, const kg_call *);\n} kx_rt;\n\n", KG_OP_COUNT);
    out(&b, "int kiln_pkg_abi(void) { return %d; }\n", KX_ABI);
    out(&b, "/* the op table this code indexes (ops.def) */\nconst char *kiln_pkg_ops(void) { return \"%s\"; }\n",
        kg_op_table_names());
    out(&b, "/* SHA-256 of the manifest's plan this code was generated for */\n");
    out(&b, "const char *kiln_pkg_digest(void) { return \"%s\"; }\n\n", digest);

    int nr = regional ? g->n_regions : 0;
    int *kind = calloc((size_t)nr + 1, sizeof *kind);  /* region -> kind (index of its first region) */
    char **sig = calloc((size_t)nr + 1, sizeof *sig);
    kg_id **ext = calloc((size_t)nr + 1, sizeof *ext);
    int *n_ext = calloc((size_t)nr + 1, sizeof *n_ext);
    int *local = malloc(sizeof(int) * ((size_t)g->n + 1));
    kiln_status st = kind && sig && ext && n_ext && local ? KILN_OK : KILN_ERR_NOMEM;
    for (int r = 0; !st && r < nr; r++) {
        const kg_region *rg = &g->regions[r];
        if (rg->end < rg->start || !(ext[r] = malloc(sizeof(kg_id) * (size_t)(3 * (rg->end - rg->start) + 1)))) {
            st = rg->end < rg->start ? kb_fail(KILN_ERR_SHAPE, "codegen: region %d is not closed", r) : KILN_ERR_NOMEM;
            break;
        }
        if (!(sig[r] = signature(x, p, rg, ext[r], &n_ext[r]))) st = KILN_ERR_NOMEM;
        kind[r] = r;
        for (int q = 0; !st && q < r; q++)
            if (kind[q] == q && !strcmp(sig[q], sig[r])) {
                kind[r] = q;
                break;
            }
    }
    /* one function per kind, written from its first region */
    for (int r = 0; !st && r < nr; r++) {
        if (kind[r] != r) continue;
        const kg_region *rg = &g->regions[r];
        for (int i = 0; i < g->n; i++) local[i] = -1;
        for (int i = rg->start; i < rg->end; i++) local[i] = i - rg->start;
        for (int e = 0; e < n_ext[r]; e++) local[ext[r][e]] = rg->end - rg->start + e;
        refs rf = {local};
        out(&b, "/* block kind %d (first: layer %d) */\nstatic void block_%d(const kx_rt *rt, const int64_t *S, void *const *P, "
                "const int32_t *m) {\n    (void)S;\n", *n_kinds, rg->layer, r);
        for (int i = rg->start; i < rg->end; i++)
            if (runs(p, i)) emit_node(&b, x, i, &rf);
        out(&b, "}\n\n");
        ++*n_kinds;
    }
    for (int r = 0; !st && r < nr; r++) {
        const kg_region *rg = &g->regions[r];
        out(&b, "static const int32_t map_%d[] = {", r);
        int len = rg->end - rg->start;
        for (int j = 0; j < len + n_ext[r]; j++) out(&b, "%s%d", j ? "," : "", j < len ? rg->start + j : ext[r][j - len]);
        out(&b, "};\n");
    }
    refs direct = {NULL};
    out(&b, "\n/* the shape constants, for the symbol values S */\n"
            "int kiln_pkg_consts(const kx_rt *rt, const int64_t *S, void *const *P) {\n    (void)rt, (void)S, (void)P;\n");
    for (int i = 0; !st && i < g->n; i++)
        if (p->place[i].kind == KX_CONST) emit_node(&b, x, i, &direct);
    out(&b, "    return 0;\n}\n");
    out(&b, "\nint kiln_pkg_forward(const kx_rt *rt, const int64_t *S, void *const *P) {\n    (void)S;\n");
    for (int i = 0; !st && i < g->n;) {
        int r = 0;
        while (r < nr && g->regions[r].start != i) r++;
        if (r < nr && g->regions[r].end > i) {
            out(&b, "    block_%d(rt, S, P, map_%d); /* layer %d */\n", kind[r], r, g->regions[r].layer);
            i = g->regions[r].end;
            continue;
        }
        if (runs(p, i)) emit_node(&b, x, i, &direct);
        i++;
    }
    out(&b, "    return 0;\n}\n");
    for (int r = 0; r < nr; r++) {
        if (sig) free(sig[r]);
        if (ext) free(ext[r]);
    }
    free(kind);
    free(sig);
    free(ext);
    free(n_ext);
    free(local);
    if (!st && b.oom) st = KILN_ERR_NOMEM;
    if (st) {
        free(b.s);
        return st == KILN_ERR_NOMEM ? kb_fail(st, "codegen: out of memory") : st;
    }
    *src = b.s;
    return KILN_OK;
}
