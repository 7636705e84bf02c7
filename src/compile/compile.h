/* compile.h - the ahead-of-time compiler: export a graph with symbolic
 * dimensions, plan its memory, generate C for it, build a weightless
 * package (shared object + manifest), and run packages and plans.
 *
 *   export   kx_export_graph: build the model's graph at the corners of the
 *            symbol ranges and fit every dimension as a polynomial in the
 *            symbols (one model definition, no second copy of the math)
 *   plan     kx_plan: one arena, offsets from tensor lifetimes
 *   codegen  kx_codegen: C source calling the kernels through kx_rt
 *   package  kx_package_*: publish, open lazily, verify, bind by name, run
 *
 * The compiler knows graphs and kernels, not models: the model hands it a
 * builder callback (data flows model -> compile -> kernels). */
#ifndef KILN_COMPILE_H
#define KILN_COMPILE_H

#include "graph/graph.h"
#include "kernels/kernels.h"
#include "kiln.h"

#include <stddef.h>
#include <stdint.h>

#define KX_MAX_SYMS 4
#define KX_NMONO (1 << KX_MAX_SYMS)
#define KX_FORMAT_VERSION 2 /* 2: shape constants (placement "const", const_bytes) */
#define KX_ABI 13 /* 10: ops called through the op table (kg_call), kiln_pkg_ops; 11: named outputs;
                   * 12: kiln_pkg_consts, the shape constants apart; 13: an op's call has 7 sources
                   * (an attention's rotary table) */

/* A named dimension with a range; lo == hi is a static dimension. */
typedef struct kx_sym {
    char name[16];
    int64_t lo, hi;
} kx_sym;

/* A dimension as a polynomial in the symbols: sum over monomials m (bit i
 * set = symbol i is a factor) of c[m] * prod s_i. Graph dimensions are
 * multilinear (tokens = h * w), so this form is exact. */
typedef struct kx_expr {
    int64_t c[KX_NMONO];
} kx_expr;

int64_t kx_eval(const kx_expr *e, const int64_t *s);
int kx_is_const(const kx_expr *e);
/* "2*w", "h*w+333", "4" */
void kx_expr_str(const kx_expr *e, const kx_sym *syms, int nsym, char *buf, size_t cap);

/* Build (and fuse/plan) the graph for symbol values s. */
typedef kiln_status (*kx_build_fn)(void *user, const int64_t *s, kg_graph *g);

/* An exported graph: the graph built at the largest shape (every symbol at
 * hi, which sizes the arena) with every dimension and integer parameter as
 * an expression. */
typedef struct kx_export {
    int nsym;
    kx_sym sym[KX_MAX_SYMS];
    kg_graph g;
    kx_expr (*dim)[4]; /* per node */
    kx_expr (*ip)[4];
} kx_export;

kiln_status kx_export_graph(kx_build_fn build, void *user, const kx_sym *syms, int nsym, kx_export *out);
void kx_export_free(kx_export *x);

/* An input's shape as expressions, and guards read from them. */
typedef struct kx_iospec {
    char name[48];
    int ndim;
    kx_expr dim[4];
} kx_iospec;

/* Solve the symbols from the actual input shapes and check every guard
 * (ranges, divisibility, static dimensions, shared dimensions equal). On a
 * failed guard, returns KILN_ERR_RANGE with the reason as the message. */
kiln_status kx_solve(const kx_sym *syms, int nsym, const kx_iospec *in, int n_in, const int64_t (*shape)[4],
                     int64_t *s);

/* ---- memory plan ------------------------------------------------------- */

/* KX_CONST: a shape constant (kg_shape_consts), in the constants' area */
typedef enum kx_place_kind { KX_NONE, KX_ARENA, KX_INPUT, KX_OUTPUT, KX_WEIGHT, KX_CONST } kx_place_kind;
typedef struct kx_place {
    kx_place_kind kind;
    int64_t at; /* arena offset in bytes, or the input/output slot, or the weight's index, or the
                 * offset in the constants' area */
} kx_place;

typedef struct kx_plan {
    int n;
    kx_place *place;    /* per node */
    size_t arena_bytes;
    size_t const_bytes; /* the shape constants', one after another */
    int n_weights;
    kg_id *weights;     /* weight nodes in index order */
} kx_plan;

/* Lifetimes from kg_liveness, sizes from the graph's shapes (bf16 outputs
 * take 2 bytes an element); offsets 64-byte aligned. The shape constants
 * go in an area of their own, kept between forwards (kx_consts). */
kiln_status kx_plan_graph(const kg_graph *g, kx_plan *p);
void kx_plan_free(kx_plan *p);

/* A graph's shape constants kept on the backend between forwards by their
 * owner (a model's executor state; a package keeps its own): recomputed
 * only when their signature (every constant's op, shape and parameters, and
 * the weights it reads) is not the one they were computed for: when a
 * dimension changes. */
typedef struct kx_consts {
    void *buf; /* the backend's memory, bytes long */
    size_t bytes;
    char *sig; /* the signature they hold (malloc'd), sig_len bytes */
    size_t sig_len;
} kx_consts;
void kx_consts_free(kx_consts *c, const kk_backend *be);

/* The in-process planned executor: the graph's nodes in order, with
 * buffers from the plan inside arena (at least p->arena_bytes), the shape
 * constants in consts (computed first where they do not hold them; NULL:
 * computed for this forward alone), inputs and outputs the backend's
 * buffers (a forward stages them: src/model/exec.c). */
kiln_status kx_run_planned(const kg_graph *g, const kx_plan *p, const kk_backend *be, void *arena, kx_consts *consts,
                           const float *const *inputs, float *const *outputs);

/* ---- runtime ABI of generated code ------------------------------------- */

/* What a package calls: every op's runner (ops.c), indexed by op number,
 * with the context (backend, collectives) they run in. Generated code
 * declares the same struct (codegen.c); kiln_pkg_ops() in the package names
 * the op table it was generated against, and the loader refuses another. */
typedef struct kx_rt {
    int abi;
    const kg_ctx *ctx;
    kg_run_fn run[KG_OP_COUNT];
} kx_rt;

/* The table for a context (its backend and, in a parallel run, its dist). */
void kx_rt_init(kx_rt *rt, const kg_ctx *ctx);

/* ---- code generation ------------------------------------------------------ */

/* C source for the exported, planned graph. regional: each distinct kind
 * of region (transformer block) is emitted once and called per layer.
 * *n_kinds receives the number of distinct block functions; digest (the
 * manifest plan's SHA-256) is compiled in for the loader to check. Malloc'd. */
kiln_status kx_codegen(const kx_export *x, const kx_plan *p, int regional, const char *digest, char **src, int *n_kinds);

/* ---- packages ------------------------------------------------------------- */

/* What the host binds a weight name to (the model's side of binding). */
typedef struct kx_bound {
    int ndim;
    int64_t shape[4];
    const kk_weight *kw; /* the GEMM view, or NULL */
    const float *data;   /* f32 data, or NULL */
    kiln_dtype dtype;    /* the GEMM view's packed dtype */
    const char *layout;  /* the GEMM view's layout name */
} kx_bound;
typedef int (*kx_weight_fn)(void *user, const char *name, kx_bound *out);

typedef struct kx_compile_req {
    kx_build_fn build;
    void *build_user;
    kx_weight_fn weight;
    void *weight_user;
    kx_sym sym[KX_MAX_SYMS];
    int nsym;
    int regional;         /* 1: one function per block kind (default); 0: whole graph */
    const char *root;     /* package root folder */
    const char *family;   /* folder for everything the package depends on but dims:
                           * architecture, dtype, quantization, CPU layout, kiln version */
    const char *dtype;    /* "bf16" / "f32" (recorded) */
    const char *quant;    /* "none" (recorded) */
    const char *cpu_isa;  /* the CPU feature the packed layouts need, e.g. "amx" */
    const kk_backend *be; /* the backend it runs on (kk_has_feature checks cpu_isa) */
    const char *model_json; /* recorded as "model" in the manifest (may be NULL) */
    /* Called with the staging folder once the package is complete, before
     * it is published; an error stops the publish (may be NULL). */
    kiln_status (*check)(void *user, const char *staging_dir);
    void *check_user;
} kx_compile_req;

typedef struct kx_compile_info {
    char path[1024];      /* the published package folder */
    int reused;           /* an identical package was already there */
    int n_kinds, n_regions, n_nodes;
    double export_s, codegen_s, cc_s;
    size_t so_bytes, arena_bytes;
} kx_compile_info;

/* Export, plan, generate, build with $KILN_CC (default cc), write the
 * manifest and publish atomically under root/family/<dims>-<hash>. */
kiln_status kx_compile(const kx_compile_req *r, kx_compile_info *info);

typedef struct kx_package kx_package;

/* Read and check the manifest only (cheap, fork-friendly): the shared
 * object is verified, loaded and bound on the first run. dir is
 * <root>/<family>/<package>; the root, family and package folders must be
 * owned by this user or root and not writable by group or others, the
 * family and package folders and the files no symbolic links, and the
 * manifest's signature (file "signature", kb_sign of manifest.json's bytes)
 * valid under this user's key, before anything in the manifest is parsed
 * (kx_manifest_parse, compile/manifest.h). A refusal is KILN_ERR_CORRUPT
 * naming the reason ("... is writable by others (mode 0777); refused").
 * docs/package.md: the trust model. */
kiln_status kx_package_open(const char *dir, kx_package **out);
void kx_package_close(kx_package *p);
const char *kx_package_dir(const kx_package *p);
/* 1 when every symbol is static (a fixed-shape package) */
int kx_package_fixed(const kx_package *p);
/* The package's inputs (by slot) and outputs are these names; else
 * KILN_ERR_RANGE naming both lists. */
kiln_status kx_package_check_io(const kx_package *p, int n_in, const char *const *in, int n_out, const char *const *out);
/* Guards: solve the symbols from input shapes (n inputs, as the manifest's
 * input order). KILN_ERR_RANGE with the reason when the shape is not covered. */
kiln_status kx_package_solve(const kx_package *p, int n_in, const int64_t (*shape)[4], int64_t *s);
/* Check the CPU features, the folders again, open model.so (no symbolic
 * link, owner and mode as above), hash it through that descriptor against
 * the signed manifest's SHA-256 and dlopen that same descriptor
 * (/proc/self/fd/N), check its ABI and plan digest, bind
 * every weight by name (a list of the names that are missing or differ is
 * the error), allocate the arena. Done once per process; the result, good
 * or bad, is remembered. */
kiln_status kx_package_load(kx_package *p, const kk_backend *be, const kg_dist *dist, kx_weight_fn weight, void *user);
kiln_status kx_package_run(kx_package *p, const int64_t *s, const float *const *inputs, float *const *outputs);
/* 1 when name is a package staging folder (".staging-<pid>-<n>") whose
 * compiler died (its pid is gone on this machine): an interrupted compile
 * that `kiln package ls` shows and `package rm --all` removes. */
int kx_staging_dead(const char *name);
/* Check a package folder without loading it: folders, signature, manifest,
 * the features its weights' layouts need on backend be (kk_has_feature),
 * library hash (all that open and load check before dlopen). */
kiln_status kx_package_verify(const char *dir, const kk_backend *be);
/* The manifest's summary line for listings ("w=8..128 regional ...") */
const char *kx_package_summary(const kx_package *p);

#endif
