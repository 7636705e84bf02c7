/* test_api_files.c - the public API's files: kiln_tensors_read / write
 * (safetensors as f32 and i64), kiln_png_write, kiln_latent_to_rgb and
 * kiln_version, through include/kiln.h alone plus the internal writer to
 * make files of every dtype. */
#include "base/base.h"
#include "format/safetensors.h"
#include "test.h"

#include <png.h>

TEST(version) {
    CHECK(!strcmp(kiln_version(), KILN_VERSION));
    CHECK(strlen(kiln_version()) >= 5);
}

TEST(tensors_round_trip) {
    char dir[256], path[400];
    test_tmpdir(dir, sizeof dir, "api-files");
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    float a[6] = {1, -2.5f, 3, 4, 5, 6e-8f};
    int64_t ids[3] = {-1, 0, (int64_t)1 << 40};
    float sc = 7;
    kiln_tensor t[3] = {
        {"a", KILN_F32, 2, {2, 3}, a},
        {"ids", KILN_I64, 1, {3}, ids},
        {"scalar", KILN_F32, 0, {0}, &sc},
    };
    CHECK_OK(kiln_tensors_write(path, 3, t));
    kiln_tensor *r = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tensors_read(path, &r, &n));
    CHECK(n == 3);
    const kiln_tensor *ra = kiln_tensors_find(r, n, "a"), *ri = kiln_tensors_find(r, n, "ids"),
                      *rs = kiln_tensors_find(r, n, "scalar");
    CHECK(ra && ra->dtype == KILN_F32 && ra->ndim == 2 && ra->shape[0] == 2 && ra->shape[1] == 3 &&
          !memcmp(ra->data, a, sizeof a));
    CHECK(ri && ri->dtype == KILN_I64 && ri->ndim == 1 && !memcmp(ri->data, ids, sizeof ids));
    CHECK(rs && rs->ndim == 0 && *(const float *)rs->data == 7);
    CHECK(((uintptr_t)ra->data & 63) == 0);
    CHECK(kiln_tensors_find(r, n, "nope") == NULL);
    kiln_tensors_free(r);
    /* what was read writes back unchanged */
    test_rmrf(dir);
}

/* the other stored dtypes read as f32 (floats) or i64 (integers, bool) */
TEST(tensors_convert) {
    char dir[256], path[400];
    test_tmpdir(dir, sizeof dir, "api-conv");
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    uint16_t h[2] = {0x3c00, 0xc000};     /* f16 1, -2 */
    uint16_t b[2] = {0x3f80, 0x4040};     /* bf16 1, 3 */
    double d[2] = {0.5, -1e300};          /* -1e300 -> -inf in f32 */
    int8_t i8[2] = {-128, 127};
    uint32_t u32[2] = {0, 4000000000u};
    uint8_t bo[2] = {0, 1};
    st_tensor s[6] = {
        {.name = "h", .dtype = KILN_F16, .ndim = 1, .shape = {2}, .data = h, .nbytes = 4},
        {.name = "b", .dtype = KILN_BF16, .ndim = 1, .shape = {2}, .data = b, .nbytes = 4},
        {.name = "d", .dtype = KILN_F64, .ndim = 1, .shape = {2}, .data = d, .nbytes = 16},
        {.name = "i8", .dtype = KILN_I8, .ndim = 1, .shape = {2}, .data = i8, .nbytes = 2},
        {.name = "u32", .dtype = KILN_U32, .ndim = 1, .shape = {2}, .data = u32, .nbytes = 8},
        {.name = "bool", .dtype = KILN_BOOL, .ndim = 1, .shape = {2}, .data = bo, .nbytes = 2},
    };
    CHECK_OK(st_write(path, s, 6, NULL, 0));
    kiln_tensor *r = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tensors_read(path, &r, &n));
    if (r && n == 6) {
        const float *fh = r[0].data, *fb = r[1].data, *fd = r[2].data;
        const int64_t *v8 = r[3].data, *v32 = r[4].data, *vb = r[5].data;
        CHECK(r[0].dtype == KILN_F32 && fh[0] == 1 && fh[1] == -2);
        CHECK(fb[0] == 1 && fb[1] == 3);
        CHECK(fd[0] == 0.5f && isinf(fd[1]) && fd[1] < 0);
        CHECK(r[3].dtype == KILN_I64 && v8[0] == -128 && v8[1] == 127);
        CHECK(v32[1] == 4000000000LL);
        CHECK(vb[0] == 0 && vb[1] == 1);
    }
    kiln_tensors_free(r);
    /* a u64 beyond i64 is refused by name */
    uint64_t big = UINT64_MAX;
    st_tensor u = {.name = "big", .dtype = KILN_U64, .ndim = 1, .shape = {1}, .data = &big, .nbytes = 8};
    CHECK_OK(st_write(path, &u, 1, NULL, 0));
    r = (kiln_tensor *)1;
    CHECK_FAILS(kiln_tensors_read(path, &r, &n), KILN_ERR_RANGE, "big");
    CHECK(r == NULL && n == 0);
    test_rmrf(dir);
}

