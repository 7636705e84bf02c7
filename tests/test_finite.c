/* test_finite.c - NaN and Inf are refused: the scan itself (finite.c), each
 * input of kiln_forward and kiln_generate (the message names the tensor and
 * the first bad index), a forward whose output is not finite, and a sampler
 * step that overflows the latent; plus the size limits checked before any
 * allocation (km_check_sizes). */
#include "base/base.h"
#include "golden_util.h"
#include "model/model.h"
#include "tensor/dtype.h"

#include <stdint.h>

static float bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

TEST(scan_finds_the_first_bad_value) {
    size_t n = 3 * 4096 + 77; /* several blocks and a tail */
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)i - 5000.0f;
    CHECK(kt_find_nonfinite(x, n) == n);
    CHECK(kt_find_nonfinite(x, 0) == 0);
    CHECK(kt_check_finite("x", x, n) == KILN_OK);
    /* finite extremes are finite: largest, smallest normal, subnormals, -0 */
    float edge[] = {3.4028235e38f, -3.4028235e38f, 1.17549435e-38f, bits(1), bits(0x807fffffu), -0.0f};
    CHECK(kt_find_nonfinite(edge, 6) == 6);
    /* every kind of non-finite value at positions across the block edges */
    const uint32_t bad[] = {0x7fc00000u /* qNaN */, 0x7f800001u /* sNaN */, 0xffc00000u /* -NaN */,
                            0x7f800000u /* +Inf */, 0xff800000u /* -Inf */};
    const char *names[] = {"NaN", "NaN", "NaN", "+Inf", "-Inf"};
    size_t at[] = {0, 1, 4095, 4096, 8191, 8192, n - 1};
    for (size_t b = 0; b < 5; b++)
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
            float keep = x[at[k]];
            x[at[k]] = bits(bad[b]);
            CHECK_MSG(kt_find_nonfinite(x, n) == at[k], "value %08x at %zu", bad[b], at[k]);
            CHECK(!strcmp(kt_nonfinite_name(x[at[k]]), names[b]));
            x[at[k]] = keep;
        }
    /* two bad values: the first one is reported */
    x[9000] = bits(0x7f800000u);
    x[20] = bits(0x7fc00000u);
    CHECK_FAILS(kt_check_finite("thing", x, n), KILN_ERR_NONFINITE, "thing holds NaN at index 20");
    free(x);
}

/* A forward on sd3-tiny with its golden inputs (B 2, 32x32, T 154). */
typedef struct fwd {
    kiln_model *m;
    st_file *io;
    float *in[4], *out;
    size_t n[4];
    kiln_forward_args a;
} fwd;

static int fwd_open(fwd *f) {
    memset(f, 0, sizeof *f);
    CHECK_OK(kiln_model_open(golden_path("sd3-tiny", NULL), NULL, &f->m));
    CHECK_OK(st_open(golden_path("sd3-tiny", "io.safetensors"), &f->io));
    if (!f->m || !f->io) return 0;
    const char *names[4] = {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"};
    for (int i = 0; i < 4; i++) f->in[i] = golden_tensor(f->io, names[i], &f->n[i]);
    const st_tensor *h = golden_info(f->io, "hidden_states"), *c = golden_info(f->io, "encoder_hidden_states");
    f->a = (kiln_forward_args){(int)h->shape[0], (int)h->shape[2], (int)h->shape[3], (int)c->shape[1],
                               f->in[0], f->in[1], f->in[2], f->in[3]};
    f->out = calloc(f->n[0], sizeof(float)); /* out_channels == in_channels here */
    return 1;
}

static void fwd_close(fwd *f) {
    for (int i = 0; i < 4; i++) free(f->in[i]);
    free(f->out);
    st_close(f->io);
    kiln_model_free(f->m);
}

TEST(forward_refuses_nonfinite_inputs) {
    fwd f;
    if (!fwd_open(&f)) return;
    CHECK_OK(kiln_forward(f.m, &f.a, f.out));
    const char *want[4] = {"input hidden_states holds NaN at index 17",
                           "input encoder_hidden_states holds +Inf at index 17",
                           "input pooled_projections holds -Inf at index 17", "input timestep holds NaN at index 1"};
    const uint32_t bad[4] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7fc00000u};
    for (int i = 0; i < 4; i++) {
        size_t at = i == 3 ? 1 : 17;
        float keep = f.in[i][at];
        f.in[i][at] = bits(bad[i]);
        for (size_t k = 0; k < f.n[0]; k++) f.out[k] = -1.0f;
        CHECK_FAILS(kiln_forward(f.m, &f.a, f.out), KILN_ERR_NONFINITE, want[i]);
        CHECK(f.out[0] == -1.0f); /* refused before anything ran */
        f.in[i][at] = keep;
    }
    CHECK_OK(kiln_forward(f.m, &f.a, f.out));
    fwd_close(&f);
}

/* Finite inputs so large that the forward overflows: the output check, not
 * the input check, stops it, and names the executor that ran. */
TEST(forward_with_nonfinite_output_fails) {
    fwd f;
    if (!fwd_open(&f)) return;
    for (size_t k = 0; k < f.n[0]; k++) f.in[0][k] = 3e38f;
    for (size_t k = 0; k < f.n[1]; k++) f.in[1][k] = 3e38f;
    CHECK_FAILS(kiln_forward(f.m, &f.a, f.out), KILN_ERR_NONFINITE, "gave a non-finite output sample (");
    CHECK(strstr(kiln_last_error(), "forward (") != NULL);
    fwd_close(&f);
}

