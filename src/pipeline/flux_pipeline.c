/* flux_pipeline.c - FluxPipeline (diffusers 0.42) after its folder is
 * open: encode_prompt (CLIP-L's pooler_output from 77 tokens, T5's
 * last_hidden_state from max_sequence_length tokens, no attention mask),
 * the schedule with the dynamic shift, and the Euler loop over the
 * transformer with the guidance as an input (dev) and no CFG batch. The
 * transformer packs and unpacks the latents itself, so the latents here are
 * [B, 16, h, w], as the noise a caller gives. */
#include "pipeline/flux_pipeline.h"

#include "arch/flux/flux.h" /* FLUX_MAX_TOKENS: the family's limit on image patches */

#include "base/base.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLIP_LEN 77

struct kp_flux {
    kiln_tokenizer *tok[2];
    kiln_model *enc[2]; /* CLIP-L (CLIPTextModel), T5; NULL once released (low_memory) */
    kp_schedule sched;
    int guided;
    int channels; /* the latent's: the transformer's in_channels / 4 */
};

static const char *const k_tok[2] = {"tokenizer", "tokenizer_2"};
static const char *const k_enc[2] = {"text_encoder", "text_encoder_2"};

void kp_flux_free(kp_flux *f) {
    if (!f) return;
    for (int i = 0; i < 2; i++) {
        kiln_tokenizer_free(f->tok[i]);
        kiln_model_free(f->enc[i]);
    }
    free(f);
}

kiln_model *kp_flux_text_model(kp_flux *f, int i) { return f && i >= 0 && i < 2 ? f->enc[i] : NULL; }
int kp_flux_guided(const kp_flux *f) { return f ? f->guided : 0; }
int kp_flux_channels(const kp_flux *f) { return f ? f->channels : 0; }

kiln_status kp_flux_open(const kp_source *src, const char *where, const kiln_load_opts *base, kiln_model *transformer,
                         const kp_schedule *sched, kp_flux **out) {
    *out = NULL;
    const char *fam = kiln_model_family(transformer);
    if (strcmp(fam, "flux") && strcmp(fam, "flux-schnell"))
        return kb_fail(KILN_ERR_CONFIG, "%s/transformer is a %s model, not a Flux transformer", where, fam);
    kp_flux *f = kb_calloc(1, sizeof *f);
    if (!f) return KILN_ERR_NOMEM;
    f->sched = *sched;
    f->guided = !strcmp(fam, "flux");
    kiln_status st = KILN_OK;
    for (int i = 0; i < 2 && !st; i++) {
        char *td = kp_aux_path(src, k_tok[i]);
        if (!td) st = KILN_ERR_NOMEM;
        else if (!kb_is_dir(td)) st = kp_missing_tokenizer(src, k_tok[i]);
        else if (!kp_has_component(src, k_enc[i]))
            st = kb_fail(KILN_ERR_MISSING, "%s: a Flux pipeline needs %s/ and %s/", where, k_tok[i], k_enc[i]);
        else if (!(st = kiln_tokenizer_open(td, &f->tok[i])) && (st = kp_open_part(src, k_enc[i], base, &f->enc[i])))
            st = kb_wrap(st, "%s", k_enc[i]);
        free(td);
    }
    int64_t pw = 0, tw = 0;
    if (!st && strcmp(kiln_model_family(f->enc[0]), "clip"))
        st = kb_fail(KILN_ERR_CONFIG, "%s/text_encoder is a %s model; Flux needs CLIP-L (CLIPTextModel)", where,
                     kiln_model_family(f->enc[0]));
    if (!st && strcmp(kiln_model_family(f->enc[1]), "t5"))
        st = kb_fail(KILN_ERR_CONFIG, "%s/text_encoder_2 is a %s model; Flux needs a T5 encoder", where,
                     kiln_model_family(f->enc[1]));
    if (!st) st = kp_output_width(f->enc[0], CLIP_LEN, "pooler_output", &pw);
    if (!st) st = kp_output_width(f->enc[1], 1, "last_hidden_state", &tw);
    /* the transformer's widths, from its config */
    if (!st) {
        int64_t J = kp_config_int(transformer, "joint_attention_dim", 0), P = kp_config_int(transformer, "pooled_projection_dim", 0);
        f->channels = kp_config_int(transformer, "in_channels", 0) / 4;
        if (tw != J)
            st = kb_fail(KILN_ERR_CONFIG, "%s: T5 gives %lld features a token, the transformer takes joint_attention_dim "
                         "%lld", where, (long long)tw, (long long)J);
        else if (pw != P)
            st = kb_fail(KILN_ERR_CONFIG, "%s: CLIP's pooled output has %lld features, the transformer takes "
                         "pooled_projection_dim %lld", where, (long long)pw, (long long)P);
    }
    if (st) {
        kp_flux_free(f);
        return st;
    }
    *out = f;
    return KILN_OK;
}

