/* cmd_generate.c - kiln generate PIPELINE --prompt TEXT --output out.png
 * (a diffusers pipeline folder, prompt to image) or kiln generate
 * TRANSFORMER --cond FILE --output FILE (the backbone alone, on stored
 * conditioning). */
#include "base/base.h"
#include "cli.h"
#include "format/png.h"
#include "model/model.h"
#include "arch/sd3/sd3.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char k_usage[] =
    "kiln generate PIPELINE|FILE (--prompt TEXT | --prompts-file FILE) --output out.png [--tokenizers DIR]\n"
    "                     [--negative-prompt TEXT] [--width W --height H] [--images-per-prompt N]\n"
    "                     [--max-sequence-length N]\n"
    "                     [--latents-output FILE] [--tensor-output FILE] [--low-memory] [--micro-batch N]\n"
    "                     [--memory BYTES] [--steps N] [--shift S] [--guidance G]\n"
    "                     [--seed N | --noise FILE] [--quiet] [options]\n"
    "       kiln generate TRANSFORMER --cond FILE --output FILE [--latent HxW] [--steps N] ...";

static int help(void) {
    printf("usage: %s\n\n"
           "Flow-matching Euler sampling (diffusers' FlowMatchEulerDiscreteScheduler) with\n"
           "classifier-free guidance, B images in one backbone batch (CFG: 2B rows, uncond first).\n\n"
           "From a diffusers StableDiffusion3Pipeline or FluxPipeline folder (model_index.json, scheduler/,\n"
           "text_encoder*/, tokenizer*/, transformer/, vae/), as its __call__: each component loads\n"
           "through the weight cache under its own key; the prompt is encoded (kiln encode), sampled\n"
           "with the scheduler config's shift, and decoded by the VAE. Or from an all-in-one SD3 /\n"
           "SD3.5 safetensors file (model.diffusion_model.*, text_encoders.clip_l.* / clip_g.* /\n"
           "t5xxl.*, first_stage_model.*) or Flux.1 one (ComfyUI's: model.diffusion_model.* in Black\n"
           "Forest Labs' names, text_encoders.clip_l.* / t5xxl.*, vae.*) with --tokenizers DIR, a folder\n"
           "with its tokenizer*/ (and optionally the components' config.json; else inferred from the\n"
           "shapes: docs/cli.md).\n"
           "  --prompt TEXT           the prompt  --negative-prompt TEXT (default \"\", as diffusers)\n"
           "  --prompts-file FILE     one prompt per line, or per line a JSON object with that prompt's\n"
           "                          own settings: {\"prompt\": \"...\", \"negative_prompt\": \"...\", \"seed\": 7,\n"
           "                          \"steps\": 20, \"guidance\": 5, \"width\": 768, \"height\": 768,\n"
           "                          \"images_per_prompt\": 2}; prompts with the same settings run as one\n"
           "                          batch; images are numbered in the file's order\n"
           "  --width W --height H    pixels (default: the transformer's sample_size x the VAE factor;\n"
           "                          multiples of the VAE factor x the patch)\n"
           "  --images-per-prompt N   (default 1)  --max-sequence-length N  T5 tokens (default 256)\n"
           "  --latents-output FILE   also write the final latents `latents` [B, C, h, w]\n"
           "  --tensor-output FILE    also write every intermediate under diffusers' names:\n"
           "                          prompt_embeds, pooled_prompt_embeds, negative_*, latents_step1..N,\n"
           "                          latents, image_decoded [B, 3, H, W] (the decoder's float image)\n"
           "  --low-memory            release the text encoders before sampling (default: only when\n"
           "                          the pipeline's weights pass 3/4 of the RAM)\n"
           "  --micro-batch N         at most N images a backbone call (CFG: 2N rows); default: as\n"
           "                          many as fit --memory BYTES (default a quarter of the RAM)\n"
           "  --vae-tile auto|off|PX  the decode's tiling (default auto: tiled when an untiled decode\n"
           "                          would pass --vae-memory BYTES, default a quarter of the RAM)\n"
           "  --compile               compile a package for every shape a component runs that none\n"
           "                          covers yet, so the next process starts from packages\n"
           "  --output out.png        one PNG per image: out.png, or out-0.png, out-1.png ... for B > 1\n\n"
           "From a transformer folder and stored conditioning: --cond FILE (safetensors) holds\n"
           "diffusers' pipeline names:\n"
           "  prompt_embeds                  [B, T, joint_attention_dim]\n"
           "  pooled_prompt_embeds           [B, pooled_projection_dim]\n"
           "  negative_prompt_embeds         [B, T, joint_attention_dim]   (needed when guidance > 1)\n"
           "  negative_pooled_prompt_embeds  [B, pooled_projection_dim]    (needed when guidance > 1)\n\n"
           "  --steps N        inference steps (default 28)\n"
           "  --shift S        schedule shift (default: a pipeline's scheduler config's shift, else 3.0, SD3's)\n"
           "  --guidance G     guidance scale (default 7.0; <= 1 samples the prompt alone)\n"
           "  --latent HxW     latent size (default: the config's sample_size square; pixels / 8)\n"
           "  --seed N         seed of kiln's noise generator (default 0): image k starts from seed + k,\n"
           "                   so it equals the same image made alone with --seed N+k\n"
           "  --noise FILE     start from `noise` [B, C, H, W] in FILE instead (sets the latent size;\n"
           "                   not with --seed)\n"
           "  --output FILE    (--cond) writes `latents` [B, C, H, W] (F32) to FILE and a PNG preview\n"
           "                   beside it: x.safetensors -> x.png; x.png -> x.safetensors + x.png\n"
           "  --vae VAE        (--cond) decode the latents with this VAE (or pipeline) folder into one PNG per\n"
           "                   image (x.png, x-0.png ...) instead of the preview\n"
           "  --quiet          no per-step progress\n%s",
           k_usage, cli_common_help);
    return 0;
}

