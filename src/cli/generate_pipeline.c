/* generate_pipeline.c - kiln generate PIPELINE --prompt TEXT | --prompts-file
 * FILE: the requests (a prompt each, with its own settings from a JSON
 * line), grouped into one pipeline batch per set of settings, encoded,
 * sampled (in micro-batches when memory is short) and decoded to one PNG an
 * image; and kiln compile PIPELINE (one step of a request compiles every
 * component's shapes). */
#include "base/base.h"
#include "cli.h"
#include "cache/cache.h"
#include "format/png.h"
#include "model/model.h"
#include "pipeline/prompts.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* one image's request: its prompt, negative prompt and seed */
typedef struct {
    const kp_prompt *req;
    uint64_t seed;
    int index; /* in the run: the output file's number */
} image_job;

/* What --tensor-output keeps of a single batch: diffusers' names. */
typedef struct {
    cli_progress pr;
    int keep;
    float *cond[4];
    int64_t es[3], ps[2];
    float **steps; /* n_steps latents */
    int n_steps;
    size_t lat_n;
} run_state;

static void on_cond(void *user, const float *e, const int64_t es[3], const float *p, const int64_t ps[2], const float *ne,
                    const float *np) {
    run_state *r = user;
    double now = kb_now();
    if (!r->pr.quiet) fprintf(stderr, "  prompts encoded  %.2f s\n", now - r->pr.last);
    r->pr.last = now;
    if (!r->keep) return;
    size_t en = (size_t)(es[0] * es[1] * es[2]), pn = (size_t)(ps[0] * ps[1]);
    const float *src[4] = {e, p, ne, np};
    size_t n[4] = {en, pn, en, pn};
    for (int k = 0; k < 4; k++)
        if (src[k] && (r->cond[k] = malloc(sizeof(float) * n[k]))) memcpy(r->cond[k], src[k], sizeof(float) * n[k]);
    memcpy(r->es, es, sizeof r->es);
    memcpy(r->ps, ps, sizeof r->ps);
}

static void on_step(void *user, int step, int steps, double sigma, const float *latent) {
    run_state *r = user;
    cli_step_progress(&r->pr, step, steps, sigma, latent);
    if (!r->keep || step < 1 || step > r->n_steps) return;
    if ((r->steps[step - 1] = malloc(sizeof(float) * r->lat_n)))
        memcpy(r->steps[step - 1], latent, sizeof(float) * r->lat_n);
}

static void run_state_free(run_state *r) {
    for (int k = 0; k < 4; k++) free(r->cond[k]);
    for (int k = 0; r->steps && k < r->n_steps; k++) free(r->steps[k]);
    free(r->steps);
}

/* --tensor-output: the conditioning, every step's latents, the final
 * latents and the decoder's float image under the names of diffusers'
 * pipeline (and of the reference cases) */
static kiln_status write_tensors(const char *path, const run_state *r, int cfg, const float *lat, const int64_t sh[4],
                                 const float *img, const int64_t ish[4]) {
    /* every step's latents (--steps goes to 10000), so the lists are sized from it */
    size_t n = 0, cap = (size_t)r->n_steps + 6;
    kiln_tensor *t = calloc(cap, sizeof *t);
    char (*names)[32] = calloc((size_t)r->n_steps + 1, sizeof *names);
    kiln_status st = KILN_OK;
    if (!t || !names) {
        st = kb_fail(KILN_ERR_NOMEM, "out of memory listing %d steps' latents", r->n_steps);
        goto out;
    }
    const char *cn[4] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"};
    for (int k = 0; k < 4; k++) {
        if (k >= 2 && !cfg) break;
        if (!r->cond[k]) {
            st = kb_fail(KILN_ERR_NOMEM, "out of memory keeping the conditioning");
            goto out;
        }
        const int64_t *s = k % 2 ? r->ps : r->es;
        t[n++] = (kiln_tensor){cn[k], KILN_F32, k % 2 ? 2 : 3, {s[0], s[1], k % 2 ? 0 : s[2]}, r->cond[k]};
    }
    for (int k = 0; k < r->n_steps; k++) {
        if (!r->steps[k]) {
            st = kb_fail(KILN_ERR_NOMEM, "out of memory keeping the step latents");
            goto out;
        }
        snprintf(names[k], sizeof names[k], "latents_step%d", k + 1);
        t[n++] = (kiln_tensor){names[k], KILN_F32, 4, {sh[0], sh[1], sh[2], sh[3]}, r->steps[k]};
    }
    t[n++] = (kiln_tensor){"latents", KILN_F32, 4, {sh[0], sh[1], sh[2], sh[3]}, lat};
    if (img) t[n++] = (kiln_tensor){"image_decoded", KILN_F32, 4, {ish[0], ish[1], ish[2], ish[3]}, img};
    st = kiln_tensors_write(path, n, t);
out:
    free(t);
    free(names);
    return st;
}