kiln_status kp_flux_schedule(const kp_schedule *s, int steps, int64_t N, double *mu, float *timesteps, float *sigmas) {
    if (steps < 1 || steps > 100000) return kb_fail(KILN_ERR_INVALID_ARG, "steps = %d: must be between 1 and 100000", steps);
    /* calculate_shift: the line through (base_seq, base_shift), (max_seq, max_shift) */
    double m = (s->max_shift - s->base_shift) / (double)(s->max_seq - s->base_seq);
    double b = s->base_shift - m * (double)s->base_seq;
    *mu = (double)N * m + b;
    float e = (float)exp(*mu);
    for (int i = 0; i < steps; i++) {
        /* np.linspace(1, 1/steps, steps) in double, then float32 */
        double lo = 1.0 / steps, t = steps == 1 ? 1.0 : 1.0 + (lo - 1.0) * (double)i / (double)(steps - 1);
        if (i == steps - 1) t = lo;
        float sf = (float)t;
        float sig = s->dynamic ? e / (e + (1.0f / sf - 1.0f)) /* time_shift "exponential" in f32 */
                               : (float)(s->shift * sf / (1.0 + (s->shift - 1.0) * sf));
        sigmas[i] = sig;
        timesteps[i] = sig * (float)s->num_train_timesteps;
    }
    sigmas[steps] = 0.0f;
    return KILN_OK;
}

