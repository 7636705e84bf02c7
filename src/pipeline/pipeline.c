/* pipeline.c - a diffusers pipeline folder, or an all-in-one file, as one
 * object whatever its class: model_index.json names the class (an
 * all-in-one file's transformer names tell it), which picks a row of the
 * class table (pipeline_kind.h: SD3's, Flux's); scheduler/ gives the
 * schedule, the transformer and the VAE load through the weight cache under
 * their own component keys and are checked against each other and the row,
 * and a request is checked here once, at the boundary (prompts, batch,
 * steps, guidance, size), before the row turns prompts into latents as the
 * class's __call__ does. */
#include "base/base.h"
#include "kiln.h"
#include "model/model.h"
#include "pipeline/component.h"
#include "pipeline/pipeline_files.h"
#include "pipeline/pipeline_kind.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the classes kiln runs, in the order a class name is looked up */
static const kp_kind *const k_kinds[] = {&kp_sd3_kind, &kp_flux_kind};
#define N_KINDS (sizeof k_kinds / sizeof *k_kinds)

struct kiln_pipeline {
    const kp_kind *kind;
    void *impl;          /* the row's part (its text encoders ...) */
    char *dir;           /* the folder or the all-in-one file */
    char *tokenizers;    /* an all-in-one file's tokenizers folder, or NULL */
    kp_source src;       /* where the parts are (pointing at dir, tokenizers) */
    kiln_load_opts base;
    int has_base;
    kiln_model *transformer;
    kiln_model *vae; /* the decoder; NULL when the folder has no vae/ */
    int vae_scale;   /* 2^(len(block_out_channels) - 1): pixels per latent cell */
    int sample_size; /* the default size, in latent cells */
};

int kp_kind_runs(const kp_kind *k, const char *family) {
    for (int i = 0; family && k->families[i]; i++)
        if (!strcmp(k->families[i], family)) return 1;
    return 0;
}

static const kp_kind *kind_of_class(const char *cls) {
    for (size_t i = 0; i < N_KINDS; i++)
        if (!strcmp(k_kinds[i]->cls, cls)) return k_kinds[i];
    return NULL;
}

static const kp_kind *kind_of_family(const char *family) {
    for (size_t i = 0; i < N_KINDS; i++)
        if (kp_kind_runs(k_kinds[i], family)) return k_kinds[i];
    return NULL;
}

void kiln_pipeline_free(kiln_pipeline *p) {
    if (!p) return;
    if (p->impl) p->kind->free(p->impl);
    kiln_model_free(p->transformer);
    kiln_model_free(p->vae);
    free(p->dir);
    free(p->tokenizers);
    free(p);
}

/* the source's model_index.json (its aux folder's), parsed; *have 0 when
 * there is none (an error when required) */
static kiln_status read_index(const kp_source *src, int required, kp_index *ix, int *have) {
    char *path = kp_aux_path(src, "model_index.json"), *text = NULL;
    size_t len = 0;
    kiln_status st = KILN_OK;
    *have = 0;
    if (!path) return src->aux ? KILN_ERR_NOMEM : KILN_OK;
    if (!kb_is_file(path)) {
        if (required) st = kb_fail(KILN_ERR_MISSING, "%s: no model_index.json (a diffusers pipeline folder has one)", src->aux);
    } else if (!(st = kb_read_file(path, &text, &len)) && !(st = kp_index_parse(text, len, path, ix))) {
        *have = 1;
    }
    free(path);
    free(text);
    return st;
}

static kiln_status open_model(kiln_pipeline *p, const char *component, kiln_model **out) {
    kiln_status st = kp_open_part(&p->src, component, p->has_base ? &p->base : NULL, out);
    return st ? kb_wrap(st, "%s", component) : KILN_OK;
}

/* the VAE factor of a VAE config (as diffusers' pipeline: 2^(blocks - 1);
 * 8 without one) */
static int scale_of(const char *js) {
    cJSON *j = cJSON_Parse(js ? js : "");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "block_out_channels");
    int blocks = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    cJSON_Delete(j);
    return blocks > 0 && blocks <= 8 ? 1 << (blocks - 1) : 8; /* VAE_MAX_BLOCKS: a validated config has at most 8 */
}

