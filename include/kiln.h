/*
 * kiln.h - the one public header of libkiln.
 *
 *     kiln_load_opts lo = kiln_load_defaults();         // through the weight cache:
 *     lo.model_name = "sd3"; lo.source = "sd3/transformer"; // converted once, then mapped
 *     kiln_model *m;
 *     if (kiln_load_model(&lo, &m) != KILN_OK)            // cache root: $KILN_CACHE_DIR
 *         fprintf(stderr, "%s\n", kiln_last_error());
 *     kiln_generate_opts o = kiln_generate_defaults();   // fill o.cond, o.latent_h/w ...
 *     kiln_generate(m, &o, latents);  kiln_model_free(m);
 *
 * Build: cc app.c $(pkg-config --cflags --libs kiln); docs/api.md, examples/embed.c.
 *
 * Every function that can fail returns a kiln_status and leaves a message for
 * kiln_last_error() (per thread). Bad input never aborts the process.
 * Handles are opaque; options are plain structs filled from *_defaults().
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What libkiln.so exports: the library is built with -fvisibility=hidden and
 * only these declarations are visible (plus a linker version script that
 * keeps kiln_* alone). */
#if defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#define KILN_VERSION "0.1.0" /* the header's version; kiln_version() gives the library's */
#define KILN_MAX_DIMS 8

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARG,  /* a caller passed something impossible */
    KILN_ERR_IO,           /* open/read/write/mmap failed */
    KILN_ERR_FORMAT,       /* a file is malformed (safetensors, JSON, ...) */
    KILN_ERR_CONFIG,       /* a model config holds impossible values */
    KILN_ERR_MISSING,      /* expected tensors/keys are absent */
    KILN_ERR_UNEXPECTED,   /* tensors that the model does not know */
    KILN_ERR_SHAPE,        /* a tensor or input has the wrong shape */
    KILN_ERR_DTYPE,        /* a dtype that is known but not usable here */
    KILN_ERR_RANGE,        /* a size outside what the model supports */
    KILN_ERR_NOMEM,        /* allocation failed */
    KILN_ERR_UNSUPPORTED,  /* a feature that this build does not have */
    KILN_ERR_CACHE_MISSING,/* no complete cache under the key and no source to build it */
    KILN_ERR_CORRUPT,      /* a cache or package failed its size or checksum checks */
    KILN_ERR_NONFINITE,    /* a NaN or Inf in an input, or a forward / step that produced one */
    KILN_ERR_UNTRUSTED,    /* a cache another user could have written (docs/trust.md) */
} kiln_status;

/* The message of the last failure on this thread ("" if none). */
KILN_API const char *kiln_last_error(void);
/* A stable short name for a status ("format", "missing", ...). */
KILN_API const char *kiln_status_name(kiln_status s);

/* Element types. The first ones are safetensors' names; kiln computes in f32. */
typedef enum kiln_dtype {
    KILN_DTYPE_INVALID = 0,
    KILN_F32, KILN_F16, KILN_BF16, KILN_F64,
    KILN_F8_E4M3, KILN_F8_E5M2,
    KILN_I8, KILN_U8, KILN_I16, KILN_U16, KILN_I32, KILN_U32, KILN_I64, KILN_U64,
    KILN_BOOL,
    KILN_DTYPE_COUNT
} kiln_dtype;

KILN_API const char *kiln_dtype_name(kiln_dtype t);  /* "F32", "BF16", ... */
KILN_API size_t kiln_dtype_size(kiln_dtype t);       /* bytes per element; 0 if invalid */

/* ---- model ------------------------------------------------------------ */

/* Quantized backbones (off by default): the selected linear layers' weights
 * are quantized once, at conversion, per output channel; the weight cache
 * stores them quantized and its key records the scheme.
 *   KILN_QUANT_INT8  symmetric int8 weights, activations quantized per token
 *                    at run time, s8 x s8 GEMM with int32 accumulation, the
 *                    dequantization fused with bias and activation
 *   KILN_QUANT_FP8   e4m3 weights (half the bytes of bf16), decoded and
 *                    computed as bf16
 * Needs the fast backend (not `reference`); FP8 needs a bf16 GEMM. */
typedef enum kiln_quant { KILN_QUANT_NONE = 0, KILN_QUANT_INT8, KILN_QUANT_FP8 } kiln_quant;
KILN_API const char *kiln_quant_name(kiln_quant q); /* "none", "int8", "fp8" */

/* Which linear layers a scheme quantizes, by layer name (the weight's name
 * without ".weight"): comma-separated fnmatch(3) patterns, "!" before one
 * excludes. A layer is quantized when it matches a pattern and no excluding
 * one. The default is the model family's (kiln_family_quant_layers): for
 * SD3, every linear of the transformer blocks except the modulations;
 * embedders, norm_out and proj_out stay bf16. */
KILN_API const char *kiln_family_quant_layers(const char *family); /* NULL: no such family */
/* What a family ("sd3", "clip", "t5", "vae-decoder", ...) is, for people:
 * "SD3 / SD3.5 MMDiT (SD3Transformer2DModel)"; NULL: no such family. */
KILN_API const char *kiln_family_title(const char *family);

typedef struct kiln_model kiln_model;

/* The architecture read from config.json (diffusers keys) or inferred from a
 * single-file checkpoint. */
typedef struct kiln_config {
    int sample_size;
    int patch_size;
    int in_channels, out_channels;
    int num_layers;
    int attention_head_dim, num_attention_heads;
    int joint_attention_dim;
    int caption_projection_dim;
    int pooled_projection_dim;
    int pos_embed_max_size;
    int qk_norm_rms;               /* qk_norm == "rms_norm" */
    uint64_t dual_attention_mask;  /* bit i: block i has attn2 (SD3.5) */
} kiln_config;

typedef struct kiln_open_opts {
    /* For a single-file checkpoint: a diffusers config.json to use instead of
     * inferring the architecture from tensor shapes. NULL: infer. */
    const char *config_path;
    /* Compute precision of the GEMMs and attention: KILN_BF16 (the default,
     * also when 0: f32 accumulation; falls back to F32 on CPUs without
     * AVX-512 BF16) or KILN_F32 (matches diffusers to ~1e-5). Everything
     * else is computed in f32. */
    kiln_dtype dtype;
    /* Run the reference kernels (the test oracle: plain loops, double sums). */
    int reference;
    /* Quantized linear layers (KILN_QUANT_NONE: off) and which ones
     * (NULL: KILN_QUANT_DEFAULT_LAYERS). */
    kiln_quant quant;
    const char *quant_layers;
    /* Open as this model family ("vae-encoder": the encoder half of a VAE
     * folder) instead of the one that claims the config; NULL: that one. */
    const char *family;
    /* The backend that runs it (kiln_backends(): "cpu", "reference",
     * "check"); NULL: $KILN_BACKEND, else "cpu" ("reference" with
     * reference set). */
    const char *backend;
} kiln_open_opts;

