/* test_pipeline.c - kiln generate PIPELINE: sd3-pipeline-tiny's prompt,
 * negative prompt, settings and stored noise give its final latents
 * (f32); a batch of 2 prompts x 2 images equals the 4 images generated
 * one by one (bitwise on the reference kernels, 1e-5 on the fast path); the
 * errors a user can make, each named before any work. */
#include "base/base.h"
#include "cli_util.h"
#include "golden_util.h"
#include "pipeline_util.h"

#include <unistd.h>

#define CASE PIPELINE_CASE

static char g_dir[128];

TEST(pipeline_matches_diffusers) {
    char lat[256], png[256], tens[256];
    snprintf(lat, sizeof lat, "%s/latents.safetensors", g_dir);
    snprintf(png, sizeof png, "%s/image.png", g_dir);
    snprintf(tens, sizeof tens, "%s/tensors.safetensors", g_dir);
    const char *pipe = golden_path(CASE, NULL);
    char *out = NULL;
    int rc = run_kiln(&out, "generate '%s' " PIPELINE_ARGS " --noise '%s' --latents-output '%s' --tensor-output '%s' "
                      "--output '%s'", pipe, golden_path(CASE, "io.safetensors"), lat, tens, png);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    CHECK(out && strstr(out, "1 image 48x32, 4 steps"));
    CHECK(out && strstr(out, "generate: text_encoder_3  ")); /* progress per component */
    free(out);
    pipeline_check_case("kiln generate PIPELINE", lat, tens, png);
}

/* image k of a batch starts from seed + k: the batch equals the images made alone */
static void batch_equals_alone(const char *extra, double tol) {
    char pf[256], lat[256], png[256];
    snprintf(pf, sizeof pf, "%s/prompts.txt", g_dir);
    snprintf(lat, sizeof lat, "%s/batch.safetensors", g_dir);
    snprintf(png, sizeof png, "%s/batch.png", g_dir);
    FILE *f = fopen(pf, "w");
    if (!f) return;
    fputs("a red fox in the snow\nan astronaut riding a horse\n", f);
    fclose(f);
    const char *pipe = golden_path(CASE, NULL), *prompts[2] = {"a red fox in the snow", "an astronaut riding a horse"};
    char *out = NULL;
    int rc = run_kiln(&out, "generate '%s' --prompts-file '%s' --images-per-prompt 2 --steps 2 --guidance 4 --seed 5 %s "
                      "--quiet --latents-output '%s' --output '%s'", pipe, pf, extra, lat, png);
    CHECK_MSG(rc == 0, "batch: exit %d: %s", rc, out);
    free(out);
    size_t n = 0;
    float *batch = pipeline_read_latents(lat, &n);
    if (!batch) return;
    size_t one = n / 4;
    for (int k = 0; k < 4; k++) {
        char lk[256], pk[256];
        snprintf(lk, sizeof lk, "%s/alone-%d.safetensors", g_dir, k);
        snprintf(pk, sizeof pk, "%s/alone-%d.png", g_dir, k);
        rc = run_kiln(&out, "generate '%s' --prompt '%s' --steps 2 --guidance 4 --seed %d %s --quiet --latents-output '%s' "
                      "--output '%s'", pipe, prompts[k / 2], 5 + k, extra, lk, pk);
        CHECK_MSG(rc == 0, "alone %d: exit %d: %s", k, rc, out);
        free(out);
        size_t m = 0;
        float *x = pipeline_read_latents(lk, &m);
        if (!x) continue;
        double e = m == one ? kb_rel_l2(batch + (size_t)k * one, x, one) : INFINITY;
        if (tol == 0) CHECK_MSG(m == one && !memcmp(batch + (size_t)k * one, x, sizeof(float) * one), "image %d: %.3g", k, e);
        else CHECK_MSG(e <= tol, "image %d: %.3g", k, e);
        free(x);
        char *pi = kb_strfmt("%s/batch-%d.png", g_dir, k); /* one PNG per image */
        CHECK(pi && access(pi, F_OK) == 0);
        free(pi);
    }
    /* micro-batches (3 images a call: 2 + 2, and 1 a call) give the same images */
    const int micro[2] = {3, 1};
    for (int k = 0; k < 2; k++) {
        char lm[256];
        snprintf(lm, sizeof lm, "%s/micro-%d.safetensors", g_dir, micro[k]);
        rc = run_kiln(&out, "generate '%s' --prompts-file '%s' --images-per-prompt 2 --steps 2 --guidance 4 --seed 5 %s "
                      "--micro-batch %d --timings --latents-output '%s' --output '%s'", pipe, pf, extra, micro[k], lm, png);
        CHECK_MSG(rc == 0 && strstr(out, micro[k] == 3 ? "cfg batch 8 in 2 calls" : "cfg batch 8 in 4 calls"),
                  "micro-batch %d: exit %d: %s", micro[k], rc, out);
        free(out);
        size_t m = 0;
        float *x = pipeline_read_latents(lm, &m);
        if (!x) continue;
        double e = m == n ? kb_rel_l2(batch, x, n) : INFINITY;
        printf("  micro-batch %d against the whole batch (%s): %.3g relative L2\n", micro[k], extra, e);
        if (tol == 0) CHECK_MSG(m == n && !memcmp(batch, x, sizeof(float) * n), "micro-batch %d: %.3g", micro[k], e);
        else CHECK_MSG(e <= tol, "micro-batch %d: %.3g", micro[k], e);
        free(x);
    }
    free(batch);
}

