/* manifest.h - a compiled package's manifest.json as a struct: the parser
 * (text -> struct, no file system, no kernels) that package.c uses once the
 * manifest's signature has been verified, and that the libFuzzer harness
 * tests/fuzz/fuzz_package_manifest.c calls alone. Every field is checked
 * before use: integers range-checked as doubles before the cast and
 * non-integral values refused, slots and indices bounds-checked, sizes and
 * the input dimensions' values at the largest shape overflow-checked.
 * docs/package.md describes the fields. */
#ifndef KILN_COMPILE_MANIFEST_H
#define KILN_COMPILE_MANIFEST_H

#include "compile/compile.h"
#include "tensor/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define KX_MAX_IN 8            /* a forward's inputs (KA_MAX_IO; Flux-dev: 5) */
#define KX_MAX_OUT KG_MAX_OUTPUTS /* and outputs (SD3: sample; a text encoder: every hidden state) */
#define KX_SYM_MAX (1LL << 30) /* a symbol's largest value (tokens, batch rows) */
#define KX_COEF_MAX (1LL << 32) /* |coefficient| of a dimension's polynomial */
#define KX_DIM_MAX (1LL << 40) /* a weight's dimension */
#define KX_ARENA_MAX (1LL << 46) /* 64 TiB: more than any machine has */
#define KX_NODES_MAX (1 << 24)

typedef struct kx_pkg_weight {
    char *name;
    int node, ndim, gemm;
    int64_t shape[4];
    kiln_dtype dtype;
    char layout[40];
} kx_pkg_weight;

/* What a manifest says, checked. */
typedef struct kx_manifest {
    int nsym, n_in, n_out, n_nodes, nw, n_cpu;
    kx_sym sym[KX_MAX_SYMS];
    kx_iospec in[KX_MAX_IN];
    int in_slot[KX_MAX_IN]; /* input i reads the caller's shape/buffer in_slot[i] (< n_in, distinct) */
    char out_name[KX_MAX_OUT][48]; /* output slot i's name */
    kx_place *place;        /* [n_nodes] */
    size_t arena_bytes;
    size_t const_bytes;     /* the shape constants' area */
    kx_pkg_weight *w;       /* [nw] */
    char so_sha[65], cpu[4][24], summary[256];
} kx_manifest;

/* Parse and check manifest text (len bytes; no NUL needed). label names the
 * package in messages. KILN_ERR_CORRUPT (what is wrong) for a bad manifest,
 * KILN_ERR_UNSUPPORTED for another format version or ABI, KILN_ERR_NOMEM. */
kiln_status kx_manifest_parse(const char *text, size_t len, const char *label, kx_manifest **out);
void kx_manifest_free(kx_manifest *m);
/* The manifest's executable content (symbols, inputs, arena, placements,
 * weight bindings) as SHA-256; compiled into the shared object. */
void kx_manifest_digest(const kx_manifest *m, char hex[65]);
/* "none", "arena", "input", "output", "weight" */
const char *kx_place_name(kx_place_kind k);

#endif