static kiln_status flux_generate(void *impl, const kp_open_ctx *c, const kiln_pipeline_opts *o, int lh, int lw,
                                 const kp_release *release, float **latents) {
    kp_flux *f = impl;
    kiln_model *transformer = c->transformer;
    *latents = NULL;
    int n = o->n_prompts, ipp = o->images_per_prompt ? o->images_per_prompt : 1, B = n * ipp;
    int msl = o->max_sequence_length > 0 ? o->max_sequence_length : f->guided ? 512 : 256;
    if (msl > 512) return kb_fail(KILN_ERR_INVALID_ARG, "max_sequence_length %d: at most 512 (T5's)", msl);
    if (o->negative_prompt || o->negative_prompts)
        return kb_fail(KILN_ERR_UNSUPPORTED, "a negative prompt: Flux is guidance-distilled and samples without one "
                       "(true CFG, FluxPipeline's true_cfg_scale, is not in kiln yet)");
    if (o->shift > 0)
        return kb_fail(KILN_ERR_UNSUPPORTED, "shift %g: a Flux pipeline's shift comes from the image's size "
                       "(use_dynamic_shifting)", o->shift);
    if (f->guided && !(o->guidance >= 0)) return kb_fail(KILN_ERR_INVALID_ARG, "guidance %g: 0 or more", o->guidance);
    for (int p = 0; p < n; p++)
        if (!o->prompts[p]) return kb_fail(KILN_ERR_INVALID_ARG, "prompt %d is NULL", p);
    static const char *const clip_out[1] = {"pooler_output"}, *t5_out[1] = {"last_hidden_state"};
    float *b[2] = {NULL, NULL};
    int64_t sh[2][1][3];
    kiln_status st = KILN_OK;
    if (!f->enc[0] || !f->enc[1]) { /* released by low_memory after the last request: mapped again (cache hits) */
        double t1 = kb_now();
        for (int i = 0; i < 2 && !st; i++)
            if (!f->enc[i] && (st = kp_open_part(c->src, k_enc[i], c->base, &f->enc[i])))
                st = kb_wrap(st, "%s", k_enc[i]);
            else
                kiln_model_set_compile(f->enc[i], o->compile);
        if (st) return st;
        kb_ledger_add("load text encoders", kb_now() - t1, "again, after low_memory released them");
    }
    double t0 = kb_now();
    st = kp_encode_ids(f->enc[0], f->tok[0], o->prompts, n, CLIP_LEN, "CLIP", 1, clip_out, &b[0], sh[0]);
    if (st) st = kb_wrap(st, "text_encoder");
    if (!st && (st = kp_encode_ids(f->enc[1], f->tok[1], o->prompts, n, msl, "T5 (max_sequence_length)", 1, t5_out, &b[1],
                                   sh[1])))
        st = kb_wrap(st, "text_encoder_2");
    int64_t P = st ? 0 : sh[0][0][1], J = st ? 0 : sh[1][0][2], T = msl, C = f->channels;
    /* each prompt's rows repeated images_per_prompt times in a row */
    float *pe = st ? NULL : malloc(sizeof(float) * (size_t)(B * T * J)), *pp = st ? NULL : malloc(sizeof(float) * (size_t)(B * P));
    if (!st && (!pe || !pp)) st = kb_fail(KILN_ERR_NOMEM, "out of memory for the prompt embeddings");
    for (int r = 0; !st && r < B; r++) {
        int p = r / ipp;
        memcpy(pe + (size_t)r * T * J, b[1] + (size_t)p * T * J, sizeof(float) * (size_t)(T * J));
        memcpy(pp + (size_t)r * P, b[0] + (size_t)p * P, sizeof(float) * (size_t)P);
    }
    free(b[0]);
    free(b[1]);
    if (!st) {
        kb_ledger_add("encode_prompt", kb_now() - t0, "CLIP-L, T5");
        int64_t es[3] = {B, T, J}, ps[2] = {B, P};
        if (o->on_cond) o->on_cond(o->user, pe, es, pp, ps, NULL, NULL);
    }
    if (!st && release->now(release->ctx)) /* the encoders' mappings go before the backbone runs (T5-XXL: 9.5 GB in bf16) */
        for (int i = 0; i < 2; i++) {
            kiln_model_free(f->enc[i]);
            f->enc[i] = NULL;
        }
    size_t lat = (size_t)(C * lh * lw), nl = (size_t)B * lat;
    float *x = st ? NULL : malloc(sizeof(float) * nl), *v = st ? NULL : malloc(sizeof(float) * nl);
    float *ts = st ? NULL : malloc(sizeof(float) * ((size_t)o->steps + 1)), *sig = st ? NULL : malloc(sizeof(float) * ((size_t)o->steps + 1));
    float *tin = st ? NULL : malloc(sizeof(float) * (size_t)B), *gin = st ? NULL : malloc(sizeof(float) * (size_t)B);
    if (!st && (!x || !v || !ts || !sig || !tin || !gin)) st = kb_fail(KILN_ERR_NOMEM, "out of memory for the latents");
    double mu = 0;
    if (!st) st = kp_flux_schedule(&f->sched, o->steps, (int64_t)(lh / 2) * (lw / 2), &mu, ts, sig);
    if (!st) {
        if (o->noise) memcpy(x, o->noise, sizeof(float) * nl);
        else /* image k from (seed + k) alone */
            for (int k = 0; k < B; k++) kiln_noise(o->seed + (uint64_t)k, x + (size_t)k * lat, lat);
        if (o->noise) st = kt_check_finite("noise", x, nl);
    }
    for (int k = 0; !st && k < B; k++) gin[k] = (float)o->guidance;
    for (int i = 0; !st && i < o->steps; i++) {
        double t1 = kb_now();
        /* the transformer gets timesteps[i] / 1000 and multiplies by 1000:
         * sigma[i], whose product by 1000 in the model is timesteps[i] */
        for (int k = 0; k < B; k++) tin[k] = sig[i];
        kiln_tensor in[5] = {{"latents", KILN_F32, 4, {B, C, lh, lw}, x},
                             {"encoder_hidden_states", KILN_F32, 3, {B, T, J}, pe},
                             {"pooled_projections", KILN_F32, 2, {B, P}, pp},
                             {"timestep", KILN_F32, 1, {B}, tin},
                             {"guidance", KILN_F32, 1, {B}, gin}};
        kiln_output out = {"sample", v, nl, 0, {0}};
        if ((st = kiln_run(transformer, in, f->guided ? 5 : 4, &out, 1))) {
            st = kb_wrap(st, "step %d of %d", i + 1, o->steps);
            break;
        }
        /* FlowMatchEulerDiscreteScheduler.step: x (as f32) + (sigma_next - sigma) v, dt in f32 */
        float dt = sig[i + 1] - sig[i];
        for (size_t k = 0; k < nl; k++) x[k] = (float)((double)x[k] + (double)dt * (double)v[k]);
        size_t bad = kt_find_nonfinite(x, nl);
        if (bad < nl) {
            st = kb_fail(KILN_ERR_NONFINITE, "step %d of %d gave a non-finite latent (%s at index %zu)", i + 1, o->steps,
                         kt_nonfinite_name(x[bad]), bad);
            break;
        }
        char what[64];
        snprintf(what, sizeof what, "batch %d, mu %.4f", B, mu);
        kb_ledger_add("sampler_step", kb_now() - t1, what);
        if (o->on_step) o->on_step(o->user, i + 1, o->steps, sig[i + 1], x);
    }
    free(pe);
    free(pp);
    free(v);
    free(ts);
    free(sig);
    free(tin);
    free(gin);
    if (st) {
        free(x);
        return st;
    }
    *latents = x;
    return KILN_OK;
}

