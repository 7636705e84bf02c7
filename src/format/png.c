/* png.c - RGB images and latent previews as PNG through libpng, written to memory first so
 * the file appears atomically. */
#include "format/png.h"

#include "base/base.h"

#include <png.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    int failed;
} membuf;

static void mem_write(png_structp p, png_bytep data, png_size_t n) {
    membuf *m = png_get_io_ptr(p);
    if (m->failed) return;
    if (m->len + n > m->cap) {
        size_t cap = (m->cap ? m->cap * 2 : 65536);
        while (cap < m->len + n) cap *= 2;
        uint8_t *nb = realloc(m->buf, cap);
        if (!nb) {
            m->failed = 1;
            return;
        }
        m->buf = nb;
        m->cap = cap;
    }
    memcpy(m->buf + m->len, data, n);
    m->len += n;
}

static void mem_flush(png_structp p) { (void)p; }

kiln_status kiln_latent_to_rgb(const float *latent, int C, int H, int W, uint8_t *rgb) {
    if (!latent || !rgb) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_latent_to_rgb: latent and rgb are required");
    size_t hw;
    if (C < 1 || H < 1 || W < 1 || !kb_mul_ok((size_t)H, (size_t)W, &hw) || hw > SIZE_MAX / 3)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_latent_to_rgb: latent [%d, %d, %d]: every size must be positive", C, H,
                       W);
    for (int ch = 0; ch < 3; ch++) {
        const float *src = latent + (size_t)(ch < C ? ch : C - 1) * hw;
        float lo = src[0], hi = src[0];
        for (size_t i = 0; i < hw; i++) {
            if (src[i] < lo) lo = src[i];
            if (src[i] > hi) hi = src[i];
        }
        for (size_t i = 0; i < hw; i++) {
            float r = hi > lo ? (src[i] - lo) / (hi - lo) : 0.5f;
            if (!(r >= 0)) r = 0; /* NaN too */
            if (r > 1) r = 1;
            rgb[i * 3 + (size_t)ch] = (uint8_t)(r * 255.0f + 0.5f);
        }
    }
    return KILN_OK;
}

/* tEXt keys: 1..79 printable Latin-1 characters (PNG spec 11.3.4.3) */
static int png_key_ok(const char *k) {
    size_t n = k ? strlen(k) : 0;
    if (n < 1 || n > 79 || k[0] == ' ' || k[n - 1] == ' ') return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)k[i];
        if (c < 32 || (c > 126 && c < 161)) return 0;
    }
    return 1;
}

kiln_status kiln_png_write(const char *path, const uint8_t *rgb, int height, int width, const char *const *text,
                           size_t n_text) {
    if (!path || !rgb || (n_text && !text))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_png_write: path, rgb%s are required", n_text ? " and text" : "");
    size_t row;
    /* PNG allows 2^31 - 1; the row pointer arithmetic below wants size_t room */
    if (height < 1 || width < 1 || !kb_mul_ok((size_t)width, 3, &row) || !kb_mul_ok(row, (size_t)height, &row))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_png_write %s: image %dx%d: height and width must be positive", path,
                       height, width);
    for (size_t i = 0; i < n_text; i++) {
        if (!png_key_ok(text[2 * i]))
            return kb_fail(KILN_ERR_INVALID_ARG,
                           "kiln_png_write %s: text key %zu \"%s\" must be 1..79 printable Latin-1 characters", path, i,
                           text[2 * i] ? text[2 * i] : "(null)");
        if (!text[2 * i + 1])
            return kb_fail(KILN_ERR_INVALID_ARG, "kiln_png_write %s: text key %s has no value", path, text[2 * i]);
    }
    membuf m = {0};
    png_text *chunks = n_text ? kb_calloc(n_text, sizeof *chunks) : NULL;
    if (n_text && !chunks) return KILN_ERR_NOMEM;
    for (size_t i = 0; i < n_text; i++) {
        /* tEXt is Latin-1: a value with bytes above 127 (UTF-8 prompts) goes
         * into an iTXt chunk, which is UTF-8 (what PIL does for text Latin-1
         * cannot hold; readers of "parameters" take either) */
        int ascii = 1;
        for (const unsigned char *c = (const unsigned char *)text[2 * i + 1]; *c; c++) ascii &= *c < 128;
        chunks[i].compression = ascii ? PNG_TEXT_COMPRESSION_NONE : PNG_ITXT_COMPRESSION_NONE;
        chunks[i].key = (png_charp)text[2 * i];
        chunks[i].text = (png_charp)text[2 * i + 1];
        chunks[i].text_length = strlen(text[2 * i + 1]);
    }
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = p ? png_create_info_struct(p) : NULL;
    kiln_status st = KILN_OK;
    if (!p || !info) {
        st = kb_fail(KILN_ERR_NOMEM, "png: cannot create the encoder");
    } else if (setjmp(png_jmpbuf(p))) {
        st = kb_fail(KILN_ERR_IO, "png: encoding %s failed", path);
    } else {
        png_set_write_fn(p, &m, mem_write, mem_flush);
        png_set_IHDR(p, info, (png_uint_32)width, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
        if (n_text) png_set_text(p, info, chunks, (int)n_text);
        png_write_info(p, info);
        for (int y = 0; y < height; y++) png_write_row(p, (png_bytep)(rgb + (size_t)y * (size_t)width * 3));
        png_write_end(p, NULL);
    }
    if (p) png_destroy_write_struct(&p, info ? &info : NULL);
    free(chunks);
    if (!st && m.failed) st = kb_fail(KILN_ERR_NOMEM, "png: out of memory encoding %s", path);
    if (!st) st = kb_write_file_atomic(path, m.buf, m.len);
    free(m.buf);
    return st;
}

kiln_status kf_write_latent_png(const char *path, const float *latent, int C, int H, int W) {
    if (C < 1 || H < 1 || W < 1) return kb_fail(KILN_ERR_INVALID_ARG, "png: empty latent");
    int scale = W >= 256 ? 1 : (256 + W - 1) / W;
    if (scale > 64) scale = 64;
    int ow = W * scale, oh = H * scale;
    uint8_t *px = malloc((size_t)W * 3 * (size_t)H), *rows = malloc((size_t)ow * 3 * (size_t)oh);
    kiln_status st = px && rows ? kiln_latent_to_rgb(latent, C, H, W, px) : kb_fail(KILN_ERR_NOMEM, "png: out of memory");
    /* scaled up by whole pixels, so that a 32x32 latent is seen */
    for (int y = 0; !st && y < oh; y++)
        for (int x = 0; x < ow; x++)
            memcpy(rows + ((size_t)y * (size_t)ow + (size_t)x) * 3,
                   px + ((size_t)(y / scale) * (size_t)W + (size_t)(x / scale)) * 3, 3);
    const char *text[] = {"Software", "kiln " KILN_VERSION};
    if (!st) st = kiln_png_write(path, rows, oh, ow, text, 1);
    free(px);
    free(rows);
    return st;
}
