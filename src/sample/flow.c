/* flow.c - FlowMatchEulerDiscrete (diffusers' schedule, exactly) and the
 * sampling loop with classifier-free guidance (the noise: base/rng.c). */
#include "base/base.h"
#include "model/model.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double shifted(double shift, double sigma) { return shift * sigma / (1.0 + (shift - 1.0) * sigma); }

/* diffusers 0.31: the training sigmas t/N are shifted once to give sigma_max
 * and sigma_min; set_timesteps spaces N*sigma linearly between them and
 * shifts again (both shifts are what diffusers computes). */
kiln_status kiln_flow_schedule(int steps, double shift, int num_train_timesteps, double *timesteps,
                               double *sigmas) {
    if (steps < 1 || steps > 100000)
        return kb_fail(KILN_ERR_INVALID_ARG, "steps = %d: must be between 1 and 100000", steps);
    if (!(shift > 0) || !isfinite(shift))
        return kb_fail(KILN_ERR_INVALID_ARG, "shift = %g: must be a positive number", shift);
    if (num_train_timesteps < 1)
        return kb_fail(KILN_ERR_INVALID_ARG, "num_train_timesteps = %d: must be positive",
                       num_train_timesteps);
    double n = num_train_timesteps;
    double sigma_max = shifted(shift, 1.0), sigma_min = shifted(shift, 1.0 / n);
    double t_hi = sigma_max * n, t_lo = sigma_min * n;
    for (int i = 0; i < steps; i++) {
        double t = steps == 1 ? t_hi : t_hi + (t_lo - t_hi) * (double)i / (double)(steps - 1);
        double s = shifted(shift, t / n);
        sigmas[i] = s;
        timesteps[i] = s * n;
    }
    sigmas[steps] = 0.0;
    return KILN_OK;
}

kiln_generate_opts kiln_generate_defaults(void) {
    kiln_generate_opts o;
    memset(&o, 0, sizeof o);
    o.steps = 28;
    o.shift = 3.0;
    o.num_train_timesteps = 1000;
    o.guidance = 7.0;
    o.seed = 0;
    o.batch = 1;
    return o;
}

kiln_status kiln_generate_micro_batch(kiln_model *m, const kiln_generate_opts *o, int *images, uint64_t *row_bytes) {
    if (!m || !o || !images) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_generate_micro_batch: model, options and out are required");
    const kiln_config *c = kiln_model_config(m);
    if (!c) return kb_fail(KILN_ERR_UNSUPPORTED, "kiln_generate samples SD3 backbones; this is a %s model", kiln_model_family(m));
    int N = o->batch > 0 ? o->batch : 1, r = o->guidance > 1.0 ? 2 : 1;
    *images = N;
    if (row_bytes) *row_bytes = 0;
    if (o->max_batch < 0) return kb_fail(KILN_ERR_INVALID_ARG, "max_batch %d: images per backbone call, 1 or more (0: by memory)", o->max_batch);
    if (o->max_batch > 0) {
        if (o->max_batch < N) *images = o->max_batch;
        return KILN_OK;
    }
    /* nothing to split (one image), no budget, or a mesh (it splits the batch its own way): no planning */
    if (N == 1 || !o->memory_budget || m->mesh) return KILN_OK;
    /* the planned arena of one image's rows and of two: what an image adds,
     * and what every call holds whatever its batch */
    size_t a1 = 0, a2 = 0;
    kiln_status st = km_forward_bytes(m, r, o->latent_h, o->latent_w, o->context_len, &a1);
    if (!st) st = km_forward_bytes(m, 2 * r, o->latent_h, o->latent_w, o->context_len, &a2);
    if (st) return kb_wrap(st, "sizing the micro-batches");
    uint64_t per = a2 > a1 ? a2 - a1 : a1 ? a1 : 1, fixed = a1 > per ? a1 - per : 0; /* per > 0 */
    if (row_bytes) *row_bytes = per;
    uint64_t fit = o->memory_budget > fixed ? (o->memory_budget - fixed) / per : 0;
    if (fit < 1) {
        kb_log(KILN_LOG_WARN, "one image's backbone activations (%.2f GiB) pass the memory budget (%.2f GiB): running "
               "one image a call", (double)(fixed + per) / (1 << 30), (double)o->memory_budget / (1 << 30));
        fit = 1;
    }
    if (fit < (uint64_t)N) *images = (int)fit;
    return KILN_OK;
}

