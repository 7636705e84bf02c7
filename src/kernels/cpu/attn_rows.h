/* attn_rows.h - where the fused attention kernels (attn_amx.c, attn_f16.c, attn_bf16.c)
 * find their token rows and put their outputs, in every activation format. */
#ifndef KILN_ATTN_ROWS_H
#define KILN_ATTN_ROWS_H

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- shared by the fused attention kernels (attn_amx.c, attn_f16.c: head size 64; attn_bf16.c) ---- */

/* Where the token rows of q, k or v lie: token i of batch b is row
 * b * na + i of a for i < na, else row b * nb + i - na of b (attention over
 * two token segments, the image and context streams, read in place); the
 * elements are f32, or bf16 (esz 2) */
typedef struct kk_rows_of {
    const void *a, *b;
    int64_t na, nb;
    int esz;
} kk_rows_of;

static inline const char *kk_row_of(const kk_rows_of *r, int64_t batch, int64_t i, int64_t D) {
    int64_t row;
    return (const char *)(kk_segment_row(batch, i, r->na, r->nb, &row) ? r->b : r->a) + row * D * r->esz;
}

/* elements [j, j+16) of a row as f32 (bf16 widened: exact) */
AMX_FN static inline __m512 kk_load16(const kk_rows_of *r, const char *row, int64_t j) {
    if (r->esz == 2)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * j))), 16));
    return _mm512_loadu_ps((const float *)row + j);
}

/* r[j] lane i <- r[i] lane j, for 32-bit lanes */
AMX_FN static inline void kk_transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(u[i + j], u[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_i32x4(u[i + j], u[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

/* Where the output goes: f32 or bf16 rows [B, Na+Nb, D] (fmt KK_FMT_F32,
 * KK_FMT_BF16), or KK_FMT_BLOCKED by segment as kk_block_segments lays it
 * out, so that the GEMMs after read each segment as it is (Nb: the second
 * segment's queries, 0 when only the first asks). */
typedef struct kk_out_of {
    void *o;
    int fmt;
    int64_t B, Na, Nb, D;
} kk_out_of;

/* the 32 outputs from column col (a multiple of 32) for query i of batch entry b */
static inline void *kk_out_col(const kk_out_of *w, int64_t b, int64_t i, int64_t col) {
    if (w->fmt != KK_FMT_BLOCKED)
        return (char *)w->o + ((b * (w->Na + w->Nb) + i) * w->D + col) * (w->fmt == KK_FMT_BF16 ? 2 : 4);
    int64_t r;
    int second = kk_segment_row(b, i, w->Na, w->Nb, &r);
    return (uint16_t *)w->o + (second ? kk_blocked_elems(w->B * w->Na, w->D) : 0) + kk_blocked_index(r, col, w->D);
}

/* the 32 outputs from dim c of head h (of 64 dims) for query i of batch entry b */
static inline void *kk_out_at(const kk_out_of *w, int64_t b, int64_t i, int64_t h, int64_t c) {
    return kk_out_col(w, b, i, h * 64 + c);
}


/* blocked output (KK_FMT_BLOCKED): the padding rows of each segment's last
 * block get zeros, as every blocked writer leaves them */
static inline void kk_out_zero_padding(const kk_out_of *w) {
    if (w->fmt != KK_FMT_BLOCKED) return;
    for (int seg = 0; seg < 2; seg++) {
        int64_t rows = w->B * (seg ? w->Nb : w->Na), pad = (rows + 31) / 32 * 32;
        uint16_t *base = (uint16_t *)w->o + (seg ? kk_blocked_elems(w->B * w->Na, w->D) : 0);
        for (int64_t r = rows; r < pad; r++)
            for (int64_t c = 0; c < w->D; c += 32) memset(base + kk_blocked_index(r, c, w->D), 0, 64);
    }
}

#endif