static const char k_pixels_hint[] =
    "\n  (--latent is the latent size, image pixels / 8: --latent 128x128 for a 1024x1024 image)";

/* --latent HxW against MODEL's config.json (MODEL/config.json or --config),
 * before anything loads: 1 (printed) when it cannot be sampled; 0 when it can
 * or there is no config to read yet (a single file: checked after the load). */
static int latent_hint(const char *cmd, const char *model, const cli_common *com, int h, int w) {
    char *path = com->config ? kb_strdup(com->config) : kb_is_dir(model) ? kb_path_join(model, "config.json") : NULL;
    char *json = NULL;
    size_t len;
    kiln_config cfg;
    int rc = 0;
    if (path && kb_is_file(path) && !kb_read_file(path, &json, &len) && !sd3_config_parse(json, &cfg) &&
        sd3_check_latent(&cfg, h, w))
        rc = cli_error(cmd, "%s%s", kiln_last_error(), k_pixels_hint);
    kb_clear_error();
    free(path);
    free(json);
    return rc;
}

int cli_generate_run(const char *cmd, kiln_model *m, kiln_generate_opts *o, const char *output,
                     int quiet, kiln_model *vae) {
    const kiln_config *c = kiln_model_config(m);
    int N = o->batch > 0 ? o->batch : 1;
    /* every size checked before the latent is allocated: --latent 65536x65536
     * must say which limit it passes, not allocate 64 GiB and run out */
    kiln_status s = km_check_sizes(c, o->guidance > 1 ? 2 * N : N, o->latent_h, o->latent_w,
                                   o->context_len > 0 ? o->context_len : 1, NULL);
    if (s) return cli_fail(cmd, s);
    size_t one = (size_t)c->in_channels * (size_t)o->latent_h * (size_t)o->latent_w, n = one * (size_t)N;
    float *lat = malloc(sizeof(float) * n);
    if (!lat) return cli_error(cmd, "out of memory");
    int rank = kiln_dist_rank(); /* on a mesh every rank samples; rank 0 reports and writes */
    if (rank) quiet = 1;
    cli_progress p = {kb_now(), kb_now(), quiet};
    o->on_step = cli_step_progress;
    o->user = &p;
    if (!quiet)
        fprintf(stderr, "%s: %d step%s, latent %dx%d, %d image%s, guidance %g%s\n", cmd, o->steps, o->steps == 1 ? "" : "s",
                o->latent_h, o->latent_w, N, N == 1 ? "" : "s", o->guidance, o->guidance > 1 ? " (CFG: uncond and cond rows)" : "");
    s = kiln_generate(m, o, lat);
    if (s) { /* nothing written: neither the latents nor the preview */
        free(lat);
        return cli_fail(cmd, s);
    }
    double total = kb_now() - p.t0;
    if (rank) {
        free(lat);
        return 0;
    }
    int64_t shape[4] = {N, c->in_channels, o->latent_h, o->latent_w};
    char *png = cli_preview_path(output), *file = cli_latents_path(output);
    if (!png || !file) {
        free(lat);
        free(png);
        free(file);
        return cli_error(cmd, "out of memory");
    }
    /* the images (or previews), every one or none (outputs.c) */
    cli_outputs outs;
    if (cli_outputs_begin(&outs, png, N)) {
        free(lat);
        free(png);
        free(file);
        return cli_error(cmd, "out of memory");
    }
    s = cli_write_f32(file, "latents", lat, 4, shape);
    if (!s && vae) { /* --vae: the decoded images, one PNG per image, instead of the preview */
        kiln_vae_opts vo = kiln_vae_defaults();
        kiln_image_info info = {.steps = o->steps, .guidance = o->guidance, .has_seed = o->noise == NULL, .seed = o->seed,
                                .sampler = "Euler (flow matching)"};
        s = kiln_vae_write_png(vae, lat, shape, &vo, outs.tmp_base, &info, NULL, NULL);
    }
    for (int k = 0; k < N && !s && !vae; k++) /* a preview per image: x.png, or x-0.png, x-1.png ... */
        s = kf_write_latent_png(outs.tmp[k], lat + (size_t)k * one, c->in_channels, o->latent_h, o->latent_w);
    free(lat);
    if (s) {
        cli_outputs_abort(&outs);
    } else if (cli_outputs_commit(&outs, cmd, quiet || !strcmp(cmd, "demo"))) { /* the demo rewrites its own files */
        free(png);
        free(file);
        return 1;
    }
    if (!s && !quiet) {
        /* a step of the chain that was skipped (a package whose ranges miss
         * this shape, say) is worth a line: it costs time on every step */
        const char *why = kiln_model_exec_note(m);
        fprintf(stderr, "%s: %.2f s (backbone: %s) -> %s (preview %s)\n", cmd, total, kiln_model_last_exec(m), file,
                png);
        if (*why) fprintf(stderr, "%s: backbone %s because %s\n", cmd, kiln_model_last_exec(m), why);
    }
    free(png);
    free(file);
    return s ? cli_fail(cmd, s) : 0;
}