/* A batch's images decoded (tiled when memory is short) and written one PNG
 * each with what made it in its "parameters" text; without vae/ the
 * latents' false-colour preview. Every image decodes before a file is
 * written, under its temporary name in outs (renamed into place when the
 * whole run is written; removed when a later batch fails or a signal
 * comes). sample: the float decode, kept when not NULL. */
static kiln_status write_images(kiln_pipeline *p, const pipe_args *pa, const image_job *jobs, int B, int from_noise,
                                const float *lat, const int64_t sh[4], const char *model, const cli_outputs *outs,
                                float *sample, int quiet) {
    kiln_model *vae = kiln_pipeline_vae(p);
    size_t one = (size_t)(sh[1] * sh[2] * sh[3]);
    kiln_status s = KILN_OK;
    if (!vae) {
        fprintf(stderr, "generate: the pipeline has no vae/: writing the latents' preview instead of images\n");
        for (int k = 0; k < B && !s; k++)
            s = kf_write_latent_png(outs->tmp[jobs[k].index], lat + (size_t)k * one, (int)sh[1], (int)sh[2], (int)sh[3]);
        return s;
    }
    kiln_vae_opts vo = kiln_vae_defaults();
    if (pa->vae_tile && (s = kiln_vae_parse_tile(pa->vae_tile, &vo))) return s;
    if (pa->vae_memory && (s = kiln_vae_parse_memory(pa->vae_memory, &vo))) return s;
    int H = (int)sh[2] * kiln_pipeline_vae_scale(p), W = (int)sh[3] * kiln_pipeline_vae_scale(p);
    uint8_t *rgb = malloc((size_t)B * (size_t)H * (size_t)W * 3);
    if (!rgb) return kb_fail(KILN_ERR_NOMEM, "out of memory for %d images of %dx%d", B, W, H);
    kiln_vae_plan plan; /* kiln_vae_decode puts its time in the ledger ("vae decode") */
    s = kiln_vae_decode_rgb(vae, lat, sh, &vo, rgb, sample, &plan);
    for (int k = 0; k < B && !s; k++) {
        const kp_prompt *q = jobs[k].req;
        int i = jobs[k].index;
        double g = q->guidance;
        kiln_image_info info = {.prompt = q->prompt, .negative_prompt = g > 1 ? (q->negative ? q->negative : "") : NULL,
                                .steps = q->steps, .guidance = g, .has_seed = !from_noise, .seed = jobs[k].seed,
                                .sampler = "Euler (flow matching)", .model = model};
        if (!(s = kiln_image_write_png(outs->tmp[i], rgb + (size_t)k * (size_t)H * (size_t)W * 3, H, W, &info)) && !quiet)
            fprintf(stderr, "generate: image %d -> %s\n", i, outs->final[i]);
    }
    free(rgb);
    return s;
}

/* the settings that make requests one batch */
static int same_batch(const kp_prompt *a, const kp_prompt *b) {
    return a->steps == b->steps && a->guidance == b->guidance && a->width == b->width && a->height == b->height &&
           a->images == b->images; /* a batch is prompts x images_per_prompt */
}


