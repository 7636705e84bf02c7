/* pipeline_util.h - checking a `kiln generate PIPELINE` run of
 * sd3-pipeline-tiny against the case: its final latents within 1e-5
 * relative L2 and the PNG's pixels diffusers' uint8 image (at most 0.1% of
 * values off by one, at rounding boundaries). One definition for every test
 * that generates the case (a pipeline folder, an all-in-one file); with a
 * --tensor-output file, its conditioning, every step and the float image too. */
#ifndef KILN_PIPELINE_UTIL_H
#define KILN_PIPELINE_UTIL_H

#include "golden_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define PIPELINE_CASE "sd3-pipeline-tiny"
#define PIPELINE_PROMPT "A cat holding a sign that says hello world"
#define PIPELINE_NEGATIVE "blurry, low quality, deformed hands"
/* the case's settings as kiln generate options (f32), before --noise */
#define PIPELINE_ARGS "--prompt '" PIPELINE_PROMPT "' --negative-prompt '" PIPELINE_NEGATIVE "' --steps 4 --guidance 5 --dtype f32"

/* the `latents` tensor of a --latents-output file (n its count) */
static inline float *pipeline_read_latents(const char *path, size_t *n) {
    st_file *f = NULL;
    if (st_open(path, &f)) return NULL;
    float *x = golden_tensor(f, "latents", n);
    st_close(f);
    return x;
}

/* what: named in the lines printed ("kiln generate PIPELINE"); tens: a
 * --tensor-output file (NULL: none), checked for the conditioning, every
 * step's latents and the decoder's float image */
static inline void pipeline_check_case(const char *what, const char *lat, const char *tens, const char *png) {
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path(PIPELINE_CASE, "io.safetensors"), &io));
    size_t n = 0, m = 0;
    float *x = pipeline_read_latents(lat, &n);
    CHECK_MSG(x != NULL, "%s: no latents in %s", what, lat);
    if (io && x) {
        float *want = golden_tensor(io, "latents", &m);
        double e = n == m ? kb_rel_l2(x, want, n) : INFINITY;
        printf("  %s: final latents %.3g relative L2\n", what, e);
        CHECK_MSG(e < 1e-5, "latents %.3g", e);
        free(want);
    }
    /* --tensor-output: the conditioning, every step's latents and the decoder's float image */
    st_file *tf = NULL;
    if (tens) CHECK_OK(st_open(tens, &tf));
    const char *names[] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                           "negative_pooled_prompt_embeds", "latents_step1", "latents_step2", "latents_step3",
                           "latents_step4", "latents", "image_decoded"};
    for (size_t k = 0; tf && io && k < sizeof names / sizeof *names; k++) {
        size_t a = 0, b = 0;
        float *got = golden_tensor(tf, names[k], &a), *want = golden_tensor(io, names[k], &b);
        double e = got && want && a == b ? kb_rel_l2(got, want, a) : INFINITY;
        printf("  %-30s %.3g relative L2\n", names[k], e);
        CHECK_MSG(e < 1e-5, "%s: %.3g", names[k], e);
        free(got);
        free(want);
    }
    st_close(tf);
    /* the PNG's pixels are diffusers' uint8 image (round(255 x), its float image stored) */
    uint8_t *rgb = NULL;
    int ph = 0, pw = 0;
    CHECK_OK(kiln_png_read(png, &rgb, &ph, &pw));
    if (io && rgb) {
        size_t k = 0;
        float *img = golden_tensor(io, "image", &k);
        CHECK(ph == 32 && pw == 48 && k == (size_t)ph * pw * 3);
        size_t off = 0, worse = 0;
        for (size_t i = 0; i < k && k == (size_t)ph * pw * 3; i++) {
            int want = (int)lrint(img[i] * 255.0), d = abs(want - (int)rgb[i]);
            off += d == 1;
            worse += d > 1;
        }
        printf("  %s: PNG against diffusers' uint8 image: %zu of %zu values off by one, %zu by more\n", what, off, k,
               worse);
        CHECK(worse == 0 && off * 1000 <= k);
        free(img);
    }
    free(rgb);
    free(x);
    st_close(io);
}

#endif
