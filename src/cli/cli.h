/* cli.h - helpers shared by the kiln subcommands: option parsing, tensor
 * files, errors. Each subcommand lives in its own cmd_*.c file. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include "format/safetensors.h"
#include "kiln.h"

#include <stdint.h>
#include <stdio.h>

/* Subcommands: argv[0] is the subcommand name. Return the exit code. */
int cmd_info(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_cache(int argc, char **argv);
int cmd_make(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_package(int argc, char **argv);
int cmd_quality(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_encode(int argc, char **argv);
int cmd_decode(int argc, char **argv);
int cmd_encode_image(int argc, char **argv);

/* A run's output files, all or none (outputs.c): each written to tmp[i]
 * (beside final[i], a hidden name), renamed into place by commit once all
 * are written; a SIGINT, SIGTERM or SIGHUP before then removes them. final
 * and tmp are kiln_image_path(output, i, n) and (tmp_base, i, n), so a call
 * that writes n images from one path takes tmp_base. */
typedef struct cli_outputs {
    int n;
    char **final, **tmp;
    char *tmp_base;
} cli_outputs;
/* 0, or -1 when out of memory (nothing to clean up) */
int cli_outputs_begin(cli_outputs *o, const char *output, int n);
/* rename every file into place (saying once, unless quiet, how many
 * existing files were replaced); 0, or the exit code after printing why
 * (then none of them is left) */
int cli_outputs_commit(cli_outputs *o, const char *cmd, int quiet);
/* remove what was written */
void cli_outputs_abort(cli_outputs *o);

/* kiln_load_opts.on_component for a command's progress: "CMD: loading X ..."
 * before a component loads, "CMD: X  hit, 0.01 s" after; nothing when quiet */
typedef struct cli_load_progress {
    const char *cmd;
    int quiet;
} cli_load_progress;
void cli_on_component(void *user, const char *component, const char *origin, double seconds);

/* How many packages the package folder root holds (cmd_package.c's listing). */
int cli_count_packages(const char *root);

/* Print "kiln <cmd>: <message>" and return 1 (or 2 for usage errors). */
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Report a failed kiln call with its status and message. */
int cli_fail(const char *cmd, kiln_status s);

/* Option parsing: --name VALUE or --name=VALUE. *i is advanced past what is used.
 * Returns 1 when argv[*i] is this option (value in *val), 0 otherwise,
 * -1 when the value is missing (an error was printed). */
int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val);
int cli_flag(char **argv, int i, const char *name);
int cli_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_double(const char *cmd, const char *opt, const char *s, double *out);
int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);
/* "HxW" -> h, w */
int cli_parse_hw(const char *cmd, const char *opt, const char *s, int *h, int *w);

/* Common options every model command takes. */
typedef struct cli_common {
    const char *config;
    int timings;
    int quiet; /* --quiet: errors only (the log level, and each command's progress lines) */
    /* the weight cache and its key */
    const char *cache_dir; /* --cache-dir, else $KILN_CACHE_DIR */
    const char *name;      /* --name: the model's cache folder (default: from MODEL) */
    const char *component; /* --component (default transformer) */
    int no_create_cache, verify, fsdp;
    int mesh_rows, mesh_cols;
    kiln_parallel parallel;
    kiln_dtype dtype; /* --dtype bf16|f32, default bf16 */
    int reference;    /* --reference: the reference kernels (f32) */
    const char *backend; /* --backend NAME (NULL: KILN_BACKEND, else cpu) */
    const char *exec;        /* --exec CHAIN / --no-package */
    const char *package_dir; /* --package-dir */
    kiln_quant quant; /* --quant none|int8|fp8 (default none) */
    const char *quant_layers; /* --quant-layers PATTERNS (default: the family's, kiln_family_quant_layers) */
    const char *tokenizers; /* --tokenizers DIR: an all-in-one file's tokenizers (and optional configs) */
} cli_common;
/* A pipeline: a folder with model_index.json, or an all-in-one single file
 * (kiln_is_single_file), or any file when the command was given
 * --tokenizers (kiln_pipeline_open_file then says what is wrong with it). */
int cli_is_pipeline(const char *path, const cli_common *c);
/* "none", "int8", "fp8" -> *q; -1 and a message naming the value otherwise */
int cli_parse_quant(const char *cmd, const char *s, kiln_quant *q);
/* Defaults for cli_common. */
cli_common cli_common_defaults(void);
/* --threads above this many per online core is capped, with a warning */
#define CLI_THREADS_PER_CORE 4
/* Handles --config, --threads, --timings, --log and the cache options
 * (--cache-dir, --name, --component, --no-create-cache, --verify, --mesh,
 * --tp, --sp, --cfgp, --fsdp). 1 consumed, 0 not, -1 error. */
int cli_common_opt(const char *cmd, int argc, char **argv, int *i, cli_common *c);
void cli_common_finish(const cli_common *c);
/* Help text for the common options. */
extern const char cli_common_help[];
/* Open MODEL through the load flow: with a cache root, map or build the
 * cache; without one, convert (kiln_load_model prints a hint). */
kiln_status cli_load_model(const char *model, const cli_common *c, kiln_model **out);
/* cli_load_model for a command that runs one family (family: "sd3", ...;
 * needs: what the command needs, in words): a model of another family is
 * refused naming both, before it converts when its config.json says so. */
kiln_status cli_load_model_of(const char *model, const cli_common *c, const char *family, const char *needs,
                              kiln_model **out);
/* The load options the common options say for MODEL (name: a buffer of cap
 * bytes the default cache name is written to; it must outlive the options). */
/* path's component when it is a pipeline folder's component folder
 * (transformer, text_encoder*, vae beside a model_index.json), with the
 * pipeline folder in parent; NULL otherwise */
const char *cli_pipeline_component(const char *path, char *parent, size_t cap);
/* the family MODEL's config.json (or --config) names, before anything
 * loads; NULL when there is none to read or no family claims it */
const char *cli_config_family(const char *model, const cli_common *c);
kiln_load_opts cli_load_opts(const char *model, const cli_common *c, char *name, size_t cap);
/* kiln compile PIPELINE: one step of a request of that many images and size
 * (0: defaults) with compile on, so every component has its packages. */
int cli_pipeline_compile(const char *dir, const cli_common *com, int images, int width, int height, double guidance);
/* The cache folder name derived from a MODEL path: its name plus a short
 * hash of its absolute path ("sd3-medium-3f2a91" for .../sd3-medium/transformer
 * or sd3-medium.safetensors), so two folders of one name never collide. */
void cli_model_name(const char *path, char *buf, size_t cap);

/* A named f32 copy of a tensor in f with ndim dims; NULL and a message
 * naming file and tensor otherwise (a NaN or Inf in it too: the message
 * gives the first one's index). shape gets its dims. */
float *cli_tensor(const char *cmd, const st_file *f, const char *name, int ndim, int64_t *shape);
/* Write one f32 tensor to a safetensors file. */
kiln_status cli_write_f32(const char *path, const char *name, const float *data, int ndim,
                          const int64_t *shape);
/* Per-step progress on stderr (a kiln_generate_opts.on_step; user: a
 * cli_progress, quiet: nothing printed). */
typedef struct cli_progress {
    double t0, last;
    int quiet;
} cli_progress;
void cli_step_progress(void *user, int step, int steps, double sigma, const float *latent);
/* kiln generate PIPELINE: what was asked */
typedef struct pipe_args {
    const char *prompt, *prompts_file, *negative, *latents_out, *tensor_out, *vae_tile, *vae_memory, *memory;
    long width, height, ipp, msl, micro_batch;
    int low_memory, compile;
    int steps_set, guidance_set, msl_set; /* given on the command line: else the pipeline class's defaults */
} pipe_args;
/* kiln generate PIPELINE ... (generate_pipeline.c): g holds --steps,
 * --guidance, --shift, --seed. Returns the exit code. */
int cli_generate_pipeline(const char *dir, const cli_common *com, const pipe_args *pa, const kiln_generate_opts *g,
                          const char *noise_file, const char *output, int quiet);
/* Sample with progress on stderr, then write `latents` [B,C,H,W] to output
 * and beside it a PNG per image: the VAE's decode, or without one (NULL) a
 * preview of the latents. Returns the exit code. */
int cli_generate_run(const char *cmd, kiln_model *m, kiln_generate_opts *o, const char *output, int quiet,
                     kiln_model *vae);
/* Seeded conditioning under diffusers' pipeline names (prompt_embeds,
 * pooled_prompt_embeds and the negative_* pair), T tokens. */
kiln_status cli_write_seeded_cond(const char *path, const kiln_config *c, int T, uint64_t seed);
/* The files of --output X: the latents go to X, or to STEM.safetensors when
 * X is STEM.png; the preview to STEM.png, where STEM is X without a final
 * .safetensors or .png (so x.png and x.safetensors both give x.png, never
 * x.png.png). Both malloc'd. */
char *cli_preview_path(const char *path);
char *cli_latents_path(const char *output);
/* --output's folder exists and is writable, and the path is no folder:
 * checked before any work. 0, or a message printed and 1. */
int cli_check_output(const char *cmd, const char *path);
/* cli_check_output for an image: the name must end in .png (any case) */
int cli_check_png_output(const char *cmd, const char *path);
/* the same for a safetensors output: a name ending in .safetensors */
int cli_check_st_output(const char *cmd, const char *path);
/* Under a launcher that started several ranks (mpirun -np N) a command needs
 * a parallel mode, or every rank would repeat the whole job and write the
 * same files: INVALID_ARG saying so. cli_load_model calls it. */
kiln_status cli_check_ranks(const cli_common *c);

#endif
