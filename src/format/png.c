/* png.c - latent previews as PNG through libpng, written to memory first so
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

kiln_status kf_write_latent_png(const char *path, const float *latent, int C, int H, int W) {
    if (C < 1 || H < 1 || W < 1) return kb_fail(KILN_ERR_INVALID_ARG, "png: empty latent");
    int scale = W >= 256 ? 1 : (256 + W - 1) / W;
    if (scale > 64) scale = 64;
    int ow = W * scale, oh = H * scale;
    float lo[3], hi[3];
    for (int ch = 0; ch < 3; ch++) {
        const float *src = latent + (size_t)(ch < C ? ch : C - 1) * (size_t)H * (size_t)W;
        lo[ch] = hi[ch] = src[0];
        for (size_t i = 0; i < (size_t)H * (size_t)W; i++) {
            if (src[i] < lo[ch]) lo[ch] = src[i];
            if (src[i] > hi[ch]) hi[ch] = src[i];
        }
    }
    uint8_t *rows = malloc((size_t)ow * 3 * (size_t)oh);
    membuf m = {0};
    if (!rows) return kb_fail(KILN_ERR_NOMEM, "png: out of memory");
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++)
            for (int ch = 0; ch < 3; ch++) {
                const float *src = latent + (size_t)(ch < C ? ch : C - 1) * (size_t)H * (size_t)W;
                float v = src[(size_t)(y / scale) * (size_t)W + (size_t)(x / scale)];
                float r = hi[ch] > lo[ch] ? (v - lo[ch]) / (hi[ch] - lo[ch]) : 0.5f;
                if (!(r >= 0)) r = 0; /* NaN too */
                if (r > 1) r = 1;
                rows[((size_t)y * (size_t)ow + (size_t)x) * 3 + (size_t)ch] = (uint8_t)(r * 255.0f + 0.5f);
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
        png_set_IHDR(p, info, (png_uint_32)ow, (png_uint_32)oh, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
        png_write_info(p, info);
        for (int y = 0; y < oh; y++) png_write_row(p, rows + (size_t)y * (size_t)ow * 3);
        png_write_end(p, NULL);
    }
    if (p) png_destroy_write_struct(&p, info ? &info : NULL);
    free(rows);
    if (!st && m.failed) st = kb_fail(KILN_ERR_NOMEM, "png: out of memory encoding %s", path);
    if (!st) st = kb_write_file_atomic(path, m.buf, m.len);
    free(m.buf);
    return st;
}
