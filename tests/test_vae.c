/* test_vae.c - diffusers' AutoencoderKL decoder (family vae-decoder) on the
 * reference case vae-sd3-tiny (16 latent channels, no quant convs, a
 * mid-block attention, 2 blocks: 8x12 latent -> 16x24 image): through the
 * real loader (kiln_model_open on the vae folder; kiln_load_model with a
 * cache root, a miss then a hit) and kiln_run, on every path of the
 * execution chain: the reference kernels and the fast backend in f32 within
 * 1e-5 relative L2 of diffusers' float64 decode, bf16 within 1e-2; a
 * compiled dynamic package over h and w, a fixed-shape package, the planned
 * executor, eager. And the refusals: a latent of the wrong channel count,
 * impossible configs. */
#include "arch/vae/vae.h"
#include "base/base.h"
#include "compile/compile.h"
#include "golden_util.h"
#include "kernels/kernels.h"

#define CASE "vae-sd3-tiny"

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
    {"fast bf16, fixed-shape package", {.dtype = KILN_BF16}, 1e-2, "fixed"},
    {"fast bf16, eager", {.dtype = KILN_BF16}, 1e-2, "eager"},
    {"reference f32, dynamic package", {.dtype = KILN_F32, .reference = 1}, 1e-5, "dynamic"},
    {"reference f32, eager", {.dtype = KILN_F32, .reference = 1}, 1e-5, "eager"},
};

static char g_pkg_dir[1024];

/* the case's decode_input and decode_sample */
typedef struct {
    float *latent, *want;
    int64_t lshape[4], oshape[4];
    size_t nl, no;
} golden;

static void golden_read(golden *gd) {
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path(CASE, "io.safetensors"), &io));
    if (!io) exit(2);
    const st_tensor *l = golden_info(io, "decode_input"), *o = golden_info(io, "decode_sample");
    for (int d = 0; d < 4; d++) {
        gd->lshape[d] = l->shape[d];
        gd->oshape[d] = o->shape[d];
    }
    gd->latent = golden_tensor(io, "decode_input", &gd->nl);
    gd->want = golden_tensor(io, "decode_sample", &gd->no);
    st_close(io);
}

/* decode through kiln_run; the output's shape checked; returns the relative L2 error */
static double decode(kiln_model *m, const golden *gd, float *got) {
    kiln_tensor in = {.name = "latent", .dtype = KILN_F32, .ndim = 4, .data = gd->latent};
    memcpy(in.shape, gd->lshape, sizeof gd->lshape);
    kiln_output out = {.name = "sample", .data = got, .capacity = gd->no};
    kiln_status st = kiln_run(m, &in, 1, &out, 1);
    CHECK_MSG(st == KILN_OK, "kiln_run: %s", kiln_last_error());
    if (st) return INFINITY;
    CHECK(out.ndim == 4 && !memcmp(out.shape, gd->oshape, sizeof gd->oshape));
    return rel_l2(got, gd->want, gd->no);
}

/* Restrict m to the mode's one step; for a dynamic package, compile one
 * whose ranges cover the latent but are wider than it. */
static void prepare_exec(kiln_model *m, const mode *md, const golden *gd) {
    if (!md->exec) return;
    CHECK_OK(kiln_model_set_package_dir(m, g_pkg_dir));
    CHECK_OK(kiln_model_set_exec(m, md->exec));
    if (strcmp(md->exec, "dynamic")) return;
    int h = (int)gd->lshape[2], w = (int)gd->lshape[3];
    char dims[160];
    snprintf(dims, sizeof dims, "batch=1:2,h=%d:%d,w=%d:%d", h - 2, h + 1, w - 2, w + 1);
    kiln_compile_opts co = kiln_compile_defaults();
    co.dims = dims;
    co.batch = (int)gd->lshape[0];
    co.height = h;
    co.width = w;
    co.capture = 1; /* the package reproduces an eager run of the example (the family's example_input) */
    kiln_compile_result r;
    CHECK_OK(kiln_compile(m, &co, &r));
    CHECK_MSG(r.capture_rel_err >= 0 && r.capture_rel_err < 1e-6, "capture: relative error %.3g against eager",
              r.capture_rel_err);
}

