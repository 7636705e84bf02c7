/* cmd_demo.c - kiln demo: the README's main job on an embedded default.
 * Makes a tiny SD3.5-style model from seeded weights, writes it as a
 * diffusers folder, generates at two widths and prints where the time went;
 * then the whole pipeline, prompt to PNG, on the embedded sd3-pipeline-tiny:
 * once in this process (converting and compiling every component), once in
 * a fresh process on the caches and packages. */
#include "arch/sd3/sd3.h"
#include "base/base.h"
#include "cache/cache.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char k_usage[] = "kiln demo [--dir DIR] [--steps N] [--pipeline DIR] [--threads N]";

#ifndef KILN_DEMO_PIPELINE
#define KILN_DEMO_PIPELINE ""
#endif

#define DEMO_PROMPT "a lighthouse on a cliff at dawn, oil painting"

/* each component's origin as it loads: how many were converted, how many mapped */
typedef struct {
    int hits, misses;
} origins;
static void count_origin(void *user, const char *component, const char *origin, double seconds) {
    (void)component;
    origins *o = user;
    if (seconds < 0 || !origin) return;
    if (!strncmp(origin, "hit", 3)) o->hits++;
    else o->misses++;
}

/* The pipeline part: prompt -> PNG through every component, then the same
 * request from a fresh process on what the first run left (caches, packages). */
static int demo_pipeline(const char *dir, const char *pipe, const cli_common *com, long steps) {
    char *cache = kb_path_join(dir, "cache"), *first = kb_path_join(dir, "pipeline.png"),
         *again = kb_path_join(dir, "pipeline-again.png"), self[4096], *pkg = NULL;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    int rc = 1;
    if (!cache || !first || !again || n <= 0) goto done;
    self[n] = 0;
    const char *env_cache = getenv("KILN_CACHE_DIR");
    const char *root = com->cache_dir ? com->cache_dir : env_cache && *env_cache ? env_cache : cache;
    printf("\nkiln demo: the whole SD3 pipeline, prompt to PNG, on %s\n"
           "  (seeded weights: the pictures are noise, but every component runs: 3 tokenizers, CLIP-L,\n"
           "  CLIP-G, T5, the MMDiT with CFG over a batch of 2 images, the VAE decoder)\n", pipe);
    cli_common pc = *com;
    pc.cache_dir = root;
    pc.name = "kiln-demo-pipeline";
    char name[128];
    kiln_load_opts lo = cli_load_opts(pipe, &pc, name, sizeof name);
    origins og = {0, 0};
    lo.on_component = count_origin;
    lo.component_user = &og;
    pkg = kcache_package_root(pc.package_dir, root);
    int pkgs_before = cli_count_packages(pkg);
    kiln_pipeline *p = NULL;
    float *lat = NULL;
    double t0 = kb_now();
    kiln_status s = kiln_pipeline_open(pipe, &lo, &p);
    if (s) {
        rc = cli_fail("demo", s);
        goto done;
    }
    double topen = kb_now() - t0;
    const char *prompts[1] = {DEMO_PROMPT};
    kiln_pipeline_opts po = kiln_pipeline_defaults();
    po.prompts = prompts;
    po.n_prompts = 1;
    po.images_per_prompt = 2;
    po.negative_prompt = "blurry";
    po.steps = (int)steps;
    po.guidance = 5.0;
    po.seed = 42;
    po.compile = 1; /* every shape this run sees gets a package: the fresh process starts from them */
    int64_t sh[4];
    if ((s = kiln_pipeline_generate(p, &po, &lat, sh))) {
        rc = cli_fail("demo", s);
        goto done;
    }
    kiln_vae_opts vo = kiln_vae_defaults();
    kiln_image_info info = {.prompt = DEMO_PROMPT, .negative_prompt = "blurry", .steps = (int)steps, .guidance = 5.0,
                            .has_seed = 1, .seed = 42, .sampler = "Euler (flow matching)", .model = "sd3-pipeline-tiny"};
    if ((s = kiln_vae_write_png(kiln_pipeline_vae(p), lat, sh, &vo, first, &info, NULL, NULL))) {
        rc = cli_fail("demo", s);
        goto done;
    }
    double t1 = kb_now() - t0;
    char *f0 = kiln_image_path(first, 0, 2), *f1 = kiln_image_path(first, 1, 2);
    int made = cli_count_packages(pkg) - pkgs_before;
    char what[256];
    if (og.misses)
        snprintf(what, sizeof what, "%d component%s converted into the cache%s", og.misses, og.misses == 1 ? "" : "s",
                 og.hits ? ", the others mapped from it" : "");
    else
        snprintf(what, sizeof what, "every component mapped from the cache (an earlier run converted them)");
    printf("  first run, this process: %.2f s (%s in %.2f s; %s) -> %s, %s\n", t1, what, topen,
           made > 0 ? "every shape compiled into a package as it ran" : "every shape's package already there", f0, f1);
    free(f0);
    free(f1);
    fflush(stdout);
    /* the same request from a fresh process: caches mapped, packages found */
    char *cmd = kb_strfmt("'%s' generate '%s' --prompt '" DEMO_PROMPT "' --negative-prompt blurry --images-per-prompt 2 "
                          "--steps %ld --guidance 5 --seed 42 --cache-dir '%s' --name kiln-demo-pipeline --quiet "
                          "--timings --output '%s' 2>&1", self, pipe, steps, root, again);
    double t2 = kb_now();
    FILE *f = cmd ? popen(cmd, "r") : NULL;
    char line[512];
    printf("  a fresh process on the caches and packages (kiln generate PIPELINE --prompt ...):\n");
    while (f && fgets(line, sizeof line, f)) printf("    %s", line);
    int st = f ? pclose(f) : -1;
    double tf = kb_now() - t2;
    free(cmd);
    if (st != 0) {
        cli_error("demo", "the fresh process failed (exit status %d)", st);
        goto done;
    }
    /* the same pixels from both processes */
    int same = 1;
    for (int k = 0; k < 2; k++) {
        char *a = kiln_image_path(first, k, 2), *b = kiln_image_path(again, k, 2);
        uint8_t *x = NULL, *y = NULL;
        int h1, w1, h2, w2;
        same &= a && b && !kiln_png_read(a, &x, &h1, &w1) && !kiln_png_read(b, &y, &h2, &w2) && h1 == h2 && w1 == w2 &&
                !memcmp(x, y, (size_t)h1 * (size_t)w1 * 3);
        free(a);
        free(b);
        free(x);
        free(y);
    }
    printf("  fresh process: %.2f s for its first images, %.2fx the first run's %.2f s; the pictures are %s\n", tf,
           tf / t1, t1, same ? "pixel for pixel the same" : "NOT the same");
    printf("\nnext:  kiln info %s\n"
           "       kiln generate %s --prompt \"a red fox\" --steps 8 --cache-dir %s --name kiln-demo-pipeline "
           "--output %s/fox.png\n", pipe, pipe, root, dir);
    rc = same ? 0 : 1;
done:
    free(pkg);
    free(lat);
    kiln_pipeline_free(p);
    free(cache);
    free(first);
    free(again);
    return rc;
}