TEST(tensors_errors) {
    char dir[256], path[400], bad[400];
    test_tmpdir(dir, sizeof dir, "api-err");
    snprintf(path, sizeof path, "%s/e.safetensors", dir);
    float x[2] = {1, 2};
    kiln_tensor t[2] = {{"x", KILN_F32, 1, {2}, x}, {"x", KILN_F32, 1, {2}, x}};
    CHECK_FAILS(kiln_tensors_write(path, 2, t), KILN_ERR_INVALID_ARG, "'x' given twice");
    t[1].name = NULL;
    CHECK_FAILS(kiln_tensors_write(path, 2, t), KILN_ERR_INVALID_ARG, "tensor 1 has no name");
    t[1].name = "y";
    t[1].shape[0] = -3;
    CHECK_FAILS(kiln_tensors_write(path, 2, t), KILN_ERR_INVALID_ARG, "y: dimension 0 is -3");
    t[1].shape[0] = INT64_MAX;
    CHECK_FAILS(kiln_tensors_write(path, 2, t), KILN_ERR_INVALID_ARG, "too large");
    t[1].shape[0] = 2;
    t[1].dtype = (kiln_dtype)99;
    CHECK_FAILS(kiln_tensors_write(path, 2, t), KILN_ERR_INVALID_ARG, "unknown dtype 99");
    t[1].dtype = KILN_F32;
    t[1].ndim = 9;
    CHECK_FAILS(kiln_tensors_write(path, 2, t), KILN_ERR_INVALID_ARG, "9 dimensions");
    t[1].ndim = 1;
    t[1].data = NULL;
    CHECK_FAILS(kiln_tensors_write(path, 2, t), KILN_ERR_INVALID_ARG, "no data");
    CHECK(!kb_is_file(path)); /* nothing written by a refused call */
    snprintf(bad, sizeof bad, "%s/no-such-folder/e.safetensors", dir);
    CHECK_FAILS(kiln_tensors_write(bad, 1, t), KILN_ERR_IO, "no-such-folder");
    CHECK_FAILS(kiln_tensors_write(NULL, 0, NULL), KILN_ERR_INVALID_ARG, "path");
    /* reading: missing, truncated and garbage files fail with the path */
    kiln_tensor *r = NULL;
    size_t n;
    CHECK_FAILS(kiln_tensors_read(bad, &r, &n), KILN_ERR_IO, "no-such-folder");
    CHECK_OK(kiln_tensors_write(path, 1, t));
    FILE *f = fopen(path, "r+b");
    if (f) { /* a header length far past the end */
        uint8_t len[8] = {0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0};
        fwrite(len, 1, 8, f);
        fclose(f);
    }
    CHECK_FAILS(kiln_tensors_read(path, &r, &n), KILN_ERR_FORMAT, "e.safetensors");
    CHECK(r == NULL);
    CHECK_FAILS(kiln_tensors_read(path, NULL, &n), KILN_ERR_INVALID_ARG, "required");
    kiln_tensors_free(NULL);
    test_rmrf(dir);
}