int cli_generate_pipeline(const char *dir, const cli_common *com, const pipe_args *pa, const kiln_generate_opts *g,
                          const char *noise_file, const char *output, int quiet) {
    const char *cmd = "generate";
    kp_prompt *reqs = NULL, one = {0};
    int n = 1, rc = 1, total = 0;
    if (pa->prompts_file) {
        kiln_status ps = kp_prompts_read(pa->prompts_file, &reqs, &n);
        if (ps) return cli_fail(cmd, ps);
    } else {
        one.prompt = (char *)pa->prompt;
        one.seed = -1;
        reqs = &one;
    }
    uint64_t budget = 0;
    if (pa->memory) {
        kiln_vae_opts mo = kiln_vae_defaults(); /* the same byte syntax as --vae-memory */
        kiln_status s = kiln_vae_parse_memory(pa->memory, &mo);
        if (s) {
            rc = cli_error(cmd, "--memory: %s", kiln_last_error());
            goto out0;
        }
        budget = mo.memory_budget;
    }
    /* every request's settings: its own, else the run's */
    for (int r = 0; r < n; r++) {
        kp_prompt *q = &reqs[r];
        if (!q->negative && pa->negative && !(q->negative = kb_strdup(pa->negative))) goto out0;
        if (!q->width) q->width = (int)pa->width;
        if (!q->height) q->height = (int)pa->height;
        if (!q->images) q->images = (int)pa->ipp;
        if ((total += q->images) > 65536) { /* checked as it grows: 10^7 lines x 512 images would pass INT_MAX */
            rc = cli_error(cmd, "%d images in one run (prompts x images per prompt) by prompt %d of %d: at most 65536",
                           total, r + 1, n);
            goto out0;
        }
    }
    if ((pa->latents_out && cli_check_output(cmd, pa->latents_out)) || (pa->tensor_out && cli_check_output(cmd, pa->tensor_out)))
        goto out0;
    char name[128];
    kiln_load_opts lo = cli_load_opts(dir, com, name, sizeof name);
    cli_load_progress lp = {cmd, quiet};
    lo.on_component = cli_on_component;
    lo.component_user = &lp;
    kiln_pipeline *p = NULL;
    st_file *nf = NULL;
    float *nz = NULL, *all = NULL, *lat = NULL, *noise = NULL, *img = NULL;
    image_job *jobs = NULL;
    cli_outputs outs = {0};
    const char **prompts = NULL, **negs = NULL;
    run_state rs = {{kb_now(), kb_now(), quiet || kiln_dist_rank()}, 0, {0}, {0}, {0}, NULL, 0, 0};
    double t0 = kb_now();
    kiln_status s = cli_check_ranks(com);
    /* the sizes asked for, from the configs, before a first run converts
     * every component (again, with the defaults, once it is open) */
    for (int r = 0; r < n && !s; r++) {
        int seen = 0; /* each size once: it reads the configs (a file's tensor headers) */
        for (int q = 0; q < r && !seen; q++) seen = reqs[q].height == reqs[r].height && reqs[q].width == reqs[r].width;
        if (!seen && (s = kiln_pipeline_check_size_early(dir, com->tokenizers, reqs[r].height, reqs[r].width))) {
            rc = pa->prompts_file ? cli_fail(cmd, kb_wrap(s, "%s line %d", pa->prompts_file, reqs[r].line)) : cli_fail(cmd, s);
            goto done;
        }
    }
    if (!s) s = kiln_pipeline_open_file(dir, com->tokenizers, &lo, &p); /* a folder, or an all-in-one file */
    if (s) {
        rc = cli_fail(cmd, s);
        goto done;
    }
    if (!quiet) fprintf(stderr, "%s: pipeline ready in %.2f s (%s)\n", cmd, kb_now() - t0, dir);
    /* the run's steps, guidance and T5 length: given, else the pipeline class's */
    kiln_pipeline_opts pd = kiln_pipeline_defaults_of(p);
    int flux = !strcmp(kiln_pipeline_class(p), "FluxPipeline");
    int run_steps = pa->steps_set ? g->steps : pd.steps, msl = pa->msl_set ? (int)pa->msl : pd.max_sequence_length;
    double run_guidance = pa->guidance_set ? g->guidance : pd.guidance;
    for (int r = 0; r < n; r++) {
        if (!reqs[r].steps) reqs[r].steps = run_steps;
        if (!reqs[r].has_guidance) reqs[r].guidance = run_guidance;
        if (flux && reqs[r].negative) {
            rc = cli_error(cmd, "%s: a negative prompt%s; a Flux pipeline samples without one (guidance-distilled)", dir,
                           pa->prompts_file ? " in the prompts file or --negative-prompt" : " (--negative-prompt)");
            goto done;
        }
    }
    int f = kiln_pipeline_vae_scale(p), C = 0, cells = 0;
    kiln_pipeline_latent_shape(p, &C, &cells);
    int64_t sn[4] = {0};
    if (noise_file) { /* the noise sets the size unless a prompt sets its own (then they must agree) */
        if ((s = st_open(noise_file, &nf))) {
            rc = cli_fail(cmd, s);
            goto done;
        }
        if (!(nz = cli_tensor(cmd, nf, "noise", 4, sn))) goto done;
        if (sn[2] < 1 || sn[3] < 1 || sn[2] > 1 << 16 || sn[3] > 1 << 16) {
            cli_error(cmd, "%s: noise is [%lld, %lld, %lld, %lld]: not a latent size", noise_file, (long long)sn[0],
                      (long long)sn[1], (long long)sn[2], (long long)sn[3]);
            goto done;
        }
    }
    /* every size is one the pipeline makes, before any work */
    for (int r = 0; r < n; r++) {
        kp_prompt *q = &reqs[r];
        if (!q->width) q->width = nz ? (int)sn[3] * f : cells * f;
        if (!q->height) q->height = nz ? (int)sn[2] * f : cells * f;
        if ((s = kiln_pipeline_check_size(p, q->height, q->width, NULL, NULL))) {
            rc = pa->prompts_file ? cli_fail(cmd, kb_wrap(s, "%s line %d", pa->prompts_file, q->line)) : cli_fail(cmd, s);
            goto done;
        }
    }
    int one_size = 1, one_batch = 1;
    for (int r = 1; r < n; r++) {
        one_size &= reqs[r].width == reqs[0].width && reqs[r].height == reqs[0].height;
        one_batch &= same_batch(&reqs[r], &reqs[0]);
    }
    if (!one_size && (noise_file || pa->latents_out)) {
        rc = cli_error(cmd, "%s needs every prompt at one size; %s gives several", noise_file ? "--noise" : "--latents-output",
                       pa->prompts_file);
        goto done;
    }
    if (!one_batch && pa->tensor_out) {
        rc = cli_error(cmd, "--tensor-output needs one batch: every prompt with the same steps, guidance and size");
        goto done;
    }
    int lh = reqs[0].height / f, lw = reqs[0].width / f;
    size_t per = (size_t)C * (size_t)(reqs[0].height / f) * (size_t)(reqs[0].width / f);
    if (nz) {
        if (sn[0] != total || sn[1] != C || sn[2] != lh || sn[3] != lw) {
            cli_error(cmd, "%s: noise is [%lld, %lld, %lld, %lld]; this run needs [%d, %d, %d, %d] (%d image%s of %dx%d "
                      "pixels)", noise_file, (long long)sn[0], (long long)sn[1], (long long)sn[2], (long long)sn[3], total,
                      C, lh, lw, total, total == 1 ? "" : "s", reqs[0].width, reqs[0].height);
            goto done;
        }
    }
    jobs = calloc((size_t)total, sizeof *jobs);
    prompts = calloc((size_t)n, sizeof *prompts);
    negs = calloc((size_t)n, sizeof *negs);
    int *done_req = calloc((size_t)n, sizeof *done_req), *first = calloc((size_t)n, sizeof *first);
    if (!jobs || !prompts || !negs || !done_req || !first || cli_outputs_begin(&outs, output, total)) {
        free(done_req);
        free(first);
        rc = cli_error(cmd, "out of memory");
        goto done;
    }
    for (int r = 0, k = 0; r < n; r++) {
        first[r] = k;
        k += reqs[r].images;
    }
    if ((pa->latents_out || pa->tensor_out) && !(all = malloc(sizeof(float) * per * (size_t)total))) {
        free(done_req);
        free(first);
        rc = cli_error(cmd, "out of memory for the latents");
        goto done;
    }
    int tensors_written = 0;
    const char *model = strrchr(dir, '/') && strrchr(dir, '/')[1] ? strrchr(dir, '/') + 1 : dir;
    /* one batch per set of settings, in the order the prompts come */
    for (int r0 = 0; r0 < n && !s; r0++) {
        if (done_req[r0]) continue;
        const kp_prompt *q0 = &reqs[r0];
        int np = 0, B = 0;
        for (int r = r0; r < n; r++) {
            if (done_req[r] || !same_batch(&reqs[r], q0) || B + reqs[r].images > KM_MAX_BATCH / 2) continue;
            done_req[r] = 1;
            prompts[np] = reqs[r].prompt;
            negs[np] = reqs[r].negative ? reqs[r].negative : "";
            for (int j = 0; j < reqs[r].images; j++, B++) {
                jobs[B].req = &reqs[r];
                jobs[B].index = first[r] + j;
                /* image k of the run starts from seed + k; a prompt's own seed s gives its images s, s + 1, ... */
                jobs[B].seed = reqs[r].seed >= 0 ? (uint64_t)reqs[r].seed + (uint64_t)j : g->seed + (uint64_t)(first[r] + j);
            }
            np++;
        }
        int bh = q0->height / f, bw = q0->width / f;
        size_t bper = (size_t)C * (size_t)bh * (size_t)bw;
        free(noise);
        if (!(noise = malloc(sizeof(float) * bper * (size_t)B))) {
            s = kb_fail(KILN_ERR_NOMEM, "out of memory for the noise of %d images", B);
            break;
        }
        for (int k = 0; k < B; k++) {
            if (nz) memcpy(noise + (size_t)k * bper, nz + (size_t)jobs[k].index * bper, sizeof(float) * bper);
            else kiln_noise(jobs[k].seed, noise + (size_t)k * bper, bper);
        }
        kiln_pipeline_opts po = pd;
        po.prompts = prompts;
        po.n_prompts = np;
        po.negative_prompts = flux ? NULL : negs;
        po.images_per_prompt = q0->images;
        po.height = q0->height;
        po.width = q0->width;
        po.steps = q0->steps;
        po.guidance = q0->guidance;
        po.shift = g->shift;
        po.noise = noise;
        po.max_sequence_length = msl;
        po.low_memory = pa->low_memory;
        po.compile = pa->compile;
        po.max_batch = (int)pa->micro_batch;
        po.memory_budget = budget;
        rs.keep = pa->tensor_out != NULL;
        rs.n_steps = q0->steps;
        rs.lat_n = bper * (size_t)B;
        if (rs.keep && !(rs.steps = calloc((size_t)q0->steps, sizeof *rs.steps))) {
            s = KILN_ERR_NOMEM;
            break;
        }
        po.on_step = on_step;
        po.on_cond = on_cond;
        rs.pr.last = kb_now();
        po.user = &rs;
        if (!quiet)
            fprintf(stderr, "%s: %d image%s %dx%d, %d step%s, guidance %g\n", cmd, B, B == 1 ? "" : "s", po.width,
                    po.height, po.steps, po.steps == 1 ? "" : "s", po.guidance);
        int64_t sh[4];
        free(lat);
        lat = NULL;
        if ((s = kiln_pipeline_generate(p, &po, &lat, sh))) break;
        if (kiln_dist_rank()) continue; /* on a mesh rank 0 writes */
        if (all)
            for (int k = 0; k < B; k++) memcpy(all + (size_t)jobs[k].index * per, lat + (size_t)k * per, sizeof(float) * per);
        int64_t ish[4] = {B, 3, q0->height, q0->width};
        if (pa->tensor_out && kiln_pipeline_vae(p) &&
            !(img = malloc(sizeof(float) * (size_t)B * 3 * (size_t)q0->height * (size_t)q0->width))) {
            s = kb_fail(KILN_ERR_NOMEM, "out of memory for the decoded image");
            break;
        }
        if ((s = write_images(p, pa, jobs, B, noise_file != NULL, lat, sh, model, &outs, img, quiet))) break;
        if (pa->tensor_out && (s = write_tensors(pa->tensor_out, &rs, !flux && q0->guidance > 1, lat, sh, img, ish))) break;
        tensors_written = pa->tensor_out != NULL;
    }
    free(done_req);
    free(first);
    if (!s && !kiln_dist_rank() && pa->latents_out) {
        int64_t sh[4] = {total, C, lh, lw};
        s = cli_write_f32(pa->latents_out, "latents", all, 4, sh);
    }
    if (s) {
        cli_outputs_abort(&outs); /* nothing half-done: every image of the run or none */
        if (tensors_written) unlink(pa->tensor_out); /* ours only: a file of an earlier run stays */
        rc = cli_fail(cmd, s);
        goto done;
    }
    if (!kiln_dist_rank() && (rc = cli_outputs_commit(&outs, cmd, quiet))) goto done;
    if (!quiet && !kiln_dist_rank())
        fprintf(stderr, "%s: %.2f s in all (backbone: %s)\n", cmd, kb_now() - t0,
                kiln_model_last_exec(kiln_pipeline_transformer(p)));
    rc = 0;
done:
    cli_outputs_abort(&outs); /* a run that failed before its images: nothing (after a commit: nothing left to do) */
    free(jobs);
    free(prompts);
    free(negs);
    free(lat);
    free(all);
    free(noise);
    free(img);
    free(nz);
    run_state_free(&rs);
    st_close(nf);
    kiln_pipeline_free(p);
out0:
    if (reqs != &one) kp_prompts_free(reqs, n);
    else free(one.negative);
    return rc;
}