TEST(batch_reference_bitwise) { batch_equals_alone("--reference", 0); }
TEST(batch_fast) { batch_equals_alone("--dtype f32", 1e-5); }

/* --prompts-file with JSON lines: per-prompt settings, one batch per set of
 * settings, images numbered in the file's order, each the image its settings
 * make alone */
TEST(prompts_json_lines) {
    char pf[256], lat[256], png[256];
    snprintf(pf, sizeof pf, "%s/prompts.jsonl", g_dir);
    snprintf(lat, sizeof lat, "%s/jl.safetensors", g_dir);
    snprintf(png, sizeof png, "%s/jl.png", g_dir);
    FILE *f = fopen(pf, "w");
    if (!f) return;
    fputs("a red fox in the snow\n"
          "{\"prompt\": \"an astronaut riding a horse\", \"negative_prompt\": \"ugly\", \"seed\": 11}\n"
          "  {\"prompt\": \"a lighthouse\", \"steps\": 3, \"guidance\": 1}\n"
          "{\"prompt\": \"a boat\"}\n", f);
    fclose(f);
    const char *pipe = golden_path(CASE, NULL);
    char *out = NULL;
    int rc = run_kiln(&out, "generate '%s' --prompts-file '%s' --steps 2 --guidance 4 --seed 5 --reference --latents-output '%s' "
                      "--output '%s'", pipe, pf, lat, png);
    CHECK_MSG(rc == 0 && strstr(out, "3 images 64x64, 2 steps, guidance 4") && strstr(out, "1 image 64x64, 3 steps, guidance 1"),
              "exit %d: %s", rc, out);
    free(out);
    size_t n = 0;
    float *all = pipeline_read_latents(lat, &n);
    if (!all) return;
    const char *alone[4] = {"--prompt 'a red fox in the snow' --steps 2 --guidance 4 --seed 5",
                            "--prompt 'an astronaut riding a horse' --negative-prompt ugly --steps 2 --guidance 4 --seed 11",
                            "--prompt 'a lighthouse' --steps 3 --guidance 1 --seed 7",
                            "--prompt 'a boat' --steps 2 --guidance 4 --seed 8"};
    for (int k = 0; k < 4; k++) {
        char lk[256];
        snprintf(lk, sizeof lk, "%s/jl-%d.safetensors", g_dir, k);
        rc = run_kiln(&out, "generate '%s' %s --reference --quiet --latents-output '%s' --output '%s/jl-alone.png'", pipe,
                      alone[k], lk, g_dir);
        CHECK_MSG(rc == 0, "alone %d: %s", k, out);
        free(out);
        size_t m = 0;
        float *x = pipeline_read_latents(lk, &m);
        CHECK_MSG(x && m * 4 == n && !memcmp(all + (size_t)k * m, x, sizeof(float) * m), "line %d's image differs", k + 1);
        free(x);
        char *pi = kb_strfmt("%s/jl-%d.png", g_dir, k);
        CHECK(pi && access(pi, F_OK) == 0);
        free(pi);
    }
    /* --low-memory (the encoders mapped again for the second batch) and a
     * budget too small for two images a call: the same images */
    rc = run_kiln(&out, "generate '%s' --prompts-file '%s' --steps 2 --guidance 4 --seed 5 --reference --low-memory --memory 1K "
                  "--log warn --timings --latents-output '%s' --output '%s'", pipe, pf, lat, png);
    CHECK_MSG(rc == 0 && strstr(out, "running one image a call") &&
              strstr(out, "load text encoders"), "exit %d: %s", rc, out);
    free(out);
    size_t m = 0;
    float *again = pipeline_read_latents(lat, &m);
    CHECK(again && m == n && !memcmp(again, all, sizeof(float) * n));
    free(again);
    free(all);
    /* a bad line names itself and nothing is written */
    f = fopen(pf, "w");
    if (f) {
        fputs("a cat\n{\"prompt\": \"a dog\", \"sed\": 3}\n", f);
        fclose(f);
    }
    CHECK_RUN_WITH(run_kiln, 1, "line 2: unknown key \"sed\"", "generate '%s' --prompts-file '%s' --output '%s/bad.png'", pipe,
                   pf, g_dir);
    f = fopen(pf, "w");
    if (f) {
        fputs("{\"prompt\": \"a dog\", \"width\": 50}\n", f);
        fclose(f);
    }
    CHECK_RUN_WITH(run_kiln, 1, "line 1: width 50 px: must be a multiple of 4", "generate '%s' --prompts-file '%s' --output "
                   "'%s/bad.png'", pipe, pf, g_dir);
    f = fopen(pf, "w");
    if (f) {
        fputs("a\n{\"prompt\": \"b\", \"steps\": 3}\n", f);
        fclose(f);
    }
    CHECK_RUN_WITH(run_kiln, 1, "--tensor-output needs one batch", "generate '%s' --prompts-file '%s' --tensor-output "
                   "'%s/t.safetensors' --output '%s/bad.png'", pipe, pf, g_dir, g_dir);
    CHECK(kiln_sh(&out, "ls '%s' | grep -c '^bad' || true", g_dir) == 0 && out && atoi(out) == 0);
    free(out);
}

