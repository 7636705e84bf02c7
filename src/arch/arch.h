/* arch.h - the architecture table: everything kiln knows about one model
 * family, as one struct of data and functions. The cache, quantization,
 * sharding, the compiler and packages, the execution chain and the CLI read
 * a family only through this table; its config is opaque to them (a blob
 * of config_size bytes that the family's functions read).
 *
 * A family lives in src/arch/<family>/ and is listed in arch.c; a test or
 * an embedding program may add one at run time (ka_register). */
#ifndef KILN_ARCH_H
#define KILN_ARCH_H

#include "format/checkpoint.h"
#include "graph/graph.h"
#include "kiln.h"

#include <cjson/cJSON.h>

#include <stddef.h>
#include <stdint.h>

#define KA_MAX_SYMS 4 /* symbolic dimensions of a family's forward (the compiler's KX_MAX_SYMS) */
#define KA_MAX_IO 8   /* named inputs of a forward, and outputs in the table's static list */
#define KA_MAX_OUT 80 /* outputs of a config (ka_arch.outputs): every hidden state of a text encoder */

/* How tensor parallel splits a weight: column-parallel linears keep a block
 * of output rows, row-parallel ones a block of input columns; a
 * row-parallel bias is added once, so rank 0's shard holds it and the
 * others hold zeros. Everything else is replicated. */
enum { KA_SPLIT_NONE = 0, KA_SPLIT_ROWS, KA_SPLIT_COLS, KA_SPLIT_BIAS0, KA_SPLIT_COLS_1_4 };
/* KA_SPLIT_COLS_1_4: a row-parallel linear whose input joins two
 * column-parallel outputs of widths C/5 and 4C/5 (Flux's single-block
 * proj_out over [attention, MLP]): each rank keeps its block of each part. */

/* One expected weight: the diffusers (or transformers) name and exact shape. */
typedef struct ka_spec {
    char name[112];
    int ndim;
    int64_t shape[4];
    int linear; /* the W of a linear layer: packed for the fast GEMM, quantizable */
    int split;  /* KA_SPLIT_*, the rule tensor parallel applies (ka_shard_spec) */
    int block;  /* FSDP: the block it belongs to, gathered before the block runs; -1: none */
    int keep_f32; /* a linear whose GEMM stays f32 in a bf16 model: bf16 rounding of it would go,
                   * unscaled, into a softmax's exponent (T5's q and k); with conv, a convolution
                   * likewise (the VAE's that read the latent: it is not rounded to bf16) */
    int conv;     /* the W [Cout,Cin,kh,kw] of a 2-D convolution: packed at conversion in the
                   * backend's convolution layout (kk_pack_layout), in the compute dtype (f32 with keep_f32) */
    int up2;      /* with conv: the W [Cout,Cin,3,3] of a conv after a nearest 2x upsample, stored in its
                   * sub-pixel form [4 Cout, Cin, 2, 2] (kk_conv_up2_weight) for kg_conv2d_up2; shape
                   * stays the checkpoint's (ka_stored_shape gives the stored one) */
} ka_spec;

/* One rank's part of a parallel run: the builder places the collectives. */
typedef struct ka_par {
    int tp;           /* tensor parallel factor */
    int sp, sp_index; /* sequence parallel factor, this rank's part */
    int fsdp;         /* gather each block's weights before it runs */
} ka_par;

/* A named input or output of the forward. Symbol 0 is the batch: every
 * input and output has it as its first dimension (CFG parallel splits it). */
typedef struct ka_io {
    const char *name;
    int ndim;
} ka_io;

typedef struct ka_arch {
    const char *name;      /* "sd3": the family's name in package folders, caches, `kiln info` */
    const char *title;     /* what it is, for people: "SD3 / SD3.5 MMDiT (SD3Transformer2DModel)" */
    const char *component; /* its diffusers subfolder ("transformer") */
    const char *weights_file; /* the file its library saves: NULL diffusers' diffusion_pytorch_model.safetensors,
                               * "model.safetensors" for transformers' models */
    size_t config_size;

    /* ---- config: parse (missing keys take the reference's defaults),
     * validate (a message naming the key), to JSON (the one form caches and
     * packages key on), and infer from tensor shapes (NULL: a config.json is
     * required). claims: does this config.json describe the family
     * (_class_name, architectures); the first family that claims it opens it. */
    int (*claims)(const char *config_json);
    kiln_status (*config_parse)(const char *json, void *cfg);
    kiln_status (*config_validate)(const void *cfg);
    char *(*config_to_json)(const void *cfg);
    kiln_status (*config_infer)(const kc_checkpoint *c, void *cfg);

    /* ---- weights: every tensor the config needs, in a stable order (the
     * cache's order); split and block set for every entry. Caller frees. */
    kiln_status (*weight_spec)(const void *cfg, ka_spec **out, size_t *n);
    /* the original single-file names (NULL: diffusers names only) */
    const kc_renamer *renamer;
    /* the layers --quant quantizes by default (patterns as kiln_open_opts.quant_layers) */
    const char *quant_layers;
    /* seeded weights (kiln_write_seeded_model): fill a tensor that is not
     * random noise (a position table); 0 = not special (NULL: none is) */
    int (*seed_tensor)(const void *cfg, const char *name, float *v, size_t n);

    /* ---- the forward: its symbolic dimensions, named inputs and outputs */
    int nsym;
    const char *sym[KA_MAX_SYMS];
    const char *sym_doc[KA_MAX_SYMS]; /* what each is, for --help ("latent height / patch size") */
    int n_in, n_out;
    ka_io in[KA_MAX_IO], out[KA_MAX_IO];
    /* the outputs of a config when they depend on it (every layer's hidden
     * state): fills out[] (names pointing into names[]) and returns their
     * count, at most KA_MAX_OUT; NULL: the static list above */
    int (*outputs)(const void *cfg, ka_io *out, char (*names)[48]);
    /* the shapes of every input and output for symbol values s (out has
     * room for KA_MAX_OUT) */
    void (*io_shapes)(const void *cfg, const int64_t *s, int64_t in[][4], int64_t out[][4]);
    /* the symbol values of input shapes in[n_in][4] (the caller then checks
     * every input against io_shapes); an impossible shape is an error naming it */
    kiln_status (*solve)(const void *cfg, const int64_t (*in)[4], int64_t *s);
    /* symbol values the model can run (ranges, multiples), named in the message */
    kiln_status (*check)(const void *cfg, const int64_t *s);
    /* the example compile traces and --capture checks when none is given */
    void (*example)(const void *cfg, int64_t *s);
    /* the example from kiln_compile_opts' height, width, context_len (NULL:
     * the family takes none; batch is symbol 0's for every family) */
    kiln_status (*example_opts)(const void *cfg, const kiln_compile_opts *o, int64_t *s);
    /* values of input k for the example (seeded: deterministic) */
    void (*example_input)(const void *cfg, int k, float *x, size_t n);
    /* can this config run split this way? (NULL: only unsplit) */
    kiln_status (*check_parallel)(const void *cfg, int tp, int sp);
    /* build the forward graph for symbol values s (par NULL: one process);
     * inputs in the order of `in`, outputs in the order of `out` */
    kiln_status (*build)(const void *cfg, kg_graph *g, const int64_t *s, const ka_par *par);
} ka_arch;

