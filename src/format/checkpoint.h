/* checkpoint.h - a checkpoint as a list of tensors under diffusers names.
 *
 * Sources: a diffusers model folder (config.json + diffusion_pytorch_model
 * .safetensors or model.safetensors, or shards through its .index.json), or
 * one safetensors file with either diffusers names or a family's original
 * names. A family's renamer (its architecture table, src/arch/) says how
 * original names map: renamed, a fused tensor split along dim 0, halves
 * swapped - all applied here as views into the mapped file: a tensor is up
 * to two byte ranges read one after the other. */
#ifndef KILN_CHECKPOINT_H
#define KILN_CHECKPOINT_H

#include "format/safetensors.h"
#include "kiln.h"

typedef struct kc_tensor {
    char *name;              /* diffusers name */
    const char *source_name; /* name in the file (for messages) */
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    const uint8_t *part[2];  /* the tensor's bytes are part[0] ++ part[1] */
    size_t part_bytes[2];
} kc_tensor;

/* What one original tensor becomes: n tensors (1, or a fused tensor split
 * in n parts along dim 0: equal ones, or with ratio set part i's share
 * ratio[i] / the ratios' sum, as Flux's linear1 holds q, k, v and the MLP's
 * 4x wider input) named to[0..n), each with the two halves of dim 0 swapped
 * when swap is set ((shift, scale) -> (scale, shift)). */
#define KC_RENAME_MAX 4
typedef struct kc_rename {
    int n;
    char to[KC_RENAME_MAX][128];
    int ratio[KC_RENAME_MAX]; /* all 0: equal parts */
    int swap;
    int squeeze; /* drop trailing dims of size 1: a 1x1 conv weight [C, C, 1, 1] read as a linear's [C, C] */
    int drop;    /* leave the tensor out (a tied copy of another one) */
} kc_rename;

/* A family's original single-file layout. detect: do these names use it
 * (state: what rename needs to know about the whole file, e.g. the last
 * block's index); rename: 1 with r filled, or 0 to keep the name (an
 * unknown tensor is then listed as unexpected by the model's check). */
typedef struct kc_renamer {
    const char *layout; /* "sd3-single-file" */
    int (*detect)(const char *const *names, size_t n, int64_t state[4]);
    int (*rename)(const int64_t state[4], const char *name, kc_rename *r);
} kc_renamer;

typedef struct kc_checkpoint {
    char *path;
    char *config_json; /* config.json text, NULL when there is none */
    const char *layout; /* "diffusers" or the renamer's layout */
    st_set *set;
    kc_tensor *t;
    size_t n;
    int64_t bytes_on_disk;
    st_tensor *owned; /* tensors copied from a callback source */
    size_t n_owned;
} kc_checkpoint;

/* config_path overrides (or supplies) config.json; may be NULL. renamers:
 * NULL-terminated (may be NULL); the first that detects its layout names
 * the tensors. */
kiln_status kc_open(const char *path, const char *config_path, const kc_renamer *const *renamers,
                    kc_checkpoint **out);
/* One component of a file that holds several (an all-in-one single file:
 * model.diffusion_model.*, text_encoders.clip_l.transformer.*,
 * first_stage_model.* ...): only the tensors whose names start with prefix,
 * the prefix stripped before the renamers see them (NULL or "": all);
 * transformers' position_ids buffers under it are left out (never weights).
 * Still views into the one mapped file. config_json (text, may be NULL)
 * wins over config_path. No tensor under prefix is KILN_ERR_MISSING. */
kiln_status kc_open_part(const char *path, const char *prefix, const char *config_path, const char *config_json,
                         const kc_renamer *const *renamers, kc_checkpoint **out);
/* The tensors a kiln_source_fn emits (copied), with config.json text. */
kiln_status kc_from_source(kiln_source_fn fn, void *user, const char *config_json, const char *name,
                           const kc_renamer *const *renamers, kc_checkpoint **out);
void kc_close(kc_checkpoint *c);
/* The weights file of a model folder (malloc'd path): diffusers'
 * diffusion_pytorch_model.safetensors or transformers' model.safetensors,
 * each also as .index.json shards; KILN_ERR_MISSING naming them when none is. */
kiln_status kc_find_weights(const char *dir, char **out);
const kc_tensor *kc_find(const kc_checkpoint *c, const char *name);
int64_t kc_numel(const kc_tensor *t);
/* Done with tensor t for now: a mapped file's pages of it are given back
 * (a copy from a callback source stays). */
void kc_release(const kc_checkpoint *c, const kc_tensor *t);
/* The tensor's values as f32 (out holds kc_numel floats). */
kiln_status kc_read_f32(const kc_tensor *t, float *out);

#endif