TEST(pipeline_info) {
    CHECK_RUN_WITH(run_kiln, 0, "text_encoder_3   t5: 0.35 M parameters in 21 tensors, F16 x 21", "info '%s'",
                   golden_path(CASE, NULL));
    CHECK_RUN_WITH(run_kiln, 0, "vae              vae-decoder", "info '%s'", golden_path(CASE, NULL));
}

/* kiln cache build PIPELINE: every component under its key; a second run hits */
TEST(pipeline_cache_build) {
    char *out = NULL;
    /* kiln info PIPELINE says each component's cache state: none yet */
    int rc = run_kiln(&out, "info '%s' --cache-dir '%s/cache'", golden_path(CASE, NULL), g_dir);
    int uncached = 0;
    for (const char *p = out; p && (p = strstr(p, ", not cached\n")); p++) uncached++;
    CHECK_MSG(rc == 0 && strstr(out, "cache name:     sd3-pipeline-tiny-") && !strstr(out, "cached (") && uncached == 5,
              "%s", out);
    free(out);
    rc = run_kiln(&out, "cache build '%s' --cache-dir '%s/cache'", golden_path(CASE, NULL), g_dir);
    CHECK_MSG(rc == 0 && strstr(out, "text_encoder_3  miss") && strstr(out, "vae             miss"), "%s", out);
    free(out);
    rc = run_kiln(&out, "cache build '%s' --cache-dir '%s/cache'", golden_path(CASE, NULL), g_dir);
    CHECK_MSG(rc == 0 && strstr(out, "transformer     hit") && !strstr(out, "miss"), "%s", out);
    free(out);
    /* now every component is cached, under its own key; under another name none is */
    rc = run_kiln(&out, "info '%s' --cache-dir '%s/cache'", golden_path(CASE, NULL), g_dir);
    int cached = 0;
    for (const char *p = out; p && (p = strstr(p, ", cached (sd3-pipeline-tiny-")); p++) cached++;
    CHECK_MSG(rc == 0 && cached == 5 && !strstr(out, "not cached") && strstr(out, "/text_encoder_3/mesh1x1_"), "%s", out);
    free(out);
    rc = run_kiln(&out, "info '%s' --cache-dir '%s/cache' --name other", golden_path(CASE, NULL), g_dir);
    CHECK_MSG(rc == 0 && !strstr(out, "cached (") && strstr(out, "cache name:     other under"), "%s", out);
    free(out);
}