TEST(vae_decode_every_path) {
    golden gd;
    golden_read(&gd);
    float *got = calloc(gd.no, sizeof(float));
    for (size_t i = 0; i < sizeof k_modes / sizeof k_modes[0]; i++) {
        const mode *md = &k_modes[i];
        kiln_model *m = NULL;
        CHECK_OK(kiln_model_open(golden_path(CASE, NULL), &md->o, &m));
        if (!m) continue;
        CHECK(!strcmp(kiln_model_family(m), "vae-decoder") && kiln_model_config(m) == NULL);
        prepare_exec(m, md, &gd);
        memset(got, 0, sizeof(float) * gd.no);
        double err = decode(m, &gd, got);
        if (md->exec)
            CHECK_MSG(!strcmp(kiln_model_last_exec(m), md->exec), "ran by %s, not %s", kiln_model_last_exec(m), md->exec);
        fprintf(stderr, "  %s, %s (%s): relative L2 error %.3g\n", CASE, md->label, kiln_model_last_exec(m), err);
        CHECK_MSG(err <= md->tol, "%s: error %.3g > %.1g", md->label, err, md->tol);
        kiln_model_free(m);
    }
    free(got);
    free(gd.latent);
    free(gd.want);
}

/* kiln_load_model with a cache root under the vae component: a miss that
 * converts and publishes, then (in a fresh load) a hit that maps it; both decode alike */
TEST(vae_decode_through_the_cache) {
    golden gd;
    golden_read(&gd);
    char root[1024];
    test_tmpdir(root, sizeof root, "vae-cache");
    float *a = calloc(gd.no, sizeof(float)), *b = calloc(gd.no, sizeof(float));
    const kiln_dtype dts[2] = {KILN_F32, KILN_BF16};
    for (int k = 0; k < 2; k++) {
        for (int pass = 0; pass < 2; pass++) {
            kiln_load_opts o = kiln_load_defaults();
            o.model_name = "vae-sd3-tiny";
            o.component = "vae";
            o.dtype = dts[k];
            o.cache_root = root;
            o.source = golden_path(CASE, NULL);
            kiln_model *m = NULL;
            CHECK_OK(kiln_load_model(&o, &m));
            if (!m) continue;
            /* a bf16 request on a CPU with no bf16 GEMM (the avx2 and avx512
             * classes), or on a backend that computes in f32 only, computes
             * in f32 on the f32 weights (docs/cache.md): the f32 load before
             * published exactly that cache */
            int f32_instead = dts[k] == KILN_BF16 && m->compute.dtype == KILN_F32;
            const char *want = pass || f32_instead ? "hit" : "miss";
            CHECK_MSG(!strcmp(kiln_model_origin(m), want), "%s load %d: origin %s, not %s", kiln_dtype_name(dts[k]), pass,
                      kiln_model_origin(m), want);
            CHECK(strstr(kiln_model_cache_path(m), "/vae") != NULL);
            double err = decode(m, &gd, pass ? b : a);
            fprintf(stderr, "  %s load (%s, %s): relative L2 error %.3g\n", kiln_dtype_name(dts[k]), kiln_model_origin(m),
                    kiln_model_last_exec(m), err);
            CHECK(err <= (dts[k] == KILN_F32 ? 1e-5 : 1e-2));
            kiln_model_free(m);
        }
        CHECK_MSG(!memcmp(a, b, sizeof(float) * gd.no), "%s: the hit decodes differently from the miss",
                  kiln_dtype_name(dts[k]));
    }
    free(a);
    free(b);
    test_rmrf(root);
    free(gd.latent);
    free(gd.want);
}