kiln_status kiln_pipeline_open(const char *dir, const kiln_load_opts *base, kiln_pipeline **out) {
    if (!dir || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_pipeline_open: folder and out are required");
    *out = NULL;
    if (!kb_is_dir(dir) && !kp_is_single_file(dir)) return kb_fail(KILN_ERR_IO, "%s is not a pipeline folder", dir);
    return kiln_pipeline_open_file(dir, NULL, base, out);
}

/* the class names kiln runs, for a message: "A and B" */
static const char *class_names(char *buf, size_t cap) {
    buf[0] = 0;
    for (size_t i = 0; i < N_KINDS; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", i ? (i + 1 == N_KINDS ? " and " : ", ") : "", k_kinds[i]->cls);
    return buf;
}

kiln_status kiln_pipeline_open_file(const char *dir, const char *tokenizers_dir, const kiln_load_opts *base,
                                    kiln_pipeline **out) {
    if (!dir || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_pipeline_open_file: path and out are required");
    *out = NULL;
    kp_source src;
    kiln_status st = kp_source_init(dir, tokenizers_dir, &src);
    if (!st) st = kp_check_tokenizers(&src); /* before any component loads */
    if (st) return st;
    /* a folder must say its class; a file says it by its transformer's names
     * (and its tokenizers folder's index, when there is one, must agree) */
    kp_index index;
    int have_index = 0;
    if ((st = read_index(&src, src.dir != NULL, &index, &have_index))) return st;
    int file_flux = src.file && kp_file_is_flux(src.file); /* (reads the file's header) */
    const kp_kind *kind = have_index ? kind_of_class(index.cls) : file_flux ? &kp_flux_kind : &kp_sd3_kind;
    char names[160];
    if (!kind)
        return kb_fail(KILN_ERR_UNSUPPORTED, "%s: model_index.json names the pipeline class %s; kiln runs %s (SD3, SD3.5 "
                       "and Flux.1)", src.aux, *index.cls ? index.cls : "(none)", class_names(names, sizeof names));
    if (src.file && (kind == &kp_flux_kind) != file_flux)
        return kb_fail(KILN_ERR_CONFIG, "%s holds %s transformer, but --tokenizers %s/model_index.json names %s", dir,
                       file_flux ? "a Flux" : "an SD3", src.aux, index.cls);
    /* every file there, before any component loads */
    if ((st = kp_check_folder(&src, kind->parts))) return st;
    kiln_pipeline *p = kb_calloc(1, sizeof *p);
    if (!p || !(p->dir = kb_strdup(dir)) || (tokenizers_dir && !(p->tokenizers = kb_strdup(tokenizers_dir)))) {
        if (p) free(p->dir);
        free(p);
        return KILN_ERR_NOMEM;
    }
    p->kind = kind;
    /* the same source, on the pipeline's own copies of the strings */
    p->src.dir = src.dir ? p->dir : NULL;
    p->src.file = src.file ? p->dir : NULL;
    p->src.aux = src.dir ? p->dir : p->tokenizers;
    if (base) {
        p->base = *base;
        p->has_base = 1;
    }
    /* the schedule: scheduler/scheduler_config.json, else the class's (an
     * all-in-one file's tokenizers folder without one) */
    kp_schedule sched = kind->sched;
    char *spath = kp_aux_path(&p->src, "scheduler/scheduler_config.json"), *stext = NULL;
    size_t slen = 0;
    if (spath && kb_is_file(spath) && !(st = kb_read_file(spath, &stext, &slen))) {
        char *where = kb_strfmt("%s/scheduler", p->src.aux);
        st = where ? kp_scheduler_parse_full(stext, slen, where, kind->sched.dynamic, &sched) : KILN_ERR_NOMEM;
        free(where);
    }
    free(spath);
    free(stext);
    if (!st) st = open_model(p, "transformer", &p->transformer);
    if (!st && !kp_kind_runs(kind, kiln_model_family(p->transformer)))
        st = kb_fail(KILN_ERR_CONFIG, "%s/transformer is a %s model; a %s runs %s", dir, kiln_model_family(p->transformer),
                     kind->cls, kind->families[0]);
    kp_open_ctx ctx = {&p->src, p->dir, p->tokenizers, p->has_base ? &p->base : NULL, p->transformer, &sched};
    if (!st) st = kind->open(&ctx, &p->impl, &p->sample_size);
    p->vae_scale = 8;
    if (!st && kp_has_component(&p->src, "vae") && !(st = open_model(p, "vae", &p->vae))) {
        int lc = kp_config_int(p->vae, "latent_channels", 4), want = kind->channels(p->impl, p->transformer);
        char *js = kiln_model_config_json(p->vae);
        p->vae_scale = scale_of(js);
        free(js);
        if (lc != want)
            st = kb_fail(KILN_ERR_CONFIG, "%s: the VAE has %d latent channels, the transformer's latent has %d", dir, lc,
                         want);
    }
    if (st) {
        kiln_pipeline_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

void kiln_pipeline_latent_shape(const kiln_pipeline *p, int *channels, int *default_cells) {
    if (channels) *channels = p ? p->kind->channels(p->impl, p->transformer) : 0;
    if (default_cells) *default_cells = p ? p->sample_size : 0;
}

const char *kiln_pipeline_class(const kiln_pipeline *p) { return p ? p->kind->cls : NULL; }

kiln_pipeline_opts kiln_pipeline_defaults_of(const kiln_pipeline *p) {
    kiln_pipeline_opts o = kiln_pipeline_defaults();
    if (p && p->kind->defaults) p->kind->defaults(p->impl, &o);
    return o;
}

kiln_pipeline_opts kiln_pipeline_defaults(void) {
    kiln_pipeline_opts o;
    memset(&o, 0, sizeof o);
    o.images_per_prompt = 1;
    o.steps = 28;
    o.guidance = 7.0;
    o.max_sequence_length = 256;
    return o;
}

int kiln_pipeline_vae_scale(const kiln_pipeline *p) { return p ? p->vae_scale : 0; }
kiln_model *kiln_pipeline_transformer(kiln_pipeline *p) { return p ? p->transformer : NULL; }
kiln_model *kiln_pipeline_vae(kiln_pipeline *p) { return p ? p->vae : NULL; }

kiln_status kiln_pipeline_check_size(const kiln_pipeline *p, int height, int width, int *lat_h, int *lat_w) {
    if (height <= 0 || width <= 0)
        return kb_fail(KILN_ERR_SHAPE, "%d x %d px (width x height): both must be positive", width, height);
    kiln_status st = p->kind->check_size(p->transformer->cfg, p->vae_scale, height, width);
    if (st) return st;
    if (lat_h) *lat_h = height / p->vae_scale;
    if (lat_w) *lat_w = width / p->vae_scale;
    return KILN_OK;
}

/* a component's config parsed and validated by its family (malloc'd, its
 * family in *a); NULL when there is none or it does not parse or validate */
static void *component_cfg(const kp_source *src, const char *component, const ka_arch **a) {
    char *text = NULL;
    void *cfg = NULL;
    *a = NULL;
    if (!kp_component_config(src, component, &text) && text && !km_config_parse(text, NULL, a, &cfg) &&
        (*a)->config_validate(cfg)) { /* every field in range (patch >= 1, ...) before it is used */
        free(cfg);
        cfg = NULL;
    }
    free(text);
    return cfg;
}

kiln_status kiln_pipeline_check_size_early(const char *path, const char *tokenizers_dir, int height, int width) {
    if (!path) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_pipeline_check_size_early: a path is required");
    kp_source src;
    if (kp_source_init(path, tokenizers_dir, &src)) {
        kb_clear_error(); /* kiln_pipeline_open_file says what is wrong with it */
        return KILN_OK;
    }
    const ka_arch *ta = NULL, *va = NULL;
    int has_vae = kp_has_component(&src, "vae");
    void *tcfg = component_cfg(&src, "transformer", &ta), *vcfg = has_vae ? component_cfg(&src, "vae", &va) : NULL;
    char *vjs = vcfg ? va->config_to_json(vcfg) : NULL; /* block_out_channels, every default filled in */
    const kp_kind *kind = tcfg ? kind_of_family(ta->name) : NULL;
    kiln_status st = KILN_OK;
    /* the row of the transformer's family checks the size (anything else is
     * kiln_pipeline_open_file's error to give) */
    if (kind && (!has_vae || vjs)) st = kind->check_size(tcfg, scale_of(vjs), height, width);
    else kb_clear_error();
    free(vjs);
    free(tcfg);
    free(vcfg);
    return st;
}

/* low_memory: 1 releases the text encoders after encoding, -1 never, 0
 * when every component's weights together pass 3/4 of the physical memory
 * (then the backbone and the VAE would push the encoders' pages out anyway) */
typedef struct release_ctx {
    const kiln_pipeline *p;
    int low_memory;
} release_ctx;

static int release_text(const void *ctx) {
    const kiln_pipeline *p = ((const release_ctx *)ctx)->p;
    int low_memory = ((const release_ctx *)ctx)->low_memory;
    if (low_memory) return low_memory > 0;
    uint64_t phys = kb_phys_bytes(), total = 0;
    kiln_model *m[2 + KP_MAX_TEXT] = {p->transformer, p->vae};
    for (int k = 0; k < KP_MAX_TEXT; k++) m[2 + k] = p->kind->text_model(p->impl, k);
    for (int k = 0; k < 2 + KP_MAX_TEXT; k++) {
        kiln_model_info in;
        if (m[k] && !kiln_model_get_info(m[k], &in) && in.weight_bytes > 0) total += (uint64_t)in.weight_bytes;
    }
    int release = phys && total > phys / 4 * 3;
    if (release)
        kb_log(KILN_LOG_INFO, "the pipeline's weights (%.1f GiB) pass 3/4 of the memory (%.1f GiB): the text encoders "
               "are released after encoding", (double)total / (1 << 30), (double)phys / (1 << 30));
    return release;
}

kiln_status kiln_pipeline_generate(kiln_pipeline *p, const kiln_pipeline_opts *o, float **latents, int64_t shape[4]) {
    if (!p || !o || !latents || !shape)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_pipeline_generate: pipeline, options and outputs are required");
    *latents = NULL;
    int n = o->n_prompts, ipp = o->images_per_prompt ? o->images_per_prompt : 1;
    /* a request's limits, before any encoding (a CFG batch holds two rows an image) */
    int most = KM_MAX_BATCH / p->kind->rows_per_image;
    if (n < 1 || !o->prompts) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_pipeline_generate: no prompt");
    if (ipp < 1 || n > most || ipp > most || n * ipp > most)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_pipeline_generate: %d prompts x %d images: at most %d images a call",
                       n, ipp, most);
    if (o->steps < 1 || o->steps > 100000)
        return kb_fail(KILN_ERR_INVALID_ARG, "steps %d: must be between 1 and 100000", o->steps);
    if (!isfinite(o->guidance)) return kb_fail(KILN_ERR_INVALID_ARG, "guidance must be a finite number");
    int H = o->height ? o->height : p->sample_size * p->vae_scale, W = o->width ? o->width : p->sample_size * p->vae_scale;
    int lh, lw;
    kiln_status st = kiln_pipeline_check_size(p, H, W, &lh, &lw);
    if (st) return st;
    kiln_model *comps[2 + KP_MAX_TEXT] = {p->transformer, p->vae};
    for (int k = 0; k < KP_MAX_TEXT; k++) comps[2 + k] = p->kind->text_model(p->impl, k);
    for (int k = 0; k < 2 + KP_MAX_TEXT; k++)
        if (comps[k]) kiln_model_set_compile(comps[k], o->compile);
    release_ctx rc = {p, o->low_memory};
    kp_release rel = {release_text, &rc};
    kp_open_ctx ctx = {&p->src, p->dir, p->tokenizers, p->has_base ? &p->base : NULL, p->transformer, NULL};
    if ((st = p->kind->generate(p->impl, &ctx, o, lh, lw, &rel, latents))) return st;
    shape[0] = (int64_t)n * ipp, shape[1] = p->kind->channels(p->impl, p->transformer), shape[2] = lh, shape[3] = lw;
    return KILN_OK;
}
