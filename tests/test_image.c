/* test_image.c - the pixels at both ends of the VAE (src/pipeline/image.c):
 * diffusers' VaeImageProcessor.postprocess against sd3-pipeline-tiny's
 * stored float image (from its stored decode) and, as uint8, against
 * round(255 x) of it from kiln's own decode of the stored decoder input;
 * numpy's round-half-to-even at exact ties; the PNG with the A1111
 * "parameters" text read back through libpng; the PNG reader on every
 * colour type and bit depth it converts, interlaced, and its refusals (not
 * a PNG, truncated, corrupt); the encode preprocess and its size check. */
#include "base/base.h"
#include "golden_util.h"
#include "pipeline/image.h"

#include <png.h>

/* ties: a sample whose f32 (x / 2 + 0.5) * 255 is exactly k + 0.5 rounds
 * to the even neighbour, as numpy's round (np.round: "rounds to the nearest
 * even value") in numpy_to_pil */
static float tie_sample(int k) {
    float t = ((float)k + 0.5f) / 255.0f;
    for (int d = -64; d <= 64; d++) {
        float v = t;
        for (int i = 0; i < (d < 0 ? -d : d); i++) v = nextafterf(v, d < 0 ? 0.0f : 1.0f);
        float x = (v - 0.5f) * 2.0f;
        if ((x / 2.0f + 0.5f) * 255.0f == (float)k + 0.5f) return x;
    }
    return NAN;
}

TEST(postprocess_rounding) {
    float x[3 * 1 * 8];
    const float vals[8] = {-1.0f, 1.0f, 2.0f, -3.0f, 0.0f, NAN, tie_sample(126), tie_sample(127)};
    CHECK(!isnan(vals[6]) && !isnan(vals[7]));
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 8; i++) x[c * 8 + i] = vals[i];
    uint8_t rgb[8 * 3];
    float f[8 * 3];
    CHECK_OK(kiln_image_postprocess(x, 1, 3, 1, 8, rgb));
    CHECK_OK(kiln_image_postprocess_f32(x, 1, 3, 1, 8, f));
    const uint8_t want[8] = {0, 255, 255, 0, 128, 0, 126, 128};
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < 3; c++) {
            CHECK_MSG(rgb[i * 3 + c] == want[i], "value %d (%g): %d, not %d", i, vals[i], rgb[i * 3 + c], want[i]);
            CHECK(f[i * 3 + c] >= 0 && f[i * 3 + c] <= 1);
        }
    CHECK(f[4 * 3] == 0.5f);
    CHECK_FAILS(kiln_image_postprocess(x, 1, 4, 1, 6, rgb), KILN_ERR_SHAPE, "has 4 channels, an RGB image needs 3");
    CHECK_FAILS(kiln_image_postprocess(x, 0, 3, 1, 8, rgb), KILN_ERR_SHAPE, "must be positive");
}

/* sd3-pipeline-tiny: image (float [1, 32, 48, 3], output_type="np") is the
 * postprocess of image_decoded [1, 3, 32, 48]; kiln's f32 decode of
 * decoder_input postprocessed to uint8 equals round(255 image) except
 * values within rounding of a half step (at most 0.1%, off by one) */