/* --compile: every shape run gets a package; the next process starts from them */
TEST(pipeline_compile) {
    char *out = NULL, png[256];
    snprintf(png, sizeof png, "%s/c.png", g_dir);
    int rc = run_kiln(&out, "generate '%s' --prompt x --steps 2 --compile --cache-dir '%s/cc' --output '%s'",
                      golden_path(CASE, NULL), g_dir, png);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    rc = run_kiln(&out, "generate '%s' --prompt x --steps 2 --cache-dir '%s/cc' --output '%s' --timings",
                  golden_path(CASE, NULL), g_dir, png);
    CHECK_MSG(rc == 0 && strstr(out, "(backbone: fixed)") && !strstr(out, "compile "), "%s", out);
    free(out);
}

/* kiln compile PIPELINE: the request's shapes are compiled for every component */
TEST(pipeline_compile_command) {
    char *out = NULL, png[256];
    snprintf(png, sizeof png, "%s/cc.png", g_dir);
    CHECK_RUN_WITH(run_kiln, 0, "(CFG) at 64x64 in", "compile '%s' --cache-dir '%s/cc2'", golden_path(CASE, NULL), g_dir);
    CHECK(kiln_sh(&out, "'%s' package ls --package-dir '%s/cc2/packages' | grep -c regional", kiln_bin(), g_dir) == 0 && out &&
          atoi(out) >= 5); /* the packages it says it published: every component's (CLIP-L, CLIP-G, T5, MMDiT, VAE) */
    free(out);
    out = NULL;
    int rc = run_kiln(&out, "generate '%s' --prompt 'a cat' --steps 3 --cache-dir '%s/cc2' --output '%s' --timings",
                      golden_path(CASE, NULL), g_dir, png);
    CHECK_MSG(rc == 0 && strstr(out, "(backbone: fixed)") && !strstr(out, "compile "), "%s", out);
    free(out);
    CHECK_RUN_WITH(run_kiln, 2, "a pipeline is compiled for a request", "compile '%s' --dim batch=1:4",
                   golden_path(CASE, NULL));
}

/* a prompts file at its edges (review, issue 28): a UTF-8 BOM, text after
 * the object, a key twice, blank lines, a NUL byte, more images than a run
 * takes; each an error naming the line before any work, and --tensor-output
 * keeps every step past 64 */
static void write_file(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(text, 1, len, f);
    fclose(f);
}
#define WRITE_LIT(path, lit) write_file(path, lit, sizeof lit - 1)