/* Open a diffusers model folder (config.json + weights, sharded or not) or a
 * single safetensors checkpoint (diffusers names or the original SD3 names).
 * opts may be NULL. */
KILN_API kiln_status kiln_model_open(const char *path, const kiln_open_opts *opts, kiln_model **out);
KILN_API void kiln_model_free(kiln_model *m);
/* An SD3 model's config (NULL for a model of another family:
 * kiln_model_config_json works for every family). */
KILN_API const kiln_config *kiln_model_config(const kiln_model *m);

typedef struct kiln_model_info {
    int64_t n_params;
    int64_t n_tensors;
    int64_t bytes_on_disk;           /* all weight files together */
    int64_t n_by_dtype[KILN_DTYPE_COUNT]; /* tensors per stored dtype */
    const char *layout;              /* "diffusers" or "sd3-single-file" */
    int64_t weight_bytes;            /* the weights as held for the kernels (packed, quantized) */
    int64_t n_quantized;             /* linear weights stored quantized */
    int64_t quantized_bytes;         /* their bytes (scales included) */
} kiln_model_info;
KILN_API kiln_status kiln_model_get_info(const kiln_model *m, kiln_model_info *out);

/* ---- any model by named tensors ----------------------------------------
 * Every model belongs to a family (its architecture: "sd3", ...) that names
 * its inputs and outputs. kiln_run takes every input once, by name, as F32
 * (kiln_tensor); the shapes solve the family's dimensions and each is
 * checked (a message names the input, its shape and the one expected).
 * Outputs are asked for by name; each gets its shape, and its data is
 * written when every output's data is set (capacity: floats it holds).
 * With a data pointer left NULL, kiln_run only fills the shapes. Outputs
 * not asked for are computed and dropped. */
struct kiln_tensor; /* below, with the tensor files */
typedef struct kiln_output {
    const char *name;
    float *data;
    size_t capacity;
    int ndim;                      /* set by kiln_run */
    int64_t shape[KILN_MAX_DIMS];  /* set by kiln_run */
} kiln_output;
KILN_API kiln_status kiln_run(kiln_model *m, const struct kiln_tensor *in, size_t n_in, kiln_output *out, size_t n_out);
KILN_API const char *kiln_model_family(const kiln_model *m);
/* The model's config as its family writes it (malloc'd JSON; free()). */
KILN_API char *kiln_model_config_json(const kiln_model *m);
KILN_API int kiln_model_n_inputs(const kiln_model *m);
KILN_API int kiln_model_n_outputs(const kiln_model *m);
KILN_API const char *kiln_model_input_name(const kiln_model *m, int i);  /* NULL past the end */
KILN_API const char *kiln_model_output_name(const kiln_model *m, int i);

/* ---- the SD3 backbone's calls ---------------------------------------- */

/* One backbone call. Shapes: hidden [B,C,H,W], context [B,T,joint_attention_dim],
 * pooled [B,pooled_projection_dim], timestep [B] (0..1000); out [B,out_channels,H,W].
 * H and W must be multiples of patch_size and H/p, W/p <= pos_embed_max_size. */
typedef struct kiln_forward_args {
    int batch, height, width, context_len;
    const float *hidden, *context, *pooled, *timestep;
} kiln_forward_args;
KILN_API kiln_status kiln_forward(kiln_model *m, const kiln_forward_args *a, float *out);

/* ---- ahead-of-time compiled packages (docs/package.md) ------------------
 * kiln_compile exports the backbone with symbolic dimensions, generates C,
 * builds it with $KILN_CC (default cc) into a weightless package and
 * publishes it under the package folder: $KILN_PACKAGE_DIR, else
 * <cache root>/packages. kiln_forward then runs, step by step, whichever
 * of these works first (each fallback logged with its reason):
 *   dynamic  a package whose ranges cover the shape
 *   fixed    a fixed-shape package for this exact shape, compiled on demand
 *            when this model has been compiled here before
 *   planned  the in-process planned executor (one arena, no compiler)
 *   eager    op by op
 * All four compute the same function with the same kernels. */
typedef struct kiln_compile_opts {
    /* The family's symbols (`kiln compile --help` lists them; symbol 0 is
     * the batch). Each is "name=min:max" (dynamic) or "name=value"
     * (static), comma-separated; symbols not named are static at the
     * example's value. */
    const char *dims;
    int batch;                           /* the example's batch; 0 = the family's */
    int height, width, context_len;      /* an SD3 backbone's example; 0 = default
                                          * (latent 64 or the largest the position
                                          * table allows, 333 context tokens) */
    int whole_graph;         /* 0: regional (each block kind emitted once) */
    int capture;             /* run the example eagerly and refuse to publish a
                              * package that does not reproduce it */
    const char *package_dir; /* NULL: the default folder above */
    /* A quantized model (kiln_load_opts.quant) is compiled only after the
     * quality gate (kiln_quality_check) passes against its unquantized twin
     * quality_base; max_rel_l2 0 = KILN_QUALITY_MAX_REL_L2. force publishes
     * without the gate or despite it. */
    kiln_model *quality_base;
    double max_rel_l2;
    int force;
} kiln_compile_opts;
KILN_API kiln_compile_opts kiln_compile_defaults(void);

typedef struct kiln_compile_result {
    char path[1024];   /* the package folder */
    int reused;        /* an identical package was already published */
    int block_kinds, regions, nodes;
    double seconds, cc_seconds;
    size_t so_bytes, arena_bytes;
    double capture_rel_err; /* with capture: relative L2 against eager */
    double quality_rel_l2;  /* quantized: the gate's final-latent error (-1: not measured) */
} kiln_compile_result;
KILN_API kiln_status kiln_compile(kiln_model *m, const kiln_compile_opts *o, kiln_compile_result *r);

/* The execution chain, e.g. "dynamic,fixed,planned,eager" (the default, or
 * $KILN_EXEC) or "eager" to restore the op-by-op forward. */
KILN_API kiln_status kiln_model_set_exec(kiln_model *m, const char *chain);
/* The package folder to look in and publish to (NULL: the default). */
KILN_API kiln_status kiln_model_set_package_dir(kiln_model *m, const char *dir);
/* on: a forward whose shape no package covers compiles a fixed-shape package
 * for it first (the fixed step of the chain), so a later process starts from
 * packages for every shape this one ran; off (default): only once the model
 * has been compiled here before (kiln_compile). */
