/* single_file.c - an all-in-one SD3 / SD3.5 or Flux.1 safetensors file
 * (every component under its name prefix, as ComfyUI and A1111 load it) as the
 * source of a pipeline's components (component.h): which prefixes the file
 * holds, where its tokenizers and configs are. Parser code (the fuzz
 * harnesses link it); opening a component (its config inferred from the
 * shapes, the weight cache) is component.c's. */
#include "base/base.h"
#include "format/safetensors.h"
#include "pipeline/component.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a component under its prefix; assume: what its config takes that no
 * shape tells (a JSON object over the inferred config; NULL: nothing) */
typedef struct {
    const char *component, *prefix, *family, *assume;
} part;

/* SD3 / SD3.5 (StableDiffusion3Pipeline's components) */
static const part k_sd3[] = {
    {"transformer", "model.diffusion_model.", "sd3", NULL},
    {"text_encoder", "text_encoders.clip_l.transformer.", "clip", "{\"hidden_act\": \"quick_gelu\"}"},
    {"text_encoder_2", "text_encoders.clip_g.transformer.", "clip", "{\"hidden_act\": \"gelu\"}"},
    {"text_encoder_3", "text_encoders.t5xxl.transformer.", "t5", NULL},
    {"vae", "first_stage_model.", "vae-decoder", NULL},
};
/* Flux.1 (FluxPipeline's components; ComfyUI's Flux checkpoints: Black
 * Forest Labs' transformer names, the VAE under vae.); the transformer is
 * "flux" with a guidance embedding (dev), else "flux-schnell" */
static const part k_flux[] = {
    {"transformer", "model.diffusion_model.", "flux", NULL},
    {"text_encoder", "text_encoders.clip_l.transformer.", "clip", "{\"hidden_act\": \"quick_gelu\"}"},
    {"text_encoder_2", "text_encoders.t5xxl.transformer.", "t5", NULL},
    /* FluxPipeline's latent scale and shift (FLUX.1's vae/config.json; the inference gives SD3's) */
    {"vae", "vae.", "vae-decoder", "{\"scaling_factor\": 0.3611, \"shift_factor\": 0.1159}"},
};
#define FLUX_MARK "model.diffusion_model.double_blocks."
#define FLUX_GUIDANCE "model.diffusion_model.guidance_in."

/* the file's kind: Flux when its transformer has double blocks (no SD3 name
 * has them), and whether it has the guidance embedding */
static int kind_of(const st_set *set, int *guided) {
    int flux = 0;
    if (guided) *guided = 0;
    for (size_t t = 0, n = st_set_count(set); t < n; t++) {
        const char *name = st_set_at(set, t)->name;
        flux |= !strncmp(name, FLUX_MARK, strlen(FLUX_MARK));
        if (guided && !strncmp(name, FLUX_GUIDANCE, strlen(FLUX_GUIDANCE))) *guided = 1;
    }
    return flux;
}

static const part *parts_of(int flux, size_t *n) {
    *n = flux ? sizeof k_flux / sizeof *k_flux : sizeof k_sd3 / sizeof *k_sd3;
    return flux ? k_flux : k_sd3;
}

static int part_index(const part *t, size_t n, const char *component) {
    for (size_t i = 0; component && i < n; i++)
        if (!strcmp(t[i].component, component)) return (int)i;
    return -1;
}

/* the file's kind (0 when it cannot be read: SD3's names) */
static int file_kind(const char *file, int *guided) {
    st_set *set = NULL;
    if (guided) *guided = 0;
    if (!file || st_set_open(file, &set)) {
        kb_clear_error();
        return 0;
    }
    int flux = kind_of(set, guided);
    st_set_close(set);
    return flux;
}

int kp_file_is_flux(const char *file) { return file_kind(file, NULL); }

const char *kp_component_prefix(const char *file, const char *component) {
    const char *prefix = NULL;
    return kp_part_lookup(file, component, &prefix, NULL, NULL) ? prefix : NULL;
}

/* which prefixes the file's names use: bit i for the kind's part i */
static unsigned prefixes_of(const st_set *set) {
    size_t np;
    const part *t = parts_of(kind_of(set, NULL), &np);
    unsigned bits = 0;
    for (size_t k = 0, n = st_set_count(set); k < n; k++) {
        const char *name = st_set_at(set, k)->name;
        for (size_t i = 0; i < np; i++)
            if (!strncmp(name, t[i].prefix, strlen(t[i].prefix))) bits |= 1u << i;
    }
    return bits;
}

int kp_is_single_file(const char *path) {
    if (!path || !kb_is_file(path)) return 0;
    size_t l = strlen(path);
    if (l < 12 || strcmp(path + l - 12, ".safetensors")) return 0;
    st_set *set = NULL;
    if (st_set_open(path, &set)) {
        kb_clear_error();
        return 0;
    }
    unsigned bits = prefixes_of(set);
    st_set_close(set);
    return (bits & 1u) && (bits & ~1u); /* the transformer and something else */
}