TEST(vae_refuses_bad_latents) {
    kiln_open_opts o = {.dtype = KILN_F32};
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path(CASE, NULL), &o, &m));
    if (!m) return;
    float x[4 * 8 * 12] = {0}, y[3 * 16 * 24];
    kiln_tensor in = {.name = "latent", .dtype = KILN_F32, .ndim = 4, .shape = {1, 4, 8, 12}, .data = x};
    kiln_output out = {.name = "sample", .data = y, .capacity = sizeof y / sizeof y[0]};
    CHECK_FAILS(kiln_run(m, &in, 1, &out, 1), KILN_ERR_SHAPE, "input latent has shape [1, 4, 8, 12], the model needs [1, 16, 8, 12]");
    in.ndim = 3;
    CHECK_FAILS(kiln_run(m, &in, 1, &out, 1), KILN_ERR_SHAPE, "input latent has 3 dimensions, the model needs 4");
    in.ndim = 4;
    in.shape[1] = 16;
    in.shape[2] = 0;
    CHECK_FAILS(kiln_run(m, &in, 1, &out, 1), KILN_ERR_SHAPE, "each side must be in 1..");
    in.name = "hidden_states";
    CHECK_FAILS(kiln_run(m, &in, 1, &out, 1), KILN_ERR_INVALID_ARG, "has no input hidden_states (its inputs: latent)");
    /* the shapes alone: a 5x7 latent decodes to 10x14 */
    in.name = "latent";
    in.shape[2] = 5;
    in.shape[3] = 7;
    out.data = NULL;
    CHECK_OK(kiln_run(m, &in, 1, &out, 1));
    CHECK(out.shape[0] == 1 && out.shape[1] == 3 && out.shape[2] == 10 && out.shape[3] == 14);
    kiln_model_free(m);
}

