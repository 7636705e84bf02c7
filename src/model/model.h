/* model.h - what a kiln_model holds: its family (the architecture table,
 * src/arch/), its config (opaque, the family's), the compute weights by
 * name (sorted), plus what `kiln info` reports. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "format/checkpoint.h"
#include "kernels/kernels.h"
#include "kiln.h"
#include "arch/arch.h"
#include "compile/compile.h"

#include <pthread.h>

struct kk_backend;

typedef struct km_weight {
    char *name;
    int ndim;
    int64_t shape[4];
    kiln_dtype src_dtype; /* as stored in the checkpoint */
    float *data;          /* f32, 64-byte aligned; owned unless the model maps a cache;
                           * NULL for a linear weight that only exists packed */
    void *packed;         /* the fast GEMM's layout (owned unless mapped), or NULL */
    size_t packed_bytes;
    kiln_dtype packed_dtype; /* F32, BF16 or quantized I8 / F8_E4M3 (kk_weight) */
    char layout[40];      /* "rowmajor" or the packed layout's name */
    kk_weight kw;         /* what the kernels see: the backend's view of data and packed (kk_buf_map) */
    const float *view;    /* the backend's view of data (data itself where its memory is the host's) */
    void *dev_f32, *dev_packed; /* the backend's copies of data and packed (owned; NULL on the host) */
    /* FSDP (shard.c): this rank's byte range of a block weight; data/packed
     * point into the model's block workspace, filled by a gather */
    int fsdp, block;
    const void *part;
    size_t part_bytes, full_bytes;
} km_weight;

struct kcache_entry;

/* How a model computes: GEMM/attention precision and which kernels. */
typedef struct km_compute {
    kiln_dtype dtype; /* F32 or BF16 */
    const kk_backend *be; /* the backend that runs it (kk_backend_get), and whose weights the cache holds */
    int tp, tp_index; /* tensor parallel: this rank holds shard tp_index of tp (0, 0: all) */
    int fsdp, fsdp_index; /* FSDP: block weights split in fsdp byte ranges, this rank holds one */
    kiln_quant quant; /* quantized linear layers (src/model/quant.c) */
    const ka_arch *family; /* open as this family, not the claiming one (NULL: that one) */
    char quant_layers[256]; /* their name patterns; "" until the family is known: its default */
    int quant_default;      /* the family's default patterns (not named by the caller) */
} km_compute;

struct kx_package;

/* the steps of the execution chain, in their default order; a step is a
 * package step when it is below KM_STEP_PLANNED */
enum { KM_STEP_DYNAMIC, KM_STEP_FIXED, KM_STEP_PLANNED, KM_STEP_EAGER, KM_MAX_STEPS };

/* How forwards run (src/model/exec.c): the fallback chain, the packages
 * opened so far (manifests only until first used) and the planned
 * executor's arena. One forward at a time per model. */
typedef struct km_exec {
    int chain[KM_MAX_STEPS], n_steps;
    char *package_dir;         /* NULL: $KILN_PACKAGE_DIR, else <cache root>/packages */
    char *cache_root;          /* from the load options, for the default package folder */
    struct kx_package **pkgs;
    int n_pkgs;
    void *arena;               /* planned executor */
    size_t arena_bytes;
    /* the planned executor's shape constants (kg_shape_consts: a position
     * table cropped to the last shape), made once per shape, not every
     * forward */
    kx_consts consts;
    const char *last;          /* the step that ran the last forward */
    /* why the last forward skipped a package it had ("dynamic: batch ...
     * outside the package's range"), "" when none was skipped
     * (kiln_model_exec_note) */
    char note[1024];
    /* the first failure to compile a fixed-shape package (a read-only
     * package folder, no compiler): later forwards do not try again, so it
     * is warned about once, not on every step */
    char fixed_fail[512];
    int compile;               /* compile a fixed-shape package for a shape none covers (kiln_model_set_compile) */
    kg_dist dist;              /* on a mesh: what the collectives of every executor use */
    char family[256];          /* the package family folder (exec.c), made on first use */
    /* kiln_run's buffers for the outputs a call does not ask for (every
     * executor writes all of them), kept from call to call: fresh ones
     * each call were ~3,000 page faults a CLIP-G encode (35 unasked hidden
     * states of [1,77,1280]). spare_n: floats each holds. Taken out under
     * lock for one call, so concurrent calls never share them. */
    float *spare[KA_MAX_OUT];
    size_t spare_n[KA_MAX_OUT];
    pthread_mutex_t lock;
} km_exec;

