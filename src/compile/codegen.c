/* codegen.c - C source for an exported, planned graph.
 *
 * The generated file is self-contained (no kiln headers): it declares the
 * runtime table kx_rt from the one X-macro in compile.h and exports
 *   int kiln_pkg_abi(void);
 *   const char *kiln_pkg_digest(void);   (the manifest's plan, see package.c)
 *   int kiln_pkg_forward(const kx_rt *rt, const int64_t *S, void *const *P);
 * S holds the symbol values, P[i] node i's buffer (bound by the host from
 * the manifest's placements: arena offsets, inputs, outputs, weights).
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

/* product of dims [from, to) of a node */
static void dims_prod(sb *b, const kx_export *x, kg_id id, int from, int to) {
    if (from >= to) out(b, "1LL");
    for (int k = from; k < to; k++) {
        if (k > from) out(b, "*");
        dim(b, x, id, k);
    }
}

/* a linear's x: the second token segment of an attention's blocked output
 * starts after the first's iparam[3] rows (kg_plan_bf16), as
 * kk_blocked_elems counts them */
static void linear_x(sb *b, const kx_export *x, kg_id i, const refs *r) {
    const kg_node *n = &x->g.nodes[i];
    kg_id s0 = n->src[0];
    if (!n->iparam[3]) {
        ref(b, r, s0);
        return;
    }
    out(b, "(const void *)((const unsigned short *)"), ref(b, r, s0), out(b, " + (("), ipar(b, x, i, 3);
    out(b, "+31)/32*32)*(("), dim(b, x, s0, x->g.nodes[s0].ndim - 1), out(b, "+31)/32*32))");
}