TEST(vae_config_refusals) {
    vae_config c;
    /* the keys under test come first: cJSON reads a repeated key's first value */
    const char *base = "{%s\"_class_name\": \"AutoencoderKL\", \"block_out_channels\": [16, 32], \"norm_num_groups\": 8, "
                       "\"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\"], "
                       "\"up_block_types\": [\"UpDecoderBlock2D\", \"UpDecoderBlock2D\"], \"latent_channels\": 16}";
    char json[1024];
    snprintf(json, sizeof json, base, "");
    CHECK_OK(vae_config_parse(json, &c));
    CHECK(c.n_blocks == 2 && c.block_out_channels[1] == 32 && c.latent_channels == 16 && c.use_quant_conv == 1 &&
          c.has_shift == 0 && vae_scale(&c) == 2);
    /* to JSON and back: the same config */
    char *j = vae_config_to_json(&c);
    vae_config c2;
    CHECK_OK(vae_config_parse(j, &c2));
    CHECK(!memcmp(&c, &c2, sizeof c));
    free(j);
    struct {
        const char *extra, *msg;
    } bad[] = {
        {"\"norm_num_groups\": 12, ", "block_out_channels[0] = 16 is not a multiple of norm_num_groups = 12"},
        {"\"latent_channels\": 0, ", "latent_channels = 0 is impossible"},
        {"\"layers_per_block\": 1.5, ", "\"layers_per_block\" must be an integer"},
        {"\"use_quant_conv\": 2, ", "\"use_quant_conv\" must be true or false"},
        {"\"scaling_factor\": 0, ", "scaling_factor = 0 is impossible"},
        {"\"shift_factor\": \"x\", ", "\"shift_factor\" must be a finite number"},
        {"\"act_fn\": \"gelu\", ", "act_fn is gelu"},
        {"\"block_out_channels\": [16], ", "1 block_out_channels, 2 down_block_types and 2 up_block_types"},
        {"\"block_out_channels\": [], ", "block_out_channels must be a list of 1 to 8"},
        {"\"up_block_types\": [\"UpDecoderBlock2D\", \"AttnUpDecoderBlock2D\"], ", "up_block_types[1] is AttnUpDecoderBlock2D"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(json, sizeof json, base, bad[i].extra);
        kiln_status st = vae_config_parse(json, &c);
        CHECK_MSG(st == KILN_ERR_CONFIG && strstr(kiln_last_error(), bad[i].msg), "%s: %s (%s)", bad[i].extra,
                  kiln_last_error(), kiln_status_name(st));
    }
    CHECK_FAILS(vae_config_parse("{\"_class_name\": \"AutoencoderTiny\"}", &c), KILN_ERR_CONFIG,
                "_class_name is AutoencoderTiny");
    CHECK_FAILS(vae_config_parse("[1]", &c), KILN_ERR_FORMAT, "must hold a JSON object");
}

/* The encoder, graph level: its weights are in every vae-decoder model (the
 * family keeps the whole file), so the encoder graph binds the model's
 * weights (km_resolve) and runs on eager (reference and fast backends, f32
 * and bf16) and the planned executor; mean and std of latent_dist within
 * 1e-5 (f32) and 1e-2 (bf16) of diffusers' float64 encode. (The family of
 * its own, through kiln_run, is vae_encode_every_path.) */
TEST(vae_encode_graph) {
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path(CASE, "io.safetensors"), &io));
    if (!io) return;
    const st_tensor *it = golden_info(io, "encode_input");
    size_t nm;
    float *image = golden_tensor(io, "encode_input", NULL), *want_mean = golden_tensor(io, "encode_mean", &nm);
    float *want_std = golden_tensor(io, "encode_std", NULL);
    float *mean = calloc(nm, sizeof(float)), *stdv = calloc(nm, sizeof(float));
    struct {
        const char *label;
        kiln_open_opts o;
        double tol;
        int planned;
    } modes[] = {
        {"reference f32, eager", {.dtype = KILN_F32, .reference = 1}, 1e-5, 0},
        {"fast f32, eager", {.dtype = KILN_F32}, 1e-5, 0},
        {"fast f32, planned", {.dtype = KILN_F32}, 1e-5, 1},
        {"fast bf16, planned", {.dtype = KILN_BF16}, 1e-2, 1},
    };
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        kiln_model *m = NULL;
        CHECK_OK(kiln_model_open(golden_path(CASE, NULL), &modes[i].o, &m));
        if (!m) continue;
        /* the encoder's table: the symbols from the image's shape, its shapes, its graph */
        const ka_arch *a = &ka_vae_encoder;
        int64_t ish[1][4] = {{it->shape[0], it->shape[1], it->shape[2], it->shape[3]}}, s[KA_MAX_SYMS] = {0};
        int64_t want_in[KA_MAX_IO][4], want_out[KA_MAX_IO][4];
        CHECK_OK(a->solve(m->cfg, (const int64_t(*)[4])ish, s));
        CHECK_OK(ka_check_inputs(a, m->cfg, (const int64_t(*)[4])ish, s, "encode"));
        a->io_shapes(m->cfg, s, want_in, want_out);
        CHECK(ka_numel(4, want_out[0]) == nm && ka_numel(4, want_out[1]) == nm);
        kg_graph g;
        kg_init(&g, km_resolve, m);
        CHECK_OK(a->build(m->cfg, &g, s, NULL));
        CHECK(g.n_outputs == 2 && kg_numel(&g.nodes[g.outputs[0]]) == (int64_t)nm);
        /* executors take the backend's buffers (a forward stages them: exec.c) */
        const kk_backend *be = m->backend;
        size_t ni = (size_t)ka_numel(4, ish[0]);
        float *din = kk_buf_alloc(be, sizeof(float) * ni), *dout[2] = {kk_buf_alloc(be, sizeof(float) * nm),
                                                                     kk_buf_alloc(be, sizeof(float) * nm)};
        kk_copy_from_host(be, din, image, sizeof(float) * ni);
        const float *in[1] = {din};
        if (modes[i].planned) {
            kg_fuse(&g);
            kg_plan_bf16(&g, be);
            kx_plan plan;
            CHECK_OK(kx_plan_graph(&g, &plan));
            void *arena = kk_buf_alloc(be, plan.arena_bytes + 64);
            CHECK_OK(kx_run_planned(&g, &plan, be, arena, NULL, in, dout));
            kk_buf_free(be, arena);
            kx_plan_free(&plan);
        } else {
            CHECK_OK(kg_run_eager(&g, be, in, dout));
        }
        kk_copy_to_host(be, mean, dout[0], sizeof(float) * nm);
        kk_copy_to_host(be, stdv, dout[1], sizeof(float) * nm);
        kk_buf_free(be, din), kk_buf_free(be, dout[0]), kk_buf_free(be, dout[1]);
        double em = rel_l2(mean, want_mean, nm), es = rel_l2(stdv, want_std, nm);
        fprintf(stderr, "  encode, %s: mean %.3g, std %.3g relative L2\n", modes[i].label, em, es);
        CHECK_MSG(em <= modes[i].tol && es <= modes[i].tol, "%s: mean %.3g, std %.3g > %.1g", modes[i].label, em, es,
                  modes[i].tol);
        kg_free(&g);
        kiln_model_free(m);
    }
    /* an image whose sides are not multiples of the scale is refused */
    vae_config c;
    CHECK_OK(vae_config_parse("{\"_class_name\": \"AutoencoderKL\", \"block_out_channels\": [16, 32, 32, 32], "
                              "\"norm_num_groups\": 8, \"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", "
                              "\"DownEncoderBlock2D\", \"DownEncoderBlock2D\"], \"up_block_types\": [\"UpDecoderBlock2D\", "
                              "\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", \"UpDecoderBlock2D\"]}", &c));
    CHECK_FAILS(vae_check_image(&c, 1, 64, 60), KILN_ERR_SHAPE, "image 64x60 (height x width): each side must be a positive multiple of 8");
    int64_t bad[1][4] = {{1, 3, 64, 60}}, s[KA_MAX_SYMS];
    CHECK_FAILS(ka_vae_encoder.solve(&c, (const int64_t(*)[4])bad, s), KILN_ERR_SHAPE, "must be a positive multiple of 8");
    free(image), free(want_mean), free(want_std), free(mean), free(stdv);
    st_close(io);
}

