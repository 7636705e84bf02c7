/* quality.c - the quality gate of quantized backbones: one sampler request
 * (same noise, same conditioning) through an unquantized model and its
 * quantized twin, every step's latents compared (kiln_quality_check). */
#include "base/base.h"
#include "kiln.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kiln_quality_opts kiln_quality_defaults(void) {
    kiln_quality_opts o;
    memset(&o, 0, sizeof o);
    o.steps = 8;
    o.shift = 3.0;
    o.guidance = 5.0;
    o.seed = 1;
    o.context_len = 77;
    o.max_rel_l2 = KILN_QUALITY_MAX_REL_L2;
    return o;
}

typedef struct {
    float *steps; /* [n_steps][n]: the base model's latents after each step */
    size_t n;
    int n_steps, recording;
    double worst;
    int worst_step;
} recorder;

static void on_step(void *user, int step, int steps, double sigma, const float *latent) {
    (void)steps;
    (void)sigma;
    recorder *r = user;
    if (step < 1 || step > r->n_steps) return;
    float *slot = r->steps + (size_t)(step - 1) * r->n;
    if (r->recording) {
        memcpy(slot, latent, r->n * sizeof(float));
        return;
    }
    double e = kb_rel_l2(latent, slot, r->n);
    if (!(e <= r->worst)) { /* NaN counts as worst */
        r->worst = e;
        r->worst_step = step;
    }
}

static int fits(const kiln_config *c, int h, int w) {
    int p = c->patch_size, m = c->pos_embed_max_size * p;
    return h > 0 && w > 0 && h % p == 0 && w % p == 0 && h <= m && w <= m;
}

/* Any family but SD3 (which samples): one forward of the family's example
 * inputs through both models, the worst relative L2 over the outputs. */
static kiln_status forward_gate(kiln_model *base, kiln_model *quant, const kiln_quality_opts *o, kiln_quality_report *out) {
    const ka_arch *a = base->arch;
    char *ja = a->config_to_json(base->cfg), *jb = quant->arch->config_to_json(quant->cfg);
    int same = a == quant->arch && ja && jb && !strcmp(ja, jb);
    free(ja);
    free(jb);
    if (!same) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_quality_check: the two models have different configs (not the same checkpoint)");
    if (!(o->max_rel_l2 > 0)) return kb_fail(KILN_ERR_INVALID_ARG, "quality check: threshold %g must be positive", o->max_rel_l2);
    int64_t s[KA_MAX_SYMS] = {0}, ish[KA_MAX_IO][4] = {{0}}, osh[KA_MAX_OUT][4] = {{0}};
    a->example(base->cfg, s);
    a->io_shapes(base->cfg, s, ish, osh);
    float *in[KA_MAX_IO] = {0}, *ob[KA_MAX_OUT] = {0}, *oq[KA_MAX_OUT] = {0};
    kiln_status st = KILN_OK;
    for (int k = 0; k < a->n_in && !st; k++) {
        size_t n = ka_numel(a->in[k].ndim, ish[k]);
        if (!(in[k] = malloc(sizeof(float) * (n ? n : 1)))) st = KILN_ERR_NOMEM;
        else a->example_input(base->cfg, k, in[k], n);
    }
    for (int k = 0; k < base->n_out && !st; k++) {
        size_t n = ka_numel(base->out[k].ndim, osh[k]);
        if (!(ob[k] = malloc(sizeof(float) * n)) || !(oq[k] = malloc(sizeof(float) * n))) st = KILN_ERR_NOMEM;
    }
    if (!st) st = km_run(base, (const int64_t(*)[4])ish, (const float *const *)in, ob, "quality check");
    if (!st) st = km_run(quant, (const int64_t(*)[4])ish, (const float *const *)in, oq, "quality check");
    memset(out, 0, sizeof *out);
    out->max_rel_l2 = o->max_rel_l2;
    out->psnr_db = INFINITY;
    for (int k = 0; k < base->n_out && !st; k++) {
        double e = kb_rel_l2(oq[k], ob[k], ka_numel(base->out[k].ndim, osh[k]));
        if (!(e <= out->rel_l2)) out->rel_l2 = e; /* NaN counts as worst */
    }
    if (!st) {
        out->n = 1;
        out->c[0].rel_l2 = out->worst_step_rel_l2 = out->rel_l2;
        out->c[0].psnr_db = INFINITY;
    }
    for (int k = 0; k < KA_MAX_IO; k++) free(in[k]);
    for (int k = 0; k < KA_MAX_OUT; k++) {
        free(ob[k]);
        free(oq[k]);
    }
    out->pass = !st && out->rel_l2 <= out->max_rel_l2;
    return st;
}