static void emit_node(sb *b, const kx_export *x, const kx_plan *p, kg_id i, const refs *r) {
    const kg_node *n = &x->g.nodes[i];
    const kg_node *nodes = x->g.nodes;
    kg_id s0 = n->src[0], s1 = n->src[1], s2 = n->src[2];
    int nd = n->ndim;
#define A(k) ref(b, r, n->src[k])
#define Y() ref(b, r, i)
#define C out(b, ", ")
    out(b, "    /* %d %s */ ", i, kg_op_name(n->op));
    switch (n->op) {
    case KG_LINEAR: {
        if (n->iparam[1]) { /* a gate_add folded in: res + gate * (x W^T + b); no gate: an add */
            out(b, "rt->linear_gate_add("), linear_x(b, x, i, r), out(b, ", %d, (const struct kk_weight *)", nodes[s0].out_bf16), A(1), C;
            if (s2 >= 0) A(2);
            else out(b, "0");
            C, A(3), C;
            if (n->src[4] >= 0) out(b, "(const float *)"), A(4), out(b, " + "), ipar(b, x, i, 2), C, dim(b, x, n->src[4], 1), C;
            else out(b, "0, 0LL, ");
            Y(), C, dim(b, x, i, 0), C, dim(b, x, i, 1), out(b, ");\n");
            break;
        }
        int io = nodes[s0].out_bf16 || n->out_bf16;
        out(b, io ? "rt->linear_io(" : "rt->linear(");
        linear_x(b, x, i, r), C;
        if (io) out(b, "%d, ", nodes[s0].out_bf16);
        out(b, "(const struct kk_weight *)"), A(1), C;
        if (s2 >= 0) A(2);
        else out(b, "0");
        C, Y(), C;
        if (io) out(b, "%d, ", n->out_bf16);
        dims_prod(b, x, i, 0, nd - 1), out(b, ", %d);\n", (int)n->iparam[0]);
        break;
    }
    case KG_LN_MODULATE:
    case KG_MODULATE:
    case KG_GATE_ADD: {
        const char *fn = n->op == KG_GATE_ADD ? "gate_add" : n->op == KG_MODULATE ? "modulate" : "layernorm_modulate";
        out(b, "rt->%s%s(", fn, n->out_bf16 ? "_bf16" : "");
        A(0), C, A(1), C, A(2), C, Y(), C, dim(b, x, i, 0), C, dim(b, x, i, 1), C, dim(b, x, i, 2);
        if (n->op == KG_LN_MODULATE) out(b, ", %af", (double)n->fparam);
        if (n->out_bf16) out(b, ", %d", n->out_bf16);
        out(b, ");\n");
        break;
    }
    case KG_ADD:
        out(b, "rt->add_bcast("), A(0), C, A(1), C, Y(), C, dims_prod(b, x, i, 0, nd), C;
        dims_prod(b, x, s1, 0, nodes[s1].ndim), out(b, ");\n");
        break;
    case KG_SILU:
    case KG_GELU_TANH:
        out(b, "rt->%s(", n->op == KG_SILU ? "silu" : "gelu_tanh"), A(0), C, Y(), C, dims_prod(b, x, i, 0, nd);
        out(b, ");\n");
        break;
    case KG_LAYERNORM:
        out(b, "rt->layernorm("), A(0), C, Y(), C, dims_prod(b, x, i, 0, nd - 1), C, dim(b, x, i, nd - 1);
        out(b, ", %af);\n", (double)n->fparam);
        break;
    case KG_RMSNORM_HEADS:
        out(b, "rt->rmsnorm_heads("), A(0), C, A(1), C, Y(), C, dims_prod(b, x, i, 0, nd - 1), C, ipar(b, x, i, 0), C;
        dim(b, x, i, nd - 1), out(b, "/"), ipar(b, x, i, 0), out(b, ", %af);\n", (double)n->fparam);
        break;
    case KG_SLICE_COLS:
        out(b, "rt->slice_rows("), A(0), C, Y(), C, dim(b, x, i, 0), C, dim(b, x, s0, 1), C, ipar(b, x, i, 0), C;
        ipar(b, x, i, 1), out(b, ");\n");
        break;
    case KG_CONCAT_TOKENS:
        out(b, "rt->concat_rows("), A(0), C, dim(b, x, s0, 1), out(b, "*"), dim(b, x, i, 2), C, A(1), C;
        dim(b, x, s1, 1), out(b, "*"), dim(b, x, i, 2), C, Y(), C, dim(b, x, i, 0), out(b, ");\n");
        break;
    case KG_SLICE_TOKENS: { /* bf16 rows (D even) move as pairs, in f32-sized units */
        const char *half = n->out_bf16 ? "/2" : "";
        out(b, "rt->slice_rows("), A(0), C, Y(), C, dim(b, x, i, 0), C, dim(b, x, s0, 1), out(b, "*"), dim(b, x, i, 2);
        out(b, "%s, ", half), ipar(b, x, i, 0), out(b, "*"), dim(b, x, i, 2), out(b, "%s, ", half), ipar(b, x, i, 1);
        out(b, "*"), dim(b, x, i, 2), out(b, "%s);\n", half);
        break;
    }
    case KG_ATTENTION:
        if (nodes[s1].out_bf16) { /* q, k, v in bf16 rows; plain attention as one segment */
            int j = (int)n->iparam[1];
            out(b, "rt->attention_joint_bf16("), A(0), C, A(1), C, A(2), C;
            if (j) A(3), C, A(4), C, A(5), C;
            else out(b, "0, 0, 0, ");
            Y(), out(b, ", %d, ", n->out_bf16), dim(b, x, i, 0), C, dim(b, x, s0, 1), C;
            if (j) dim(b, x, n->src[4], 1);
            else out(b, "0");
            C, ipar(b, x, i, 0), C, dim(b, x, i, 2), out(b, "/"), ipar(b, x, i, 0), out(b, ");\n");
            break;
        }
        if (n->iparam[1]) { /* joint: two token segments read in place */
            out(b, "rt->attention_joint("), A(0), C, A(1), C, A(2), C, A(3), C, A(4), C, A(5), C, Y(), C;
            dim(b, x, i, 0), C, dim(b, x, s0, 1), C, dim(b, x, n->src[4], 1), C, ipar(b, x, i, 0), C, dim(b, x, i, 2);
            out(b, "/"), ipar(b, x, i, 0), out(b, ");\n");
            break;
        }
        out(b, "rt->attention("), A(0), C, A(1), C, A(2), C, Y(), C, dim(b, x, i, 0), C, dim(b, x, i, 1), C;
        dim(b, x, s1, 1), C, ipar(b, x, i, 0), C, dim(b, x, i, 2), out(b, "/"), ipar(b, x, i, 0), out(b, ");\n");
        break;
    case KG_PATCHIFY:
        out(b, "rt->patchify("), A(0), C, Y(), C, dim(b, x, s0, 0), C, dim(b, x, s0, 1), C, dim(b, x, s0, 2), C;
        dim(b, x, s0, 3), C, ipar(b, x, i, 0), out(b, ");\n");
        break;
    case KG_UNPATCHIFY:
        out(b, "rt->unpatchify("), A(0), C, Y(), C, dim(b, x, i, 0), C, ipar(b, x, i, 0), C, ipar(b, x, i, 1), C;
        ipar(b, x, i, 2), C, ipar(b, x, i, 3), out(b, ");\n");
        break;
    case KG_TIMESTEP_PROJ:
        out(b, "rt->timestep_proj("), A(0), C, Y(), C, dim(b, x, i, 0), C, ipar(b, x, i, 0), out(b, ");\n");
        break;
    case KG_POS_CROP:
        out(b, "rt->pos_crop("), A(0), C, Y(), C, ipar(b, x, i, 0), C, ipar(b, x, i, 1), C, ipar(b, x, i, 2), C;
        dim(b, x, i, 2), out(b, ");\n");
        break;
    case KG_SHARD: /* the collectives of a parallel run: [B,N,D] in and out */
    case KG_ALLGATHER:
    case KG_ALLTOALL:
    case KG_ALLREDUCE:
    case KG_FSDP_GATHER:
        out(b, "{\n        const int64_t ip[4] = {"), ipar(b, x, i, 0), C, ipar(b, x, i, 1), C, ipar(b, x, i, 2), C;
        ipar(b, x, i, 3), out(b, "}, xs[3] = {"), dim(b, x, s0, 0), C, dim(b, x, s0, 1), C, dim(b, x, s0, 2);
        out(b, "}, ys[3] = {"), dim(b, x, i, 0), C, dim(b, x, i, 1), C, dim(b, x, i, 2);
        out(b, "};\n        rt->dist(rt->dist_ctx, %d, ip, xs, ys, ", (int)n->op), A(0), C, Y(), out(b, ");\n    }\n");
        break;
    case KG_INPUT:
    case KG_WEIGHT:
    case KG_ALIAS:
    case KG_OP_COUNT: out(b, "\n"); break;
    }
    (void)p;
#undef A
#undef Y
#undef C
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
        if (n->op == KG_WEIGHT) out(&b, "w%d%d ", n->kw != NULL, n->data != NULL);
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

#define KX_STR2(...) #__VA_ARGS__
#define KX_STR(...) KX_STR2(__VA_ARGS__)
#define KX_RT_DECL(name, ret, args) "    " #ret " (*" #name ")" #args ";\n"

kiln_status kx_codegen(const kx_export *x, const kx_plan *p, int regional, const char *digest, char **src, int *n_kinds) {
    *src = NULL;
    *n_kinds = 0;
    const kg_graph *g = &x->g;
    sb b = {0};
    out(&b, "/* Generated by kiln: the planned backbone graph (%d nodes, %s). Do not edit. */\n", g->n,
        regional ? "regional" : "whole graph");
    out(&b, "#include <stdint.h>\n\nstruct kk_weight;\ntypedef struct kx_rt {\n    int abi;\n%s    const void *dist_ctx;\n} kx_rt;\n\n",
        KX_RT_FUNCS(KX_RT_DECL));
    out(&b, "int kiln_pkg_abi(void) { return %d; }\n", KX_ABI);
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
            if (runs(p, i)) emit_node(&b, x, p, i, &rf);
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
    out(&b, "\nint kiln_pkg_forward(const kx_rt *rt, const int64_t *S, void *const *P) {\n    (void)S;\n");
    refs direct = {NULL};
    for (int i = 0; !st && i < g->n;) {
        int r = 0;
        while (r < nr && g->regions[r].start != i) r++;
        if (r < nr && g->regions[r].end > i) {
            out(&b, "    block_%d(rt, S, P, map_%d); /* layer %d */\n", kind[r], r, g->regions[r].layer);
            i = g->regions[r].end;
            continue;
        }
        if (runs(p, i)) emit_node(&b, x, p, i, &direct);
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