KILN_API kiln_status kiln_model_set_compile(kiln_model *m, int on);
/* Read the manifests of this model's packages now (nothing is loaded or
 * run: safe in a parent before fork; each child loads and binds the shared
 * object on its first forward). *n receives how many are open. */
KILN_API kiln_status kiln_model_open_packages(kiln_model *m, int *n);
/* Which step ran the last forward: "dynamic", "fixed", "planned", "eager". */
KILN_API const char *kiln_model_last_exec(const kiln_model *m);
/* Why the last forward did not run an earlier step of the chain that it had
 * a package for, or whose step failed, e.g. "dynamic: tokens = 77 (from
 * input_ids dimension 1) is outside the package's range [256, 256]"; "" when nothing was skipped that way. */
KILN_API const char *kiln_model_exec_note(const kiln_model *m);

/* ---- the weight cache: convert once, map everywhere -------------------- */

/* One parallel dimension: a factor (1 = off) and the mesh axis it runs on. */
typedef struct kiln_par_dim {
    int factor;
    int axis;
} kiln_par_dim;

typedef struct kiln_parallel {
    kiln_par_dim cfg; /* CFG parallel: uncond and cond halves on different ranks */
    kiln_par_dim tp;  /* tensor parallel */
    kiln_par_dim sp;  /* sequence parallel */
} kiln_parallel;

/* A tensor handed to a source callback's emit(); data is copied. */
typedef struct kiln_source_tensor {
    const char *name; /* diffusers name (or original SD3 name) */
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    const void *data;
} kiln_source_tensor;
typedef kiln_status (*kiln_emit_fn)(void *ctx, const kiln_source_tensor *t);
/* Yields every tensor through emit(ctx, t); returns KILN_OK or an error. */
typedef kiln_status (*kiln_source_fn)(void *user, kiln_emit_fn emit, void *ctx);

typedef struct kiln_load_opts {
    const char *model_name;  /* cache folder name, e.g. "sd3-medium" (required with a cache) */
    const char *component;   /* diffusers subfolder, default "transformer" */
    kiln_parallel parallel;
    int mesh_rows, mesh_cols;/* default 1 x 1 */
    kiln_dtype dtype;        /* compute precision, BF16 (default) or F32: what the cache stores */
    int reference;           /* reference kernels, f32 row-major weights (the oracle) */
    kiln_quant quant;        /* quantized linear layers (off by default; part of the key) */
    const char *quant_layers;/* NULL: the family's default (part of the key) */
    int fsdp;                /* weights sharded across ranks (key flag) */
    int no_create_cache;     /* do not publish on a miss */
    const char *cache_root;  /* NULL: $KILN_CACHE_DIR; NULL and unset: no cache */
    int verify;              /* check every tensor's hash on a hit */
    /* hosts: set host_coords to key a run spanning several hosts by the mesh
     * rows r0..r1 and columns c0..c1 that this host owns */
    int host_coords, host_r0, host_r1, host_c0, host_c1;
    /* the source, touched only on a miss: a checkpoint path ... */
    const char *source;
    const char *config_path; /* config.json for a single file (optional) */
    /* ... or a callback, with its config.json text and an identity string
     * (e.g. a version or content hash) that goes into the cache key */
    kiln_source_fn source_fn;
    void *source_user;
    const char *source_config_json;
    const char *source_id;
    /* as kiln_open_opts.family: a family that reads the same weights (its
     * weight list is the claiming family's, so both map one cache) */
    const char *family;
    /* Progress of a pipeline's components (kiln_pipeline_open, kiln_sd3_text_open):
     * called before each loads (seconds < 0, origin NULL) and after it
     * (kiln_model_origin: "hit", "miss: ...", seconds taken); may be NULL. */
    void (*on_component)(void *user, const char *component, const char *origin, double seconds);
    void *component_user;
    /* one component of a file that holds several (an all-in-one SD3 file):
     * only the tensors under this name prefix ("first_stage_model."), the
     * prefix stripped; it is part of the source's identity. NULL: all */
    const char *source_prefix;
    /* config.json text for the source (wins over config_path); part of the
     * source's identity. NULL: none */
    const char *source_config_text;
    /* as kiln_open_opts.backend (the cache holds the weights it reads: the
     * reference and check backends share f32 row-major ones) */
    const char *backend;
    /* where the model's packages are compiled and looked up
     * (kiln_model_set_package_dir); NULL: packages/ under the cache root.
     * A pipeline's components all use it. */
    const char *package_dir;
} kiln_load_opts;

KILN_API kiln_load_opts kiln_load_defaults(void);

/* The load flow. A model already loaded under the same key is returned again
 * (reference counted; kiln_model_free releases it). With a complete cache it
 * is mapped, with no conversion; without one it is converted from the source
 * and published atomically (unless no_create_cache). Errors: KILN_ERR_CACHE_MISSING
 * (no complete cache and no source; the message has the path looked at) and
 * KILN_ERR_INVALID_ARG (no cache root and no source: how to set one). */
KILN_API kiln_status kiln_load_model(const kiln_load_opts *o, kiln_model **out);

/* Where a load found its weights: "hit", "miss", "rebuilt" or "no-cache". */
KILN_API const char *kiln_model_origin(const kiln_model *m);
/* The cache folder the model was mapped from or published to ("" if none). */
KILN_API const char *kiln_model_cache_path(const kiln_model *m);

/* Multi-process runs: called after the cache check and after the publish
 * (the default does nothing). A model on a mesh meets at MPI_Barrier instead. */
KILN_API void kiln_set_barrier(void (*fn)(void *user), void *user);

/* ---- parallel runs on a mesh of ranks (docs/distributed.md) ------------ */
/* kiln_load_model with mesh_rows x mesh_cols > 1 (or parallel factors > 1,
 * which then span the mesh) runs under MPI (mpirun -np R, R = rows * cols):
 * every rank loads and caches only its own shard, and every rank must then
 * make the same kiln_forward / kiln_generate calls with the same inputs.
 * Needs a build with MPI (KILN_ERR_UNSUPPORTED otherwise). MPI is
 * initialised on the first such load (and finalised at exit) unless the
 * caller did it first; a single process never touches MPI. */
/* 1 when this build has MPI. */
KILN_API int kiln_dist_available(void);
/* This process's rank and the number of ranks: 0 and 1 unless MPI is
 * running (kiln_dist_init, or a load on a mesh, started it). */
