/* pipeline_kind.h - a pipeline class as a row of a table: what a diffusers
 * pipeline does beside its transformer and its VAE (its text side, its
 * latents, its guidance and schedule, its sampling loop), so that one
 * pipeline object (pipeline.c), one CLI and one C API serve every class.
 * A row: sd3_pipeline.c (StableDiffusion3Pipeline: three text encoders, CFG
 * in the backbone batch, a fixed shift), flux_pipeline.c (FluxPipeline:
 * CLIP-L's pooled output and T5, the distilled guidance as an input, the
 * shift from the image's size). Adding a class is adding a row here and
 * to pipeline.c's table. */
#ifndef KILN_PIPELINE_KIND_H
#define KILN_PIPELINE_KIND_H

#include "kiln.h"
#include "arch/arch.h"
#include "pipeline/component.h"
#include "pipeline/pipeline_files.h"

/* What a row opens with, and generates with (to map its text encoders
 * again after a release): the source and the options every component loads
 * with, the transformer, the schedule of scheduler/ (or the row's default,
 * sched below; at open only) */
typedef struct kp_open_ctx {
    const kp_source *src;
    const char *path;             /* the folder or file, for messages */
    const char *tokenizers;       /* an all-in-one file's tokenizers folder, or NULL */
    const kiln_load_opts *base;   /* NULL: no weight cache */
    kiln_model *transformer;
    const kp_schedule *sched;
} kp_open_ctx;

#define KP_MAX_TEXT 3 /* text encoders a class has at most (SD3's) */

/* Whether to release the text encoders once a request's prompts are
 * encoded (kiln_pipeline_opts.low_memory; in its automatic mode decided
 * then, from every component's weights): the row asks after encoding */
typedef struct kp_release {
    int (*now)(const void *ctx);
    const void *ctx;
} kp_release;

typedef struct kp_kind {
    const char *cls;                   /* model_index.json's _class_name */
    const char *const *parts;          /* what the folder must hold (kp_check_folder) */
    const char *const *families;       /* the transformer families it runs (NULL-terminated) */
    kp_schedule sched;                 /* without a scheduler config */
    int rows_per_image;                /* backbone batch rows an image takes (CFG: 2) */
    /* the row's own part (its text encoders ...) once the transformer is
     * open, checked against it; *sample_size its default size in latent cells */
    kiln_status (*open)(const kp_open_ctx *c, void **impl, int *sample_size);
    void (*free)(void *impl);
    /* the latent's channels (what the VAE must have) */
    int (*channels)(const void *impl, const kiln_model *transformer);
    /* height x width in pixels against the transformer's config (its
     * family's, parsed) and the VAE factor; a dimension <= 0 is not checked */
    kiln_status (*check_size)(const void *transformer_cfg, int vae_scale, int height, int width);
    /* the class's __call__ defaults over kiln_pipeline_defaults() */
    void (*defaults)(const void *impl, kiln_pipeline_opts *o);
    /* text encoder i (NULL past them, or released) */
    kiln_model *(*text_model)(void *impl, int i);
    /* prompts -> latents [B, channels, lh, lw] (malloc'd, *latents); the
     * request's common checks are done; once the prompts are encoded, when
     * release->now says so, the text encoders are freed (the next request
     * maps them again, text_model NULL meanwhile) */
    kiln_status (*generate)(void *impl, const kp_open_ctx *c, const kiln_pipeline_opts *o, int lh, int lw,
                            const kp_release *release, float **latents);
} kp_kind;

extern const kp_kind kp_sd3_kind, kp_flux_kind;

/* 1 when family (a transformer's) is one the row runs */
int kp_kind_runs(const kp_kind *k, const char *family);

#endif