TEST(prompts_file_edges) {
    const char *pipe = golden_path(CASE, NULL);
    char pf[256], png[256];
    snprintf(pf, sizeof pf, "%s/edges.jsonl", g_dir);
    snprintf(png, sizeof png, "%s/edge.png", g_dir);
    /* a BOM before the first line's { (Windows editors): still a JSON line */
    WRITE_LIT(pf, "\xEF\xBB\xBF{\"prompt\": \"a\", \"sed\": 1}\n");
    CHECK_RUN_WITH(run_kiln, 1, "line 1: unknown key \"sed\"", "generate '%s' --prompts-file '%s' --output '%s'", pipe, pf, png);
    /* a second object on the line was ignored */
    WRITE_LIT(pf, "{\"prompt\": \"a\"} {\"prompt\": \"b\"}\n");
    CHECK_RUN_WITH(run_kiln, 1, "line 1: a line starting with { must be one JSON object", "generate '%s' --prompts-file '%s' "
                   "--output '%s'", pipe, pf, png);
    /* a key twice: cJSON keeps both, the first one won silently */
    WRITE_LIT(pf, "{\"prompt\": \"a\", \"seed\": 1, \"seed\": 2}\n");
    CHECK_RUN_WITH(run_kiln, 1, "line 1: key \"seed\" appears twice", "generate '%s' --prompts-file '%s' --output '%s'", pipe,
                   pf, png);
    /* blank lines are no prompts (they made images of ""); the lines keep their numbers */
    WRITE_LIT(pf, "\n  \r\n\t\n");
    CHECK_RUN_WITH(run_kiln, 1, "holds no prompt", "generate '%s' --prompts-file '%s' --output '%s'", pipe, pf, png);
    WRITE_LIT(pf, "a\r\n\r\n{\"prompt\": \"b\", \"sed\": 1}\r\n");
    CHECK_RUN_WITH(run_kiln, 1, "line 3: unknown key \"sed\"", "generate '%s' --prompts-file '%s' --output '%s'", pipe, pf, png);
    /* a NUL byte ended the file silently */
    WRITE_LIT(pf, "a\0\n{\"prompt\": \"b\", \"sed\": 1}\n");
    CHECK_RUN_WITH(run_kiln, 1, "a NUL byte at offset 1", "generate '%s' --prompts-file '%s' --output '%s'", pipe, pf, png);
    /* 130 x 512 images: past the run's limit, named before any work */
    FILE *f = fopen(pf, "w");
    for (int i = 0; f && i < 130; i++) fputs("{\"prompt\": \"\", \"images_per_prompt\": 512}\n", f);
    if (f) fclose(f);
    CHECK_RUN_WITH(run_kiln, 1, "at most 65536", "generate '%s' --prompts-file '%s' --output '%s'", pipe, pf, png);
    CHECK(access(png, F_OK) != 0);
    /* --tensor-output with 65 steps: latents_step65 too (64 were kept, silently) */
    char tens[256];
    snprintf(tens, sizeof tens, "%s/steps.safetensors", g_dir);
    char *out = NULL;
    int rc = run_kiln(&out, "generate '%s' --prompt x --steps 65 --guidance 1 --reference --quiet --tensor-output '%s' "
                      "--output '%s'", pipe, tens, png);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    free(out);
    st_file *tf = NULL;
    CHECK_OK(st_open(tens, &tf));
    CHECK(tf && st_find(tf, "latents_step64") && st_find(tf, "latents_step65") && st_find(tf, "latents"));
    st_close(tf);
    /* a run that fails before writing its --tensor-output leaves the file of
     * an earlier run alone (it was removed): noise holding a NaN, refused on
     * every backend */
    char png2[256], nan_noise[256];
    snprintf(png2, sizeof png2, "%s/edge2.png", g_dir);
    snprintf(nan_noise, sizeof nan_noise, "%s/nan-noise.safetensors", g_dir);
    st_file *gio = NULL;
    CHECK_OK(st_open(golden_path(CASE, "io.safetensors"), &gio));
    if (gio) {
        st_tensor t = *golden_info(gio, "noise");
        size_t nn = (size_t)st_numel(&t);
        float *bad = calloc(nn, sizeof(float));
        bad[nn / 2] = NAN;
        t.name = "noise", t.dtype = KILN_F32, t.data = bad, t.nbytes = sizeof(float) * nn;
        CHECK_OK(st_write(nan_noise, &t, 1, NULL, 0));
        free(bad);
        st_close(gio);
    }
    CHECK_RUN_WITH(run_kiln, 1, "holds NaN", "generate '%s' --prompt x --steps 2 --noise '%s' --quiet --tensor-output "
                   "'%s' --output '%s'", pipe, nan_noise, tens, png2);
    CHECK_MSG(access(tens, F_OK) == 0, "a failed run removed %s, which it never wrote", tens);
    CHECK(access(png2, F_OK) != 0);
}

/* the API's batch limits, refused before any encoding */
TEST(pipeline_api_limits) {
    kiln_pipeline *p = NULL;
    CHECK_OK(kiln_pipeline_open(golden_path(CASE, NULL), NULL, &p));
    if (!p) return;
    static const char *prompts[513];
    for (int k = 0; k < 513; k++) prompts[k] = "";
    kiln_pipeline_opts o = kiln_pipeline_defaults();
    o.prompts = prompts;
    o.n_prompts = 513;
    o.steps = 1;
    float *lat = NULL;
    int64_t sh[4];
    CHECK_FAILS(kiln_pipeline_generate(p, &o, &lat, sh), KILN_ERR_INVALID_ARG, "513 prompts x 1 images: at most 512 images a call");
    o.n_prompts = 1;
    o.max_batch = -1;
    CHECK_FAILS(kiln_pipeline_generate(p, &o, &lat, sh), KILN_ERR_INVALID_ARG, "max_batch -1");
    CHECK(lat == NULL);
    CHECK_FAILS(kiln_pipeline_check_size(p, 0, 32, NULL, NULL), KILN_ERR_SHAPE, "32 x 0 px (width x height): both must be positive");
    CHECK_FAILS(kiln_pipeline_check_size(p, 32, -4, NULL, NULL), KILN_ERR_SHAPE, "both must be positive");
    int lh = 0, lw = 0;
    CHECK_OK(kiln_pipeline_check_size(p, 32, 48, &lh, &lw));
    CHECK(lh == 16 && lw == 24);
    kiln_pipeline_free(p);
}