int cmd_generate(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    const char *model = NULL, *cond = NULL, *output = NULL, *noise = NULL, *vae_dir = NULL, *v;
    kiln_generate_opts o = kiln_generate_defaults();
    int shift_set = 0; /* --shift given */
    int quiet = 0, hw_set = 0, seed_set = 0;
    pipe_args pa = {.ipp = 1, .msl = 256};
    for (int i = 1; i < argc; i++) {
        int r;
        long l;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if (cli_flag(argv, i, "--low-memory")) {
            pa.low_memory = 1;
            continue;
        }
        if (cli_flag(argv, i, "--compile")) {
            pa.compile = 1;
            continue;
        }
        if ((r = cli_opt("generate", argc, argv, &i, "--prompt", &pa.prompt)) ||
            (r = cli_opt("generate", argc, argv, &i, "--prompts-file", &pa.prompts_file)) ||
            (r = cli_opt("generate", argc, argv, &i, "--negative-prompt", &pa.negative)) ||
            (r = cli_opt("generate", argc, argv, &i, "--latents-output", &pa.latents_out)) ||
            (r = cli_opt("generate", argc, argv, &i, "--tensor-output", &pa.tensor_out)) ||
            (r = cli_opt("generate", argc, argv, &i, "--memory", &pa.memory)) ||
            (r = cli_opt("generate", argc, argv, &i, "--vae-tile", &pa.vae_tile)) ||
            (r = cli_opt("generate", argc, argv, &i, "--vae-memory", &pa.vae_memory))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("generate", argc, argv, &i, "--width", &v)) && (r < 0 || cli_parse_int("generate", "--width", v, 1, 1 << 20, &pa.width)))
            return 2;
        if (r) continue;
        if ((r = cli_opt("generate", argc, argv, &i, "--height", &v)) && (r < 0 || cli_parse_int("generate", "--height", v, 1, 1 << 20, &pa.height)))
            return 2;
        if (r) continue;
        if ((r = cli_opt("generate", argc, argv, &i, "--images-per-prompt", &v)) &&
            (r < 0 || cli_parse_int("generate", "--images-per-prompt", v, 1, KM_MAX_BATCH / 2, &pa.ipp)))
            return 2;
        if (r) continue;
        if ((r = cli_opt("generate", argc, argv, &i, "--micro-batch", &v)) &&
            (r < 0 || cli_parse_int("generate", "--micro-batch", v, 1, KM_MAX_BATCH / 2, &pa.micro_batch)))
            return 2;
        if (r) continue;
        if ((r = cli_opt("generate", argc, argv, &i, "--max-sequence-length", &v)) &&
            (r < 0 || cli_parse_int("generate", "--max-sequence-length", v, 1, 512, &pa.msl)))
            return 2;
        if (r) {
            pa.msl_set = 1;
            continue;
        }
        if ((r = cli_common_opt("generate", argc, argv, &i, &com)) ||
            (r = cli_opt("generate", argc, argv, &i, "--cond", &cond)) ||
            (r = cli_opt("generate", argc, argv, &i, "--output", &output)) ||
            (r = cli_opt("generate", argc, argv, &i, "--noise", &noise)) ||
            (r = cli_opt("generate", argc, argv, &i, "--vae", &vae_dir))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("generate", argc, argv, &i, "--steps", &v))) {
            if (r < 0 || cli_parse_int("generate", "--steps", v, 1, 10000, &l)) return 2;
            o.steps = (int)l;
            pa.steps_set = 1;
        } else if ((r = cli_opt("generate", argc, argv, &i, "--shift", &v))) {
            if (r < 0 || cli_parse_double("generate", "--shift", v, &o.shift)) return 2;
            shift_set = 1;
            if (o.shift <= 0)
                return cli_usage_error("generate", k_usage,
                                       "--shift %s: must be positive (it stretches the schedule toward high noise: "
                                       "sigma' = shift sigma / (1 + (shift - 1) sigma); SD3 uses 3.0)", v);
        } else if ((r = cli_opt("generate", argc, argv, &i, "--guidance", &v))) {
            if (r < 0 || cli_parse_double("generate", "--guidance", v, &o.guidance)) return 2;
            pa.guidance_set = 1;
            if (!(o.guidance >= 0) || !isfinite(o.guidance))
                return cli_usage_error("generate", k_usage, "--guidance %s: must be 0 or more (above 1 it is classifier-free "
                                       "guidance's scale; 1 or less samples the prompt alone)", v);
        } else if ((r = cli_opt("generate", argc, argv, &i, "--latent", &v))) {
            if (r < 0 || cli_parse_hw("generate", "--latent", v, &o.latent_h, &o.latent_w)) return 2;
            hw_set = 1;
        } else if ((r = cli_opt("generate", argc, argv, &i, "--seed", &v))) {
            if (r < 0 || cli_parse_u64("generate", "--seed", v, &o.seed)) return 2;
            seed_set = 1;
        } else if (argv[i][0] == '-') {
            return cli_usage_error("generate", k_usage, "unknown option %s", argv[i]);
        } else if (model) {
            return cli_usage_error("generate", k_usage, "more than one MODEL given");
        } else {
            model = argv[i];
        }
    }
    quiet = com.quiet;
    /* the byte budgets checked where they are given (a usage error, exit 2) */
    const char *budgets[2][2] = {{"--memory", pa.memory}, {"--vae-memory", pa.vae_memory}};
    for (int k = 0; k < 2; k++) {
        kiln_vae_opts vo = kiln_vae_defaults();
        if (budgets[k][1] && kiln_vae_parse_memory(budgets[k][1], &vo))
            return cli_usage_error("generate", k_usage, "%s %s: expected a positive number of bytes, optionally with K, M, "
                                   "G or T (e.g. 8G): %s", budgets[k][0], budgets[k][1],
                                   k ? "the VAE decode's memory budget" : "the sampler's memory budget for a micro-batch");
    }
    if (pa.vae_tile) {
        kiln_vae_opts vo = kiln_vae_defaults();
        if (kiln_vae_parse_tile(pa.vae_tile, &vo)) return cli_usage_error("generate", k_usage, "%s", kiln_last_error());
    }
    if (noise && seed_set)
        return cli_usage_error("generate", k_usage,
                               "--noise and --seed both set the starting noise: give one (--noise %s is used as is, "
                               "the seed would be ignored)", noise);
    /* a pipeline folder or an all-in-one file (a file given a prompt is meant as one) */
    int pipeline = cli_is_pipeline(model, &com) || (model && kb_is_file(model) && (pa.prompt || pa.prompts_file));
    if (pipeline) { /* a whole pipeline: prompt to image */
        if (cond) return cli_usage_error("generate", k_usage, "--cond is for a transformer folder; a pipeline encodes --prompt");
        if (hw_set) return cli_usage_error("generate", k_usage, "--latent is for a transformer; a pipeline takes --width and --height in pixels");
        if (pa.prompt && pa.prompts_file)
            return cli_usage_error("generate", k_usage, "give only one of --prompt and --prompts-file");
        if (!pa.prompt && !pa.prompts_file)
            return cli_usage_error("generate", k_usage, "a pipeline needs --prompt TEXT or --prompts-file FILE");
        if (!output) return cli_usage_error("generate", k_usage, "--output is required");
        if (cli_check_png_output("generate", output)) return 1; /* before any work */
        /* no --shift: the pipeline's scheduler config's (kiln_pipeline_opts.shift 0) */
        if (!shift_set) o.shift = 0;
        int rc = cli_generate_pipeline(model, &com, &pa, &o, noise, output, quiet);
        cli_common_finish(&com);
        return rc;
    }
    if (model && access(model, F_OK) != 0)
        return cli_error("generate", "%s does not exist (a pipeline folder, an all-in-one file or a transformer "
                         "folder was expected)", model);
    if (pa.prompt || pa.prompts_file || pa.width || pa.height || pa.tensor_out || pa.micro_batch || pa.memory)
        return cli_usage_error("generate", k_usage, "%s is not a pipeline folder (no model_index.json): --prompt, "
                               "--width and --height need one; a transformer takes --cond and --latent",
                               model ? model : "MODEL");
    if (!model || !cond || !output)
        return cli_usage_error("generate", k_usage, "MODEL, --cond and --output are required");
    char *latents_file = cli_latents_path(output), *png_file = cli_preview_path(output);
    int bad_out = !latents_file || !png_file || cli_check_output("generate", latents_file) ||
                  (strcmp(latents_file, output) && cli_check_output("generate", output));
    free(latents_file);
    free(png_file);
    if (bad_out) return 1;
    /* the latent size against the config before any weights load (a real
     * model's conversion takes minutes) */
    if (hw_set && latent_hint("generate", model, &com, o.latent_h, o.latent_w)) return 1;

    int rc = 1;
    kiln_model *m = NULL, *vae = NULL;
    st_file *cf = NULL, *nf = NULL;
    float *pe = NULL, *pp = NULL, *ne = NULL, *np = NULL, *nz = NULL;
    kiln_status s;
    if ((s = st_open(cond, &cf)) || (noise && (s = st_open(noise, &nf))) ||
        (s = cli_load_model_of(model, &com, "sd3", "an SD3 transformer (a pipeline's transformer/ folder, or give "
                               "the pipeline folder and --prompt)", &m))) {
        rc = cli_fail("generate", s);
        goto done;
    }
    const kiln_config *c = kiln_model_config(m);
    int64_t s3[3], s2[2], n3[3], n2[2], sn[4];
    if (!(pe = cli_tensor("generate", cf, "prompt_embeds", 3, s3)) ||
        !(pp = cli_tensor("generate", cf, "pooled_prompt_embeds", 2, s2)))
        goto done;
    if (s3[1] < 1 || s3[1] > KM_MAX_CONTEXT) {
        cli_error("generate", "%s: prompt_embeds has %lld tokens; the context length must be between 1 and %d",
                  cond, (long long)s3[1], KM_MAX_CONTEXT);
        goto done;
    }
    if (s3[0] < 1 || s3[0] > KM_MAX_BATCH / 2 || s3[2] != c->joint_attention_dim) {
        cli_error("generate", "%s: prompt_embeds is [%lld, %lld, %lld]; this model needs [B, T, %d] (B images, 1 to %d; "
                  "joint_attention_dim %d)", cond, (long long)s3[0], (long long)s3[1], (long long)s3[2],
                  c->joint_attention_dim, KM_MAX_BATCH / 2, c->joint_attention_dim);
        goto done;
    }
    if (s2[0] != s3[0] || s2[1] != c->pooled_projection_dim) {
        cli_error("generate", "%s: pooled_prompt_embeds is [%lld, %lld]; this model needs [%lld, %d] (the prompts' "
                  "batch, pooled_projection_dim %d)", cond, (long long)s2[0], (long long)s2[1], (long long)s3[0],
                  c->pooled_projection_dim, c->pooled_projection_dim);
        goto done;
    }
    o.batch = (int)s3[0];
    if (o.guidance > 1) {
        if (!(ne = cli_tensor("generate", cf, "negative_prompt_embeds", 3, n3)) ||
            !(np = cli_tensor("generate", cf, "negative_pooled_prompt_embeds", 2, n2))) {
            fprintf(stderr, "  (guidance %g > 1 needs the negative conditioning; --guidance 1 samples without it)\n",
                    o.guidance);
            goto done;
        }
        if (memcmp(n3, s3, sizeof s3) || memcmp(n2, s2, sizeof s2)) {
            cli_error("generate", "%s: negative_prompt_embeds [%lld, %lld, %lld] and negative_pooled_prompt_embeds "
                      "[%lld, %lld] must have the prompt's shapes [%lld, %lld, %lld] and [%lld, %lld]", cond,
                      (long long)n3[0], (long long)n3[1], (long long)n3[2], (long long)n2[0], (long long)n2[1],
                      (long long)s3[0], (long long)s3[1], (long long)s3[2], (long long)s2[0], (long long)s2[1]);
            goto done;
        }
    }
    if (nf) {
        if (!(nz = cli_tensor("generate", nf, "noise", 4, sn))) goto done;
        if (sn[0] != o.batch || sn[1] != c->in_channels) {
            cli_error("generate", "%s: noise is [%lld, %lld, %lld, %lld]; this model needs [%d, %d, H, W] (the "
                      "conditioning's batch)", noise, (long long)sn[0], (long long)sn[1], (long long)sn[2],
                      (long long)sn[3], o.batch, c->in_channels);
            goto done;
        }
        if ((s = sd3_check_latent(c, sn[2], sn[3]))) { /* before the int casts below */
            rc = cli_fail("generate", kb_wrap(s, "%s: noise", noise));
            goto done;
        }
        if (hw_set && (sn[2] != o.latent_h || sn[3] != o.latent_w)) {
            cli_error("generate", "--latent %dx%d disagrees with the noise's %lldx%lld", o.latent_h,
                      o.latent_w, (long long)sn[2], (long long)sn[3]);
            goto done;
        }
        o.latent_h = (int)sn[2];
        o.latent_w = (int)sn[3];
        o.noise = nz;
    } else if (!hw_set) {
        o.latent_h = o.latent_w = c->sample_size;
    }
    if (sd3_check_latent(c, o.latent_h, o.latent_w)) {
        cli_error("generate", "%s%s", kiln_last_error(), k_pixels_hint);
        goto done;
    }
    o.context_len = (int)s3[1];
    o.cond = pe;
    o.cond_pooled = pp;
    o.uncond = ne;
    o.uncond_pooled = np;
    if (vae_dir) {
        char name[128];
        kiln_load_opts vl = cli_load_opts(vae_dir, &com, name, sizeof name);
        if ((s = kiln_vae_open(vae_dir, &vl, NULL, &vae))) {
            rc = cli_fail("generate", kb_wrap(s, "--vae %s", vae_dir));
            goto done;
        }
    }
    rc = cli_generate_run("generate", m, &o, output, quiet, vae);
done:
    free(pe);
    free(pp);
    free(ne);
    free(np);
    free(nz);
    st_close(cf);
    st_close(nf);
    kiln_model_free(m);
    kiln_model_free(vae);
    cli_common_finish(&com);
    return rc;
}
