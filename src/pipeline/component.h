/* component.h - one component of a pipeline (text_encoder, transformer,
 * vae ...) opened the one way the pipeline code opens them: from a
 * diffusers pipeline folder (component.c), or from an all-in-one single
 * file that holds every component under its prefix (single_file.c). */
#ifndef KILN_PIPELINE_COMPONENT_H
#define KILN_PIPELINE_COMPONENT_H

#include "kiln.h"

/* dir as the model of component: through the weight cache with base's
 * options (source and component set here), or kiln_model_open without one
 * (base NULL); its load time goes into the ledger as "load COMPONENT". */
kiln_status kp_open_component(const char *dir, const char *component, const kiln_load_opts *base, kiln_model **out);

/* Loading progress of one component: kp_component_start before it loads
 * (base's on_component with seconds < 0; returns the start time) and
 * kp_component_done after it loaded (the ledger's "load COMPONENT", then
 * on_component with its origin and seconds). base may be NULL. */
double kp_component_start(const kiln_load_opts *base, const char *component);
void kp_component_done(const kiln_load_opts *base, const char *component, double t0, const kiln_model *m);

/* ---- where a pipeline's parts are --------------------------------------------
 * A diffusers pipeline folder (dir: every component a sub-folder, aux ==
 * dir), or an all-in-one single file (file) as ComfyUI and A1111 load SD3 /
 * SD3.5, whose components are name prefixes:
 *
 *   transformer     model.diffusion_model.              (original MMDiT names)
 *   text_encoder    text_encoders.clip_l.transformer.   (transformers' CLIP-L names)
 *   text_encoder_2  text_encoders.clip_g.transformer.   (transformers' CLIP-G names)
 *   text_encoder_3  text_encoders.t5xxl.transformer.    (transformers' T5 names)
 *   vae             first_stage_model.                  (original LDM names)
 *
 * or as ComfyUI saves Flux.1 (told apart by the transformer's double_blocks):
 *
 *   transformer     model.diffusion_model.              (Black Forest Labs' names)
 *   text_encoder    text_encoders.clip_l.transformer.   (CLIP-L)
 *   text_encoder_2  text_encoders.t5xxl.transformer.    (T5)
 *   vae             vae.                                (original LDM names)
 *
 * Such a file has no configs and no tokenizers: aux (the --tokenizers DIR,
 * laid out as a diffusers pipeline folder) gives tokenizer*, and optionally
 * model_index.json, scheduler/ and <component>/config.json; a component
 * without a config there gets one inferred from its tensors' shapes. */
typedef struct kp_source {
    const char *dir;  /* the pipeline folder, or NULL */
    const char *file; /* the all-in-one file, or NULL */
    const char *aux;  /* where tokenizers, scheduler and configs are: dir, or the tokenizers folder (may be NULL) */
} kp_source;

/* path a pipeline folder or an all-in-one file (tokenizers_dir: the file's
 * tokenizers folder; for a folder it must be NULL). Nothing is copied: out
 * points at the strings given. */
kiln_status kp_source_init(const char *path, const char *tokenizers_dir, kp_source *out);
/* 1 when path is a safetensors file holding model.diffusion_model.* and at
 * least one other component prefix (a plain transformer checkpoint is not) */
int kp_is_single_file(const char *path);
/* A component of the all-in-one file (NULL: SD3's names): 1 and its name
 * prefix and family ("model.diffusion_model.", "sd3"; a Flux file's
 * transformer "flux" or, without a guidance embedding, "flux-schnell"), and
 * what its inferred config assumes beyond the shapes (a JSON object: CLIP-L's
 * quick_gelu, CLIP-G's gelu, a Flux VAE's scale and shift; NULL: nothing); 0
 * for a name that is none. Any out pointer may be NULL. */
int kp_part_lookup(const char *file, const char *component, const char **prefix, const char **family,
                   const char **assume);