TEST(postprocess_sd3_pipeline) {
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path("sd3-pipeline-tiny", "io.safetensors"), &io));
    if (!io) return;
    size_t n, nd;
    float *image = golden_tensor(io, "image", &n), *dec = golden_tensor(io, "image_decoded", &nd);
    float *dec_in = golden_tensor(io, "decoder_input", NULL);
    const st_tensor *it = golden_info(io, "decoder_input");
    CHECK(n == nd && n == 32 * 48 * 3);
    float *got = calloc(n, sizeof(float)), *kdec = calloc(n, sizeof(float));
    CHECK_OK(kiln_image_postprocess_f32(dec, 1, 3, 32, 48, got));
    double maxd = 0;
    for (size_t i = 0; i < n; i++) maxd = fmax(maxd, fabs(got[i] - image[i]));
    fprintf(stderr, "  postprocess of the stored decode against the stored image: max abs %.3g\n", maxd);
    CHECK_MSG(maxd < 1e-6, "max abs %.3g", maxd);
    /* kiln's decode (fast f32) of the stored decoder input -> uint8 */
    kiln_open_opts o = {.dtype = KILN_F32};
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path("sd3-pipeline-tiny", "vae"), &o, &m));
    if (m) {
        kiln_tensor in = {.name = "latent", .dtype = KILN_F32, .ndim = 4, .data = dec_in};
        for (int d = 0; d < 4; d++) in.shape[d] = it->shape[d];
        kiln_output out = {.name = "sample", .data = kdec, .capacity = n};
        CHECK_OK(kiln_run(m, &in, 1, &out, 1));
        uint8_t *u = malloc(n);
        CHECK_OK(kiln_image_postprocess(kdec, 1, 3, 32, 48, u));
        size_t off = 0, bad = 0;
        for (size_t i = 0; i < n; i++) {
            int want = (int)nearbyint(image[i] * 255.0);
            int dlt = abs((int)u[i] - want);
            if (dlt == 1) {
                off++;
                /* only where the float lies within rounding of a half step */
                double fr = image[i] * 255.0 - floor(image[i] * 255.0);
                if (fabs(fr - 0.5) > 1e-3) bad++;
            } else if (dlt > 1) {
                bad++;
            }
        }
        fprintf(stderr, "  uint8 of kiln's f32 decode against round(255 image): %zu of %zu off by one\n", off, n);
        CHECK_MSG(bad == 0 && off * 1000 <= n, "%zu off by one, %zu not near a half step", off, bad);
        free(u);
        kiln_model_free(m);
    }
    free(image), free(dec), free(dec_in), free(got), free(kdec);
    st_close(io);
}

/* libpng's text chunks of a PNG file */
static int png_text_of(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(p);
    int found = 0;
    if (!setjmp(png_jmpbuf(p))) {
        png_init_io(p, f);
        png_read_info(p, info);
        png_textp t;
        int nt = 0;
        png_get_text(p, info, &t, &nt);
        for (int i = 0; i < nt; i++)
            if (!strcmp(t[i].key, key)) {
                snprintf(out, cap, "%s", t[i].text);
                found = 1;
            }
    }
    png_destroy_read_struct(&p, &info, NULL);
    fclose(f);
    return found;
}

