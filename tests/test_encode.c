/* test_encode.c - SD3's encode_prompt against sd3-pipeline-tiny: the four
 * stored conditioning tensors from the pipeline's tokenizers and three text
 * encoders (kiln_sd3_encode, through the weight cache: a miss then a hit),
 * and the CLI chain `kiln encode` -> `kiln generate --cond` reproducing the
 * pipeline's latents. */
#include "base/base.h"
#include "cli_util.h"
#include "golden_util.h"

#include <string.h>
#include <unistd.h>

#define CASE "sd3-pipeline-tiny"
#define PROMPT "A cat holding a sign that says hello world"
#define NEGATIVE "blurry, low quality, deformed hands"

static char g_dir[128];

static double rel_l2_to(const st_file *io, const char *name, const float *x, size_t n) {
    size_t m = 0;
    float *want = golden_tensor(io, name, &m);
    double e = m == n ? kb_rel_l2(x, want, n) : INFINITY;
    free(want);
    return e;
}

/* prompt and negative through the API; worst relative L2 of the four */
static double encode_case(kiln_sd3_text *t, const st_file *io, int ipp) {
    const char *p[1] = {PROMPT}, *n[1] = {NEGATIVE};
    float *e = NULL, *po = NULL, *ne = NULL, *np = NULL;
    int64_t es[3], ps[2], nes[3], nps[2];
    double worst = INFINITY;
    CHECK_OK(kiln_sd3_encode(t, p, 1, ipp, 256, &e, es, &po, ps));
    CHECK_OK(kiln_sd3_encode(t, n, 1, ipp, 256, &ne, nes, &np, nps));
    if (e && ne) {
        CHECK(es[0] == ipp && es[1] == 333 && es[2] == 96 && ps[0] == ipp && ps[1] == 80);
        worst = 0;
        for (int r = 0; r < ipp; r++) { /* every repeat of the prompt is the prompt's */
            double v[4] = {rel_l2_to(io, "prompt_embeds", e + (size_t)r * 333 * 96, 333 * 96),
                           rel_l2_to(io, "pooled_prompt_embeds", po + (size_t)r * 80, 80),
                           rel_l2_to(io, "negative_prompt_embeds", ne + (size_t)r * 333 * 96, 333 * 96),
                           rel_l2_to(io, "negative_pooled_prompt_embeds", np + (size_t)r * 80, 80)};
            for (int k = 0; k < 4; k++)
                if (!(v[k] <= worst)) worst = v[k];
        }
    }
    free(e);
    free(po);
    free(ne);
    free(np);
    return worst;
}

TEST(encode_matches_pipeline) {
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path(CASE, "io.safetensors"), &io));
    if (!io) return;
    char cache[256];
    snprintf(cache, sizeof cache, "%s/cache", g_dir);
    kiln_load_opts o = kiln_load_defaults();
    o.model_name = "sd3-pipeline-tiny";
    o.cache_root = cache;
    o.dtype = KILN_F32;
    for (int pass = 0; pass < 2; pass++) { /* a miss converts and publishes, then a hit maps */
        kiln_sd3_text *t = NULL;
        CHECK_OK(kiln_sd3_text_open(golden_path(CASE, NULL), &o, &t));
        if (!t) break;
        double e = encode_case(t, io, pass ? 2 : 1);
        printf("  f32 (%s): worst relative L2 %.3g over the four tensors\n", pass ? "cache hit, 2 images a prompt" : "miss",
               e);
        CHECK_MSG(e < 1e-5, "f32 %s: %.3g", pass ? "hit" : "miss", e);
        kiln_sd3_text_free(t);
    }
    char *path = kb_strfmt("%s/sd3-pipeline-tiny/text_encoder_3", cache); /* the component key's folder */
    CHECK(path && kb_is_dir(path));
    free(path);
    /* bf16: every encoder within 1e-2 (T5's q and k stay f32: ka_spec.keep_f32) */
    o.dtype = KILN_BF16;
    kiln_sd3_text *t = NULL;
    CHECK_OK(kiln_sd3_text_open(golden_path(CASE, NULL), &o, &t));
    if (t) {
        double e = encode_case(t, io, 1);
        printf("  bf16: worst relative L2 %.3g\n", e);
        CHECK_MSG(e < 1e-2, "bf16: %.3g", e);
    }
    kiln_sd3_text_free(t);
    st_close(io);
}

