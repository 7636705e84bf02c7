/* test_cli_edges.c - the rough edges a new user hits (issue 25), each as the
 * kiln command shows it: messages with the shape received and expected, the
 * output path checked before any work, conflicting options refused, mpirun
 * without a parallel mode refused, preview names, the demo's next command,
 * a package skipped for its context length made visible, a fixed-shape
 * compile that fails warned about once. */
#include "base/base.h"
#include "format/safetensors.h"
#include "golden_util.h"
#include "cli_util.h"

#include <sys/wait.h>

/* a shell line in which $K is kiln (cli_util.h) */
#define run kiln_sh
#define bin kiln_bin
#define CHECK_RUN(...) CHECK_RUN_WITH(kiln_sh, __VA_ARGS__)

static int count(const char *s, const char *sub) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub)) n++;
    return n;
}

static char g_dir[256], g_model[400], g_cond[400];

/* a seeded demo model and its conditioning (32 tokens) in a scratch folder */
static void setup(void) {
    test_tmpdir(g_dir, sizeof g_dir, "cli-edges");
    snprintf(g_model, sizeof g_model, "%s/model", g_dir);
    snprintf(g_cond, sizeof g_cond, "%s/cond.safetensors", g_dir);
    char *o = NULL;
    int rc = run(&o, "$K make-model %s --demo --cond %s --context 32", g_model, g_cond);
    CHECK_MSG(rc == 0, "make-model: %s", o);
    free(o);
}

TEST(preview_names) {
    char p[600];
    /* --output x.png: latents in x.safetensors, the preview x.png (never x.png.png) */
    CHECK_RUN(0, "-> ", "$K generate %s --cond %s --steps 1 --latent 16x16 --output %s/a.png", g_model, g_cond, g_dir);
    snprintf(p, sizeof p, "%s/a.safetensors", g_dir);
    CHECK(kb_is_file(p));
    snprintf(p, sizeof p, "%s/a.png", g_dir);
    CHECK(kb_is_file(p));
    snprintf(p, sizeof p, "%s/a.png.png", g_dir);
    CHECK(!kb_is_file(p));
    st_file *f = NULL;
    snprintf(p, sizeof p, "%s/a.png", g_dir);
    CHECK(st_open(p, &f) != KILN_OK); /* a PNG, not safetensors under a .png name */
    CHECK_RUN(0, "preview ", "$K generate %s --cond %s --steps 1 --latent 16x16 --output %s/b.safetensors", g_model,
              g_cond, g_dir);
    snprintf(p, sizeof p, "%s/b.png", g_dir);
    CHECK(kb_is_file(p));
}

TEST(output_checked_first) {
    char *o = NULL;
    int rc = run(&o, "$K generate %s --cond %s --steps 2 --output %s/no-such-folder/x.safetensors", g_model, g_cond,
                 g_dir);
    CHECK_MSG(rc == 1 && strstr(o, "no-such-folder does not exist") && !strstr(o, "step 1/"), "exit %d: %s", rc, o);
    free(o);
    CHECK_RUN(1, "is a folder", "$K generate %s --cond %s --output %s", g_model, g_cond, g_dir);
    CHECK_RUN(1, "does not exist", "$K forward %s --inputs x --output %s/nope/o.safetensors", g_model, g_dir);
}

TEST(conflicts_and_values) {
    CHECK_RUN(2, "--noise and --seed both set the starting noise",
              "$K generate %s --cond %s --noise n.safetensors --seed 5 --output %s/x.safetensors", g_model, g_cond, g_dir);
    CHECK_RUN(2, "--shift -1: must be positive", "$K generate %s --cond %s --shift -1 --output %s/x.safetensors", g_model,
              g_cond, g_dir);
    CHECK_RUN(2, "--max-size 3X: expected a size", "$K cache gc --cache-dir %s/c --max-size 3X", g_dir);
}