KILN_API int kiln_dist_rank(void);
KILN_API int kiln_dist_size(void);
/* Start MPI now (e.g. to know the rank before loading). */
KILN_API kiln_status kiln_dist_init(void);
/* Bytes this rank has sent through collectives since the start. */
KILN_API uint64_t kiln_dist_bytes_sent(void);

/* ---- sampler ---------------------------------------------------------- */

typedef struct kiln_generate_opts {
    int steps;                  /* default 28 */
    double shift;               /* default 3.0 */
    int num_train_timesteps;    /* default 1000 */
    double guidance;            /* default 7.0; <= 1 turns CFG off (cond only) */
    int latent_h, latent_w;     /* latent size (not pixels) */
    uint64_t seed;              /* used when noise == NULL: image k of the batch
                                 * starts from kiln_noise(seed + k), so it equals
                                 * the same image generated alone with seed + k */
    const float *noise;         /* [B,C,H,W] or NULL */
    int context_len;            /* T */
    const float *cond, *cond_pooled;      /* [B,T,J], [B,P] */
    const float *uncond, *uncond_pooled;  /* needed when guidance > 1 */
    /* Called after every step with the latents [B,C,H,W]; may be NULL. */
    void (*on_step)(void *user, int step, int steps, double sigma, const float *latent);
    void *user;
    int batch;                  /* B images in one backbone batch (CFG: 2B rows,
                                 * uncond first as diffusers orders them); default 1 */
    /* Micro-batches: each step runs the backbone on at most max_batch images
     * at a time (CFG: 2 max_batch rows, the chunk's uncond rows first). 0:
     * as many as fit memory_budget (bytes of the planned executor's
     * activations; 0: all B at once). An image's result does not depend on
     * the split (bitwise on the reference kernels). */
    int max_batch;
    uint64_t memory_budget;
} kiln_generate_opts;

/* Images per backbone call for a batch of o->batch under o's max_batch /
 * memory_budget (kiln_generate's choice; *row_bytes, may be NULL, the
 * activations one image adds: CFG's two rows). */
KILN_API kiln_status kiln_generate_micro_batch(kiln_model *m, const kiln_generate_opts *o, int *images,
                                               uint64_t *row_bytes);

KILN_API kiln_generate_opts kiln_generate_defaults(void);
/* out: [B, in_channels, latent_h, latent_w]. */
KILN_API kiln_status kiln_generate(kiln_model *m, const kiln_generate_opts *o, float *out);

/* FlowMatchEulerDiscrete schedule exactly as diffusers computes it.
 * timesteps: steps values; sigmas: steps + 1 values (the last is 0). */
KILN_API kiln_status kiln_flow_schedule(int steps, double shift, int num_train_timesteps,
                               double *timesteps, double *sigmas);

/* Standard normal noise from a seed (counter-based, reproducible across
 * platforms and thread counts). */
KILN_API void kiln_noise(uint64_t seed, float *out, size_t n);

/* ---- quality gate: a quantized model against its unquantized twin ---- */

/* The default gate: the final latents of the quantized model may differ from
 * the unquantized model's by at most 3% relative L2 error (the bar for
 * int8). A compiler or deployment step refuses a scheme above it. */
#define KILN_QUALITY_MAX_REL_L2 0.03
#define KILN_QUALITY_MAX_SIZES 8

typedef struct kiln_quality_opts {
    /* latent sizes, each sampled once per model (n_sizes 0: two, 32x32 and
     * 32x48, shrunk to what the model's position table holds) */
    int n_sizes;
    int latent_h[KILN_QUALITY_MAX_SIZES], latent_w[KILN_QUALITY_MAX_SIZES];
    int steps;          /* default 8 */
    double shift;       /* default 3.0 */
    double guidance;    /* default 5.0 (CFG, batch 2) */
    uint64_t seed;      /* the noise, and the conditioning when cond is NULL; default 1 */
    int context_len;    /* T; default 77 with seeded conditioning */
    const float *cond, *cond_pooled, *uncond, *uncond_pooled; /* NULL: seeded from seed */
    double max_rel_l2;  /* the gate; default KILN_QUALITY_MAX_REL_L2 */
} kiln_quality_opts;

typedef struct kiln_quality_case {
    int latent_h, latent_w;
    double rel_l2;            /* final latents: ||q - b|| / ||b|| */
    double psnr_db;           /* final latents: 10 log10(range^2 / MSE), range = max - min of b */
    double worst_step_rel_l2; /* the largest per-step relative L2 error */
    int worst_step;           /* its step, 1-based */
} kiln_quality_case;

typedef struct kiln_quality_report {
    int n;                          /* cases (latent sizes) */
    kiln_quality_case c[KILN_QUALITY_MAX_SIZES];
    double rel_l2, psnr_db;         /* the worst case's: largest error, smallest PSNR */
    double worst_step_rel_l2;       /* the largest over every step of every case */
    double max_rel_l2;              /* the gate applied */
    int pass;                       /* rel_l2 <= max_rel_l2 (NaN fails) */
} kiln_quality_report;

KILN_API kiln_quality_opts kiln_quality_defaults(void);
/* Run the same sampler request (same noise and conditioning) through base
 * (e.g. bf16) and quant (the same checkpoint with a kiln_quant scheme) at each
 * latent size, and compare every step's latents. KILN_OK whether or not the
 * gate passes (read out->pass); errors for models of different configs or bad
 * options. */
KILN_API kiln_status kiln_quality_check(kiln_model *base, kiln_model *quant, const kiln_quality_opts *o,
                               kiln_quality_report *out);

/* ---- tokenizers (src/pipeline/tokenizer*.c) ---------------------------- */

/* The CLIP (byte-level BPE) and T5 (Unigram) tokenizers of a diffusers
 * pipeline, exact to Hugging Face `tokenizers`. A tokenizer is immutable
 * once open: kiln_tokenize may run on several threads at once. */
typedef struct kiln_tokenizer kiln_tokenizer;
typedef enum kiln_tokenizer_kind { KILN_TOKENIZER_CLIP = 1, KILN_TOKENIZER_T5 = 2 } kiln_tokenizer_kind;

/* A `tokenizer*` folder: tokenizer.json when it has one (a "BPE" model is
 * CLIP, "Unigram" T5), else CLIP's vocab.json + merges.txt, else T5's
 * spiece.model; added tokens and the pad token from tokenizer_config.json /
 * special_tokens_map.json. */