TEST(encode_errors) {
    kiln_sd3_text *t = NULL;
    CHECK_FAILS(kiln_sd3_text_open("/nonexistent", NULL, &t), KILN_ERR_IO, "not a pipeline folder");
    CHECK_FAILS(kiln_sd3_text_open(golden_path("t5-tiny", NULL), NULL, &t), KILN_ERR_MISSING, "no text_encoder/ folder");
    /* a pipeline without text_encoder_3: zeros in T5's place, as diffusers */
    char *p = kb_strfmt("%s/no-t5", g_dir);
    char *out = NULL;
    CHECK(kiln_sh(&out, "mkdir -p '%s' && cp -r '%s'/tokenizer* '%s'/text_encoder '%s'/text_encoder_2 '%s'/transformer '%s'/",
                  p, golden_path(CASE, NULL), golden_path(CASE, NULL), golden_path(CASE, NULL), golden_path(CASE, NULL),
                  p) == 0);
    free(out);
    CHECK_OK(kiln_sd3_text_open(p, NULL, &t));
    if (t) {
        const char *pr[2] = {PROMPT, ""};
        float *e = NULL, *po = NULL;
        int64_t es[3], ps[2];
        CHECK_OK(kiln_sd3_encode(t, pr, 2, 1, 8, &e, es, &po, ps));
        CHECK(es[0] == 2 && es[1] == 77 + 8 && es[2] == 96 && ps[1] == 80); /* transformer's joint_attention_dim */
        int zeros = 1;
        for (int64_t r = 0; e && r < 2; r++)
            for (int64_t k = 77 * es[2]; k < es[1] * es[2]; k++) zeros &= e[r * es[1] * es[2] + k] == 0;
        CHECK(e && zeros);
        free(e);
        free(po);
        CHECK_FAILS(kiln_sd3_encode(t, pr, 0, 1, 8, &e, es, &po, ps), KILN_ERR_INVALID_ARG, "0 prompts");
        CHECK_FAILS(kiln_sd3_encode(t, pr, 1, 1, 513, &e, es, &po, ps), KILN_ERR_INVALID_ARG, "at most 512");
        const char *bad[1] = {"\xff\xfe"};
        CHECK_FAILS(kiln_sd3_encode(t, bad, 1, 1, 8, &e, es, &po, ps), KILN_ERR_INVALID_ARG, "prompt 0");
    }
    kiln_sd3_text_free(t);
    free(p);
}

/* the CLI: kiln encode's file feeds kiln generate, which reproduces the
 * pipeline's latents from its stored noise */
