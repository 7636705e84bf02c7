/* sd3_pipeline.c - a diffusers StableDiffusion3Pipeline folder (SD3,
 * SD3.5), or a FluxPipeline one (its own parts: flux_pipeline.c), as one
 * object: model_index.json names the class and components,
 * scheduler/scheduler_config.json the schedule, the components' configs are
 * checked against each other, and a request goes prompt -> conditioning
 * (sd3_text.c) -> flow-matching sampling with CFG in one backbone batch
 * (kiln_generate) -> latents, as diffusers' pipeline __call__ does. Every
 * component loads through the weight cache under its own component key. */
#include "base/base.h"
#include "kiln.h"
#include "model/model.h"
#include "pipeline/component.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/pipeline_files.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kiln_pipeline {
    char *dir;           /* the folder or the all-in-one file */
    char *tokenizers;    /* an all-in-one file's tokenizers folder, or NULL */
    kp_source src;       /* where the parts are (pointing at dir, tokenizers) */
    kiln_sd3_text *text; /* NULL once released (kiln_pipeline_opts.low_memory) */
    kiln_load_opts base;
    int has_base;
    kiln_model *transformer;
    kiln_model *vae; /* the decoder; NULL when the folder has no vae/ */
    int vae_scale;   /* 2^(len(block_out_channels) - 1): pixels per latent cell */
    double shift;    /* the scheduler config's */
    int num_train_timesteps;
    int sample_size; /* the transformer's, in latent cells: the default size */
    kp_flux *flux;   /* a FluxPipeline's text side and sampler; NULL for SD3 */
};

/* a FluxPipeline folder's parts for kp_check_folder */
static const char *const k_flux_parts[] = {"transformer", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
                                           "?vae",        "?scheduler",   NULL};
#define FLUX_DEFAULT_SAMPLE 128 /* FluxPipeline.default_sample_size, in latent cells */
#define FLUX_MAX_TOKENS 65536   /* packed image tokens (src/arch/flux's limit) */

void kiln_pipeline_free(kiln_pipeline *p) {
    if (!p) return;
    kiln_sd3_text_free(p->text);
    kp_flux_free(p->flux);
    kiln_model_free(p->transformer);
    kiln_model_free(p->vae);
    free(p->dir);
    free(p->tokenizers);
    free(p);
}

/* a JSON file of the pipeline folder, or of an all-in-one file's tokenizers
 * folder (NULL when absent; *st set on a bad one) */
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