TEST(pipeline_errors) {
    const char *pipe = golden_path(CASE, NULL);
    char png[256];
    snprintf(png, sizeof png, "%s/e.png", g_dir);
    CHECK_RUN_WITH(run_kiln, 1, "width 50 px: must be a multiple of 4 (VAE factor 2 x patch 2)",
                   "generate '%s' --prompt x --width 50 --height 32 --output '%s'", pipe, png);
    CHECK_RUN_WITH(run_kiln, 1, "the nearest are 48 and 52", "generate '%s' --prompt x --width 50 --output '%s'", pipe, png);
    CHECK_RUN_WITH(run_kiln, 1, "height 100000 px: at most 96 for this transformer (pos_embed_max_size 24",
                   "generate '%s' --prompt x --height 100000 --output '%s'", pipe, png);
    CHECK_RUN_WITH(run_kiln, 1, "width 2 px: at least 4", "generate '%s' --prompt x --width 2 --output '%s'", pipe, png);
    CHECK_RUN_WITH(run_kiln, 2, "needs --prompt TEXT or --prompts-file FILE", "generate '%s' --output '%s'", pipe, png);
    CHECK_RUN_WITH(run_kiln, 2, "give only one of --prompt and --prompts-file",
                   "generate '%s' --prompt x --prompts-file x.txt --output '%s'", pipe, png);
    CHECK_RUN_WITH(run_kiln, 2, "--steps", "generate '%s' --prompt x --steps 0 --output '%s'", pipe, png);
    CHECK_RUN_WITH(run_kiln, 2, "--latent is for a transformer", "generate '%s' --prompt x --latent 16x16 --output '%s'",
                   pipe, png);
    char empty[256];
    snprintf(empty, sizeof empty, "%s/empty.txt", g_dir);
    FILE *f = fopen(empty, "w");
    if (f) fclose(f);
    CHECK_RUN_WITH(run_kiln, 1, "holds no prompt", "generate '%s' --prompts-file '%s' --output '%s'", pipe, empty, png);
    CHECK_RUN_WITH(run_kiln, 1, "does not exist (checked before any work", "generate '%s' --prompt x --output /nonexistent-dir/x.png", pipe);
    char jpg[256];
    snprintf(jpg, sizeof jpg, "%s/e.jpg", g_dir);
    CHECK_RUN_WITH(run_kiln, 1, "e.jpg: expected a file name ending in .png", "generate '%s' --prompt x --output '%s'", pipe, jpg);
    CHECK(access(jpg, F_OK) != 0);
    /* another pipeline class, and components that do not fit each other */
    char *bad = kb_strfmt("%s/sdxl", g_dir), *out = NULL;
    CHECK(kiln_sh(&out, "mkdir -p '%s' && echo '{\"_class_name\": \"StableDiffusionXLPipeline\"}' > '%s/model_index.json'", bad, bad) == 0);
    free(out);
    CHECK_RUN_WITH(run_kiln, 1, "names the pipeline class StableDiffusionXLPipeline", "generate '%s' --prompt x --output '%s'", bad, png);
    free(bad);
    /* a FluxPipeline folder without its parts: the first one missing, named */
    bad = kb_strfmt("%s/flux", g_dir);
    CHECK(kiln_sh(&out, "mkdir -p '%s' && echo '{\"_class_name\": \"FluxPipeline\"}' > '%s/model_index.json'", bad, bad) == 0);
    free(out);
    CHECK_RUN_WITH(run_kiln, 1, "no transformer/ folder", "generate '%s' --prompt x --output '%s'", bad, png);
    free(bad);
    bad = kb_strfmt("%s/mixed", g_dir);
    CHECK(kiln_sh(&out, "cp -r '%s' '%s' && rm -rf '%s/transformer' && cp -r '%s' '%s/transformer'", pipe, bad, bad,
                  golden_path("sd3-tiny", NULL), bad) == 0);
    free(out);
    CHECK_RUN_WITH(run_kiln, 1, "the transformer takes joint_attention_dim", "generate '%s' --prompt x --output '%s'", bad,
                   png);
    CHECK(kiln_sh(&out, "rm -rf '%s/transformer'", bad) == 0);
    free(out);
    CHECK_RUN_WITH(run_kiln, 1, "transformer", "generate '%s' --prompt x --output '%s'", bad, png);
    free(bad);
    /* a size is checked from the configs before any component loads (a
     * first run converts them all): a copy whose weights are all empty
     * files gives the size error, and only a good size reaches the weights */
    bad = kb_strfmt("%s/noweights", g_dir);
    CHECK(kiln_sh(&out, "cp -r '%s' '%s' && for f in '%s'/*/*.safetensors; do : > \"$f\"; done", pipe, bad, bad) == 0);
    free(out);
    CHECK_RUN_WITH(run_kiln, 1, "width 50 px: must be a multiple of 4", "generate '%s' --prompt x --width 50 --output '%s'",
                   bad, png);
    CHECK_RUN_WITH(run_kiln, 1, "transformer", "generate '%s' --prompt x --width 48 --output '%s'", bad, png);
    CHECK_RUN_WITH(run_kiln, 1, "width 50 px: must be a multiple of 4", "compile '%s' --width 50 --height 32", bad);
    CHECK_FAILS(kiln_pipeline_check_size_early(bad, NULL, 100000, 0), KILN_ERR_SHAPE, "height 100000 px: at most 96");
    CHECK_OK(kiln_pipeline_check_size_early(bad, NULL, 32, 48));
    CHECK_OK(kiln_pipeline_check_size_early(bad, NULL, 0, 0));
    CHECK_OK(kiln_pipeline_check_size_early("/nonexistent-pipeline", NULL, 50, 50)); /* open's error to give */
    free(bad);
    CHECK_RUN_WITH(run_kiln, 2, "--memory 12Q: expected a positive number of bytes", "generate '%s' --prompt x --memory 12Q --output '%s'", pipe, png);
    CHECK_RUN_WITH(run_kiln, 2, "--micro-batch", "generate '%s' --prompt x --micro-batch 0 --output '%s'", pipe, png);
    CHECK(access(png, F_OK) != 0); /* no error above left an image */
}