/* The encoder as a family of its own (vae-encoder, listed but claiming no
 * config: kiln_open_opts.family opens the vae folder as it): kiln_run
 * "image" -> "mean", "std" of latent_dist on every path of the chain (the
 * reference kernels, the fast backend f32 and bf16, a dynamic package over
 * h and w, a fixed-shape package, planned, eager), within 1e-5 (f32) and
 * 1e-2 (bf16) relative L2 of diffusers' float64 encode; and through the
 * weight cache (kiln_load_opts.family), a miss then a hit. */
static double encode(kiln_model *m, const float *image, const int64_t ish[4], const float *want_mean,
                     const float *want_std, float *mean, float *stdv, size_t nm, double *es) {
    kiln_tensor in = {.name = "image", .dtype = KILN_F32, .ndim = 4, .data = image};
    memcpy(in.shape, ish, 4 * sizeof(int64_t));
    kiln_output out[2] = {{.name = "mean", .data = mean, .capacity = nm}, {.name = "std", .data = stdv, .capacity = nm}};
    kiln_status st = kiln_run(m, &in, 1, out, 2);
    CHECK_MSG(st == KILN_OK, "kiln_run (encode): %s", kiln_last_error());
    if (st) return *es = INFINITY;
    CHECK(out[0].ndim == 4 && out[0].shape[0] == ish[0] && out[0].shape[2] * 2 == ish[2] && out[0].shape[3] * 2 == ish[3]);
    *es = rel_l2(stdv, want_std, nm);
    return rel_l2(mean, want_mean, nm);
}