KILN_API kiln_status kiln_tokenizer_open(const char *folder, kiln_tokenizer **out);
KILN_API void kiln_tokenizer_free(kiln_tokenizer *t);
KILN_API kiln_tokenizer_kind kiln_tokenizer_get_kind(const kiln_tokenizer *t);
/* The pipeline's length: 77 for CLIP, 256 for T5 (SD3's max_sequence_length) */
KILN_API int kiln_tokenizer_max_length(const kiln_tokenizer *t);
KILN_API int64_t kiln_tokenizer_pad_id(const kiln_tokenizer *t);

/* Tokenize a NUL-terminated UTF-8 prompt as the pipelines call the tokenizer
 * (padding="max_length", truncation=True, special tokens): CLIP
 * [bos] + ids[:max_length-2] + [eos], T5 ids[:max_length-1] + [</s>], then the
 * pad id up to max_length (<= 0: kiln_tokenizer_max_length). ids (and mask,
 * when not NULL: 1 on real tokens, 0 on padding) hold max_length entries;
 * *n_tokens (may be NULL) gets the count before truncation, specials
 * included. Invalid UTF-8 is KILN_ERR_INVALID_ARG naming the byte offset. */
KILN_API kiln_status kiln_tokenize(const kiln_tokenizer *t, const char *utf8, int max_length, int64_t *ids,
                          int64_t *mask, int *n_tokens);

/* ---- prompt encoding for SD3 / SD3.5 (src/pipeline/sd3_text.c) ---------
 * The text side of a diffusers StableDiffusion3Pipeline folder: tokenizer/,
 * tokenizer_2/, tokenizer_3/ and text_encoder/ (CLIP-L), text_encoder_2/
 * (CLIP-G), text_encoder_3/ (T5; a pipeline without it gets zeros in its
 * place, as diffusers gives). base: how to load each encoder (the weight
 * cache: model_name, cache_root, dtype, quant ...; source and component are
 * set per encoder), NULL: kiln_model_open without a cache. */
typedef struct kiln_sd3_text kiln_sd3_text;
KILN_API kiln_status kiln_sd3_text_open(const char *pipeline, const kiln_load_opts *base, kiln_sd3_text **out);
KILN_API void kiln_sd3_text_free(kiln_sd3_text *t);
/* encode_prompt for n prompts: embeds [B, 77 + max_sequence_length, T5
 * width] (CLIP-L and CLIP-G penultimate states joined on features and
 * zero-padded to the T5 width, then T5's states), pooled [B, P_L + P_G]
 * (both projections), B = n * images_per_prompt (each prompt's rows in a
 * row); malloc'd, free() them. max_sequence_length <= 0: 256. A negative
 * prompt is encoded by another call (diffusers: "" when none is given). */
KILN_API kiln_status kiln_sd3_encode(kiln_sd3_text *t, const char *const *prompts, int n, int images_per_prompt,
                                     int max_sequence_length, float **embeds, int64_t embeds_shape[3], float **pooled,
                                     int64_t pooled_shape[2]);

/* The widths encode gives: prompt_embeds' last dimension (T5's width, or
 * the transformer's joint_attention_dim without T5) and pooled's. */
KILN_API kiln_status kiln_sd3_text_widths(kiln_sd3_text *t, int64_t *t5_width, int64_t *pooled_width);
/* Encoder i (0 CLIP-L, 1 CLIP-G, 2 T5; NULL when absent), owned by t. */
KILN_API kiln_model *kiln_sd3_text_model(kiln_sd3_text *t, int i);

/* ---- whole pipelines: prompt to latents (src/pipeline/sd3_pipeline.c) --
 * A diffusers StableDiffusion3Pipeline folder (SD3, SD3.5): model_index.json,
 * scheduler/, text encoders and tokenizers (above), transformer/, vae/. The
 * components' configs are checked against each other (T5 width =
 * joint_attention_dim, CLIP projections = pooled_projection_dim, VAE latent
 * channels = the transformer's), each error naming both sides. base: how
 * every component loads (weight cache, dtype, quant; NULL: no cache). */
typedef struct kiln_pipeline kiln_pipeline;
KILN_API kiln_status kiln_pipeline_open(const char *folder, const kiln_load_opts *base, kiln_pipeline **out);
KILN_API void kiln_pipeline_free(kiln_pipeline *p);
typedef struct kiln_pipeline_opts {
    const char *const *prompts;   /* n_prompts UTF-8 prompts */
    int n_prompts;
    const char *negative_prompt;  /* for every prompt; NULL: "" (diffusers) */
    int images_per_prompt;        /* default 1; B = n_prompts x images_per_prompt */
    int height, width;            /* pixels; 0: the transformer's sample_size x the VAE factor */
    int steps;                    /* default 28 */
    double guidance;              /* default 7.0 (<= 1: no CFG) */
    double shift;                 /* 0: the scheduler config's */
    uint64_t seed;                /* image k starts from kiln_noise(seed + k) */
    const float *noise;           /* [B, C, h, w] instead, or NULL */
    int max_sequence_length;      /* T5's tokens; default 256 */
    int low_memory;               /* 1: release the text encoders' mappings after encoding
                                   * (the next request maps them again: cache hits);
                                   * 0: only when every component's weights together pass
                                   * 3/4 of the physical memory; -1: never */
    int compile;                  /* every component compiles a fixed-shape package for
                                   * a shape no package covers (kiln_model_set_compile) */
    void (*on_step)(void *user, int step, int steps, double sigma, const float *latent);
    void *user;
    const char *const *negative_prompts; /* n_prompts negative prompts instead of
                                          * negative_prompt, or NULL */
    int max_batch;                /* images per backbone call (kiln_generate_opts) */
    uint64_t memory_budget;       /* bytes for a call's activations; 0: a quarter of the RAM */
    /* Called once with the conditioning (encode_prompt's four tensors under
     * diffusers' names: prompt_embeds [B, T, J], pooled_prompt_embeds [B, P],
     * negative_* the same, NULL without CFG); may be NULL. */
    void (*on_cond)(void *user, const float *embeds, const int64_t embeds_shape[3], const float *pooled,
                    const int64_t pooled_shape[2], const float *negative_embeds, const float *negative_pooled);
} kiln_pipeline_opts;
KILN_API kiln_pipeline_opts kiln_pipeline_defaults(void);
/* The defaults of p's class: SD3's as kiln_pipeline_defaults; a
 * FluxPipeline's guidance 3.5 (the distilled guidance, an input of the
 * transformer: Flux.1-dev) and 512 T5 tokens, or for a transformer without
 * a guidance embedding (schnell) 4 steps and 256 tokens. For a FluxPipeline
 * the latents and noise are [B, 16, h, w] (the transformer packs them),
 * guidance is not CFG (one batch row an image), and negative prompts and a
 * shift are refused (its shift comes from the image's size). */
