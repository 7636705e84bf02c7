/* image.c - diffusers' VaeImageProcessor at both ends of the VAE, the PNG's
 * "parameters" text (the A1111 convention) and the PNG reader for encode
 * (libpng, from memory: the file is read whole, then decoded). */
#include "pipeline/image.h"

#include "base/base.h"

#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_status check_sample(const char *fn, const void *x, const void *y, int64_t B, int C, int H, int W) {
    if (!x || !y) return kb_fail(KILN_ERR_INVALID_ARG, "%s: the sample and the output are required", fn);
    if (C != 3)
        return kb_fail(KILN_ERR_SHAPE, "%s: sample [%lld, %d, %d, %d] has %d channels, an RGB image needs 3", fn,
                       (long long)B, C, H, W, C);
    size_t n;
    if (B < 1 || H < 1 || W < 1 || !kb_mul_ok((size_t)B, (size_t)H, &n) || !kb_mul_ok(n, (size_t)W, &n) ||
        !kb_mul_ok(n, 3 * sizeof(float), &n))
        return kb_fail(KILN_ERR_SHAPE, "%s: sample [%lld, %d, %d, %d]: batch, height and width must be positive", fn,
                       (long long)B, C, H, W);
    return KILN_OK;
}

/* denormalize: (x / 2 + 0.5).clamp(0, 1) in f32 as torch does it; NaN -> 0 */
static inline float denorm(float x) {
    float v = x / 2.0f + 0.5f;
    return v > 0.0f ? (v < 1.0f ? v : 1.0f) : 0.0f;
}

kiln_status kiln_image_postprocess_f32(const float *sample, int64_t B, int C, int H, int W, float *out) {
    kiln_status st = check_sample("kiln_image_postprocess_f32", sample, out, B, C, H, W);
    if (st) return st;
    size_t hw = (size_t)H * (size_t)W;
    /* [B, 3, H, W] -> [B, H, W, 3] (pt_to_numpy's permute) */
    for (int64_t b = 0; b < B; b++)
        for (int c = 0; c < 3; c++) {
            const float *src = sample + ((size_t)b * 3 + (size_t)c) * hw;
            float *dst = out + (size_t)b * hw * 3 + (size_t)c;
            for (size_t i = 0; i < hw; i++) dst[i * 3] = denorm(src[i]);
        }
    return KILN_OK;
}

kiln_status kiln_image_postprocess(const float *sample, int64_t B, int C, int H, int W, uint8_t *rgb) {
    kiln_status st = check_sample("kiln_image_postprocess", sample, rgb, B, C, H, W);
    if (st) return st;
    size_t hw = (size_t)H * (size_t)W;
    for (int64_t b = 0; b < B; b++)
        for (int c = 0; c < 3; c++) {
            const float *src = sample + ((size_t)b * 3 + (size_t)c) * hw;
            uint8_t *dst = rgb + (size_t)b * hw * 3 + (size_t)c;
            /* numpy_to_pil: (images * 255).round().astype("uint8"): the
             * product in f32, rounded half to even (the default rounding
             * mode, as numpy's round) */
            for (size_t i = 0; i < hw; i++) dst[i * 3] = (uint8_t)nearbyintf(denorm(src[i]) * 255.0f);
        }
    return KILN_OK;
}

kiln_status kiln_image_preprocess(const uint8_t *rgb, int H, int W, int factor, float *image) {
    if (!rgb || !image) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_image_preprocess: rgb and image are required");
    if (factor < 1) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_image_preprocess: factor %d must be positive", factor);
    if (H < 1 || W < 1 || H % factor || W % factor || (size_t)H * (size_t)W > KP_MAX_PIXELS)
        return kb_fail(KILN_ERR_SHAPE,
                       "image %dx%d (height x width): each side must be a positive multiple of %d (the VAE's "
                       "downsampling factor); kiln does not resize",
                       H, W, factor);
    size_t hw = (size_t)H * (size_t)W;
    /* pil_to_numpy (u / 255 in f32), normalize (2x - 1), [H, W, 3] -> [3, H, W] */
    for (size_t i = 0; i < hw; i++)
        for (int c = 0; c < 3; c++) image[(size_t)c * hw + i] = 2.0f * ((float)rgb[i * 3 + (size_t)c] / 255.0f) - 1.0f;
    return KILN_OK;
}