/* scheduler/scheduler_config.json: its shift is the default --shift (a
 * copy with shift 2 gives, bitwise, the original with --shift 2; one
 * without shift the scheduler's default 1.0), and a
 * config kiln does not sample with is refused, naming the scheduler */
/* the reference run of pipeline dir (a changed scheduler config) gives,
 * bitwise, the one of pipe with --shift shift (latents in a and b) */
static void same_as_shift(const char *dir, const char *pipe, const char *shift, const char *a, const char *b, const char *png) {
    char *out = NULL;
    int rc = run_kiln(&out, "generate '%s' " PIPELINE_ARGS " --reference --noise '%s' --latents-output '%s' --output '%s'",
                      dir, golden_path(CASE, "io.safetensors"), a, png);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    rc = run_kiln(&out, "generate '%s' " PIPELINE_ARGS " --reference --shift %s --noise '%s' --latents-output '%s' --output '%s'",
                  pipe, shift, golden_path(CASE, "io.safetensors"), b, png);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    CHECK_MSG(kiln_sh(&out, "cmp '%s' '%s'", a, b) == 0, "the config's run and --shift %s differ", shift);
    free(out);
}

TEST(scheduler_config) {
    char pipe[1024]; /* golden_path's buffers rotate: keep a copy */
    snprintf(pipe, sizeof pipe, "%s", golden_path(CASE, NULL));
    char *dir = kb_strfmt("%s/sched", g_dir), *out = NULL, a[256], b[256], png[256];
    snprintf(a, sizeof a, "%s/shift-config.safetensors", g_dir);
    snprintf(b, sizeof b, "%s/shift-flag.safetensors", g_dir);
    snprintf(png, sizeof png, "%s/sched.png", g_dir);
    const char *cfg = "scheduler/scheduler_config.json";
    CHECK(kiln_sh(&out, "cp -r '%s' '%s' && sed -i 's/\"shift\": 3.0/\"shift\": 2.0/' '%s/%s' && grep -c '\"shift\": 2.0' "
                  "'%s/%s'", pipe, dir, dir, cfg, dir, cfg) == 0);
    free(out);
    same_as_shift(dir, pipe, "2", a, b, png);
    /* and it differs from shift 3 (the test would pass on an ignored config otherwise) */
    int rc = run_kiln(&out, "generate '%s' " PIPELINE_ARGS " --reference --noise '%s' --latents-output '%s' --output '%s'", pipe,
                  golden_path(CASE, "io.safetensors"), b, png);
    free(out);
    CHECK(rc == 0 && kiln_sh(&out, "cmp -s '%s' '%s'", a, b) != 0);
    free(out);
    /* a config without shift: the scheduler class's default 1.0, as diffusers
     * builds it (not SD3's 3.0, which only a missing config gets) */
    CHECK(kiln_sh(&out, "cp '%s/%s' '%s/%s' && sed -i '/\"shift\": 3.0,/d' '%s/%s' && ! grep -q '\"shift\"' '%s/%s'", pipe,
                  cfg, dir, cfg, dir, cfg, dir, cfg) == 0);
    free(out);
    same_as_shift(dir, pipe, "1", a, b, png);
    unlink(png); /* the good runs' image */
    struct {
        const char *from, *to, *msg;
    } bad[] = {
        {"\"shift\": 3.0", "\"shift\": 1e999", "shift inf must be a positive number"},
        {"\"shift\": 3.0", "\"shift\": 0", "shift 0 must be a positive number"},
        {"\"shift\": 3.0", "\"shift\": \"3.0\"", "scheduler: shift must be a number"},
        {"\"num_train_timesteps\": 1000", "\"num_train_timesteps\": 0", "num_train_timesteps 0 in 1..100000"},
        {"\"num_train_timesteps\": 1000", "\"num_train_timesteps\": 1000.5", "num_train_timesteps must be an integer"},
        {"\"use_dynamic_shifting\": false", "\"use_dynamic_shifting\": true", "use_dynamic_shifting is true"},
        {"\"use_karras_sigmas\": false", "\"use_karras_sigmas\": true", "use_karras_sigmas is true"},
        {"\"stochastic_sampling\": false", "\"stochastic_sampling\": true", "stochastic_sampling is true"},
        {"\"shift_terminal\": null", "\"shift_terminal\": 0.02", "shift_terminal is set"},
        {"FlowMatchEulerDiscreteScheduler", "DDIMScheduler", "scheduler: DDIMScheduler; kiln samples with "
                                                            "FlowMatchEulerDiscreteScheduler"},
    };
    /* each case one change to the case's own config */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(kiln_sh(&out, "cp '%s/%s' '%s/%s' && sed -i 's/%s/%s/' '%s/%s' && grep -c '%s' '%s/%s'", pipe, cfg, dir, cfg,
                      bad[i].from, bad[i].to, dir, cfg, bad[i].to, dir, cfg) == 0);
        free(out);
        CHECK_RUN_WITH(run_kiln, 1, bad[i].msg, "generate '%s' --prompt x --output '%s'", dir, png);
    }
    CHECK(access(png, F_OK) != 0); /* no refused config left an image */
    free(dir);
}