TEST(latent_pixels_hint) {
    char cache[400], *o = NULL;
    snprintf(cache, sizeof cache, "%s/hint-cache", g_dir);
    int rc = run(&o, "$K generate %s --cond %s --latent 1024x1024 --cache-dir %s --output %s/x.safetensors", g_model,
                 g_cond, cache, g_dir);
    CHECK_MSG(rc == 1 && strstr(o, "image pixels / 8") && strstr(o, "pos_embed_max_size"), "exit %d: %s", rc, o);
    free(o);
    CHECK(!kb_is_dir(cache)); /* refused before the weights were loaded (or cached) */
    /* a single file (no config to read first) still gets the hint, after the load */
    CHECK_RUN(1, "pixels / 8", "$K generate %s/diffusion_pytorch_model.safetensors --config %s/config.json --cond %s "
              "--latent 1024x1024 --output %s/x.safetensors", g_model, g_model, g_cond, g_dir);
}

TEST(shapes_in_messages) {
    char cond[600];
    snprintf(cond, sizeof cond, "%s/bad-cond.safetensors", g_dir);
    float z[5 * 7] = {0};
    st_tensor t[2] = {{.name = "prompt_embeds", .dtype = KILN_F32, .ndim = 3, .shape = {1, 5, 7}, .data = z, .nbytes = sizeof z},
                      {.name = "pooled_prompt_embeds", .dtype = KILN_F32, .ndim = 2, .shape = {1, 7}, .data = z, .nbytes = 28}};
    CHECK_OK(st_write(cond, t, 2, NULL, 0));
    kiln_config c = kiln_config_demo();
    char want[200];
    snprintf(want, sizeof want, "prompt_embeds is [1, 5, 7]; this model needs [B, T, %d]", c.joint_attention_dim);
    CHECK_RUN(1, want, "$K generate %s --cond %s --guidance 1 --output %s/x.safetensors", g_model, cond, g_dir);
    t[0].shape[2] = c.joint_attention_dim;
    float *big = calloc((size_t)5 * (size_t)c.joint_attention_dim, sizeof(float));
    t[0].data = big;
    t[0].nbytes = sizeof(float) * 5 * (size_t)c.joint_attention_dim;
    CHECK_OK(st_write(cond, t, 2, NULL, 0));
    snprintf(want, sizeof want, "pooled_prompt_embeds is [1, 7]; this model needs [1, %d]", c.pooled_projection_dim);
    CHECK_RUN(1, want, "$K generate %s --cond %s --guidance 1 --output %s/x.safetensors", g_model, cond, g_dir);
    free(big);
    /* a single file whose architecture cannot be inferred: the fix is named */
    CHECK_RUN(1, "--config FILE", "$K info %s/diffusion_pytorch_model.safetensors", g_model);
}

TEST(mpirun_needs_a_parallel_mode) {
    CHECK_RUN(1, "one of 2 MPI ranks (mpirun -np 2) but no parallel mode",
              "OMPI_COMM_WORLD_SIZE=2 $K generate %s --cond %s --output %s/x.safetensors", g_model, g_cond, g_dir);
    CHECK_RUN(1, "--tp N", "PMI_SIZE=4 $K cache build %s --cache-dir %s/c", g_model, g_dir);
}

/* the demo's next command maps the demo's cache and runs its package; a
 * conditioning of another length skips the package and says why (once per
 * run, not "333 = 333") */