KILN_API kiln_pipeline_opts kiln_pipeline_defaults_of(const kiln_pipeline *p);
/* "StableDiffusion3Pipeline" or "FluxPipeline" */
KILN_API const char *kiln_pipeline_class(const kiln_pipeline *p);
/* The latents' channels (SD3: 16; Flux: 16, the transformer's in_channels /
 * 4) and the default size in latent cells (a side; x the VAE factor for
 * pixels: SD3's sample_size, Flux's 128) */
KILN_API void kiln_pipeline_latent_shape(const kiln_pipeline *p, int *channels, int *default_cells);
/* The sampled latents [B, C, h, w] (malloc'd; free()) before decoding. */
KILN_API kiln_status kiln_pipeline_generate(kiln_pipeline *p, const kiln_pipeline_opts *o, float **latents,
                                            int64_t shape[4]);
/* A size in pixels the pipeline can make (multiples of the VAE factor x the
 * patch, inside the position table), else an error with the nearest ones;
 * the latent size it gives. */
KILN_API kiln_status kiln_pipeline_check_size(const kiln_pipeline *p, int height, int width, int *latent_h,
                                              int *latent_w);
/* The same from the pipeline's configs alone, before anything loads (a
 * first run converts every component, minutes for a real pipeline): path
 * and tokenizers_dir as kiln_pipeline_open_file takes them, a dimension
 * <= 0 not checked. KILN_OK too where the configs cannot tell (then
 * kiln_pipeline_open_file says what is wrong with them). */
KILN_API kiln_status kiln_pipeline_check_size_early(const char *path, const char *tokenizers_dir, int height, int width);
KILN_API int kiln_pipeline_vae_scale(const kiln_pipeline *p);
/* The components (owned by the pipeline; the VAE is NULL without vae/). */
KILN_API kiln_model *kiln_pipeline_transformer(kiln_pipeline *p);
KILN_API kiln_model *kiln_pipeline_vae(kiln_pipeline *p);

/* ---- all-in-one single files (src/pipeline/single_file.c) -------------
 * SD3 / SD3.5 as ONE safetensors file, as ComfyUI and A1111 load it:
 * model.diffusion_model.* (the transformer, original MMDiT names),
 * text_encoders.clip_l.transformer.*, text_encoders.clip_g.transformer.*,
 * text_encoders.t5xxl.transformer.* (transformers' names) and
 * first_stage_model.* (the VAE, original LDM names). Each component opens as
 * a model of its own (the tensors under its prefix, as views into the one
 * mapped file), through the weight cache under its own component key
 * (transformer, text_encoder, text_encoder_2, text_encoder_3, vae). Such a
 * file has no tokenizers and no configs: tokenizers_dir is a folder laid out
 * as a diffusers pipeline (tokenizer/, tokenizer_2/, tokenizer_3/; optional
 * model_index.json, scheduler/, and <component>/config.json, which win over
 * configs inferred from the tensors' shapes; docs/cli.md says what inference
 * assumes). path may also be a pipeline folder (tokenizers_dir NULL):
 * then these are kiln_pipeline_open and kiln_sd3_text_open, which in turn
 * take an all-in-one file too (and then say that tokenizers are needed). */
KILN_API kiln_status kiln_pipeline_open_file(const char *path, const char *tokenizers_dir, const kiln_load_opts *base,
                                             kiln_pipeline **out);
KILN_API kiln_status kiln_sd3_text_open_file(const char *path, const char *tokenizers_dir, const kiln_load_opts *base,
                                             kiln_sd3_text **out);
/* 1 when path is an all-in-one file (the transformer's prefix and another
 * component's); a plain transformer checkpoint is not one */
KILN_API int kiln_is_single_file(const char *path);

/* ---- seeded models ---------------------------------------------------- */

/* The embedded default of `kiln demo`: a tiny SD3.5-style model (RMS qk-norm,
 * one dual-attention block, 16 latent channels, patch 2). */
KILN_API kiln_config kiln_config_demo(void);

/* Write a diffusers model folder (config.json + diffusion_pytorch_model
 * .safetensors) whose weights are seeded random values stored as dtype
 * (F32, F16 or BF16) and whose pos_embed is diffusers' 2-D sin-cos table.
 * The folder is created if needed; each file is written atomically. */
KILN_API kiln_status kiln_write_seeded_model(const char *dir, const kiln_config *cfg, uint64_t seed,
                                    kiln_dtype dtype);
/* The same for a config.json of any family kiln knows (the one that claims
 * it: SD3Transformer2DModel, CLIPTextModelWithProjection, T5EncoderModel,
 * AutoencoderKL, ...), written as that family's config; *family (may be
 * NULL) its name ("sd3", "clip", "t5", ...). */
/* The family that claims a config.json (the one kiln_model_open would open
 * it as: "sd3", "clip", "t5", "vae-decoder", ...); NULL when none does
 * (kiln_last_error names its class). */
KILN_API const char *kiln_config_family(const char *config_json);
KILN_API kiln_status kiln_write_seeded_model_json(const char *dir, const char *config_json, uint64_t seed,
                                                  kiln_dtype dtype, const char **family);
/* A safetensors file at path of the forward inputs, by name, of the family
 * that claims config_json (its example values: seeded noise, fixed timesteps
 * and guidance), for a batch (0: 1), a latent height x width and a context
 * length (0: the family's example), checked as a request would be:
 * `kiln make-model --inputs` (benchmarks, `kiln forward`). */
KILN_API kiln_status kiln_write_example_inputs(const char *config_json, const char *path, int batch, int height,
                                               int width, int context_len);

/* ---- tensor files and images ------------------------------------------ */

/* A named tensor, row-major. kiln_tensors_read gives KILN_F32 (from F32,
 * F16, BF16, F64, F8_E4M3, F8_E5M2) or KILN_I64 (from the integer types and
 * BOOL) values; kiln_tensors_write takes data of any dtype as stored. */
typedef struct kiln_tensor {
    const char *name;
    kiln_dtype dtype;
    int ndim;                      /* 0..KILN_MAX_DIMS (0: a scalar) */
    int64_t shape[KILN_MAX_DIMS];
    const void *data;              /* prod(shape) elements of dtype */
} kiln_tensor;

