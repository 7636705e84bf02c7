/* test_goldens.c - every reference case in tests/data/goldens through the
 * real loader: backbone outputs and every sampler step within 1e-5 relative
 * L2 error of diffusers' float64 results (f32; looser for bf16 and the
 * quantized schemes, see k_modes). */
#include "golden_util.h"

/* every path: the reference kernels and the fast backend in f32 within 1e-5,
 * the fast backend in bf16 within 1e-2, and bf16 with the transformer blocks'
 * linear layers quantized (docs/PERFORMANCE.md, "Quantized backbones"):
 * int8 within 2e-2 (measured <= 1.3e-2), fp8 e4m3 within 6e-2 (measured
 * <= 4.6e-2; 3 mantissa bits) */
typedef struct {
    const char *label;
    kiln_open_opts o;
    double tol;
} mode;

static const mode k_modes[] = {
    {"reference f32", {.dtype = KILN_F32, .reference = 1}, 1e-5},
    {"fast f32", {.dtype = KILN_F32}, 1e-5},
    {"fast bf16", {.dtype = KILN_BF16}, 1e-2},
    {"fast bf16, int8 blocks", {.dtype = KILN_BF16, .quant = KILN_QUANT_INT8}, 2e-2},
    {"fast bf16, fp8 blocks", {.dtype = KILN_BF16, .quant = KILN_QUANT_FP8}, 6e-2},
};

static void run_backbone_mode(const char *name, const mode *md) {
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path(name, NULL), &md->o, &m));
    if (!m) return;
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path(name, "io.safetensors"), &io));
    if (!io) {
        kiln_model_free(m);
        return;
    }
    const st_tensor *hs = golden_info(io, "hidden_states"), *ctx = golden_info(io, "encoder_hidden_states");
    size_t n_out;
    float *hidden = golden_tensor(io, "hidden_states", NULL);
    float *context = golden_tensor(io, "encoder_hidden_states", NULL);
    float *pooled = golden_tensor(io, "pooled_projections", NULL);
    float *t = golden_tensor(io, "timestep", NULL);
    float *want = golden_tensor(io, "sample", &n_out);
    float *got = calloc(n_out, sizeof(float));
    kiln_forward_args a = {(int)hs->shape[0], (int)hs->shape[2], (int)hs->shape[3],
                           (int)ctx->shape[1], hidden, context, pooled, t};
    CHECK_OK(kiln_forward(m, &a, got));
    double err = rel_l2(got, want, n_out);
    fprintf(stderr, "  %s, %s: relative L2 error %.3g\n", name, md->label, err);
    CHECK_MSG(err <= md->tol, "%s, %s: error %.3g > %.1g", name, md->label, err, md->tol);
    free(hidden);
    free(context);
    free(pooled);
    free(t);
    free(want);
    free(got);
    st_close(io);
    kiln_model_free(m);
}

static void run_backbone(const char *name) {
    for (size_t i = 0; i < sizeof k_modes / sizeof k_modes[0]; i++) run_backbone_mode(name, &k_modes[i]);
}

TEST(golden_sd3_tiny) { run_backbone("sd3-tiny"); }
TEST(golden_sd35_tiny) { run_backbone("sd35-tiny"); }
TEST(golden_sd3_wide) { run_backbone("sd3-wide"); }

typedef struct {
    const st_file *io;
    double worst, tol;
    int steps_seen;
} step_check;

static void on_step(void *user, int step, int steps, double sigma, const float *latent) {
    (void)steps;
    (void)sigma;
    step_check *sc = user;
    char name[32];
    snprintf(name, sizeof name, "latents_step%d", step);
    size_t n;
    float *want = golden_tensor(sc->io, name, &n);
    double err = rel_l2(latent, want, n);
    fprintf(stderr, "  step %d: relative L2 error %.3g\n", step, err);
    CHECK_MSG(err <= sc->tol, "step %d: error %.3g > %.1g", step, err, sc->tol);
    if (err > sc->worst) sc->worst = err;
    sc->steps_seen++;
    free(want);
}

static void run_sampler(const mode *md) {
    const char *name = "sampler-sd3-tiny";
    fprintf(stderr, "  sampler, %s\n", md->label);
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path(name, NULL), &md->o, &m));
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path(name, "io.safetensors"), &io));
    if (!m || !io) {
        kiln_model_free(m);
        st_close(io);
        return;
    }
    /* the schedule itself */
    size_t nt, ns;
    float *want_t = golden_tensor(io, "timesteps", &nt);
    float *want_s = golden_tensor(io, "sigmas", &ns);
    double ts[16], sig[17];
    CHECK(nt == 4 && ns == 5);
    CHECK_OK(kiln_flow_schedule((int)nt, 3.0, 1000, ts, sig));
    for (size_t i = 0; i < nt; i++) CHECK_MSG(fabs(ts[i] - want_t[i]) <= 1e-4 * fabs(want_t[i]) + 1e-6,
                                              "timestep %zu: %g vs %g", i, ts[i], want_t[i]);
    for (size_t i = 0; i < ns; i++) CHECK_MSG(fabs(sig[i] - want_s[i]) <= 1e-6, "sigma %zu: %g vs %g",
                                              i, sig[i], want_s[i]);

    const st_tensor *noise_t = golden_info(io, "noise"), *cond_t = golden_info(io, "cond_embeds");
    float *noise = golden_tensor(io, "noise", NULL);
    float *cond = golden_tensor(io, "cond_embeds", NULL);
    float *uncond = golden_tensor(io, "uncond_embeds", NULL);
    float *cp = golden_tensor(io, "cond_pooled", NULL);
    float *up = golden_tensor(io, "uncond_pooled", NULL);
    size_t n;
    float *want = golden_tensor(io, "latents", &n);
    float *got = calloc(n, sizeof(float));
    step_check sc = {io, 0, md->tol, 0};
    kiln_generate_opts o = kiln_generate_defaults();
    o.steps = (int)nt;
    o.shift = 3.0;
    o.guidance = 5.0;
    o.latent_h = (int)noise_t->shape[2];
    o.latent_w = (int)noise_t->shape[3];
    o.noise = noise;
    o.context_len = (int)cond_t->shape[1];
    o.cond = cond;
    o.cond_pooled = cp;
    o.uncond = uncond;
    o.uncond_pooled = up;
    o.on_step = on_step;
    o.user = &sc;
    CHECK_OK(kiln_generate(m, &o, got));
    CHECK(sc.steps_seen == 4);
    double err = rel_l2(got, want, n);
    fprintf(stderr, "  final latents: relative L2 error %.3g\n", err);
    CHECK(err <= md->tol);
    free(want_t);
    free(want_s);
    free(noise);
    free(cond);
    free(uncond);
    free(cp);
    free(up);
    free(want);
    free(got);
    st_close(io);
    kiln_model_free(m);
}

TEST(golden_sampler) {
    for (size_t i = 0; i < sizeof k_modes / sizeof k_modes[0]; i++) run_sampler(&k_modes[i]);
}

int main(void) {
    RUN(golden_sd3_tiny);
    RUN(golden_sd35_tiny);
    RUN(golden_sd3_wide);
    RUN(golden_sampler);
    return TEST_SUMMARY();
}