/* a PNG of any colour type and depth through libpng (the reader's inputs) */
static void write_png_raw(const char *path, int w, int h, int color, int depth, int interlace, const uint8_t *data,
                          int palette) {
    FILE *f = fopen(path, "wb");
    if (!f) exit(2);
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(p);
    if (setjmp(png_jmpbuf(p))) exit(2);
    png_init_io(p, f);
    png_set_IHDR(p, info, (png_uint_32)w, (png_uint_32)h, depth, color, interlace, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_color pal[4] = {{0, 0, 0}, {255, 0, 0}, {0, 255, 0}, {10, 20, 30}};
    if (palette) png_set_PLTE(p, info, pal, 4);
    png_write_info(p, info);
    int ch = color == PNG_COLOR_TYPE_RGB ? 3 : color == PNG_COLOR_TYPE_RGBA ? 4 : color == PNG_COLOR_TYPE_GRAY_ALPHA ? 2 : 1;
    size_t row = ((size_t)w * (size_t)ch * (size_t)depth + 7) / 8;
    png_bytep *rows = malloc(sizeof(png_bytep) * (size_t)h);
    for (int y = 0; y < h; y++) rows[y] = (png_bytep)data + (size_t)y * row;
    png_write_image(p, rows);
    png_write_end(p, NULL);
    png_destroy_write_struct(&p, &info);
    free(rows);
    fclose(f);
}

TEST(png_parameters_roundtrip) {
    char dir[1024], path[1100], txt[2048];
    test_tmpdir(dir, sizeof dir, "image-png");
    snprintf(path, sizeof path, "%s/a.png", dir);
    enum { H = 5, W = 7 };
    uint8_t rgb[H * W * 3];
    for (int i = 0; i < H * W * 3; i++) rgb[i] = (uint8_t)(i * 37 + 11);
    kiln_image_info info = {.prompt = "a red fox, snow \xc3\xa9t\xc3\xa9", .negative_prompt = "blurry", .steps = 28,
                            .guidance = 7.5, .has_seed = 1, .seed = 42, .sampler = "Euler", .model = "sd3-medium"};
    CHECK_OK(kiln_image_write_png(path, rgb, H, W, &info));
    char want[512];
    snprintf(want, sizeof want,
             "a red fox, snow \xc3\xa9t\xc3\xa9\nNegative prompt: blurry\nSteps: 28, Sampler: Euler, CFG scale: 7.5, "
             "Seed: 42, Size: 7x5, Model: sd3-medium, Version: kiln %s",
             kiln_version());
    CHECK(png_text_of(path, "parameters", txt, sizeof txt));
    CHECK_MSG(!strcmp(txt, want), "parameters: [%s]", txt);
    CHECK(png_text_of(path, "Software", txt, sizeof txt) && !strncmp(txt, "kiln ", 5));
    uint8_t *back = NULL;
    int h = 0, w = 0;
    CHECK_OK(kiln_png_read(path, &back, &h, &w));
    CHECK(h == H && w == W && back && !memcmp(back, rgb, sizeof rgb));
    free(back);
    /* nothing known: the size and version only */
    char *p0 = kiln_image_parameters(NULL, 64, 32);
    snprintf(want, sizeof want, "Size: 32x64, Version: kiln %s", kiln_version());
    CHECK_MSG(p0 && !strcmp(p0, want), "[%s]", p0);
    free(p0);
    test_rmrf(dir);
}

TEST(png_read_formats_and_refusals) {
    char dir[1024], path[1100];
    test_tmpdir(dir, sizeof dir, "image-read");
    snprintf(path, sizeof path, "%s/x.png", dir);
    enum { H = 3, W = 5 };
    uint8_t *rgb = NULL;
    int h, w;
    /* 8-bit gray -> RGB, replicated */
    uint8_t g8[H * W], rgba[H * W * 4], g16[H * W * 2], pal[H * W], rgb16[H * W * 6], ga[H * W * 2];
    for (int i = 0; i < H * W; i++) {
        g8[i] = (uint8_t)(i * 17);
        for (int c = 0; c < 4; c++) rgba[i * 4 + c] = (uint8_t)(i * 13 + c * 50);
        g16[2 * i] = (uint8_t)(i * 9), g16[2 * i + 1] = 0xff; /* big-endian: the high byte first */
        ga[2 * i] = (uint8_t)(200 - i), ga[2 * i + 1] = 7;
        pal[i] = (uint8_t)(i % 4);
        for (int c = 0; c < 3; c++) rgb16[i * 6 + 2 * c] = (uint8_t)(i + 40 * c), rgb16[i * 6 + 2 * c + 1] = 0x80;
    }
    const uint8_t palrgb[4][3] = {{0, 0, 0}, {255, 0, 0}, {0, 255, 0}, {10, 20, 30}};
    struct {
        const char *label;
        int color, depth, interlace;
        const uint8_t *data;
    } cases[] = {
        {"gray 8", PNG_COLOR_TYPE_GRAY, 8, PNG_INTERLACE_NONE, g8},
        {"gray 16", PNG_COLOR_TYPE_GRAY, 16, PNG_INTERLACE_NONE, g16},
        {"gray+alpha 8", PNG_COLOR_TYPE_GRAY_ALPHA, 8, PNG_INTERLACE_NONE, ga},
        {"rgba 8", PNG_COLOR_TYPE_RGBA, 8, PNG_INTERLACE_NONE, rgba},
        {"rgba 8 interlaced", PNG_COLOR_TYPE_RGBA, 8, PNG_INTERLACE_ADAM7, rgba},
        {"rgb 16", PNG_COLOR_TYPE_RGB, 16, PNG_INTERLACE_NONE, rgb16},
        {"palette 8", PNG_COLOR_TYPE_PALETTE, 8, PNG_INTERLACE_NONE, pal},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        write_png_raw(path, W, H, cases[k].color, cases[k].depth, cases[k].interlace, cases[k].data,
                      cases[k].color == PNG_COLOR_TYPE_PALETTE);
        rgb = NULL;
        CHECK_OK(kiln_png_read(path, &rgb, &h, &w));
        if (!rgb) continue;
        CHECK(h == H && w == W);
        int ok = 1;
        for (int i = 0; i < H * W; i++)
            for (int c = 0; c < 3; c++) {
                int want;
                switch (k) {
                case 0: want = g8[i]; break;
                case 1: want = g16[2 * i]; break;
                case 2: want = ga[2 * i]; break;
                case 3: case 4: want = rgba[i * 4 + c]; break;
                case 5: want = rgb16[i * 6 + 2 * c]; break;
                default: want = palrgb[pal[i]][c]; break;
                }
                ok &= rgb[i * 3 + c] == want;
            }
        CHECK_MSG(ok, "%s: pixels differ", cases[k].label);
        free(rgb);
    }
    /* refusals: not a PNG, empty, truncated, a corrupt chunk */
    FILE *f = fopen(path, "wb");
    fputs("GIF89a not a png at all", f);
    fclose(f);
    CHECK_FAILS(kiln_png_read(path, &rgb, &h, &w), KILN_ERR_FORMAT, "is not a PNG image (no PNG signature)");
    f = fopen(path, "wb");
    fclose(f);
    CHECK_FAILS(kiln_png_read(path, &rgb, &h, &w), KILN_ERR_FORMAT, "shorter than 8 bytes");
    uint8_t big[64 * 48 * 3];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)((i * 2654435761u) >> 13);
    CHECK_OK(kiln_png_write(path, big, 48, 64, NULL, 0));
    char *data = NULL;
    size_t n = 0;
    CHECK_OK(kb_read_file(path, &data, &n));
    for (size_t cut = 8; cut < n; cut += n / 7 + 1) {
        kiln_status st = kp_png_decode(data, cut, KP_MAX_PIXELS, "cut.png", &rgb, &h, &w);
        CHECK_MSG(st == KILN_ERR_FORMAT && rgb == NULL && strstr(kiln_last_error(), "cut.png"),
                  "cut at %zu of %zu: %s (%s)", cut, n, kiln_status_name(st), kiln_last_error());
    }
    CHECK_FAILS(kp_png_decode(data, n / 2, KP_MAX_PIXELS, "half.png", &rgb, &h, &w), KILN_ERR_FORMAT, "truncated");
    data[40] ^= 0x55; /* inside IHDR or the first IDAT: a CRC error */
    CHECK_FAILS(kp_png_decode(data, n, KP_MAX_PIXELS, "crc.png", &rgb, &h, &w), KILN_ERR_FORMAT, "crc.png: corrupt PNG");
    data[40] ^= 0x55;
    CHECK_FAILS(kp_png_decode(data, n, 1000, "big.png", &rgb, &h, &w), KILN_ERR_FORMAT, "has 3072 pixels, more than the 1000");
    free(data);
    CHECK_FAILS(kiln_png_read("/nonexistent/x.png", &rgb, &h, &w), KILN_ERR_IO, "/nonexistent/x.png");
    test_rmrf(dir);
}