kiln_status kiln_quality_check(kiln_model *base, kiln_model *quant, const kiln_quality_opts *opts,
                               kiln_quality_report *out) {
    if (!base || !quant || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_quality_check: two models and a report are required");
    kiln_quality_opts o = opts ? *opts : kiln_quality_defaults();
    const kiln_config *c = kiln_model_config(base);
    if (!c || !kiln_model_config(quant)) return forward_gate(base, quant, &o, out);
    if (memcmp(c, kiln_model_config(quant), sizeof *c))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_quality_check: the two models have different configs (not the same checkpoint)");
    if (o.steps < 1 || o.steps > 1000) return kb_fail(KILN_ERR_INVALID_ARG, "quality check: steps %d (1..1000)", o.steps);
    if (o.n_sizes < 0 || o.n_sizes > KILN_QUALITY_MAX_SIZES)
        return kb_fail(KILN_ERR_INVALID_ARG, "quality check: %d latent sizes (at most %d)", o.n_sizes, KILN_QUALITY_MAX_SIZES);
    if (!(o.max_rel_l2 > 0)) return kb_fail(KILN_ERR_INVALID_ARG, "quality check: threshold %g must be positive", o.max_rel_l2);
    if (o.n_sizes == 0) { /* 32x32 and 32x48, shrunk (in patches) to fit the position table */
        int p = c->patch_size, m = c->pos_embed_max_size * p, s = 32 / p * p;
        if (s > m) s = m / p * p;
        int w = (48 / p) * p > m ? m / p * p : (48 / p) * p;
        o.latent_h[0] = o.latent_w[0] = s;
        o.latent_h[1] = s;
        o.latent_w[1] = w;
        o.n_sizes = w == s ? 1 : 2;
    }
    for (int i = 0; i < o.n_sizes; i++)
        if (!fits(c, o.latent_h[i], o.latent_w[i]))
            return kb_fail(KILN_ERR_SHAPE, "quality check: latent %dx%d is not a multiple of the patch %d within %d",
                           o.latent_h[i], o.latent_w[i], c->patch_size, c->pos_embed_max_size * c->patch_size);
    int seeded = !o.cond;
    if (seeded && o.context_len < 1) o.context_len = 77;
    if (!seeded && (!o.cond_pooled || (o.guidance > 1 && (!o.uncond || !o.uncond_pooled))))
        return kb_fail(KILN_ERR_INVALID_ARG, "quality check: conditioning needs cond, cond_pooled and (with guidance > 1) "
                       "uncond, uncond_pooled");
    size_t ne = (size_t)o.context_len * (size_t)c->joint_attention_dim, np = (size_t)c->pooled_projection_dim;
    float *cond = seeded ? malloc(sizeof(float) * 2 * (ne + np)) : NULL;
    if (seeded && !cond) return kb_fail(KILN_ERR_NOMEM, "out of memory");
    if (seeded) { /* the same seeded conditioning as `kiln make-model --cond` */
        kiln_noise(o.seed, cond, ne);
        kiln_noise(o.seed + 1, cond + ne, np);
        kiln_noise(o.seed + 2, cond + ne + np, ne);
        kiln_noise(o.seed + 3, cond + 2 * ne + np, np);
    }
    memset(out, 0, sizeof *out);
    out->max_rel_l2 = o.max_rel_l2;
    out->psnr_db = INFINITY;
    kiln_status st = KILN_OK;
    for (int i = 0; i < o.n_sizes && !st; i++) {
        kiln_generate_opts g = kiln_generate_defaults();
        g.steps = o.steps;
        g.shift = o.shift;
        g.guidance = o.guidance;
        g.seed = o.seed;
        g.latent_h = o.latent_h[i];
        g.latent_w = o.latent_w[i];
        g.context_len = o.context_len;
        g.cond = seeded ? cond : o.cond;
        g.cond_pooled = seeded ? cond + ne : o.cond_pooled;
        g.uncond = seeded ? cond + ne + np : o.uncond;
        g.uncond_pooled = seeded ? cond + 2 * ne + np : o.uncond_pooled;
        size_t n = (size_t)c->in_channels * (size_t)g.latent_h * (size_t)g.latent_w;
        recorder r = {.n = n, .n_steps = o.steps, .recording = 1, .worst = 0, .worst_step = 0};
        r.steps = malloc(sizeof(float) * n * (size_t)o.steps);
        float *lb = malloc(sizeof(float) * n), *lq = malloc(sizeof(float) * n);
        if (!r.steps || !lb || !lq) st = kb_fail(KILN_ERR_NOMEM, "out of memory");
        g.on_step = on_step;
        g.user = &r;
        if (!st) st = kiln_generate(base, &g, lb);
        r.recording = 0;
        if (!st) st = kiln_generate(quant, &g, lq);
        if (!st) {
            kiln_quality_case *k = &out->c[out->n++];
            k->latent_h = g.latent_h;
            k->latent_w = g.latent_w;
            k->rel_l2 = kb_rel_l2(lq, lb, n);
            double mse = 0, lo = INFINITY, hi = -INFINITY;
            for (size_t j = 0; j < n; j++) {
                double d = (double)lq[j] - (double)lb[j];
                mse += d * d;
                lo = fmin(lo, lb[j]);
                hi = fmax(hi, lb[j]);
            }
            mse /= (double)n;
            k->psnr_db = isnan(mse) ? -INFINITY : mse > 0 ? 10 * log10((hi - lo) * (hi - lo) / mse) : INFINITY;
            k->worst_step_rel_l2 = r.worst;
            k->worst_step = r.worst_step;
            if (!(k->rel_l2 <= out->rel_l2)) out->rel_l2 = k->rel_l2;
            if (!(k->psnr_db >= out->psnr_db)) out->psnr_db = k->psnr_db;
            if (!(k->worst_step_rel_l2 <= out->worst_step_rel_l2)) out->worst_step_rel_l2 = k->worst_step_rel_l2;
        }
        free(r.steps);
        free(lb);
        free(lq);
    }
    free(cond);
    out->pass = !st && out->rel_l2 <= out->max_rel_l2;
    return st;
}

/* kiln_compile: a quantized backbone is compiled and published only after
 * the quality gate passes against its unquantized twin. The gate is this
 * layer's decision (it samples); the model layer compiles (km_compile). */
kiln_status kiln_compile(kiln_model *m, const kiln_compile_opts *o, kiln_compile_result *res) {
    if (!m || !o || !res) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_compile: model, options and result are required");
    double rel = -1;
    kiln_quant q = m->compute.quant;
    if (q && !(o->force && !o->quality_base)) {
        if (!o->quality_base)
            return kb_fail(KILN_ERR_INVALID_ARG, "compile: a %s backbone needs the quality gate first: pass its "
                                                 "unquantized twin (quality_base) or force", kiln_quant_name(q));
        kiln_quality_opts qo = kiln_quality_defaults();
        if (o->max_rel_l2 > 0) qo.max_rel_l2 = o->max_rel_l2;
        kiln_quality_report rep;
        kiln_status st = kiln_quality_check(o->quality_base, m, &qo, &rep);
        if (st) return kb_wrap(st, "compile: the quality gate");
        rel = rep.rel_l2;
        if (!rep.pass && !o->force)
            return kb_fail(KILN_ERR_RANGE, "compile: the %s model's %s differ from the unquantized ones by "
                                           "%.2f%% relative L2 (gate %.2f%%); not published (--force, or "
                                           "kiln_compile_opts.force, publishes anyway)",
                           kiln_quant_name(q), kiln_model_config(m) ? "final latents" : "outputs on the example",
                           100 * rep.rel_l2, 100 * rep.max_rel_l2);
    }
    return km_compile(m, o, rel, res);
}