int cli_pipeline_compile(const char *dir, const cli_common *com, int images, int width, int height, double guidance) {
    const char *cmd = "compile";
    char name[128];
    kiln_load_opts lo = cli_load_opts(dir, com, name, sizeof name);
    int quiet = com->quiet;
    cli_load_progress lp = {cmd, quiet};
    lo.on_component = cli_on_component; /* each component as it loads (a first run converts them: minutes) */
    lo.component_user = &lp;
    kiln_pipeline *p = NULL;
    float *lat = NULL;
    int64_t sh[4];
    int flux = 0;
    double t0 = kb_now();
    char *pkg = kcache_package_root(com->package_dir, kcache_root(com->cache_dir));
    int before = cli_count_packages(pkg);
    if (!quiet)
        fprintf(stderr, "compile: %s: one step of a request of %d image%s through every component, each compiling "
                "the shapes it runs\n", dir, images, images == 1 ? "" : "s");
    kiln_status s = kiln_pipeline_check_size_early(dir, com->tokenizers, height, width); /* before any conversion */
    if (!s) s = kiln_pipeline_open_file(dir, com->tokenizers, &lo, &p);
    if (!s) {
        /* one step of a request compiles every shape the request runs: text
         * encoders, the transformer's CFG batch, the decoder */
        const char *prompts[1] = {""};
        kiln_pipeline_opts po = kiln_pipeline_defaults_of(p); /* a Flux pipeline's T5 length and guidance */
        flux = !strcmp(kiln_pipeline_class(p), "FluxPipeline");
        po.prompts = prompts;
        po.n_prompts = 1;
        po.images_per_prompt = images;
        po.width = width;
        po.height = height;
        po.steps = 1;
        if (!flux) po.guidance = guidance; /* Flux's is an input, not a CFG batch */
        po.compile = 1;
        s = kiln_pipeline_generate(p, &po, &lat, sh);
        kiln_model *vae = s ? NULL : kiln_pipeline_vae(p);
        if (vae) { /* and the decode of its latents (tiled as the request would be), compile still on */
            int f = kiln_pipeline_vae_scale(p);
            uint8_t *rgb = malloc((size_t)sh[0] * (size_t)(sh[2] * f) * (size_t)(sh[3] * f) * 3);
            kiln_vae_opts vo = kiln_vae_defaults();
            kiln_vae_plan plan;
            s = rgb ? kiln_vae_decode_rgb(vae, lat, sh, &vo, rgb, NULL, &plan) : KILN_ERR_NOMEM;
            free(rgb);
        }
    }
    int px_w = s ? 0 : (int)sh[3] * kiln_pipeline_vae_scale(p), px_h = s ? 0 : (int)sh[2] * kiln_pipeline_vae_scale(p);
    free(lat);
    kiln_pipeline_free(p);
    if (s) {
        free(pkg);
        return cli_fail(cmd, s);
    }
    int made = cli_count_packages(pkg) - before;
    if (made > 0)
        printf("compiled %s for %d image%s a request (%s) at %dx%d in %.2f s: %d package%s published under %s "
               "(kiln package ls lists them)\n", dir, images, images == 1 ? "" : "s",
               flux ? "guidance-distilled: no CFG" : guidance > 1 ? "CFG" : "no CFG", px_w, px_h, kb_now() - t0, made, made == 1 ? "" : "s", pkg ? pkg : "the package folder");
    else
        printf("%s is already compiled for %d image%s a request (%s) at %dx%d: every component's packages were under "
               "%s (kiln package ls lists them)\n", dir, images, images == 1 ? "" : "s",
               flux ? "guidance-distilled: no CFG" : guidance > 1 ? "CFG" : "no CFG", px_w, px_h, pkg ? pkg : "the package folder");
    free(pkg);
    return 0;
}