TEST(preprocess) {
    uint8_t rgb[2 * 4 * 3];
    for (int i = 0; i < 24; i++) rgb[i] = (uint8_t)(i * 11);
    rgb[0] = 0, rgb[1] = 255, rgb[2] = 128;
    float x[24];
    CHECK_OK(kiln_image_preprocess(rgb, 2, 4, 2, x));
    /* [1, 3, H, W]: channel c of pixel i at c * 8 + i; 2 (u / 255) - 1 */
    CHECK(x[0] == -1.0f && x[8] == 1.0f && x[16] == 2.0f * (128.0f / 255.0f) - 1.0f);
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < 3; c++) CHECK(x[c * 8 + i] == 2.0f * ((float)rgb[i * 3 + c] / 255.0f) - 1.0f);
    CHECK_FAILS(kiln_image_preprocess(rgb, 2, 4, 8, x), KILN_ERR_SHAPE,
                "image 2x4 (height x width): each side must be a positive multiple of 8");
    CHECK_FAILS(kiln_image_preprocess(rgb, 3, 4, 2, x), KILN_ERR_SHAPE, "multiple of 2");
}

int main(void) {
    RUN(postprocess_rounding);
    RUN(postprocess_sd3_pipeline);
    RUN(png_parameters_roundtrip);
    RUN(png_read_formats_and_refusals);
    RUN(preprocess);
    return TEST_SUMMARY();
}