/* Every tensor of a safetensors file, in the file's order, as f32 or i64
 * (above): *out is one allocation (names and data inside it), released with
 * kiln_tensors_free; *n its count. The file is validated first (offsets,
 * sizes, dtypes, overlaps): bad files give KILN_ERR_FORMAT, never a crash.
 * For conditioning, latents and inputs; a model's weights go through
 * kiln_load_model. */
KILN_API kiln_status kiln_tensors_read(const char *path, kiln_tensor **out, size_t *n);
KILN_API void kiln_tensors_free(kiln_tensor *t);
/* The tensor named name among t[0..n), or NULL. */
KILN_API const kiln_tensor *kiln_tensors_find(const kiln_tensor *t, size_t n, const char *name);
/* Write n tensors to a safetensors file atomically (a temporary file in the
 * same folder, fsync, rename: readers see the old file or the new one).
 * KILN_ERR_INVALID_ARG names the tensor at fault (no name, a name given
 * twice, an unknown dtype, a negative or overflowing shape, no data). */
KILN_API kiln_status kiln_tensors_write(const char *path, size_t n, const kiln_tensor *t);

/* Write an 8-bit RGB image rgb [height, width, 3] as a PNG, atomically.
 * text: n_text key/value pairs (text[2i] key, 1..79 Latin-1 characters;
 * text[2i+1] value) stored as tEXt chunks (a value that is not ASCII, as
 * UTF-8 in an iTXt chunk), e.g. {"Software", "kiln"};
 * NULL when n_text is 0. */
KILN_API kiln_status kiln_png_write(const char *path, const uint8_t *rgb, int height, int width,
                                    const char *const *text, size_t n_text);
/* A look at a latent [C, H, W]: its first three channels (fewer are
 * repeated), each stretched to 0..255 by its own min and max, into rgb
 * [H, W, 3] (the preview `kiln generate` writes, before scaling up). */
KILN_API kiln_status kiln_latent_to_rgb(const float *latent, int C, int H, int W, uint8_t *rgb);

/* ---- images: the VAE's pixels (src/pipeline/image.c) -------------------- */

/* diffusers' VaeImageProcessor.postprocess: sample [B, 3, H, W] (the VAE's
 * decode, in [-1, 1]) -> rgb [B, H, W, 3]: v = clamp(x / 2 + 0.5, 0, 1) in
 * f32, then round(v * 255) to the nearest, ties to even (numpy's round in
 * numpy_to_pil). NaN gives 0. */
KILN_API kiln_status kiln_image_postprocess(const float *sample, int64_t batch, int channels, int height, int width,
                                            uint8_t *rgb);
/* The same up to the float image (output_type="np"): out [B, H, W, 3] = clamp(x / 2 + 0.5, 0, 1). */
KILN_API kiln_status kiln_image_postprocess_f32(const float *sample, int64_t batch, int channels, int height,
                                                int width, float *out);
/* diffusers' VaeImageProcessor.preprocess of an RGB image (no resize):
 * rgb [H, W, 3] -> image [1, 3, H, W] = 2 (u / 255) - 1 in f32. H and W
 * must be positive multiples of factor (the VAE's 2^(blocks - 1)); diffusers
 * would resize, kiln refuses (KILN_ERR_SHAPE names the sizes). */
KILN_API kiln_status kiln_image_preprocess(const uint8_t *rgb, int height, int width, int factor, float *image);

/* What made an image, for the PNG's text. NULL / 0 fields are unknown and
 * left out (a seed is written when has_seed). */
typedef struct kiln_image_info {
    const char *prompt, *negative_prompt;
    int steps;
    double guidance;  /* CFG scale; written when > 0 */
    int has_seed;
    uint64_t seed;
    const char *sampler; /* e.g. "Euler (flow matching)" */
    const char *model;   /* e.g. the model folder's name */
} kiln_image_info;

/* The A1111 "parameters" text other tools read (malloc'd; free()):
 *   PROMPT\n
 *   Negative prompt: NEGATIVE\n          (when there is one)
 *   Steps: 28, Sampler: S, CFG scale: 7, Seed: 1, Size: WxH, Model: M, Version: kiln X
 * (the last line's keys in that order, unknown ones left out). */
KILN_API char *kiln_image_parameters(const kiln_image_info *info, int height, int width);
/* Write rgb [height, width, 3] as a PNG (atomically) with the tEXt chunks
 * "parameters" (above; info may be NULL: the size and version only) and
 * "Software" = "kiln VERSION". */
KILN_API kiln_status kiln_image_write_png(const char *path, const uint8_t *rgb, int height, int width,
                                          const kiln_image_info *info);
/* Read a PNG as 8-bit RGB rgb [*height, *width, 3] (malloc'd; free()):
 * gray and palette images are expanded to RGB, an alpha channel or tRNS is
 * dropped (as PIL's convert("RGB")), 16-bit samples are converted to 8 bits
 * by keeping the high byte (as PIL reads 16-bit RGB), interlaced images are
 * read whole. KILN_ERR_FORMAT: not a PNG, truncated, corrupt, or more than
 * 32768 pixels a side / 2^30 pixels; KILN_ERR_IO: cannot be read. */
KILN_API kiln_status kiln_png_read(const char *path, uint8_t **rgb, int *height, int *width);

/* ---- the VAE: latents to pictures and back (src/pipeline/vae_decode.c) --
 * Over a VAE model (family "vae-decoder" for decode, "vae-encoder" for
 * encode): the factors come from its config.json (scaling_factor,
 * shift_factor), never from code.
 *
 *   kiln_model *vae;  kiln_vae_open("sd3-medium", NULL, "vae-decoder", &vae);
 *   kiln_vae_opts o = kiln_vae_defaults();        // tiling auto, 1/4 of RAM
 *   kiln_vae_write_png(vae, latents, shape, &o, "out.png", &info, NULL);
 */

/* Open path (a VAE folder, or a pipeline folder with vae/) as family
 * ("vae-decoder" or "vae-encoder"; NULL: the decoder). base: how to load
 * (weight cache, dtype ...; source, component "vae" and family are set
 * here); NULL: kiln_load_defaults(). */
KILN_API kiln_status kiln_vae_open(const char *path, const kiln_load_opts *base, const char *family, kiln_model **out);

/* How a decode tiles (diffusers' AutoencoderKL.tiled_decode: tiles of
 * tile_size pixels, a quarter of them overlapping, seams blended). */