/* ---- the row of the pipeline class table ---- */

#define FLUX_DEFAULT_SAMPLE 128 /* FluxPipeline.default_sample_size, in latent cells */

static kiln_status flux_open(const kp_open_ctx *c, void **impl, int *sample_size) {
    *sample_size = FLUX_DEFAULT_SAMPLE;
    return kp_flux_open(c->src, c->path, c->base, c->transformer, c->sched, (kp_flux **)impl);
}

static void flux_free(void *impl) { kp_flux_free(impl); }
static int flux_channels(const void *impl, const kiln_model *transformer) {
    (void)transformer;
    return ((const kp_flux *)impl)->channels;
}
static kiln_model *flux_text_model(void *impl, int i) { return kp_flux_text_model(impl, i); }

/* FluxPipeline.__call__'s: 28 steps, guidance 3.5 (dev), T5's 512 tokens;
 * schnell: 4 steps, 256 tokens, no guidance */
static void flux_defaults(const void *impl, kiln_pipeline_opts *o) {
    int guided = kp_flux_guided(impl);
    o->guidance = guided ? 3.5 : 0.0;
    o->max_sequence_length = guided ? 512 : 256;
    if (!guided) o->steps = 4;
}

/* 2x2 latent patches of the VAE's cells, at most FLUX_MAX_TOKENS (the
 * family's limit; a dimension <= 0 is not checked) */
static kiln_status flux_check_size(const void *cfg, int vae_scale, int height, int width) {
    (void)cfg;
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

/* a FluxPipeline folder's parts for kp_check_folder */
static const char *const k_parts[] = {"transformer", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
                                      "?vae",        "?scheduler",   NULL};
static const char *const k_families[] = {"flux", "flux-schnell", NULL};

/* without a scheduler config: FluxPipeline's dynamic shift */
const kp_kind kp_flux_kind = {.cls = "FluxPipeline", .parts = k_parts, .families = k_families,
                              .sched = {3.0, 1000, 1, 0.5, 1.15, 256, 4096}, .rows_per_image = 1,
                              .open = flux_open, .free = flux_free, .channels = flux_channels,
                              .check_size = flux_check_size, .defaults = flux_defaults, .text_model = flux_text_model,
                              .generate = flux_generate};