TEST(vae_encode_every_path) {
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path(CASE, "io.safetensors"), &io));
    if (!io) return;
    const st_tensor *it = golden_info(io, "encode_input");
    int64_t ish[4] = {it->shape[0], it->shape[1], it->shape[2], it->shape[3]};
    size_t nm;
    float *image = golden_tensor(io, "encode_input", NULL), *want_mean = golden_tensor(io, "encode_mean", &nm);
    float *want_std = golden_tensor(io, "encode_std", NULL);
    float *mean = calloc(nm, sizeof(float)), *stdv = calloc(nm, sizeof(float));
    for (size_t i = 0; i < sizeof k_modes / sizeof k_modes[0]; i++) {
        const mode *md = &k_modes[i];
        kiln_open_opts o = md->o;
        o.family = "vae-encoder";
        kiln_model *m = NULL;
        CHECK_OK(kiln_model_open(golden_path(CASE, NULL), &o, &m));
        if (!m) continue;
        CHECK(!strcmp(kiln_model_family(m), "vae-encoder"));
        if (md->exec) {
            CHECK_OK(kiln_model_set_package_dir(m, g_pkg_dir));
            CHECK_OK(kiln_model_set_exec(m, md->exec));
            if (!strcmp(md->exec, "dynamic")) {
                int h = (int)ish[2] / 2, w = (int)ish[3] / 2;
                char dims[160];
                snprintf(dims, sizeof dims, "batch=1:2,h=%d:%d,w=%d:%d", h - 2, h + 1, w - 2, w + 1);
                kiln_compile_opts co = kiln_compile_defaults();
                co.dims = dims;
                co.batch = (int)ish[0];
                co.height = h;
                co.width = w;
                co.capture = 1;
                kiln_compile_result r;
                CHECK_OK(kiln_compile(m, &co, &r));
                CHECK_MSG(r.capture_rel_err >= 0 && r.capture_rel_err < 1e-6, "encoder capture: %.3g", r.capture_rel_err);
            }
        }
        memset(mean, 0, nm * sizeof(float));
        double es, em = encode(m, image, ish, want_mean, want_std, mean, stdv, nm, &es);
        if (md->exec)
            CHECK_MSG(!strcmp(kiln_model_last_exec(m), md->exec), "ran by %s, not %s", kiln_model_last_exec(m), md->exec);
        fprintf(stderr, "  encode, %s (%s): mean %.3g, std %.3g relative L2\n", md->label, kiln_model_last_exec(m), em, es);
        CHECK_MSG(em <= md->tol && es <= md->tol, "%s: mean %.3g, std %.3g > %.1g", md->label, em, es, md->tol);
        kiln_model_free(m);
    }
    /* the cache: the encoder family under the vae component, a miss then a hit */
    char root[1024];
    test_tmpdir(root, sizeof root, "vae-enc-cache");
    for (int pass = 0; pass < 2; pass++) {
        kiln_load_opts lo = kiln_load_defaults();
        lo.model_name = "vae-sd3-tiny";
        lo.component = "vae";
        lo.family = "vae-encoder";
        lo.dtype = KILN_F32;
        lo.cache_root = root;
        lo.source = golden_path(CASE, NULL);
        kiln_model *m = NULL;
        CHECK_OK(kiln_load_model(&lo, &m));
        if (!m) continue;
        CHECK(!strcmp(kiln_model_origin(m), pass ? "hit" : "miss") && !strcmp(kiln_model_family(m), "vae-encoder"));
        double es, em = encode(m, image, ish, want_mean, want_std, mean, stdv, nm, &es);
        fprintf(stderr, "  encode, f32 load (%s): mean %.3g, std %.3g\n", kiln_model_origin(m), em, es);
        CHECK(em <= 1e-5 && es <= 1e-5);
        kiln_model_free(m);
    }
    test_rmrf(root);
    /* a VAE folder opens as the decoder unless the encoder is asked for */
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path(CASE, NULL), NULL, &m));
    if (m) CHECK(!strcmp(kiln_model_family(m), "vae-decoder"));
    kiln_model_free(m);
    free(image), free(want_mean), free(want_std), free(mean), free(stdv);
    st_close(io);
}

/* The pipelines' decode: the stored final latents, scaled and shifted by
 * the factors the VAE's config gives (SD3 1.5305 / 0.0609, Flux 0.3611 /
 * 0.1159: read, never hard-coded), are the stored decoder input, and its
 * decode through the pipeline's vae folder is the stored image_decoded.
 * (Only vae/, io.safetensors and case.json of the two pipeline cases are
 * copied into the test data.) */