TEST(demo_next_and_package_notes) {
    char demo[400], *o = NULL;
    snprintf(demo, sizeof demo, "%s/demo", g_dir);
    int rc = run(&o, "$K demo --dir %s --steps 1", demo);
    CHECK_MSG(rc == 0, "demo: %s", o);
    char *next = o ? strstr(o, "kiln generate ") : NULL;
    if (next) {
        char *end = strchr(next, '\n');
        if (end) *end = 0;
        char *r = NULL;
        rc = run(&r, "$K %s --steps 2 --timings", next + 5);
        CHECK_MSG(rc == 0 && strstr(r, "backbone: dynamic"), "%s: %s", next, r);
        char *wl = r ? strstr(r, "\nweight_load") : NULL;
        double sec;
        int cnt, hits = 0, misses = -1;
        if (wl) sscanf(wl + 1, "weight_load %lf %d %d %d", &sec, &cnt, &hits, &misses);
        CHECK_MSG(hits == 1 && misses == 0, "the weights were not a cache hit: %s", r);
        free(r);
    }
    free(o);
    /* the packages beside the weights (<cache>/packages) are not caches */
    rc = run(&o, "$K cache verify --cache-dir %s/cache", demo);
    CHECK_MSG(rc == 0 && strstr(o, "ok ") && !strstr(o, "packages/"), "exit %d: %s", rc, o);
    free(o);
    rc = run(&o, "$K cache ls --cache-dir %s/cache", demo);
    /* the backbone, and the pipeline part's five components */
    CHECK_MSG(rc == 0 && strstr(o, "6 caches") && !strstr(o, "packages/"), "exit %d: %s", rc, o);
    free(o);
    char cond16[600];
    snprintf(cond16, sizeof cond16, "%s/cond16.safetensors", g_dir);
    CHECK(run(NULL, "$K make-model %s/m2 --demo --cond %s --context 16", g_dir, cond16) == 0);
    rc = run(&o, "$K generate %s/model --name kiln-demo-tiny --cache-dir %s/cache --cond %s --latent 32x40 --steps 2 "
                 "--guidance 5 --log info --output %s/n.safetensors", demo, demo, cond16, g_dir);
    CHECK_MSG(rc == 0 && strstr(o, "backbone fixed because dynamic: ") && strstr(o, "the package needs 32 (a static dimension") &&
                  !strstr(o, "32 = 32"),
              "exit %d: %s", rc, o);
    free(o);
    /* a fixed-shape package that cannot be built (no compiler here): one
     * warning, not one per step */
    rc = run(&o, "KILN_CC=/bin/false $K generate %s/model --name kiln-demo-tiny --cache-dir %s/cache --cond %s "
                 "--latent 32x48 --steps 4 --guidance 5 --log warn --output %s/n.safetensors", demo, demo, cond16, g_dir);
    CHECK_MSG(rc == 0 && count(o, "warning: forward: fixed") == 1, "exit %d: %s", rc, o);
    free(o);
}

/* the quality gate names the flag that overrides it */
TEST(gate_names_force) {
    char *o = NULL;
    int rc = run(&o, "$K compile %s --quant int8 --max-error 1e-9 --cache-dir %s/gate", g_model, g_dir);
    if (strstr(o, "needs a CPU")) {
        fprintf(stderr, "  (int8 not available on this CPU: skipped)\n");
    } else {
        CHECK_MSG(rc == 1 && strstr(o, "--force"), "exit %d: %s", rc, o);
        CHECK(!strstr(o, "(force to publish"));
    }
    free(o);
}

/* make-model writes any family's config as that family (it wrote every
 * config as an SD3 transformer, silently): each component of the tiny
 * pipeline seeded from its config makes a pipeline that generates */