struct kiln_model {
    const ka_arch *arch; /* the family */
    void *cfg;           /* its config (arch->config_size bytes, owned) */
    int n_out;           /* the config's outputs (km_bind_outputs) */
    ka_io out[KA_MAX_OUT];
    char out_names[KA_MAX_OUT][48];
    km_compute compute;
    km_weight *w; /* sorted by name */
    size_t nw;
    kiln_model_info info;
    char layout[32];
    const struct kk_backend *backend;
    struct kcache_entry *cache; /* when set, weights point into its mapping */
    struct kd_mesh *mesh;       /* a parallel run: this rank's place and groups (owned) */
    void *fsdp_ws;              /* FSDP: the gathered weights of one block (owned) */
    char origin[16];            /* "hit", "miss", "rebuilt", "no-cache", "open" */
    char *cache_path;
    char *registry_key;         /* set while the model is in the loaded-models registry */
    int refs;
    km_exec exec;
};

const km_weight *km_find(const kiln_model *m, const char *name);
/* kg_resolver over the model's weights (user = the model) */
int km_resolve(void *user, const char *name, int *ndim, int64_t shape[4], const float **data,
               const kk_weight **kw);
/* A model from a checkpoint: config from its config.json (or inferred),
 * every tensor checked against the config and converted to f32. */
kiln_status km_from_checkpoint(const kc_checkpoint *c, const char *config_label, km_compute cp,
                               kiln_model **out);
/* A model whose weights are the mapped tensors of a cache entry (taken over). */
kiln_status km_from_cache(struct kcache_entry *e, km_compute cp, kiln_model **out);
/* Resolve defaults and check a compute choice: the backend named (NULL:
 * $KILN_BACKEND, else "cpu"; reference: "reference") in dtype; falls back
 * (with a log line) from BF16 to F32 where the CPU has no bf16 GEMM. */
kiln_status km_compute_resolve(kiln_dtype dtype, int reference, const char *backend, km_compute *out);
/* The cache key's layout part for a compute choice ("" for f32 row-major weights). */
const char *km_compute_layout(km_compute cp);
/* kiln_compile without the quality gate, which its caller runs first
 * (kiln_compile, src/sample/quality.c); quality_rel_l2 is the gate's
 * result to record (-1: not measured). */
kiln_status km_compile(kiln_model *m, const kiln_compile_opts *o, double quality_rel_l2, kiln_compile_result *res);
/* Set up / tear down a model's execution state (exec.c). */
void km_exec_init(kiln_model *m);
void km_exec_free(kiln_model *m);
/* A forward in the family's terms: inputs in the order of arch->in with
 * their shapes (checked against the family's), outputs in the order of
 * m->out (each holding the family's shape for the solved symbols). The
 * inputs are scanned for NaN/Inf first and the outputs after, named by who
 * ("kiln_run"). On a mesh: this rank's part. */
kiln_status km_run(kiln_model *m, const int64_t (*in_shape)[4], const float *const *in, float *const *out, const char *who);
/* The symbol values and output shapes of input shapes (checked). */
kiln_status km_solve(const kiln_model *m, const int64_t (*in_shape)[4], int64_t *s, int64_t (*out_shape)[4], const char *who);
/* The fallback chain for solved symbols (no checks; exec.c). */
kiln_status km_exec_run(kiln_model *m, const int64_t *s, const float *const *in, float *const *out);
/* The planned executor's arena for solved symbols s: the activations a
 * forward of that shape holds at its peak (a package's plan is the same),
 * planned without running (the sampler's micro-batches are sized by it). */
kiln_status km_exec_arena_bytes(kiln_model *m, const int64_t *s, size_t *bytes);
/* km_exec_run on a mesh: CFG parallel splits dim 0 (the batch, symbol 0)
 * of every input and output across its group (forward_dist.c). */
kiln_status km_exec_run_dist(kiln_model *m, const int64_t *s, const float *const *in, float *const *out);
/* Tensor parallel: cut one converted f32 weight down to shard index of tp
 * by its spec's split rule (before packing; shard.c); n_params (may be
 * NULL) loses what other ranks hold. */
kiln_status km_shard_weight(km_weight *w, int split, int tp, int index, int64_t *n_params);
/* A model without weights yet from a checkpoint: its family, config and
 * outputs, and the full weight spec, every tensor checked against it
 * (exact names and shapes). */
