/* test_goldens.c - every reference case in tests/data/goldens through the
 * real loader: backbone outputs and every sampler step within 1e-5 relative
 * L2 error of diffusers' float64 results (f32; looser for bf16 and the
 * quantized schemes, see k_modes). */
#include "golden_util.h"
#include "codegen_util.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/kernels.h"

/* every path: the reference kernels and the fast backend in f32 within 1e-5,
 * the fast backend in bf16 within 1e-2; and every step of the execution
 * chain on its own: a compiled dynamic package that covers the case's shape,
 * a fixed-shape package compiled on demand, the planned executor, eager;
 * and bf16 with the transformer blocks' linear layers quantized
 * (docs/PERFORMANCE.md, "Quantized backbones"): int8 within 2e-2 (measured
 * <= 1.3e-2), fp8 e4m3 within 6e-2 (measured <= 4.6e-2; 3 mantissa bits) */
typedef struct {
    const char *label;
    kiln_open_opts o;
    double tol;
    const char *exec; /* the only step allowed (NULL: the default chain) */
} mode;

static const mode k_modes[] = {
    {"reference f32", {.dtype = KILN_F32, .reference = 1}, 1e-5, NULL},
    {"fast f32", {.dtype = KILN_F32}, 1e-5, NULL},
    {"fast bf16", {.dtype = KILN_BF16}, 1e-2, NULL},
    {"fast f32, dynamic package", {.dtype = KILN_F32}, 1e-5, "dynamic"},
    {"fast bf16, dynamic package", {.dtype = KILN_BF16}, 1e-2, "dynamic"},
    {"fast f32, fixed-shape package", {.dtype = KILN_F32}, 1e-5, "fixed"},
    {"fast f32, planned executor", {.dtype = KILN_F32}, 1e-5, "planned"},
    {"fast f32, eager", {.dtype = KILN_F32}, 1e-5, "eager"},
    {"reference f32, dynamic package", {.dtype = KILN_F32, .reference = 1}, 1e-5, "dynamic"},
    {"fast bf16, int8 blocks", {.dtype = KILN_BF16, .quant = KILN_QUANT_INT8}, 2e-2, NULL},
    {"fast bf16, fp8 blocks", {.dtype = KILN_BF16, .quant = KILN_QUANT_FP8}, 6e-2, NULL},
    {"fast bf16, int8 blocks, dynamic package", {.dtype = KILN_BF16, .quant = KILN_QUANT_INT8}, 2e-2, "dynamic"},
};

static char g_pkg_dir[1024];

/* Restrict m to the mode's one step; for a dynamic package, compile one
 * whose ranges cover B x H x W (latent) x T but are wider than it. */
static void prepare_exec(kiln_model *m, const mode *md, int B, int H, int W, int T) {
    if (!md->exec) return;
    CHECK_OK(kiln_model_set_package_dir(m, g_pkg_dir));
    CHECK_OK(kiln_model_set_exec(m, md->exec));
    if (strcmp(md->exec, "dynamic")) return;
    int p = kiln_model_config(m)->patch_size, h = H / p, w = W / p;
    char dims[160];
    snprintf(dims, sizeof dims, "batch=1:2,h_tok=%d:%d,w_tok=%d:%d", h > 2 ? h - 2 : 1, h + 1, w > 2 ? w - 2 : 1, w + 1);
    kiln_compile_opts co = kiln_compile_defaults();
    co.dims = dims;
    co.batch = B;
    co.height = H;
    co.width = W;
    co.context_len = T;
    co.force = md->o.quant != KILN_QUANT_NONE; /* the quality gate has tests of its own (test_compile) */
    kiln_compile_result r;
    CHECK_OK(kiln_compile(m, &co, &r));
    if (md->o.dtype == KILN_BF16 && md->o.quant == KILN_QUANT_NONE) {
        /* kg_plan_bf16: the attention takes q, k, v as the linears wrote them,
         * bf16 rows, where linears alone make them (SD3); SD3.5's q and k come
         * from the RMS qk-norm and stay f32 */
        char path[1200];
        snprintf(path, sizeof path, "%s/model.c", r.path);
        FILE *f = fopen(path, "r");
        CHECK_MSG(f != NULL, "no generated source at %s", path);
        if (!f) return;
        static char src[1 << 20];
        size_t n = fread(src, 1, sizeof src - 1, f);
        fclose(f);
        src[n] = 0;
        /* (a machine with no bf16 backend computes in f32, and so does the
         * check backend: nothing is planned in bf16) */
        const kk_backend *be16 = kk_supports(m->backend, KK_SLOT_ATTENTION, KK_FMT_BF16, NULL) ? m->backend : NULL;
        int qk_norm = kiln_model_config(m)->qk_norm_rms, want = be16 && be16->attention_joint_bf16 && !qk_norm;
        static gen_call calls[4096];
        int nc = gen_calls(src, calls, 4096), bf16_in = 0, segs = 0, pairs = 0;
        for (int i = 0; i < nc; i++) {
            const gen_call *c = &calls[i];
            bf16_in |= !strcmp(c->op, "attention") && c->fmt[1] != 0;      /* k in bf16 rows */
            segs |= !strcmp(c->op, "linear") && strcmp(c->ip[3], "0LL");   /* x after a blocked segment's rows */
            pairs += !strcmp(c->op, "slice_tokens") && c->fmt[KG_Y] != 0; /* token slices of bf16 rows */
        }
        CHECK_MSG(bf16_in == want, "package %s: attention with bf16 q, k, v %s, with%s qk-norm, %s bf16 backend", r.path,
                  bf16_in ? "planned" : "not planned", qk_norm ? "" : "out", be16 ? "a" : "no");
        /* and its output goes on blocked by token segment where the AMX GEMM
         * reads that layout, each GEMM reading its segment in place (the
         * context's after the image tokens' rows); elsewhere in bf16 rows,
         * through token slices that move pairs */
        int blocked = want && kk_amx_ready() && kk_supports(m->backend, KK_SLOT_LINEAR, KK_FMT_BLOCKED, NULL);
        CHECK_MSG(segs == blocked && !pairs == !(want && !blocked),
                  "package %s: %s GEMM reading a token segment in place, %d token slices of bf16 rows, with%s "
                  "qk-norm, %s bf16 backend, %s AMX", r.path, segs ? "a" : "no", pairs, qk_norm ? "" : "out",
                  be16 ? "a" : "no", kk_amx_ready() ? "with" : "without");
    }
}

static void check_exec(const kiln_model *m, const mode *md) {
    if (md->exec) CHECK_MSG(!strcmp(kiln_model_last_exec(m), md->exec), "ran by %s, not %s", kiln_model_last_exec(m), md->exec);
}

static void run_backbone_mode(const char *name, const mode *md) {
    if (!quant_runs_here(md->o.quant, md->label)) return;
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
    prepare_exec(m, md, a.batch, a.height, a.width, a.context_len);
    CHECK_OK(kiln_forward(m, &a, got));
    check_exec(m, md);
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
    if (!quant_runs_here(md->o.quant, md->label)) return;
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
    prepare_exec(m, md, 2, o.latent_h, o.latent_w, o.context_len);
    CHECK_OK(kiln_generate(m, &o, got));
    check_exec(m, md);
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
    test_tmpdir(g_pkg_dir, sizeof g_pkg_dir, "golden-packages");
    RUN(golden_sd3_tiny);
    RUN(golden_sd35_tiny);
    RUN(golden_sd3_wide);
    RUN(golden_sampler);
    test_rmrf(g_pkg_dir);
    return TEST_SUMMARY();
}