/* The sampler golden's model and conditioning (T 20, J 32, P 64, latent 16x16). */
TEST(generate_refuses_nonfinite_inputs) {
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path("sampler-sd3-tiny", NULL), NULL, &m));
    if (!m) return;
    const kiln_config *c = kiln_model_config(m);
    int T = 20, H = 16, W = 16;
    size_t tj = (size_t)T * c->joint_attention_dim, P = (size_t)c->pooled_projection_dim;
    size_t lat = (size_t)c->in_channels * H * W;
    float *cond = calloc(tj, 4), *uncond = calloc(tj, 4), *cp = calloc(P, 4), *up = calloc(P, 4);
    float *noise = malloc(lat * 4), *out = malloc(lat * 4);
    kiln_noise(1, noise, lat);
    kiln_generate_opts o = kiln_generate_defaults();
    o.latent_h = H;
    o.latent_w = W;
    o.context_len = T;
    o.steps = 2;
    o.guidance = 5.0;
    o.cond = cond;
    o.uncond = uncond;
    o.cond_pooled = cp;
    o.uncond_pooled = up;
    o.noise = noise;
    CHECK_OK(kiln_generate(m, &o, out));
    struct {
        float *x;
        size_t at;
        const char *want;
    } cases[] = {{noise, 5, "noise holds NaN at index 5"},
                 {cond, 3, "cond (prompt_embeds) holds NaN at index 3"},
                 {uncond, 7, "uncond (negative_prompt_embeds) holds NaN at index 7"},
                 {cp, 2, "cond_pooled (pooled_prompt_embeds) holds NaN at index 2"},
                 {up, 63, "uncond_pooled (negative_pooled_prompt_embeds) holds NaN at index 63"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float keep = cases[i].x[cases[i].at];
        cases[i].x[cases[i].at] = NAN;
        CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_NONFINITE, cases[i].want);
        cases[i].x[cases[i].at] = keep;
    }
    /* guidance <= 1 never reads the negative conditioning: a NaN there is no error */
    uncond[0] = NAN;
    o.guidance = 1.0;
    CHECK_OK(kiln_generate(m, &o, out));
    uncond[0] = 0;
    /* a finite guidance so large that the first step overflows the latent */
    o.guidance = 1e300;
    cond[0] = 1.0f; /* cond != uncond: v_cond - v_uncond is not zero */
    CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_NONFINITE, "step 1 of 2 gave a non-finite latent (");
    CHECK(strstr(kiln_last_error(), "at index ") != NULL);
    free(cond);
    free(uncond);
    free(cp);
    free(up);
    free(noise);
    free(out);
    kiln_model_free(m);
}

/* Sizes are checked against their limits before anything is sized from them. */
TEST(size_limits) {
    kiln_config c = kiln_config_demo();
    km_sizes z;
    CHECK_OK(km_check_sizes(&c, 2, 32, 32, 77, &z));
    CHECK(z.hidden == (size_t)2 * 16 * 32 * 32 && z.context == (size_t)2 * 77 * 64 && z.pooled == 2 * 64 &&
          z.timestep == 2);
    CHECK_FAILS(km_check_sizes(&c, 0, 32, 32, 77, &z), KILN_ERR_RANGE, "batch 0: must be between 1 and 1024");
    CHECK_FAILS(km_check_sizes(&c, KM_MAX_BATCH + 1, 32, 32, 77, &z), KILN_ERR_RANGE, "batch 1025");
    CHECK_FAILS(km_check_sizes(&c, 1, 32, 32, KM_MAX_CONTEXT + 1, &z), KILN_ERR_RANGE,
                "context length 65537: must be between 1 and 65536");
    CHECK_FAILS(km_check_sizes(&c, 1, 65536, 65536, 77, &z), KILN_ERR_RANGE, "pos_embed_max_size 48, so at most 96");

    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path("sampler-sd3-tiny", NULL), NULL, &m));
    if (!m) return;
    float one[64] = {0}, out[1];
    kiln_generate_opts o = kiln_generate_defaults();
    o.cond = o.uncond = o.cond_pooled = o.uncond_pooled = one; /* never read: the sizes fail first */
    o.latent_h = o.latent_w = 65536;
    o.context_len = 20;
    CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_RANGE, "at most");
    o.latent_h = o.latent_w = 16;
    o.context_len = 1 << 20;
    CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_RANGE, "context length 1048576");
    o.context_len = 20;
    o.steps = -5;
    CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_INVALID_ARG, "steps = -5");
    kiln_forward_args a = {KM_MAX_BATCH + 1, 16, 16, 20, one, one, one, one};
    CHECK_FAILS(kiln_forward(m, &a, out), KILN_ERR_RANGE, "batch 1025: must be between 1 and 1024");
    kiln_model_free(m);
}

int main(void) {
    RUN(scan_finds_the_first_bad_value);
    RUN(forward_refuses_nonfinite_inputs);
    RUN(forward_with_nonfinite_output_fails);
    RUN(generate_refuses_nonfinite_inputs);
    RUN(size_limits);
    return TEST_SUMMARY();
}