/* The name prefix of a component inside an all-in-one file (NULL: unknown) */
const char *kp_component_prefix(const char *file, const char *component);
/* 1 when the all-in-one file holds a Flux transformer (double_blocks in Black
 * Forest Labs' names): a FluxPipeline's parts (text_encoder CLIP-L,
 * text_encoder_2 T5, vae under vae.) */
int kp_file_is_flux(const char *file);
/* Does the source hold component (a folder: its sub-folder; a file: a tensor under its prefix) */
int kp_has_component(const kp_source *s, const char *component);
/* component as a model, as kp_open_component (through the cache with base,
 * under its own component key: for a file, the source identity is the file
 * plus the prefix, so a changed file is a miss) */
kiln_status kp_open_part(const kp_source *s, const char *component, const kiln_load_opts *base, kiln_model **out);
/* A file's component config: aux/<component>/config.json's text when there
 * is one (*inferred 0), else inferred from the tensors' shapes (*inferred
 * 1) with the real models' conventions: CLIP-L quick_gelu, CLIP-G gelu, heads
 * of width 64; T5 heads from relative_attention_bias; the VAE SD3's
 * AutoencoderKL; the transformer the SD3 family's inference. Malloc'd. */
kiln_status kp_part_config(const char *file, const char *component, const char *aux, char **json, int *inferred);
/* A component's config before anything loads (malloc'd text, *json NULL
 * when there is none): <component>/config.json of the folder (of the aux
 * folder for a file), else for a file the one kp_part_config infers. */
kiln_status kp_component_config(const kp_source *s, const char *component, char **json);
/* A file of the source's aux folder (model_index.json, scheduler/...) as a
 * malloc'd path; NULL when there is no aux folder (or out of memory). */
char *kp_aux_path(const kp_source *s, const char *rel);
/* An all-in-one file's tokenizer folders are there (tokenizer_3 only when
 * the file holds T5): checked before any component loads. KILN_OK for a folder. */
kiln_status kp_check_tokenizers(const kp_source *s);
/* A pipeline folder's files, checked before any component loads (a
 * conversion of the first would otherwise take minutes before the last is
 * found missing): every component model_index.json lists (a [library,
 * class] pair, not [null, null]) is a folder there, and each of need
 * (NULL-terminated; a name after "?" only when the index lists it or the
 * folder is there) is one too; a model folder holds config.json and a
 * weights file (kc_find_weights), a tokenizer folder one of the files kiln
 * reads. KILN_ERR_MISSING naming the folder and the file; KILN_OK for an
 * all-in-one file (kp_check_tokenizers checks its folder). */
kiln_status kp_check_folder(const kp_source *s, const char *const *need);
/* An SD3 pipeline folder's parts for kp_check_folder: the transformer,
 * then the text encoders and tokenizers (T5's optional), then the VAE and
 * the scheduler (optional); NULL-terminated */
extern const char *const kp_sd3_parts[];
/* The error for a tokenizer folder the source lacks: which one, and how to give it */
kiln_status kp_missing_tokenizer(const kp_source *s, const char *tokenizer);

/* The last dimension of encoder m's output name for input_ids [1, len]
 * (len <= 512: a shape query, nothing runs) */
kiln_status kp_output_width(kiln_model *m, int len, const char *name, int64_t *w);
/* An integer of a model's config JSON (dflt when absent or not a number) */
int kp_config_int(const kiln_model *m, const char *key, int dflt);

/* n prompts through one text encoder m: tokenized by tok to len ids each
 * (padded, truncated; a prompt cut off gets a warning naming label, NULL:
 * none), input_ids [n, len] through kiln_run; the k_out outputs named
 * names[k] land in bufs[k] (malloc'd), their shapes in sh[k] */
kiln_status kp_encode_ids(kiln_model *m, const kiln_tokenizer *tok, const char *const *prompts, int n, int len,
                          const char *label, int k_out, const char *const *names, float **bufs, int64_t (*sh)[3]);

#endif