TEST(encode_then_generate) {
    char cond[256], lat[256];
    snprintf(cond, sizeof cond, "%s/cond.safetensors", g_dir);
    snprintf(lat, sizeof lat, "%s/latents.safetensors", g_dir);
    const char *pipe = golden_path(CASE, NULL);
    CHECK_RUN_WITH(run_kiln, 0, "prompt_embeds [1, 333, 96]",
                   "encode '%s' --prompt '" PROMPT "' --negative-prompt '" NEGATIVE "' --dtype f32 --output '%s'", pipe, cond);
    char *out = NULL;
    int rc = run_kiln(&out, "generate '%s/transformer' --cond '%s' --noise '%s' --steps 4 --guidance 5 --dtype f32 --quiet "
                      "--vae '%s' --output '%s'", pipe, cond, golden_path(CASE, "io.safetensors"), pipe, lat);
    CHECK_MSG(rc == 0, "generate: exit %d: %s", rc, out);
    free(out);
    st_file *io = NULL, *got = NULL;
    CHECK_OK(st_open(golden_path(CASE, "io.safetensors"), &io));
    CHECK_OK(st_open(lat, &got));
    if (io && got) {
        size_t n = 0;
        float *x = golden_tensor(got, "latents", &n);
        double e = rel_l2_to(io, "latents", x, n);
        printf("  kiln encode -> kiln generate: latents %.3g relative L2\n", e);
        CHECK_MSG(e < 1e-5, "latents %.3g", e);
        free(x);
        /* --vae: the decoded image beside the latents, diffusers' uint8 image but rounding ties */
        char png[300];
        snprintf(png, sizeof png, "%s/latents.png", g_dir);
        uint8_t *rgb = NULL;
        int h = 0, w = 0;
        CHECK_OK(kiln_png_read(png, &rgb, &h, &w));
        size_t k = 0, off = 0;
        float *img = golden_tensor(io, "image", &k);
        for (size_t i = 0; rgb && i < k && k == (size_t)h * w * 3; i++) off += abs((int)lrint(img[i] * 255.0) - rgb[i]) > 0;
        CHECK_MSG(rgb && k == (size_t)h * w * 3 && off * 1000 <= k, "%zu of %zu pixels values differ", off, k);
        free(img);
        free(rgb);
    }
    /* and bitwise the latents of kiln generate PIPELINE: kiln encode batches
     * the prompt and the negative prompt as the pipeline does */
    char lat2[256];
    snprintf(lat2, sizeof lat2, "%s/pipeline-latents.safetensors", g_dir);
    rc = run_kiln(&out, "generate '%s' --prompt '" PROMPT "' --negative-prompt '" NEGATIVE "' --steps 4 --guidance 5 "
                  "--dtype f32 --quiet --noise '%s' --latents-output '%s' --output '%s/pipeline.png'",
                  pipe, golden_path(CASE, "io.safetensors"), lat2, g_dir);
    CHECK_MSG(rc == 0, "generate PIPELINE: exit %d: %s", rc, out);
    free(out);
    st_file *pl = NULL;
    CHECK_OK(st_open(lat2, &pl));
    if (got && pl) {
        size_t na = 0, nb = 0;
        float *a = golden_tensor(got, "latents", &na), *b = golden_tensor(pl, "latents", &nb);
        printf("  kiln encode + generate --cond against generate PIPELINE: %s\n", na == nb && na && !memcmp(a, b, sizeof(float) * na) ? "bitwise equal" : "differ");
        CHECK_MSG(na == nb && na && !memcmp(a, b, sizeof(float) * na),
                  "kiln encode + generate --cond and generate PIPELINE differ (%zu and %zu values)", na, nb);
        free(a);
        free(b);
    }
    st_close(pl);
    st_close(io);
    st_close(got);
    /* past 1024 rows (2 x 513 images) the prompts and the negatives go as two
     * batches: the same rows as the one batch gives */
    char big[256];
    snprintf(big, sizeof big, "%s/big.safetensors", g_dir);
    CHECK_RUN_WITH(run_kiln, 0, "prompt_embeds [513, 333, 96]", "encode '%s' --prompt '" PROMPT "' --negative-prompt '"
                   NEGATIVE "' --images-per-prompt 513 --dtype f32 --output '%s'", pipe, big);
    st_file *one = NULL, *two = NULL;
    CHECK_OK(st_open(cond, &one));
    CHECK_OK(st_open(big, &two));
    static const char *const names[4] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                                         "negative_pooled_prompt_embeds"};
    for (int k = 0; one && two && k < 4; k++) {
        size_t na = 0, nb = 0;
        float *a = golden_tensor(one, names[k], &na), *b = golden_tensor(two, names[k], &nb);
        int same = nb == 513 * na;
        for (size_t r = 0; same && r < 513; r++) same = !memcmp(a, b + r * na, sizeof(float) * na);
        CHECK_MSG(same, "%s: the two-batch rows differ from the one-batch row", names[k]);
        free(a);
        free(b);
    }
    st_close(one);
    st_close(two);
    CHECK_RUN_WITH(run_kiln, 2, "--prompt or --prompts-file", "encode '%s' --output '%s'", pipe, cond);
    CHECK_RUN_WITH(run_kiln, 2, "--images-per-prompt", "encode '%s' --prompt x --images-per-prompt 0 --output '%s'", pipe,
                   cond);
}

int main(void) {
    kiln_set_log_level(KILN_LOG_ERROR);
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln-encode-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN(encode_matches_pipeline);
    RUN(encode_errors);
    RUN(encode_then_generate);
    char *out = NULL;
    if (kiln_sh(&out, "rm -rf '%s'", g_dir)) fprintf(stderr, "could not remove %s\n", g_dir);
    free(out);
    return TEST_SUMMARY();
}