kiln_status kiln_pipeline_open_file(const char *dir, const char *tokenizers_dir, const kiln_load_opts *base,
                                    kiln_pipeline **out) {
    if (!dir || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_pipeline_open_file: path and out are required");
    *out = NULL;
    kp_source src;
    kiln_status st = kp_source_init(dir, tokenizers_dir, &src);
    if (!st) st = kp_check_tokenizers(&src); /* before any component loads */
    if (st) return st;
    /* a folder must say its class; a file's tokenizers folder may */
    kp_index index;
    int have_index = 0;
    if ((st = read_index(&src, src.dir != NULL, &index, &have_index))) return st;
    /* a file says its kind by its transformer's names (and its tokenizers folder's index must agree) */
    int flux = have_index ? !strcmp(index.cls, "FluxPipeline") : src.file && kp_file_is_flux(src.file);
    if (have_index && !flux && strcmp(index.cls, "StableDiffusion3Pipeline"))
        return kb_fail(KILN_ERR_UNSUPPORTED, "%s: model_index.json names the pipeline class %s; kiln runs "
                       "StableDiffusion3Pipeline (SD3, SD3.5) and FluxPipeline", src.aux, *index.cls ? index.cls : "(none)");
    if (src.file && flux != kp_file_is_flux(src.file))
        return kb_fail(KILN_ERR_CONFIG, "%s holds %s transformer, but --tokenizers %s/model_index.json names %s", dir,
                       kp_file_is_flux(src.file) ? "a Flux" : "an SD3", src.aux, index.cls);
    /* every file there, before any component loads */
    if ((st = kp_check_folder(&src, flux ? k_flux_parts : kp_sd3_parts))) return st;
    kiln_pipeline *p = kb_calloc(1, sizeof *p);
    if (!p || !(p->dir = kb_strdup(dir)) || (tokenizers_dir && !(p->tokenizers = kb_strdup(tokenizers_dir)))) {
        if (p) free(p->dir);
        free(p);
        return KILN_ERR_NOMEM;
    }
    /* the same source, on the pipeline's own copies of the strings */
    p->src.dir = src.dir ? p->dir : NULL;
    p->src.file = src.file ? p->dir : NULL;
    p->src.aux = src.dir ? p->dir : p->tokenizers;
    if (base) {
        p->base = *base;
        p->has_base = 1;
    }
    p->shift = 3.0;
    p->num_train_timesteps = 1000;
    /* no scheduler config (an all-in-one file's tokenizers folder without
     * one): SD3's shift 3.0, 1000 steps; Flux's dynamic shift */
    kp_schedule sched = {3.0, 1000, flux, 0.5, 1.15, 256, 4096};
    char *spath = kp_aux_path(&p->src, "scheduler/scheduler_config.json"), *stext = NULL;
    size_t slen = 0;
    if (spath && kb_is_file(spath) && !(st = kb_read_file(spath, &stext, &slen))) {
        char *where = kb_strfmt("%s/scheduler", p->src.aux);
        st = where ? kp_scheduler_parse_full(stext, slen, where, flux, &sched) : KILN_ERR_NOMEM;
        p->shift = sched.shift;
        p->num_train_timesteps = sched.num_train_timesteps;
        free(where);
    }
    free(spath);
    free(stext);
    if (!st) st = open_model(p, "transformer", &p->transformer);
    if (flux) {
        if (!st) st = kp_flux_open(&p->src, dir, base, p->transformer, &sched, &p->flux);
        p->sample_size = FLUX_DEFAULT_SAMPLE;
        p->vae_scale = 8;
        if (!st && kp_has_component(&p->src, "vae") && !(st = open_model(p, "vae", &p->vae))) {
            int lc = kp_config_int(p->vae, "latent_channels", 4), tin = kp_config_int(p->transformer, "in_channels", 64);
            char *js = kiln_model_config_json(p->vae);
            p->vae_scale = scale_of(js);
            free(js);
            if (4 * lc != tin)
                st = kb_fail(KILN_ERR_CONFIG, "%s: the VAE has %d latent channels, the transformer takes %d packed "
                             "(4 x the latent's)", dir, lc, tin);
        }
        if (st) {
            kiln_pipeline_free(p);
            return st;
        }
        *out = p;
        return KILN_OK;
    }
    const kiln_config *tc = st ? NULL : kiln_model_config(p->transformer);
    if (!st && !tc)
        st = kb_fail(KILN_ERR_CONFIG, "%s/transformer is a %s model, not an SD3 transformer", dir,
                     kiln_model_family(p->transformer));
    if (!st) {
        p->sample_size = tc->sample_size;
        st = kiln_sd3_text_open_file(dir, tokenizers_dir, base, &p->text);
    }
    int64_t t5w = 0, pw = 0;
    if (!st) st = kiln_sd3_text_widths(p->text, &t5w, &pw);
    if (!st && t5w != tc->joint_attention_dim)
        st = kb_fail(KILN_ERR_CONFIG, "%s: the text encoders give %lld features a token (T5's width), the transformer "
                     "takes joint_attention_dim %d", dir, (long long)t5w, tc->joint_attention_dim);
    if (!st && pw != tc->pooled_projection_dim)
        st = kb_fail(KILN_ERR_CONFIG, "%s: the CLIP projections give %lld pooled features, the transformer takes "
                     "pooled_projection_dim %d", dir, (long long)pw, tc->pooled_projection_dim);
    p->vae_scale = 8;
    if (!st && kp_has_component(&p->src, "vae")) {
        if (!(st = open_model(p, "vae", &p->vae))) {
            int lc = kp_config_int(p->vae, "latent_channels", 4);
            char *js = kiln_model_config_json(p->vae);
            p->vae_scale = scale_of(js);
            free(js);
            if (lc != tc->in_channels || lc != tc->out_channels)
                st = kb_fail(KILN_ERR_CONFIG, "%s: the VAE has %d latent channels, the transformer takes %d in and "
                             "gives %d out", dir, lc, tc->in_channels, tc->out_channels);
        }
    }
    if (st) {
        kiln_pipeline_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

void kiln_pipeline_latent_shape(const kiln_pipeline *p, int *channels, int *default_cells) {
    int c = !p ? 0 : p->flux ? kp_flux_channels(p->flux) : kiln_model_config(p->transformer)->in_channels;
    if (channels) *channels = c;
    if (default_cells) *default_cells = p ? p->sample_size : 0;
}

const char *kiln_pipeline_class(const kiln_pipeline *p) {
    return !p ? NULL : p->flux ? "FluxPipeline" : "StableDiffusion3Pipeline";
}

kiln_pipeline_opts kiln_pipeline_defaults_of(const kiln_pipeline *p) {
    kiln_pipeline_opts o = kiln_pipeline_defaults();
    if (p && p->flux) { /* FluxPipeline.__call__'s: 28 steps, guidance 3.5 (dev), T5's 512 tokens */
        o.guidance = kp_flux_guided(p->flux) ? 3.5 : 0.0;
        o.max_sequence_length = kp_flux_guided(p->flux) ? 512 : 256;
        if (!kp_flux_guided(p->flux)) o.steps = 4; /* schnell's few steps */
    }
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

/* height x width against the transformer's patch and position table and
 * the VAE's factor (a dimension <= 0 is not checked) */
static kiln_status check_size(const kiln_config *c, int vae_scale, int height, int width) {
    int f = vae_scale * c->patch_size, max = c->pos_embed_max_size * c->patch_size * vae_scale;
    int hw[2] = {height, width};
    for (int k = 0; k < 2; k++) {
        const char *what = k ? "width" : "height";
        if (hw[k] <= 0) continue;
        if (hw[k] > max)
            return kb_fail(KILN_ERR_SHAPE, "%s %d px: at most %d for this transformer (pos_embed_max_size %d x patch %d x "
                           "VAE factor %d)", what, hw[k], max, c->pos_embed_max_size, c->patch_size, vae_scale);
        if (hw[k] < f)
            return kb_fail(KILN_ERR_SHAPE, "%s %d px: at least %d (VAE factor %d x patch %d)", what, hw[k], f, vae_scale,
                           c->patch_size);
        if (hw[k] % f) /* max is a multiple of f: both neighbours are in range */
            return kb_fail(KILN_ERR_SHAPE, "%s %d px: must be a multiple of %d (VAE factor %d x patch %d); the nearest "
                           "are %d and %d", what, hw[k], f, vae_scale, c->patch_size, hw[k] / f * f, hw[k] / f * f + f);
    }
    return KILN_OK;
}

/* Flux: 2x2 latent patches of the VAE's cells, at most FLUX_MAX_TOKENS (a
 * dimension <= 0 is not checked) */
static kiln_status check_size_flux(int vae_scale, int height, int width) {
    int f = 2 * vae_scale, hw[2] = {height, width};
    for (int k = 0; k < 2; k++) {
        const char *what = k ? "width" : "height";
        if (hw[k] <= 0) continue;
        if (hw[k] < f)
            return kb_fail(KILN_ERR_SHAPE, "%s %d px: at least %d (VAE factor %d x 2x2 patches)", what, hw[k], f, vae_scale);
        if (hw[k] % f)
            return kb_fail(KILN_ERR_SHAPE, "%s %d px: must be a multiple of %d (VAE factor %d x 2x2 patches); the nearest "
                           "are %d and %d", what, hw[k], f, vae_scale, hw[k] / f * f, hw[k] / f * f + f);
    }
    if (height > 0 && width > 0 && (int64_t)(height / f) * (width / f) > FLUX_MAX_TOKENS)
        return kb_fail(KILN_ERR_SHAPE, "%d x %d px (width x height): %lld image tokens, at most %d", width, height,
                       (long long)(height / f) * (width / f), FLUX_MAX_TOKENS);
    return KILN_OK;
}

kiln_status kiln_pipeline_check_size(const kiln_pipeline *p, int height, int width, int *lat_h, int *lat_w) {
    if (height <= 0 || width <= 0)
        return kb_fail(KILN_ERR_SHAPE, "%d x %d px (width x height): both must be positive", width, height);
    kiln_status st = p->flux ? check_size_flux(p->vae_scale, height, width)
                             : check_size(kiln_model_config(p->transformer), p->vae_scale, height, width);
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
    kiln_status st = KILN_OK;
    /* an SD3 transformer config says its patch and table, a Flux one its
     * 2x2 packing (anything else is kiln_pipeline_open_file's error to give) */
    if (tcfg && ta == ka_find("sd3") && (!has_vae || vjs))
        st = check_size((const kiln_config *)tcfg, scale_of(vjs), height, width);
    else if (tcfg && (ta == ka_find("flux") || ta == ka_find("flux-schnell")) && (!has_vae || vjs))
        st = check_size_flux(scale_of(vjs), height, width);
    else
        kb_clear_error();
    free(vjs);
    free(tcfg);
    free(vcfg);
    return st;
}

/* low_memory: 1 releases the text encoders after encoding, -1 never, 0
 * when every component's weights together pass 3/4 of the physical memory
 * (then the backbone and the VAE would push the encoders' pages out anyway) */
static int release_text(const kiln_pipeline *p, int low_memory) {
    if (low_memory) return low_memory > 0;
    uint64_t phys = kb_phys_bytes(), total = 0;
    kiln_model *m[5] = {p->transformer, p->vae, NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) m[2 + k] = p->flux ? kp_flux_text_model(p->flux, k) : kiln_sd3_text_model(p->text, k);
    for (int k = 0; k < 5; k++) {
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
    const kiln_config *c = kiln_model_config(p->transformer);
    int n = o->n_prompts, ipp = o->images_per_prompt ? o->images_per_prompt : 1;
    /* a request's limits, before any encoding (SD3's CFG batch holds two rows an image) */
    int most = p->flux ? KM_MAX_BATCH : KM_MAX_BATCH / 2;
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
    if (p->flux) { /* FluxPipeline's own text side and sampler (flux_pipeline.c) */
        kiln_model *comps[4] = {p->transformer, p->vae, kp_flux_text_model(p->flux, 0), kp_flux_text_model(p->flux, 1)};
        for (int k = 0; k < 4; k++)
            if (comps[k]) kiln_model_set_compile(comps[k], o->compile);
        if ((st = kp_flux_generate(p->flux, p->transformer, o, lh, lw, release_text(p, o->low_memory), latents))) return st;
        shape[0] = (int64_t)n * ipp, shape[1] = kp_flux_channels(p->flux), shape[2] = lh, shape[3] = lw;
        return KILN_OK;
    }
    if (o->max_batch < 0) return kb_fail(KILN_ERR_INVALID_ARG, "max_batch %d: images per backbone call, 1 or more", o->max_batch);
    if (!p->text) { /* released by low_memory after the last request: mapped again (cache hits) */
        double t1 = kb_now();
        if ((st = kiln_sd3_text_open_file(p->dir, p->tokenizers, p->has_base ? &p->base : NULL, &p->text))) return kb_wrap(st, "%s: text encoders", p->dir);
        kb_ledger_add("load text encoders", kb_now() - t1, "again, after low_memory released them");
    }
    kiln_model *comps[5] = {p->transformer, p->vae, kiln_sd3_text_model(p->text, 0), kiln_sd3_text_model(p->text, 1),
                            kiln_sd3_text_model(p->text, 2)};
    for (int k = 0; k < 5; k++)
        if (comps[k]) kiln_model_set_compile(comps[k], o->compile);
    int cfg = o->guidance > 1.0;
    float *pe = NULL, *pp = NULL, *ne = NULL, *np = NULL;
    int64_t es[3], ps[2];
    double t0 = kb_now();
    /* the prompts and (CFG) their negative prompts in one encoder batch, so
     * each encoder's weights are read once: rows [prompts x ipp | negatives x ipp] */
    int ne_prompts = cfg ? 2 * n : n;
    const char **all = malloc(sizeof(char *) * (size_t)ne_prompts);
    if (!all) st = KILN_ERR_NOMEM;
    for (int k = 0; all && k < n; k++) {
        all[k] = o->prompts[k];
        if (cfg)
            all[n + k] = o->negative_prompts && o->negative_prompts[k] ? o->negative_prompts[k]
                         : o->negative_prompt                          ? o->negative_prompt
                                                                       : "";
    }
    if (!st) st = kiln_sd3_encode(p->text, all, ne_prompts, ipp, o->max_sequence_length, &pe, es, &pp, ps);
    free(all);
    if (!st && cfg) { /* views of the second half */
        es[0] = ps[0] = (int64_t)n * ipp;
        ne = pe + (size_t)(es[0] * es[1] * es[2]);
        np = pp + (size_t)(ps[0] * ps[1]);
    }
    if (!st) kb_ledger_add("encode_prompt", kb_now() - t0, "CLIP-L, CLIP-G, T5");
    if (!st && o->on_cond) o->on_cond(o->user, pe, es, pp, ps, ne, np);
    if (!st && release_text(p, o->low_memory)) { /* the encoders' mappings go before the backbone runs */
        kiln_sd3_text_free(p->text);
        p->text = NULL;
    }
    int B = n * ipp;
    float *lat = st ? NULL : malloc(sizeof(float) * (size_t)B * (size_t)c->in_channels * (size_t)lh * (size_t)lw);
    if (!st && !lat) st = kb_fail(KILN_ERR_NOMEM, "out of memory for the latents");
    if (!st) {
        kiln_generate_opts g = kiln_generate_defaults();
        g.steps = o->steps;
        g.shift = o->shift > 0 ? o->shift : p->shift;
        g.num_train_timesteps = p->num_train_timesteps;
        g.guidance = o->guidance;
        g.latent_h = lh;
        g.latent_w = lw;
        g.seed = o->seed;
        g.noise = o->noise;
        g.context_len = (int)es[1];
        g.cond = pe;
        g.cond_pooled = pp;
        g.uncond = ne;
        g.uncond_pooled = np;
        g.on_step = o->on_step;
        g.user = o->user;
        g.batch = B;
        g.max_batch = o->max_batch;
        g.memory_budget = o->memory_budget ? o->memory_budget : kb_default_budget();
        st = kiln_generate(p->transformer, &g, lat);
    }
    free(pe); /* ne and np point into pe and pp */
    free(pp);
    if (st) {
        free(lat);
        return st;
    }
    *latents = lat;
    shape[0] = B, shape[1] = c->in_channels, shape[2] = lh, shape[3] = lw;
    return KILN_OK;
}