typedef enum { KILN_VAE_TILE_AUTO = 0, KILN_VAE_TILE_OFF, KILN_VAE_TILE_ON } kiln_vae_tile_mode;
typedef struct kiln_vae_opts {
    /* AUTO: tile when the untiled decode's activations (kiln_vae_decode_bytes)
     * pass memory_budget; ON: as diffusers with enable_tiling (tiles when the
     * latent is larger than a tile); OFF: never */
    kiln_vae_tile_mode tile;
    /* a tile's side in pixels, a multiple of 4 x the VAE's factor; 0: the
     * config's sample_size (rounded down to such a multiple), which AUTO
     * shrinks until a tile fits the budget */
    int tile_size;
    uint64_t memory_budget; /* bytes; 0: a quarter of physical memory */
    int no_scale;           /* the latents are in the VAE's space already (no / scaling + shift) */
} kiln_vae_opts;
KILN_API kiln_vae_opts kiln_vae_defaults(void);
/* --vae-tile: "auto", "off" or a tile size in pixels ("512"), into o */
KILN_API kiln_status kiln_vae_parse_tile(const char *s, kiln_vae_opts *o);
/* --vae-memory: bytes, with an optional K, M, G or T suffix (powers of 1024: "2G"), into o->memory_budget */
KILN_API kiln_status kiln_vae_parse_memory(const char *s, kiln_vae_opts *o);

/* What a decode did (or would do). */
typedef struct kiln_vae_plan {
    int tiled;
    int tile_size, tile_latent;     /* pixels and latent rows of a tile (tiled) */
    int tiles;                      /* decoder runs */
    uint64_t untiled_bytes, tile_bytes, budget; /* estimated peak activations; the budget used */
} kiln_vae_plan;
/* The estimated peak activation bytes of one decode of a [batch, C, h, w]
 * latent by this decoder (from its config: the widest level's live
 * tensors and the mid-block attention's scores). 0 for a model that is no VAE. */
KILN_API uint64_t kiln_vae_decode_bytes(const kiln_model *vae, int64_t batch, int64_t h, int64_t w);
/* The plan kiln_vae_decode follows for a [batch, C, h, w] latent. */
KILN_API kiln_status kiln_vae_plan_for(const kiln_model *vae, const int64_t shape[4], const kiln_vae_opts *o,
                                       kiln_vae_plan *plan);

/* Decode latents [B, C, h, w] (the pipeline's: divided by scaling_factor,
 * shift_factor added, unless o->no_scale) into sample [B, out_channels,
 * h f, w f] (the decoder's output, [-1, 1] nominally), tiled as o says. o
 * NULL: defaults; plan NULL or what was done. */
KILN_API kiln_status kiln_vae_decode(kiln_model *vae, const float *latents, const int64_t shape[4],
                                     const kiln_vae_opts *o, float *sample, kiln_vae_plan *plan);
/* kiln_vae_decode then kiln_image_postprocess: rgb [B, H, W, 3]; sample
 * (NULL: not kept) receives the float decode. */
KILN_API kiln_status kiln_vae_decode_rgb(kiln_model *vae, const float *latents, const int64_t shape[4],
                                         const kiln_vae_opts *o, uint8_t *rgb, float *sample, kiln_vae_plan *plan);
/* The file of batch entry i: path itself when batch is 1, else STEM-i.EXT
 * (out.png -> out-0.png, out-1.png ...). malloc'd. */
KILN_API char *kiln_image_path(const char *path, int64_t i, int64_t batch);
/* Decode and write one PNG per batch entry (kiln_image_path) with the
 * parameters text of info (NULL: size and version only). Every file is
 * written only after the whole batch decoded; on a failure the ones this
 * call wrote are removed. sample as kiln_vae_decode_rgb. */
KILN_API kiln_status kiln_vae_write_png(kiln_model *vae, const float *latents, const int64_t shape[4],
                                        const kiln_vae_opts *o, const char *path, const kiln_image_info *info,
                                        float *sample, kiln_vae_plan *plan);
/* Encode an RGB image rgb [height, width, 3] (sides multiples of the VAE's
 * factor) with a vae-encoder model: the mean of latent_dist, then (x -
 * shift_factor) * scaling_factor unless no_scale; *latents malloc'd
 * [1, latent_channels, height / f, width / f] (shape). */
KILN_API kiln_status kiln_vae_encode_rgb(kiln_model *enc, const uint8_t *rgb, int height, int width, int no_scale,
                                         float **latents, int64_t shape[4]);

/* ---- runtime ---------------------------------------------------------- */

/* The version of the library (KILN_VERSION when it was built), e.g. "0.1.0";
 * compare with the header's KILN_VERSION to catch a mismatched libkiln.so. */
KILN_API const char *kiln_version(void);

typedef enum { KILN_LOG_QUIET = 0, KILN_LOG_ERROR, KILN_LOG_WARN, KILN_LOG_INFO, KILN_LOG_DEBUG } kiln_log_level;
KILN_API void kiln_set_log_level(kiln_log_level l);  /* default WARN, or $KILN_LOG */
/* Worker threads for the kernels (default: $KILN_THREADS, else all cores). */
KILN_API void kiln_set_threads(int n);
KILN_API int kiln_get_threads(void);

/* The kernels this machine runs for compute dtype dt (KILN_F32 or
 * KILN_BF16), in words, e.g. "kiln's fp16 GEMM and attention (AVX512-FP16,
 * no AMX); weight cache layouts avx512bf16-dnnl2.6-f16p64" (the layout
 * part of the cache key, for bf16); a static string. */
KILN_API const char *kiln_kernels(kiln_dtype dt);

/* The CPU class whose kernels run (docs/PERFORMANCE.md): "avx2", "avx512",
 * "avx512_bf16", "avx512_fp16" or "amx" ("sse41" below AVX2 + FMA + F16C);
 * with hardware 0, this machine's capped by the environment variable
 * KILN_MAX_ISA (one of those names: the kernels a lower class runs, oneDNN's
 * included) or ONEDNN_MAX_CPU_ISA, read once per process; with hardware 1,
 * the machine's own. A static string. */
KILN_API const char *kiln_cpu_class(int hardware);
/* The backends this build has, for kiln_open_opts.backend and $KILN_BACKEND:
 * "cpu, reference, check" (check: the reference kernels on memory the host
 * cannot touch, which proves the backend boundary; for tests). */
KILN_API const char *kiln_backends(void);
/* 1 when name is one of kiln_backends(). */
KILN_API int kiln_backend_known(const char *name);

/* The timing ledger: per category seconds and counts, printed at exit with
 * kiln_timings_print() (the CLI does it for --timings or KILN_TIMINGS=1). */
KILN_API void kiln_timings_print(void *file /* FILE* */);
KILN_API void kiln_timings_reset(void);

#ifdef __cplusplus
}
#endif
#endif
