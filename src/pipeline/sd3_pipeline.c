/* sd3_pipeline.c - StableDiffusion3Pipeline (SD3, SD3.5) as a row of the
 * pipeline class table (pipeline_kind.h): its text side (sd3_text.c: CLIP-L,
 * CLIP-G, T5), its size rule (the transformer's patch and position table),
 * and its __call__: prompt -> conditioning -> flow-matching sampling with
 * CFG in one backbone batch and the scheduler's fixed shift (kiln_generate)
 * -> latents. */
#include "base/base.h"
#include "kiln.h"
#include "model/model.h"
#include "pipeline/component.h"
#include "pipeline/pipeline_kind.h"

#include <stdlib.h>
#include <string.h>

typedef struct sd3_row {
    kiln_sd3_text *text; /* NULL once released (kiln_pipeline_opts.low_memory) */
    double shift; /* the scheduler config's */
    int num_train_timesteps;
    int channels; /* the transformer's in_channels */
} sd3_row;

static void row_free(void *impl) {
    sd3_row *r = impl;
    if (!r) return;
    kiln_sd3_text_free(r->text);
    free(r);
}

static kiln_status row_open(const kp_open_ctx *c, void **impl, int *sample_size) {
    *impl = NULL;
    const kiln_config *tc = kiln_model_config(c->transformer);
    if (!tc) return kb_fail(KILN_ERR_CONFIG, "%s/transformer is not an SD3 transformer", c->path);
    if (tc->out_channels != tc->in_channels)
        return kb_fail(KILN_ERR_CONFIG, "%s: the transformer takes %d latent channels in and gives %d out", c->path,
                       tc->in_channels, tc->out_channels);
    sd3_row *r = kb_calloc(1, sizeof *r);
    if (!r) return KILN_ERR_NOMEM;
    r->shift = c->sched->shift;
    r->num_train_timesteps = c->sched->num_train_timesteps;
    r->channels = tc->in_channels;
    kiln_status st = kiln_sd3_text_open_file(c->path, c->tokenizers, c->base, &r->text);
    int64_t t5w = 0, pw = 0;
    if (!st) st = kiln_sd3_text_widths(r->text, &t5w, &pw);
    if (!st && t5w != tc->joint_attention_dim)
        st = kb_fail(KILN_ERR_CONFIG, "%s: the text encoders give %lld features a token (T5's width), the transformer "
                     "takes joint_attention_dim %d", c->path, (long long)t5w, tc->joint_attention_dim);
    if (!st && pw != tc->pooled_projection_dim)
        st = kb_fail(KILN_ERR_CONFIG, "%s: the CLIP projections give %lld pooled features, the transformer takes "
                     "pooled_projection_dim %d", c->path, (long long)pw, tc->pooled_projection_dim);
    if (st) {
        row_free(r);
        return st;
    }
    *sample_size = tc->sample_size;
    *impl = r;
    return KILN_OK;
}

static int row_channels(const void *impl, const kiln_model *transformer) {
    (void)transformer;
    return ((const sd3_row *)impl)->channels;
}

static kiln_model *row_text_model(void *impl, int i) { return kiln_sd3_text_model(((sd3_row *)impl)->text, i); }

/* height x width against the transformer's patch and position table and
 * the VAE's factor (a dimension <= 0 is not checked) */
static kiln_status row_check_size(const void *cfg, int vae_scale, int height, int width) {
    const kiln_config *c = cfg;
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

static kiln_status row_generate(void *impl, const kp_open_ctx *c, const kiln_pipeline_opts *o, int lh, int lw,
                                const kp_release *release, float **latents) {
    sd3_row *r = impl;
    int n = o->n_prompts, ipp = o->images_per_prompt ? o->images_per_prompt : 1;
    kiln_status st = KILN_OK;
    if (o->max_batch < 0) return kb_fail(KILN_ERR_INVALID_ARG, "max_batch %d: images per backbone call, 1 or more", o->max_batch);
    if (!r->text) { /* released by low_memory after the last request: mapped again (cache hits) */
        double t1 = kb_now();
        if ((st = kiln_sd3_text_open_file(c->path, c->tokenizers, c->base, &r->text)))
            return kb_wrap(st, "%s: text encoders", c->path);
        for (int k = 0; k < KP_MAX_TEXT; k++)
            if (kiln_sd3_text_model(r->text, k)) kiln_model_set_compile(kiln_sd3_text_model(r->text, k), o->compile);
        kb_ledger_add("load text encoders", kb_now() - t1, "again, after low_memory released them");
    }
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
    if (!st) st = kiln_sd3_encode(r->text, all, ne_prompts, ipp, o->max_sequence_length, &pe, es, &pp, ps);
    free(all);
    if (!st && cfg) { /* views of the second half */
        es[0] = ps[0] = (int64_t)n * ipp;
        ne = pe + (size_t)(es[0] * es[1] * es[2]);
        np = pp + (size_t)(ps[0] * ps[1]);
    }
    if (!st) kb_ledger_add("encode_prompt", kb_now() - t0, "CLIP-L, CLIP-G, T5");
    if (!st && o->on_cond) o->on_cond(o->user, pe, es, pp, ps, ne, np);
    if (!st && release->now(release->ctx)) { /* the encoders' mappings go before the backbone runs */
        kiln_sd3_text_free(r->text);
        r->text = NULL;
    }
    int B = n * ipp;
    float *lat = st ? NULL : malloc(sizeof(float) * (size_t)B * (size_t)r->channels * (size_t)lh * (size_t)lw);
    if (!st && !lat) st = kb_fail(KILN_ERR_NOMEM, "out of memory for the latents");
    if (!st) {
        kiln_generate_opts g = kiln_generate_defaults();
        g.steps = o->steps;
        g.shift = o->shift > 0 ? o->shift : r->shift;
        g.num_train_timesteps = r->num_train_timesteps;
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
        st = kiln_generate(c->transformer, &g, lat);
    }
    free(pe); /* ne and np point into pe and pp */
    free(pp);
    if (st) {
        free(lat);
        return st;
    }
    *latents = lat;
    return KILN_OK;
}

static const char *const k_families[] = {"sd3", NULL};

/* SD3's own: shift 3.0 over 1000 training steps when there is no scheduler config */
const kp_kind kp_sd3_kind = {.cls = "StableDiffusion3Pipeline", .parts = kp_sd3_parts, .families = k_families,
                             .sched = {3.0, 1000, 0, 0.5, 1.15, 256, 4096}, .rows_per_image = 2,
                             .open = row_open, .free = row_free, .channels = row_channels,
                             .check_size = row_check_size, .defaults = NULL, .text_model = row_text_model,
                             .generate = row_generate};