int kiln_is_single_file(const char *path) { return kp_is_single_file(path); }

kiln_status kp_source_init(const char *path, const char *tokenizers_dir, kp_source *out) {
    memset(out, 0, sizeof *out);
    if (!path) return kb_fail(KILN_ERR_INVALID_ARG, "a pipeline folder or an all-in-one file is required");
    if (kb_is_dir(path)) {
        if (tokenizers_dir)
            return kb_fail(KILN_ERR_INVALID_ARG, "--tokenizers %s is for an all-in-one single file; %s is a pipeline "
                           "folder, which has its own tokenizer folders", tokenizers_dir, path);
        out->dir = out->aux = path;
        return KILN_OK;
    }
    if (!kb_is_file(path)) return kb_fail(KILN_ERR_IO, "%s: no such file or folder", path);
    st_set *set = NULL;
    kiln_status st = st_set_open(path, &set);
    if (st) return kb_wrap(st, "%s is neither a pipeline folder nor a readable all-in-one safetensors file", path);
    unsigned bits = prefixes_of(set);
    size_t np;
    const part *t = parts_of(kind_of(set, NULL), &np);
    st_set_close(set);
    if (!(bits & 1u) || !(bits & ~1u)) {
        char have[256] = "";
        for (size_t i = 0; i < np; i++)
            if (bits >> i & 1u) snprintf(have + strlen(have), sizeof have - strlen(have), " %s*", t[i].prefix);
        return kb_fail(KILN_ERR_MISSING, "%s is not an all-in-one file: it needs the transformer "
                       "(model.diffusion_model.*) and its text encoders and VAE (SD3: text_encoders.clip_l.*, "
                       "text_encoders.clip_g.*, text_encoders.t5xxl.*, first_stage_model.*; Flux: "
                       "text_encoders.clip_l.*, text_encoders.t5xxl.*, vae.*); it has%s", path,
                       have[0] ? have : " none of them");
    }
    if (tokenizers_dir && !kb_is_dir(tokenizers_dir))
        return kb_fail(KILN_ERR_IO, "--tokenizers %s is not a folder (it holds tokenizer/, tokenizer_2/, tokenizer_3/ "
                       "as a diffusers pipeline folder does)", tokenizers_dir);
    out->file = path;
    out->aux = tokenizers_dir;
    return KILN_OK;
}

int kp_has_component(const kp_source *s, const char *component) {
    if (s->dir) {
        char *d = kb_path_join(s->dir, component);
        int yes = d && kb_is_dir(d);
        free(d);
        return yes;
    }
    st_set *set = NULL;
    if (st_set_open(s->file, &set)) {
        kb_clear_error();
        return 0;
    }
    size_t np;
    const part *t = parts_of(kind_of(set, NULL), &np);
    int i = part_index(t, np, component);
    int yes = i >= 0 && (prefixes_of(set) >> i & 1u);
    st_set_close(set);
    return yes;
}

char *kp_aux_path(const kp_source *s, const char *rel) { return s->aux ? kb_path_join(s->aux, rel) : NULL; }

kiln_status kp_missing_tokenizer(const kp_source *s, const char *tokenizer) {
    if (s->dir) return kb_fail(KILN_ERR_MISSING, "%s: no %s/ folder", s->dir, tokenizer);
    if (!s->aux)
        return kb_fail(KILN_ERR_MISSING, "%s is an all-in-one file without tokenizers: pass --tokenizers DIR "
                       "(kiln_pipeline_open_file's tokenizers_dir), a folder laid out as a diffusers pipeline with "
                       "%s/ in it (tokenizer/, tokenizer_2/, tokenizer_3/, as in the model's diffusers repository)",
                       s->file, tokenizer);
    return kb_fail(KILN_ERR_MISSING, "--tokenizers %s has no %s/ folder (the tokenizer of %s); copy it from the "
                   "model's diffusers repository", s->aux, tokenizer, s->file);
}

kiln_status kp_check_tokenizers(const kp_source *s) {
    static const char *const tok[3] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    if (s->dir) return KILN_OK; /* (a Flux file has no text_encoder_3: CLIP's and T5's tokenizers) */
    for (int i = 0; i < 3; i++) {
        if (i == 2 && !kp_has_component(s, "text_encoder_3")) continue;
        char *td = kp_aux_path(s, tok[i]);
        int ok = td && kb_is_dir(td);
        free(td);
        if (!ok) return kp_missing_tokenizer(s, tok[i]);
    }
    return KILN_OK;
}

int kp_part_lookup(const char *file, const char *component, const char **prefix, const char **family,
                   const char **assume) {
    int guided = 0, flux = file ? file_kind(file, &guided) : 0;
    size_t np;
    const part *t = parts_of(flux, &np);
    int i = part_index(t, np, component);
    if (i < 0) return 0;
    if (prefix) *prefix = t[i].prefix;
    if (family) *family = flux && i == 0 && !guided ? "flux-schnell" : t[i].family;
    if (assume) *assume = t[i].assume;
    return 1;
}
