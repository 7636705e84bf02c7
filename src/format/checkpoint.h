/* checkpoint.h - a checkpoint as a list of tensors under diffusers names.
 *
 * Sources: a diffusers model folder (config.json + diffusion_pytorch_model
 * .safetensors, or shards through its .index.json), or one safetensors file
 * with either diffusers names or the original SD3 names
 * (model.diffusion_model.joint_blocks.N.x_block.attn.qkv ...). Original names
 * are renamed, fused qkv is split, and (shift, scale) halves are swapped to
 * (scale, shift) where diffusers' conversion does it - all as views into the
 * mapped file: a tensor is up to two byte ranges read one after the other. */
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

typedef struct kc_checkpoint {
    char *path;
    char *config_json; /* config.json text, NULL when there is none */
    const char *layout; /* "diffusers" or "sd3-single-file" */
    st_set *set;
    kc_tensor *t;
    size_t n;
    int64_t bytes_on_disk;
    st_tensor *owned; /* tensors copied from a callback source */
    size_t n_owned;
} kc_checkpoint;

/* config_path overrides (or supplies) config.json; may be NULL. */
kiln_status kc_open(const char *path, const char *config_path, kc_checkpoint **out);
/* The tensors a kiln_source_fn emits (copied), with config.json text. */
kiln_status kc_from_source(kiln_source_fn fn, void *user, const char *config_json, const char *name,
                           kc_checkpoint **out);
void kc_close(kc_checkpoint *c);
const kc_tensor *kc_find(const kc_checkpoint *c, const char *name);
int64_t kc_numel(const kc_tensor *t);
/* The tensor's values as f32 (out holds kc_numel floats). */
kiln_status kc_read_f32(const kc_tensor *t, float *out);

#endif