/* The families kiln knows, in the order they are asked to claim a config. */
int ka_count(void);
const ka_arch *ka_at(int i);
const ka_arch *ka_find(const char *name);
/* Add a family (its table must outlive every model of it); refused when
 * its name is taken or the table lacks a function every family needs. */
kiln_status ka_register(const ka_arch *a);
/* The family that claims a config.json; one that names a class no family
 * claims (_class_name, architectures) is NULL with the error naming it; one
 * that names none goes to the first family (SD3's configs predate
 * _class_name). */
const ka_arch *ka_for_config(const char *config_json);
/* The renamers of every family, NULL-terminated (kc_open tries each). */
const kc_renamer *const *ka_renamers(void);

/* ---- graph building the diffusion transformers share (SD3, Flux) ---- */
/* the linear layer named by fmt with %d = i (weights NAME.weight, NAME.bias) */
kg_id ka_linear_fmt(kg_graph *g, kg_id x, const char *fmt, int i);
/* the same as a row-parallel linear of tensor parallel (par NULL or tp 1:
 * plain): partial sums all-reduced, rank 0's shard holding the bias */
kg_id ka_row_linear_fmt(kg_graph *g, const ka_par *par, kg_id x, const char *fmt, int i);
/* the weight named by fmt with %d = i */
kg_id ka_weight_fmt(kg_graph *g, const char *fmt, int i);

/* The shapes one of tp ranks holds of a full spec (by each entry's split). */
void ka_shard_spec(int tp, ka_spec *spec, size_t n);
/* Append a spec entry (grows *s; returns the entry, or NULL out of memory). */
ka_spec *ka_spec_add(ka_spec **s, size_t *n, size_t *cap, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Input i's shape agrees with the family's shapes for s; else a message
 * naming the input, its shape and the one expected. */
kiln_status ka_check_inputs(const ka_arch *a, const void *cfg, const int64_t (*in)[4], const int64_t *s,
                            const char *who);
/* The element count of shape (ndim dims), 0 on overflow of size_t. */
size_t ka_numel(int ndim, const int64_t *shape);
/* the shape a spec's tensor has once converted (the checkpoint's but for an up2 conv weight) */
void ka_stored_shape(const ka_spec *s, int64_t out[4]);


/* ---- config.json, as every family's parser reads it (config_json.c) ----
 * Absent or null keys keep the default; a refusal is KILN_ERR_CONFIG naming
 * the key and what it must be. */
/* the parsed object (caller cJSON_Delete), else KILN_ERR_FORMAT */
kiln_status ka_json_object(const char *json, cJSON **root);
/* an integer (was_null, may be NULL: set when absent or null) */
kiln_status ka_json_int(const cJSON *root, const char *key, int *out, int *was_null);
typedef struct ka_int_key {
    const char *key;
    int *field;
} ka_int_key;
kiln_status ka_json_ints(const cJSON *root, const ka_int_key *keys, size_t n);
kiln_status ka_json_bool(const cJSON *root, const char *key, int *out);
/* does transformers' "architectures" list name cls */
int ka_json_lists_arch(const cJSON *root, const char *cls);
/* a finite number (present, may be NULL: 0 when absent or null) */
kiln_status ka_json_num(const cJSON *root, const char *key, double *out, int *present);
/* add key: v to o in the fewest digits that parse back to v exactly (cJSON's
 * own printing keeps 15 where its loose comparison calls them equal, so a
 * large value came back another double); null where v is not finite.
 * NULL when out of memory. */
cJSON *ka_json_add_num(cJSON *o, const char *key, double v);

#endif