/* read a PNG back with libpng: size, pixels and the text chunks */
static int read_png(const char *path, int *h, int *w, uint8_t **rgb, char *text, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(p);
    *rgb = NULL;
    if (setjmp(png_jmpbuf(p))) {
        png_destroy_read_struct(&p, &info, NULL);
        fclose(f);
        free(*rgb);
        *rgb = NULL;
        return 0;
    }
    png_init_io(p, f);
    png_read_info(p, info);
    *w = (int)png_get_image_width(p, info);
    *h = (int)png_get_image_height(p, info);
    *rgb = malloc((size_t)*w * (size_t)*h * 3);
    for (int y = 0; y < *h; y++) png_read_row(p, *rgb + (size_t)y * (size_t)*w * 3, NULL);
    png_read_end(p, info);
    png_textp tx;
    int nt = 0;
    text[0] = 0;
    if (png_get_text(p, info, &tx, &nt))
        for (int i = 0; i < nt; i++)
            snprintf(text + strlen(text), cap - strlen(text), "%s=%s;", tx[i].key, tx[i].text);
    png_destroy_read_struct(&p, &info, NULL);
    fclose(f);
    return 1;
}

TEST(png_write) {
    char dir[256], path[400], bad[400], text[512];
    test_tmpdir(dir, sizeof dir, "api-png");
    snprintf(path, sizeof path, "%s/i.png", dir);
    uint8_t rgb[2 * 3 * 3];
    for (int i = 0; i < 18; i++) rgb[i] = (uint8_t)(i * 14);
    const char *kv[] = {"Software", "kiln test", "Comment", "seed 5"};
    CHECK_OK(kiln_png_write(path, rgb, 2, 3, kv, 2));
    int h = 0, w = 0;
    uint8_t *back = NULL;
    CHECK(read_png(path, &h, &w, &back, text, sizeof text));
    CHECK(h == 2 && w == 3 && back && !memcmp(back, rgb, sizeof rgb));
    CHECK_MSG(strstr(text, "Software=kiln test;") && strstr(text, "Comment=seed 5;"), "text %s", text);
    free(back);
    CHECK_OK(kiln_png_write(path, rgb, 1, 1, NULL, 0));
    CHECK_FAILS(kiln_png_write(path, rgb, 0, 3, NULL, 0), KILN_ERR_INVALID_ARG, "image 0x3");
    CHECK_FAILS(kiln_png_write(path, rgb, 2, -1, NULL, 0), KILN_ERR_INVALID_ARG, "positive");
    const char *badkey[] = {"", "x"};
    CHECK_FAILS(kiln_png_write(path, rgb, 2, 3, badkey, 1), KILN_ERR_INVALID_ARG, "text key 0");
    const char *nov[] = {"Title", NULL};
    CHECK_FAILS(kiln_png_write(path, rgb, 2, 3, nov, 1), KILN_ERR_INVALID_ARG, "Title has no value");
    CHECK_FAILS(kiln_png_write(path, NULL, 2, 3, NULL, 0), KILN_ERR_INVALID_ARG, "rgb");
    snprintf(bad, sizeof bad, "%s/nope/i.png", dir);
    CHECK_FAILS(kiln_png_write(bad, rgb, 2, 3, NULL, 0), KILN_ERR_IO, "nope");
    test_rmrf(dir);
}

TEST(latent_to_rgb) {
    /* [C=2, H=1, W=3]: channel 0 stretched 0..255, channel 1 constant (128),
     * the third colour repeats channel 1 */
    float lat[6] = {-1, 0, 1, 5, 5, 5};
    uint8_t rgb[9];
    CHECK_OK(kiln_latent_to_rgb(lat, 2, 1, 3, rgb));
    CHECK(rgb[0] == 0 && rgb[3] == 128 && rgb[6] == 255);
    CHECK(rgb[1] == 128 && rgb[2] == 128 && rgb[8] == 128);
    lat[1] = NAN;
    CHECK_OK(kiln_latent_to_rgb(lat, 1, 1, 3, rgb));
    CHECK_FAILS(kiln_latent_to_rgb(lat, 0, 1, 3, rgb), KILN_ERR_INVALID_ARG, "[0, 1, 3]");
    CHECK_FAILS(kiln_latent_to_rgb(NULL, 1, 1, 3, rgb), KILN_ERR_INVALID_ARG, "required");
}

int main(void) {
    RUN(version);
    RUN(tensors_round_trip);
    RUN(tensors_convert);
    RUN(tensors_errors);
    RUN(png_write);
    RUN(latent_to_rgb);
    return TEST_SUMMARY();
}