kiln_status kiln_generate(kiln_model *m, const kiln_generate_opts *o, float *out) {
    if (!m || !o || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_generate: model, options and output are required");
    const kiln_config *c = kiln_model_config(m);
    if (!c)
        return kb_fail(KILN_ERR_UNSUPPORTED, "kiln_generate samples SD3 backbones; this is a %s model", kiln_model_family(m));
    int cfg = o->guidance > 1.0;
    if (!o->cond || !o->cond_pooled)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_generate: conditioning (prompt_embeds, pooled_prompt_embeds) is required");
    if (cfg && (!o->uncond || !o->uncond_pooled))
        return kb_fail(KILN_ERR_INVALID_ARG,
                       "kiln_generate: guidance %g > 1 needs negative_prompt_embeds and "
                       "negative_pooled_prompt_embeds (or guidance <= 1)", o->guidance);
    if (o->context_len < 1)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_generate: context length must be positive");
    if (!isfinite(o->guidance))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_generate: guidance must be a finite number");
    if (o->steps < 1 || o->steps > 100000) /* before the schedule's buffers are sized from it */
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_generate: steps = %d: must be between 1 and 100000", o->steps);
    int N = o->batch ? o->batch : 1; /* images */
    if (N < 1 || N > KM_MAX_BATCH / 2)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_generate: batch %d: 1 to %d images", N, KM_MAX_BATCH / 2);
    /* every size before anything is allocated from it (latent, context, batch) */
    int B = cfg ? 2 * N : N, T = o->context_len, J = c->joint_attention_dim, P = c->pooled_projection_dim;
    km_sizes z;
    kiln_status st = km_check_sizes(c, B, o->latent_h, o->latent_w, T, &z);
    if (st) return kb_wrap(st, "kiln_generate");
    /* lat: one image's latent; the batch's latents are N * lat */
    size_t lat = z.hidden / (size_t)B, vlat = z.out / (size_t)B, tj = (size_t)T * (size_t)J, nl = (size_t)N * lat;
    if (c->out_channels != c->in_channels)
        return kb_fail(KILN_ERR_CONFIG, "sampling needs out_channels == in_channels (%d != %d)",
                       c->out_channels, c->in_channels);
    /* NaN or Inf in, error out (before a step runs and turns it into NaN latents) */
    const struct {
        const char *name;
        const float *x;
        size_t n;
    } in[5] = {{"kiln_generate: noise", o->noise, nl},
               {"kiln_generate: cond (prompt_embeds)", o->cond, (size_t)N * tj},
               {"kiln_generate: cond_pooled (pooled_prompt_embeds)", o->cond_pooled, (size_t)N * (size_t)P},
               {"kiln_generate: uncond (negative_prompt_embeds)", cfg ? o->uncond : NULL, (size_t)N * tj},
               {"kiln_generate: uncond_pooled (negative_pooled_prompt_embeds)", cfg ? o->uncond_pooled : NULL,
                (size_t)N * (size_t)P}};
    for (int i = 0; i < 5; i++)
        if (in[i].x && (st = kt_check_finite(in[i].name, in[i].x, in[i].n))) return st;
    /* micro-batches of nb images (chunks as even as they go: 5 by 4 is 3 + 2) */
    int nb = N;
    if ((st = kiln_generate_micro_batch(m, o, &nb, NULL))) return st;
    int chunks = (N + nb - 1) / nb;
    nb = (N + chunks - 1) / chunks;
    int R = cfg ? 2 * nb : nb; /* rows of the largest call */
    double *ts = kb_calloc((size_t)o->steps + 1, sizeof(double));
    double *sig = kb_calloc((size_t)o->steps + 1, sizeof(double));
    float *hidden = kb_calloc((size_t)R * lat, sizeof(float));
    float *ctx = kb_calloc((size_t)B * (size_t)T * (size_t)J, sizeof(float));
    float *pooled = kb_calloc((size_t)B * (size_t)P, sizeof(float));
    float *v = kb_calloc((size_t)R * vlat, sizeof(float));
    float *tstep = kb_calloc((size_t)R, sizeof(float));
    if (!ts || !sig || !hidden || !ctx || !pooled || !v || !tstep) {
        st = KILN_ERR_NOMEM;
        goto done;
    }
    if ((st = kiln_flow_schedule(o->steps, o->shift, o->num_train_timesteps, ts, sig))) goto done;

    if (o->noise) memcpy(out, o->noise, nl * sizeof(float));
    else /* image k from (seed + k) alone: the same image as generated on its own */
        for (int k = 0; k < N; k++) kiln_noise(o->seed + (uint64_t)k, out + (size_t)k * lat, lat);
    /* each chunk's rows in diffusers' order: its uncond rows first, then its
     * cond rows (one chunk: every uncond row of the batch, then every cond row) */
    for (int i0 = 0; i0 < N; i0 += nb) {
        size_t nc = (size_t)(N - i0 < nb ? N - i0 : nb), row = cfg ? 2 * (size_t)i0 : (size_t)i0;
        float *cx = ctx + row * tj, *px = pooled + row * (size_t)P;
        if (cfg) {
            memcpy(cx, o->uncond + (size_t)i0 * tj, nc * tj * sizeof(float));
            memcpy(px, o->uncond_pooled + (size_t)i0 * P, nc * (size_t)P * sizeof(float));
            cx += nc * tj;
            px += nc * (size_t)P;
        }
        memcpy(cx, o->cond + (size_t)i0 * tj, nc * tj * sizeof(float));
        memcpy(px, o->cond_pooled + (size_t)i0 * P, nc * (size_t)P * sizeof(float));
    }
    for (int i = 0; i < o->steps; i++) {
        double t0 = kb_now();
        double dt = sig[i + 1] - sig[i];
        for (int i0 = 0; i0 < N; i0 += nb) {
            int nc = N - i0 < nb ? N - i0 : nb, rows = cfg ? 2 * nc : nc;
            size_t row = cfg ? 2 * (size_t)i0 : (size_t)i0, cl = (size_t)nc * lat;
            float *x = out + (size_t)i0 * lat;
            for (int b = 0; b < rows; b++) { /* row b (and nc + b under CFG) holds image i0 + b % nc */
                memcpy(hidden + (size_t)b * lat, x + (size_t)(b % nc) * lat, lat * sizeof(float));
                tstep[b] = (float)ts[i];
            }
            kiln_forward_args a = {rows, o->latent_h, o->latent_w, T, hidden, ctx + row * tj, pooled + row * (size_t)P,
                                   tstep};
            if ((st = kiln_forward(m, &a, v))) {
                st = chunks > 1 ? kb_wrap(st, "step %d of %d, images %d to %d", i + 1, o->steps, i0, i0 + nc - 1)
                                : kb_wrap(st, "step %d of %d", i + 1, o->steps);
                goto done;
            }
            for (size_t k = 0; k < cl; k++) { /* v: nc uncond rows, then nc cond rows */
                double vel = cfg ? (double)v[k] + o->guidance * ((double)v[cl + k] - (double)v[k]) : (double)v[k];
                x[k] = (float)((double)x[k] + dt * vel);
            }
        }
        /* finite velocities can still overflow the f32 latent (a huge guidance) */
        size_t bad = kt_find_nonfinite(out, nl);
        if (bad < nl) {
            st = kb_fail(KILN_ERR_NONFINITE, "step %d of %d gave a non-finite latent (%s at index %zu)", i + 1,
                         o->steps, kt_nonfinite_name(out[bad]), bad);
            goto done;
        }
        char what[64];
        if (chunks > 1) snprintf(what, sizeof what, "%sbatch %d in %d calls", cfg ? "cfg " : "", B, chunks);
        else snprintf(what, sizeof what, "%sbatch %d", cfg ? "cfg " : "", B);
        kb_ledger_add("sampler_step", kb_now() - t0, what);
        if (o->on_step) o->on_step(o->user, i + 1, o->steps, sig[i + 1], out);
    }
done:
    free(ts);
    free(sig);
    free(hidden);
    free(ctx);
    free(pooled);
    free(v);
    free(tstep);
    return st;
}