kiln_status km_prepare(const kc_checkpoint *c, const char *config_label, km_compute cp, kiln_model **m,
                       ka_spec **spec, size_t *ns);
/* One spec tensor as the kernels consume it: read as f32, this rank's
 * tensor-parallel shard, packed (quantized) for the fast GEMM; w owns its
 * buffers (km_weight_free); n_params (may be NULL) counts it. */
kiln_status km_convert_tensor(const kc_checkpoint *c, const ka_spec *s, const km_compute *cp, km_weight *w,
                              int64_t *n_params);
void km_weight_free(km_weight *w);
/* FSDP (shard.c). Byte range [*off, *off + *len) of part j of n of a weight of full bytes. */
void km_fsdp_range(size_t full, int n, int j, size_t *off, size_t *len);
/* A mapped cache tensor t as this rank's part of spec weight s. */
kiln_status km_fsdp_map(km_weight *w, const ka_spec *s, const struct kcache_entry *e, size_t i, km_compute cp);
/* After the weights are mapped and sorted: the block workspace. */
kiln_status km_fsdp_finish(kiln_model *m);
/* Gather the weights of one block (kg_dist.fsdp_gather; user = the model). */
void km_fsdp_gather(void *user, int block);
/* Add a quantization scheme to a resolved compute choice (checks that this
 * build and CPU can run it; layers NULL: the family's default patterns,
 * filled in by km_compute_for_arch). */
kiln_status km_compute_set_quant(km_compute *cp, kiln_quant q, const char *layers);
/* The family's default quantized layers, where the caller named none. */
void km_compute_for_arch(km_compute *cp, const ka_arch *a);
/* The packed dtype of a linear weight (by its name) under cp: the compute
 * dtype, or I8 / F8_E4M3 when the scheme quantizes its layer. */
kiln_dtype km_pack_dtype(const km_compute *cp, const char *weight_name);
/* The same for a spec entry: F32 for one the family keeps at f32 (keep_f32). */
kiln_dtype km_spec_dtype(const km_compute *cp, const ka_spec *s);
/* The scheme's part of the cache key: "" (none), "int8", "fp8", with
 * "-l<hex>" for layer patterns the caller named and "-brokenscales" under
 * the test hook KILN_TEST_BREAK_QUANT_SCALES. */
void km_quant_tag(const km_compute *cp, char *buf, size_t cap);
/* The family of a config.json (NULL text: the default family; force: this
 * one, whatever claims it) and a config parsed by it (malloc'd,
 * arch->config_size bytes). */
kiln_status km_config_parse(const char *json, const ka_arch *force, const ka_arch **arch, void **cfg);
/* The family named by an open option (NULL name: none; an unknown name is
 * an error listing the families). */
kiln_status km_family_named(const char *name, const ka_arch **out);
/* Write a seeded model of a family as a diffusers folder (seeded.c). */
kiln_status km_write_seeded(const ka_arch *a, const void *cfg, const char *dir, uint64_t seed, kiln_dtype dtype);
/* The outputs of the model's config (arch->outputs, else the static list). */
kiln_status km_bind_outputs(kiln_model *m);
/* Free a model for real (the registry calls this at refcount 0). */
void km_destroy(kiln_model *m);

/* ---- the SD3 calls of the public API (sd3_api.c): thin wrappers ------------ */

/* kiln_forward's body without the checks: km_exec_run of the SD3 inputs. */
kiln_status km_forward(kiln_model *m, const kiln_forward_args *a, float *out);
/* km_exec_arena_bytes of an SD3 forward of batch B, latent H x W, context T. */
kiln_status km_forward_bytes(kiln_model *m, int64_t B, int64_t H, int64_t W, int64_t T, size_t *bytes);
/* The largest batch and context length a forward or a sampler takes: far
 * beyond real use (SD3 runs batch 2 with CFG and 333 context tokens), small
 * enough that no size computed from them overflows before an allocation. */
#define KM_MAX_BATCH 1024
#define KM_MAX_CONTEXT 65536
/* Element counts of an SD3 forward's buffers, after checking every size
 * against its limit (batch, context length; latent H, W by
 * sd3_check_latent) and every product for overflow. Messages name the size
 * and its limit. */
typedef struct km_sizes {
    size_t hidden, context, pooled, timestep, out; /* [B,C,H,W] [B,T,J] [B,P] [B] [B,Co,H,W] */
} km_sizes;
kiln_status km_check_sizes(const kiln_config *c, int64_t batch, int64_t height, int64_t width,
                           int64_t context_len, km_sizes *out);

#endif