TEST(vae_pipeline_decodes) {
    static const char *cases[2] = {"sd3-pipeline-tiny", "flux-pipeline-tiny"};
    static const char *latent_names[2] = {"latents", "latents_unpacked"};
    const double want_scale[2] = {1.5305, 0.3611}, want_shift[2] = {0.0609, 0.1159};
    for (int k = 0; k < 2; k++) {
        st_file *io = NULL;
        CHECK_OK(st_open(golden_path(cases[k], "io.safetensors"), &io));
        if (!io) continue;
        size_t n, no;
        float *lat = golden_tensor(io, latent_names[k], &n), *dec_in = golden_tensor(io, "decoder_input", NULL);
        float *want = golden_tensor(io, "image_decoded", &no), *got = calloc(no, sizeof(float));
        const st_tensor *it = golden_info(io, "decoder_input");
        const kiln_open_opts opts[3] = {{.dtype = KILN_F32, .reference = 1}, {.dtype = KILN_F32}, {.dtype = KILN_BF16}};
        for (int o = 0; o < 3; o++) {
            kiln_model *m = NULL;
            CHECK_OK(kiln_model_open(golden_path(cases[k], "vae"), &opts[o], &m));
            if (!m) continue;
            const vae_config *c = m->cfg;
            CHECK_MSG(c->scaling_factor == want_scale[k] && c->has_shift && c->shift_factor == want_shift[k],
                      "%s: scaling %g, shift %g", cases[k], c->scaling_factor, c->shift_factor);
            /* the pipeline's step before decoding, in f32 as the pipeline does it */
            double e_in = 0, r_in = 0;
            for (size_t i = 0; i < n; i++) {
                float z = lat[i] / (float)c->scaling_factor + (float)c->shift_factor;
                e_in += (z - dec_in[i]) * (double)(z - dec_in[i]);
                r_in += (double)dec_in[i] * dec_in[i];
            }
            CHECK_MSG(sqrt(e_in / r_in) < 1e-7, "%s: latents / scaling + shift differ from decoder_input by %.3g",
                      cases[k], sqrt(e_in / r_in));
            kiln_tensor in = {.name = "latent", .dtype = KILN_F32, .ndim = 4, .data = dec_in};
            for (int d = 0; d < 4; d++) in.shape[d] = it->shape[d];
            kiln_output out = {.name = "sample", .data = got, .capacity = no};
            CHECK_OK(kiln_run(m, &in, 1, &out, 1));
            double err = rel_l2(got, want, no), tol = opts[o].dtype == KILN_F32 ? 1e-5 : 1e-2;
            fprintf(stderr, "  %s decode, %s%s: relative L2 error %.3g\n", cases[k], opts[o].reference ? "reference " : "fast ",
                    kiln_dtype_name(opts[o].dtype), err);
            CHECK_MSG(err <= tol, "%s: error %.3g > %.1g", cases[k], err, tol);
            kiln_model_free(m);
        }
        free(lat), free(dec_in), free(want), free(got);
        st_close(io);
    }
}

/* An SD 1.x-shaped VAE with seeded weights (km_write_seeded): 4 blocks
 * (three upsamplers, f = 8), layers_per_block 2 (3 resnets an up block),
 * 32 groups, 4 latent channels, quant_conv and post_quant_conv, a
 * 128-channel single-head attention: no diffusers case covers these, so
 * the fast backend is held to the reference kernels (f32 within 1e-5, bf16
 * within 2e-2) on an odd, non-square latent, and the planned executor to
 * eager bit for bit. */
TEST(vae_four_blocks_seeded) {
    const char *json = "{\"_class_name\": \"AutoencoderKL\", \"block_out_channels\": [32, 64, 128, 128], "
                       "\"layers_per_block\": 2, \"norm_num_groups\": 32, \"latent_channels\": 4, \"scaling_factor\": 0.18215, "
                       "\"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", \"DownEncoderBlock2D\", "
                       "\"DownEncoderBlock2D\"], \"up_block_types\": [\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", "
                       "\"UpDecoderBlock2D\", \"UpDecoderBlock2D\"]}";
    vae_config c;
    CHECK_OK(vae_config_parse(json, &c));
    CHECK(c.use_quant_conv && c.use_post_quant_conv && vae_scale(&c) == 8);
    char dir[1024];
    test_tmpdir(dir, sizeof dir, "vae-seeded");
    CHECK_OK(km_write_seeded(&ka_vae_decoder, &c, dir, 7, KILN_F32));
    enum { H = 3, W = 4 };
    float lat[4 * H * W];
    kiln_noise(11, lat, sizeof lat / sizeof lat[0]);
    size_t no = (size_t)3 * 8 * H * 8 * W;
    float *y[4];
    const kiln_open_opts opts[3] = {{.dtype = KILN_F32, .reference = 1}, {.dtype = KILN_F32}, {.dtype = KILN_BF16}};
    const char *exec[4] = {"eager", "eager", "eager", "planned"};
    for (int k = 0; k < 4; k++) {
        y[k] = calloc(no, sizeof(float));
        kiln_model *m = NULL;
        CHECK_OK(kiln_model_open(dir, &opts[k < 3 ? k : 1], &m));
        if (!m) continue;
        CHECK_OK(kiln_model_set_exec(m, exec[k]));
        kiln_tensor in = {.name = "latent", .dtype = KILN_F32, .ndim = 4, .shape = {1, 4, H, W}, .data = lat};
        kiln_output out = {.name = "sample", .data = y[k], .capacity = no};
        CHECK_OK(kiln_run(m, &in, 1, &out, 1));
        CHECK(out.shape[2] == 8 * H && out.shape[3] == 8 * W);
        kiln_model_free(m);
    }
    double e32 = rel_l2(y[1], y[0], no), e16 = rel_l2(y[2], y[0], no);
    fprintf(stderr, "  seeded 4-block VAE, %dx%d latent: fast f32 %.3g, fast bf16 %.3g against the reference\n", H, W, e32, e16);
    CHECK_MSG(e32 < 1e-5 && e16 < 2e-2, "fast f32 %.3g, bf16 %.3g", e32, e16);
    CHECK_MSG(!memcmp(y[1], y[3], sizeof(float) * no), "planned differs from eager (fast f32)");
    for (int k = 0; k < 4; k++) free(y[k]);
    test_rmrf(dir);
}