TEST(make_model_any_family) {
    const char *pipe = golden_path("sd3-pipeline-tiny", NULL);
    static const char *const comp[5] = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
    static const char *const fam[5] = {"clip", "clip", "t5", "sd3", "vae-decoder"};
    char *o = NULL;
    CHECK(run(&o, "mkdir -p %s/seeded && cp -r %s/model_index.json %s/scheduler %s/tokenizer %s/tokenizer_2 %s/tokenizer_3 "
              "%s/seeded/", g_dir, pipe, pipe, pipe, pipe, pipe, g_dir) == 0);
    free(o);
    for (int k = 0; k < 5; k++) {
        char want[64];
        snprintf(want, sizeof want, "(%s, F32 weights, seed 3)", fam[k]);
        CHECK_RUN(0, want, "$K make-model %s/seeded/%s --config %s/%s/config.json --weights f32 --seed 3", g_dir, comp[k],
                  pipe, comp[k]);
        snprintf(want, sizeof want, "family:         %s", fam[k]);
        CHECK_RUN(0, want, "$K info %s/seeded/%s", g_dir, comp[k]);
    }
    CHECK_RUN(0, "image 0 ->", "$K generate %s/seeded --prompt 'a cat' --steps 1 --output %s/seeded.png", g_dir, g_dir);
    CHECK_RUN(2, "--cond is for an SD3 transformer's config", "$K make-model %s/x --config %s/vae/config.json "
              "--cond %s/x.safetensors", g_dir, pipe, g_dir);
    CHECK(run(&o, "echo '{\"_class_name\": \"UNet2DConditionModel\"}' > %s/unet.json", g_dir) == 0);
    free(o);
    CHECK_RUN(1, "UNet2DConditionModel, which no model family of kiln runs", "$K make-model %s/x --config %s/unet.json",
              g_dir, g_dir);
    /* a Flux transformer of the flux-tiny case's config, seeded, runs */
    CHECK_RUN(0, "(flux, F32 weights, seed 5)", "$K make-model %s/fluxseeded --config %s/goldens/flux-tiny/config.json "
              "--weights f32 --seed 5", g_dir, test_data_dir());
    CHECK_RUN(0, "family:         flux", "$K info %s/fluxseeded", g_dir);
    /* with its inputs (the family's, by name: latents unpacked, guidance), which kiln forward runs */
    CHECK_RUN(0, "inputs: ", "$K make-model %s/fluxseeded --force --config %s/goldens/flux-tiny/config.json --weights f32 "
              "--inputs %s/flux-in.safetensors --latent 8x12 --context 5 --batch 2", g_dir, test_data_dir(), g_dir);
    char fin[600];
    snprintf(fin, sizeof fin, "%s/flux-in.safetensors", g_dir);
    kiln_tensor *t = NULL;
    size_t nt = 0;
    CHECK_OK(kiln_tensors_read(fin, &t, &nt));
    const kiln_tensor *lat = kiln_tensors_find(t, nt, "latents"), *gd = kiln_tensors_find(t, nt, "guidance");
    const kiln_tensor *ctx = kiln_tensors_find(t, nt, "encoder_hidden_states");
    CHECK(nt == 5 && lat && gd && ctx && lat->ndim == 4 && lat->shape[0] == 2 && lat->shape[1] == 16 &&
          lat->shape[2] == 8 && lat->shape[3] == 12 && ctx->shape[1] == 5 && gd->shape[0] == 2);
    kiln_tensors_free(t);
    CHECK_RUN(0, "forward: 1 output", "$K forward %s/fluxseeded --inputs %s --output %s/flux-out.safetensors", g_dir, fin,
              g_dir);
    CHECK_RUN(1, "the inputs of a flux model: flux: the latent is 7x12", "$K make-model %s/fluxseeded --force --config %s/goldens/flux-tiny/config.json --weights f32 "
              "--inputs %s/flux-bad.safetensors --latent 7x12", g_dir, test_data_dir(), g_dir);
    /* --inputs-only: another size for the model in DIR, nothing else written; misuse named */
    CHECK_RUN(0, "latent 4x6", "$K make-model %s/fluxseeded --inputs-only --inputs %s/flux-in2.safetensors --latent 4x6 "
              "--context 3", g_dir, g_dir);
    CHECK_RUN(0, "forward: 1 output", "$K forward %s/fluxseeded --inputs %s/flux-in2.safetensors --output %s/o2.safetensors",
              g_dir, g_dir, g_dir);
    CHECK_RUN(2, "--inputs-only takes DIR (a model folder) and --inputs FILE", "$K make-model %s/fluxseeded --inputs-only "
              "--config %s/goldens/flux-tiny/config.json --inputs %s/x.safetensors", g_dir, test_data_dir(), g_dir);
    CHECK_RUN(1, "holds no model (no config.json)", "$K make-model %s/nomodel --inputs-only --inputs %s/x.safetensors", g_dir, g_dir);
    char x[600];
    snprintf(x, sizeof x, "%s/x", g_dir);
    CHECK(!kb_is_dir(x)); /* nothing written for the refused ones */
}

int main(void) {
    setup();
    RUN(preview_names);
    RUN(output_checked_first);
    RUN(conflicts_and_values);
    RUN(latent_pixels_hint);
    RUN(shapes_in_messages);
    RUN(mpirun_needs_a_parallel_mode);
    RUN(demo_next_and_package_notes);
    RUN(gate_names_force);
    RUN(make_model_any_family);
    test_rmrf(g_dir);
    return TEST_SUMMARY();
}