static int help(void) {
    printf("usage: %s\n\n"
           "Writes an embedded tiny SD3.5-architecture model (seeded weights) to DIR/model as a\n"
           "diffusers folder, seeded conditioning to DIR/cond.safetensors, then generates latents at\n"
           "two widths (DIR/demo-HxW.safetensors + .png) and prints the timing ledger. The weights go\n"
           "through the weight cache (KILN_CACHE_DIR, or DIR/cache): the first run converts and\n"
           "publishes, later runs map it. The backbone is compiled once into a package with a\n"
           "dynamic width (beside the cache); later runs find it and start from it.\n\n"
           "Then the whole pipeline, prompt to PNG (DIR/pipeline-0.png, -1.png), on --pipeline DIR (default:\n"
           "the source tree's sd3-pipeline-tiny): once in this process, converting every component into\n"
           "the cache and compiling each shape, then again from a fresh process on those caches and\n"
           "packages, with where the time went and whether both made the same pixels.\n\n"
           "  --dir DIR       where to put everything (default: kiln-demo)\n"
           "  --steps N       sampler steps (default 8)\n"
           "  --pipeline DIR  a StableDiffusion3Pipeline folder for the second part\n",
           k_usage);
    return 0;
}

int cmd_demo(int argc, char **argv) {
    const char *dir = "kiln-demo", *v, *pipeline = NULL;
    long steps = 8;
    cli_common com = cli_common_defaults();
    com.timings = 1;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if ((r = cli_common_opt("demo", argc, argv, &i, &com)) ||
            (r = cli_opt("demo", argc, argv, &i, "--dir", &dir)) ||
            (r = cli_opt("demo", argc, argv, &i, "--pipeline", &pipeline))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("demo", argc, argv, &i, "--steps", &v))) {
            if (r < 0 || cli_parse_int("demo", "--steps", v, 1, 1000, &steps)) return 2;
            continue;
        }
        return cli_usage_error("demo", k_usage, "unknown argument %s", argv[i]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep stdout and the stderr progress in order */
    kiln_config cfg = kiln_config_demo();
    char *model = kb_path_join(dir, "model"), *cond = kb_path_join(dir, "cond.safetensors");
    char *cfg_file = model ? kb_path_join(model, "config.json") : NULL;
    int rc = 1;
    kiln_model *m = NULL;
    st_file *cf = NULL;
    if (!model || !cond || !cfg_file) goto done;
    kiln_status s;
    printf("kiln demo: tiny SD3.5-style MMDiT (%d blocks, width %d, RMS qk-norm, dual attention in block 0)\n",
           cfg.num_layers, cfg.num_attention_heads * cfg.attention_head_dim);
    double t0 = kb_now();
    if (kb_is_file(cfg_file)) {
        printf("  model:  %s (already there)\n", model);
    } else {
        if ((s = kiln_write_seeded_model(model, &cfg, 2026, KILN_BF16))) {
            rc = cli_fail("demo", s);
            goto done;
        }
        kb_ledger_add("demo_write_model", kb_now() - t0, "seeded bf16 weights");
        printf("  model:  %s (written from seed 2026, bf16 weights)\n", model);
    }
    if ((s = cli_write_seeded_cond(cond, &cfg, 32, 101))) {
        rc = cli_fail("demo", s);
        goto done;
    }
    printf("  cond:   %s (seeded prompt embeddings, 32 tokens)\n", cond);
    /* the weight cache: KILN_CACHE_DIR, or DIR/cache; a miss on the first run, a hit after */
    char *cache = NULL;
    if (!com.cache_dir && !(getenv("KILN_CACHE_DIR") && *getenv("KILN_CACHE_DIR")))
        com.cache_dir = cache = kb_path_join(dir, "cache");
    if (!com.name) com.name = "kiln-demo-tiny";
    double tl = kb_now();
    s = cli_load_model(model, &com, &m);
    free(cache);
    com.cache_dir = NULL;
    if (s || (s = st_open(cond, &cf))) {
        rc = cli_fail("demo", s);
        goto done;
    }
    const char *origin = kiln_model_origin(m);
    printf("  weights: %s in %.1f ms: %s\n         %s\n", origin, (kb_now() - tl) * 1e3,
           !strcmp(origin, "hit") ? "mapped the cache, no conversion"
                                  : "converted the checkpoint and published the cache (the next run maps it)",
           kiln_model_cache_path(m));
    /* the backbone: compiled once into a package with a dynamic width (published beside the
     * weights); a later process finds it and starts from it */
    kiln_compile_opts co = kiln_compile_defaults();
    char dims[64]; /* the latent width over 32..48: patch columns 16..24 */
    snprintf(dims, sizeof dims, "%s=16:24", ka_sd3.sym[SD3_SYM_W]);
    co.dims = dims;
    co.batch = 2;
    co.height = 32;
    co.width = 32;
    co.context_len = 32;
    kiln_compile_result cr;
    double tc = kb_now();
    if ((s = kiln_compile(m, &co, &cr))) {
        printf("  package: not available (%s); running the planned executor\n", kiln_last_error());
    } else {
        printf("  package: %s in %.1f ms: %s\n           %s\n", cr.reused ? "found" : "compiled", (kb_now() - tc) * 1e3,
               cr.reused ? "published by an earlier run; this process starts from it"
                         : "the backbone with a dynamic width (latent 32..48) as C, built into a weightless package",
               cr.path);
    }
    fflush(stdout);
    int widths[2] = {32, 48};
    for (int k = 0; k < 2; k++) {
        int64_t sh[3];
        kiln_generate_opts o = kiln_generate_defaults();
        o.steps = (int)steps;
        o.guidance = 5.0;
        o.latent_h = 32;
        o.latent_w = widths[k];
        o.seed = 7;
        o.cond = cli_tensor("demo", cf, "prompt_embeds", 3, sh);
        o.cond_pooled = cli_tensor("demo", cf, "pooled_prompt_embeds", 2, sh);
        o.uncond = cli_tensor("demo", cf, "negative_prompt_embeds", 3, sh);
        o.uncond_pooled = cli_tensor("demo", cf, "negative_pooled_prompt_embeds", 2, sh);
        o.context_len = 32;
        char *out = kb_strfmt("%s/demo-%dx%d.safetensors", dir, o.latent_h, o.latent_w);
        rc = out && o.cond && o.cond_pooled && o.uncond && o.uncond_pooled
                 ? cli_generate_run("demo", m, &o, out, 0, NULL)
                 : 1;
        free(out);
        free((void *)o.cond);
        free((void *)o.cond_pooled);
        free((void *)o.uncond);
        free((void *)o.uncond_pooled);
        if (rc) goto done;
    }
    const char *env_cache = getenv("KILN_CACHE_DIR");
    /* the demo's cache and name, and a width inside the package's range
     * (latent 32..48), so that the next run maps the weights
     * and runs the compiled package */
    char cache_opt[1100] = "";
    if (!(env_cache && *env_cache)) snprintf(cache_opt, sizeof cache_opt, " --cache-dir %s/cache", dir);
    printf("\nnext:  kiln info %s\n"
           "       kiln generate %s --name %s%s --cond %s --latent 32x40 --guidance 5 --output %s/out.safetensors\n"
           "       kiln package ls%s\n",
           model, model, com.name, cache_opt, cond, dir, cache_opt);
    /* the whole pipeline: --pipeline, else the source tree's embedded one when it is there */
    if (!pipeline && kb_is_dir(KILN_DEMO_PIPELINE)) pipeline = KILN_DEMO_PIPELINE;
    if (pipeline) {
        com.timings = 0; /* the pipeline part prints its own */
        kiln_timings_print(stdout);
        kiln_timings_reset();
        rc = demo_pipeline(dir, pipeline, &com, steps);
    } else {
        printf("\n(the whole-pipeline part needs a pipeline folder: --pipeline DIR, e.g. the source tree's\n"
               "tests/data/goldens/sd3-pipeline-tiny)\n");
    }
done:
    free(model);
    free(cond);
    free(cfg_file);
    st_close(cf);
    kiln_model_free(m);
    cli_common_finish(&com);
    return rc;
}