/* A config's numbers come back from its JSON exactly (fuzz_family_config
 * found a scaling_factor of 8.9e75 that cJSON's own printing, 15 digits,
 * turned into another double), in the fewest digits that do */
TEST(vae_config_round_trips_exactly) {
    vae_config c, back;
    CHECK_OK(vae_config_parse("{\"_class_name\": \"AutoencoderKL\", \"scaling_factor\": 8888888888888888888888888888888888888888888888888888888888888888888888888881.5305, "
                              "\"shift_factor\": 0.1159}",
                              &c));
    char *j = vae_config_to_json(&c);
    CHECK(j && strstr(j, "8.888888888888888e+75") && strstr(j, "0.1159")); /* 16 digits do */
    CHECK_OK(vae_config_parse(j, &back));
    /* field by field, not memcmp: the struct's padding is whatever the stack
     * held (it differed on a Zen 3); the JSON names every field */
    char *j2 = vae_config_to_json(&back);
    CHECK(j && j2 && !strcmp(j, j2));
    CHECK(!memcmp(&c.scaling_factor, &back.scaling_factor, sizeof(double)) &&
          !memcmp(&c.shift_factor, &back.shift_factor, sizeof(double)) && c.has_shift == back.has_shift);
    free(j2);
    free(j);
    c = vae_config_defaults();
    j = vae_config_to_json(&c);
    CHECK(j && strstr(j, "0.18215,"));
    free(j);
}

/* In a bf16 model the convolutions that read the latent or the image stay
 * f32 (ka_spec.keep_f32: neither is rounded to bf16 first), and only those;
 * every convolution weight is packed (ka_spec.conv) */
TEST(vae_spec_keeps_input_convs_f32) {
    vae_config c = vae_config_defaults(); /* with both quant convs */
    c.n_blocks = 2, c.block_out_channels[0] = 32, c.block_out_channels[1] = 64;
    ka_spec *s = NULL;
    size_t n = 0;
    CHECK_OK(vae_weight_spec(&c, &s, &n));
    static const char *f32[] = {"encoder.conv_in.weight", "decoder.conv_in.weight", "post_quant_conv.weight"};
    int kept = 0, convs = 0;
    for (size_t i = 0; i < n; i++) {
        int want = 0;
        for (size_t k = 0; k < sizeof f32 / sizeof *f32; k++) want |= !strcmp(s[i].name, f32[k]);
        CHECK_MSG(s[i].keep_f32 == want, "%s: keep_f32 %d, wanted %d", s[i].name, s[i].keep_f32, want);
        CHECK_MSG(!want || s[i].conv, "%s is kept f32 but not a convolution", s[i].name);
        kept += s[i].keep_f32;
        convs += s[i].conv;
    }
    CHECK(kept == 3 && convs > 10);
    free(s);
}

int main(void) {
    test_tmpdir(g_pkg_dir, sizeof g_pkg_dir, "vae-packages");
    RUN(vae_config_refusals);
    RUN(vae_spec_keeps_input_convs_f32);
    RUN(vae_config_round_trips_exactly);
    RUN(vae_refuses_bad_latents);
    RUN(vae_decode_every_path);
    RUN(vae_decode_through_the_cache);
    RUN(vae_encode_graph);
    RUN(vae_encode_every_path);
    RUN(vae_pipeline_decodes);
    RUN(vae_four_blocks_seeded);
    test_rmrf(g_pkg_dir);
    return TEST_SUMMARY();
}