/* a prompt past what CLIP (77) or T5 (max_sequence_length) reads is cut
 * off as in diffusers, with a warning naming the encoder; a short one none */
TEST(long_prompt_warns) {
    const char *pipe = golden_path(CASE, NULL);
    char png[256], *out = NULL;
    snprintf(png, sizeof png, "%s/long.png", g_dir);
    char *longp = kb_strfmt("%s", "");
    for (int i = 0; i < 60; i++) {
        char *n = kb_strfmt("%sastronaut riding a horse ", longp);
        free(longp);
        longp = n;
    }
    int rc = kiln_sh(&out, "KILN_LOG=warn '%s' generate '%s' --prompt '%s' --steps 1 --output '%s' 2>&1", kiln_bin(), pipe,
                     longp, png);
    CHECK_MSG(rc == 0 && strstr(out, "the prompt \"astronaut riding a horse astronaut ridin...\" is ") &&
                  strstr(out, " tokens; CLIP reads 77, the rest is cut off") &&
                  strstr(out, " tokens; T5 (max_sequence_length) reads 256, the rest is cut off"),
              "%s", out);
    free(out);
    rc = kiln_sh(&out, "KILN_LOG=warn '%s' generate '%s' --prompt 'a horse' --steps 1 --output '%s' 2>&1", kiln_bin(), pipe, png);
    CHECK_MSG(rc == 0 && !strstr(out, "cut off"), "%s", out);
    free(out);
    free(longp);
}

int main(void) {
    kiln_set_log_level(KILN_LOG_ERROR);
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln-pipeline-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN(pipeline_matches_diffusers);
    RUN(batch_reference_bitwise);
    RUN(batch_fast);
    RUN(prompts_json_lines);
    RUN(prompts_file_edges);
    RUN(pipeline_info);
    RUN(pipeline_cache_build);
    RUN(pipeline_compile);
    RUN(pipeline_compile_command);
    RUN(pipeline_api_limits);
    RUN(pipeline_errors);
    RUN(scheduler_config);
    RUN(long_prompt_warns);
    char *out = NULL;
    if (kiln_sh(&out, "rm -rf '%s'", g_dir)) fprintf(stderr, "could not remove %s\n", g_dir);
    free(out);
    return TEST_SUMMARY();
}