/* ---- the parameters text ---------------------------------------------- */

typedef struct {
    char *s;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) KB_PRINTF(2, 3);
static void sb_add(sbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->failed = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *kiln_image_parameters(const kiln_image_info *info, int height, int width) {
    static const kiln_image_info none = {0};
    const kiln_image_info *in = info ? info : &none;
    sbuf b = {0};
    if (in->prompt) sb_add(&b, "%s\n", in->prompt);
    if (in->negative_prompt && *in->negative_prompt) sb_add(&b, "Negative prompt: %s\n", in->negative_prompt);
    /* the settings line: "Key: value" pairs joined by ", " (A1111's infotext) */
    const char *sep = "";
    if (in->steps > 0) sb_add(&b, "%sSteps: %d", sep, in->steps), sep = ", ";
    if (in->sampler && *in->sampler) sb_add(&b, "%sSampler: %s", sep, in->sampler), sep = ", ";
    if (in->guidance > 0) sb_add(&b, "%sCFG scale: %g", sep, in->guidance), sep = ", ";
    if (in->has_seed) sb_add(&b, "%sSeed: %llu", sep, (unsigned long long)in->seed), sep = ", ";
    sb_add(&b, "%sSize: %dx%d", sep, width, height);
    if (in->model && *in->model) sb_add(&b, ", Model: %s", in->model);
    sb_add(&b, ", Version: kiln %s", kiln_version());
    if (b.failed) {
        free(b.s);
        kb_fail(KILN_ERR_NOMEM, "kiln_image_parameters: out of memory");
        return NULL;
    }
    return b.s;
}

kiln_status kiln_image_write_png(const char *path, const uint8_t *rgb, int height, int width,
                                 const kiln_image_info *info) {
    char *params = kiln_image_parameters(info, height, width);
    if (!params) return KILN_ERR_NOMEM;
    char software[64];
    snprintf(software, sizeof software, "kiln %s", kiln_version());
    const char *text[4] = {"parameters", params, "Software", software};
    kiln_status st = kiln_png_write(path, rgb, height, width, text, 2);
    free(params);
    return st;
}

/* ---- reading ------------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t n, at;
    char msg[160];
} rd;

static void rd_read(png_structp png, png_bytep out, png_size_t n) {
    rd *r = png_get_io_ptr(png);
    if (n > r->n - r->at) {
        snprintf(r->msg, sizeof r->msg, "truncated: the file ends at byte %zu, inside a chunk", r->n);
        png_error(png, "truncated");
    }
    memcpy(out, r->p + r->at, n);
    r->at += n;
}

static void rd_error(png_structp png, png_const_charp m) {
    rd *r = png_get_error_ptr(png);
    if (!r->msg[0]) snprintf(r->msg, sizeof r->msg, "%s", m);
    png_longjmp(png, 1);
}

static void rd_warn(png_structp png, png_const_charp m) { (void)png, (void)m; }

/* Deflate expands at most 1032:1, so an image whose filtered rows exceed
 * the file's size times that cannot be complete: refused before its pixels
 * are allocated (a 60-byte file cannot ask for gigabytes). */
#define KP_DEFLATE_MAX_RATIO 1100

/* The decode proper, everything it changes behind d (setjmp: no local
 * outlives a longjmp back to it) */
typedef struct {
    rd r;
    const char *what;
    size_t n, max_pixels;
    uint8_t *px;
    png_bytep *rows;
    kiln_status st;
    int h, w;
} dec;

static void decode(png_structp png, png_infop info, dec *d) {
    if (setjmp(png_jmpbuf(png))) {
        if (!d->st) d->st = kb_fail(KILN_ERR_FORMAT, "%s: corrupt PNG: %s", d->what, d->r.msg[0] ? d->r.msg : "libpng failed");
        return;
    }
    png_set_read_fn(png, &d->r, rd_read);
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
    /* the fuzzer cannot forge CRCs: without this nearly every mutation
     * stops at the first chunk and the decoder behind it goes unexplored */
    png_set_crc_action(png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
#endif
    png_set_user_limits(png, KP_MAX_SIDE, KP_MAX_SIDE);
    png_set_chunk_malloc_max(png, (png_alloc_size_t)8 << 20); /* text, iCCP...: 8 MiB a chunk */
    png_read_info(png, info);
    png_uint_32 pw, ph;
    int depth, color, interlace;
    png_get_IHDR(png, info, &pw, &ph, &depth, &color, &interlace, NULL, NULL);
    size_t npx = (size_t)pw * (size_t)ph;
    if (npx > d->max_pixels) {
        d->st = kb_fail(KILN_ERR_FORMAT, "%s: image %ux%u has %zu pixels, more than the %zu kiln reads", d->what,
                        (unsigned)ph, (unsigned)pw, npx, d->max_pixels);
        png_longjmp(png, 1);
    }
    /* the raw rows libpng inflates: the file's samples, one filter byte a row */
    int spp = color == PNG_COLOR_TYPE_RGB         ? 3
              : color == PNG_COLOR_TYPE_RGB_ALPHA  ? 4
              : color == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                                                   : 1;
    size_t raw = ((size_t)pw * (size_t)spp * (size_t)depth + 7) / 8 + 1;
    if ((size_t)ph > (d->n * KP_DEFLATE_MAX_RATIO + 4096) / raw) {
        d->st = kb_fail(KILN_ERR_FORMAT, "%s: truncated PNG: a %ux%u image cannot be held in %zu bytes", d->what,
                        (unsigned)ph, (unsigned)pw, d->n);
        png_longjmp(png, 1);
    }
    /* every format to 8-bit RGB */
    if (depth == 16) png_set_strip_16(png);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    if (color & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    if (interlace != PNG_INTERLACE_NONE) png_set_interlace_handling(png);
    png_read_update_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    if (rowbytes != (size_t)pw * 3 || png_get_channels(png, info) != 3 || png_get_bit_depth(png, info) != 8) {
        d->st = kb_fail(KILN_ERR_FORMAT, "%s: PNG color type %d, bit depth %d does not convert to 8-bit RGB", d->what,
                        color, depth);
        png_longjmp(png, 1);
    }
    d->px = malloc(npx * 3);
    d->rows = malloc(sizeof(png_bytep) * ph);
    if (!d->px || !d->rows) {
        d->st = kb_fail(KILN_ERR_NOMEM, "%s: out of memory for a %ux%u image", d->what, (unsigned)ph, (unsigned)pw);
        png_longjmp(png, 1);
    }
    for (png_uint_32 y = 0; y < ph; y++) d->rows[y] = d->px + (size_t)y * rowbytes;
    png_read_image(png, d->rows);
    png_read_end(png, NULL);
    d->h = (int)ph;
    d->w = (int)pw;
}

kiln_status kp_png_decode(const void *data, size_t n, size_t max_pixels, const char *what, uint8_t **rgb, int *height,
                          int *width) {
    if (!rgb || !height || !width || (!data && n))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_png_read: data and outputs are required");
    *rgb = NULL;
    *height = *width = 0;
    if (!what) what = "(memory)";
    if (n < 8 || png_sig_cmp(data, 0, 8))
        return kb_fail(KILN_ERR_FORMAT, "%s is not a PNG image (no PNG signature%s)", what,
                       n < 8 ? ": shorter than 8 bytes" : "");
    dec d = {.r = {.p = data, .n = n}, .what = what, .n = n, .max_pixels = max_pixels};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d.r, rd_error, rd_warn);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        if (png) png_destroy_read_struct(&png, NULL, NULL);
        return kb_fail(KILN_ERR_NOMEM, "png: cannot create the decoder");
    }
    decode(png, info, &d);
    png_destroy_read_struct(&png, &info, NULL);
    free(d.rows);
    if (d.st) {
        free(d.px);
        return d.st;
    }
    *rgb = d.px;
    *height = d.h;
    *width = d.w;
    return KILN_OK;
}

kiln_status kiln_png_read(const char *path, uint8_t **rgb, int *height, int *width) {
    if (!path) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_png_read: a path is required");
    char *data = NULL;
    size_t n = 0;
    kiln_status st = kb_read_file(path, &data, &n);
    if (st) return kb_wrap(st, "reading image %s", path);
    st = kp_png_decode(data, n, KP_MAX_PIXELS, path, rgb, height, width);
    free(data);
    return st;
}
