/* layout.c - the data-movement kernels every executor shares (eager, the
 * planned executor and compiled packages call these same functions, so
 * they compute bit for bit the same thing). */
#include "base/base.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Copies and adds of a few MiB are bound by memory bandwidth, which one
 * core cannot take alone: these kernels go over the threads, in pieces of
 * PIECE floats where they copy runs (none when small, where a thread team
 * costs more than it saves) */
#define PIECE ((int64_t)1 << 16)

/* x [B,C,H,W] -> y [B,(H/p)(W/p),C*p*p], feature order (c, py, px) to match a
 * conv weight [D,C,p,p] read as [D, C*p*p]; token order row-major (h, w). */
void kk_patchify(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W, int64_t p) {
    int64_t h = H / p, w = W / p;
#pragma omp parallel for collapse(2) schedule(static) if (B * C * H * W > 2 * PIECE)
    for (int64_t b = 0; b < B; b++)
        for (int64_t ty = 0; ty < h; ty++) {
            float *yr = y + (b * h + ty) * w * C * p * p;
            for (int64_t tx = 0; tx < w; tx++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t py = 0; py < p; py++)
                        for (int64_t px = 0; px < p; px++)
                            *yr++ = x[((b * C + c) * H + ty * p + py) * W + tx * p + px];
        }
}

/* x [B,h*w,p*p*C] (feature order py, px, c; cfirst: c, py, px) -> y
 * [B,C,h*p,w*p]: one output row (c, ty * p + py) at a time, written in
 * order, the tokens' rows read p*p*C floats apart (6.7x faster than a token
 * at a time, whose C values go to C planes: 0.043 against 0.288 ms for 16 x
 * 64 x 64) */
void kk_unpatchify(const float *x, float *y, int64_t B, int64_t p, int64_t h, int64_t w, int64_t C, int cfirst) {
    int64_t H = h * p, W = w * p, F = p * p * C;
    int64_t sc = cfirst ? p * p : 1, sy = cfirst ? p : p * C, sx = cfirst ? 1 : C; /* feature strides */
#pragma omp parallel for collapse(2) schedule(static) if (B * C * H * W > 2 * PIECE)
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t ty = 0; ty < h; ty++)
                for (int64_t py = 0; py < p; py++) {
                    const float *in = x + (b * h + ty) * w * F + py * sy + c * sc;
                    float *yr = y + ((b * C + c) * H + ty * p + py) * W;
                    for (int64_t tx = 0; tx < w; tx++)
                        for (int64_t px = 0; px < p; px++) yr[tx * p + px] = in[tx * F + px * sx];
                }
}

/* diffusers' get_timestep_embedding(flip_sin_to_cos=True, shift 0, max_period
 * 10000) of t * scale (Flux scales by 1000 first): [cos(a_i), sin(a_i)],
 * a_i = t f_i, in float32 as diffusers computes it whatever the model's
 * dtype: f_i = exp(float(-ln 10000) * i / half) rounded to f32, the product
 * rounded to f32 (at t = 1000 that rounding moves an angle by up to 6e-5,
 * which the references keep); sin and cos of that angle correctly rounded. */
void kk_timestep_proj(const float *t, float *y, int64_t B, int64_t dim, float scale) {
    int64_t half = dim / 2;
    const float nl = (float)-log(10000.0);
    for (int64_t b = 0; b < B; b++) {
        float tb = (float)((double)t[b] * (double)scale);
        for (int64_t i = 0; i < half; i++) {
            float e = (nl * (float)i) / (float)half;
            float f = (float)exp((double)e);
            double a = (double)(tb * f);
            y[b * dim + i] = (float)cos(a);
            y[b * dim + half + i] = (float)sin(a);
        }
    }
}

static void copy_par(float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 2 * PIECE)
    for (int64_t i = 0; i < n; i += PIECE) memcpy(y + i, x + i, sizeof(float) * (size_t)(n - i < PIECE ? n - i : PIECE));
}

/* centre crop of an M x M table [M*M, D] to h x w, as diffusers' cropped_pos_embed */
void kk_pos_crop(const float *table, float *y, int64_t M, int64_t h, int64_t w, int64_t D) {
    int64_t top = (M - h) / 2, left = (M - w) / 2;
#pragma omp parallel for schedule(static) if (h * w * D > 2 * PIECE)
    for (int64_t i = 0; i < h; i++)
        memcpy(y + i * w * D, table + ((top + i) * M + left) * D, sizeof(float) * (size_t)(w * D));
}

void kk_add_bcast(const float *a, const float *b, float *y, int64_t n, int64_t nb) {
    if (nb < 1) return;
    /* pieces that stay inside one row of b: no division per element, and the inner loop vectorizes */
    int64_t per = (nb + PIECE - 1) / PIECE, rows = (n + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (n > 2 * PIECE)
    for (int64_t t = 0; t < rows * per; t++) {
        int64_t off = t / per * nb, j0 = t % per * PIECE, len = n - off < nb ? n - off : nb;
        int64_t j1 = j0 + PIECE < len ? j0 + PIECE : len;
        for (int64_t j = j0; j < j1; j++) y[off + j] = a[off + j] + b[j];
    }
}

void kk_slice_rows(const float *x, float *y, int64_t rows, int64_t stride, int64_t off, int64_t len) {
    for (int64_t r = 0; r < rows; r++) copy_par(y + r * len, x + r * stride + off, len);
}

void kk_concat_rows(const float *a, int64_t na, const float *b, int64_t nb, float *y, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {
        copy_par(y + r * (na + nb), a + r * na, na);
        copy_par(y + r * (na + nb) + na, b + r * nb, nb);
    }
}

void kk_attention_joint_concat(const kk_backend *be, const float *qa, const float *ka, const float *va,
                               const float *qb, const float *kb, const float *vb, float *o, int64_t B, int64_t Na,
                               int64_t Nb, int64_t H, int64_t Dh, float *work, const float *rope) {
    int64_t D = H * Dh, n = B * (Na + Nb) * D;
    if (qb) kk_concat_rows(qa, Na * D, qb, Nb * D, work, B);
    kk_concat_rows(ka, Na * D, kb, Nb * D, work + n, B);
    kk_concat_rows(va, Na * D, vb, Nb * D, work + 2 * n, B);
    be->attention(qb ? work : qa, work + n, work + 2 * n, o, B, qb ? Na + Nb : Na, Na + Nb, H, Dh, rope);
}

void kk_linear_then_gate_add(const kk_backend *be, const void *x, int x_fmt, const kk_weight *w, const float *b,
                             const float *res, const float *gate, int64_t gate_ld, float *y, int64_t B, int64_t N) {
    if (x_fmt != KK_FMT_F32) be->linear_io(x, x_fmt, w, b, y, KK_FMT_F32, B * N, KK_ACT_NONE);
    else be->linear(x, w, b, y, B * N, KK_ACT_NONE);
    if (!gate) {
        kk_add_bcast(y, res, y, B * N * w->M, N * w->M);
        return;
    }
    for (int64_t i = 0; i < B; i++)
        be->gate_add(res + i * N * w->M, gate + i * gate_ld, y + i * N * w->M, y + i * N * w->M, 1, N, w->M);
}

void kk_block_rows(const uint16_t *x, int64_t rows, int64_t K, uint16_t *out) {
    int64_t R = (rows + 31) / 32 * 32, KP = (K + 31) / 32 * 32;
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < KP; k += 32) {
            uint16_t *d = out + kk_blocked_index(r, k, K);
            int64_t n = r < rows ? (K - k < 32 ? K - k : 32) : 0;
            if (n) memcpy(d, x + r * K + k, sizeof *d * (size_t)n);
            memset(d + n, 0, sizeof *d * (size_t)(32 - n));
        }
}

void kk_block_segments(const float *x, int64_t B, int64_t Na, int64_t Nb, int64_t K, uint16_t *out) {
    int64_t KP = (K + 31) / 32 * 32;
    for (int seg = 0; seg < 2; seg++) {
        int64_t n = seg ? Nb : Na, R = (B * n + 31) / 32 * 32;
        uint16_t *base = out + (seg ? kk_blocked_elems(B * Na, K) : 0);
#pragma omp parallel for schedule(static) if (B * n * K > 2 * PIECE)
        for (int64_t r = 0; r < R; r++) {
            /* row r of the segment: token r % n (after the first segment's) of batch entry r / n */
            const float *src = r < B * n ? x + ((r / n) * (Na + Nb) + (seg ? Na : 0) + r % n) * K : NULL;
            for (int64_t k = 0; k < KP; k += 32) {
                uint16_t *d = base + kk_blocked_index(r, k, K);
                for (int64_t j = 0; j < 32; j++) d[j] = src && k + j < K ? kt_f32_to_bf16(src[k + j]) : 0;
            }
        }
    }
}

void kk_unblock_rows(const uint16_t *in, int64_t rows, int64_t K, uint16_t *x) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < K; k += 32)
            memcpy(x + r * K + k, in + kk_blocked_index(r, k, K), sizeof *x * (size_t)(K - k < 32 ? K - k : 32));
}

/* ---- general forms (ops.def: add and mul with broadcasting, affine norms,
 * attention with a scale, bias and causal mask): f32, the same on every
 * backend; the families that need them call them where the fast forms
 * above do not apply ---- */

void kk_binary(int op, const float *a, const int64_t as[4], const float *b, const int64_t bs[4], float *y,
               const int64_t ys[4]) {
    /* an add whose b is a's trailing dims after leading 1s (a table, a
     * bias): kk_add_bcast's b[i % nb] form, the same sums */
    int d = 0, tail = op == KK_BIN_ADD;
    while (d < 4 && bs[d] == 1) d++;
    for (int k = d; k < 4 && tail; k++) tail = bs[k] == ys[k];
    for (int k = 0; k < 4 && tail; k++) tail = as[k] == ys[k];
    if (tail) {
        int64_t n = ys[0] * ys[1] * ys[2] * ys[3], nb = bs[0] * bs[1] * bs[2] * bs[3];
        kk_add_bcast(a, b, y, n, nb);
    } else {
        kk_binary_bcast(op, a, as, b, bs, y, ys);
    }
}

void kk_host_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}

void kk_binary_bcast(int op, const float *a, const int64_t as[4], const float *b, const int64_t bs[4], float *y,
                     const int64_t ys[4]) {
    /* shapes right-aligned to 4 dims; a dim of 1 in a or b is broadcast */
    int64_t ast[4], bst[4], sa = 1, sb = 1;
    for (int d = 3; d >= 0; d--) {
        ast[d] = as[d] == 1 ? 0 : sa;
        bst[d] = bs[d] == 1 ? 0 : sb;
        sa *= as[d];
        sb *= bs[d];
    }
#pragma omp parallel for collapse(2) schedule(static) if (ys[0] * ys[1] * ys[2] * ys[3] > 2 * PIECE)
    for (int64_t i0 = 0; i0 < ys[0]; i0++)
        for (int64_t i1 = 0; i1 < ys[1]; i1++)
            for (int64_t i2 = 0; i2 < ys[2]; i2++) {
                const float *ar = a + i0 * ast[0] + i1 * ast[1] + i2 * ast[2];
                const float *br = b + i0 * bst[0] + i1 * bst[1] + i2 * bst[2];
                float *yr = y + ((i0 * ys[1] + i1) * ys[2] + i2) * ys[3];
                for (int64_t i3 = 0; i3 < ys[3]; i3++) {
                    float u = ar[i3 * ast[3]], v = br[i3 * bst[3]];
                    yr[i3] = op == KK_BIN_MUL ? u * v : u + v;
                }
            }
}

void kk_affine_rows(float *y, const float *w, const float *b, int64_t rows, int64_t D) {
#pragma omp parallel for schedule(static) if (rows * D > 2 * PIECE)
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * D;
        if (w)
            for (int64_t j = 0; j < D; j++) yr[j] *= w[j];
        if (b)
            for (int64_t j = 0; j < D; j++) yr[j] += b[j];
    }
}

void kk_rmsnorm_rows(const float *x, const float *w, float *y, int64_t rows, int64_t D, float eps) {
#pragma omp parallel for schedule(static) if (rows * D > 2 * PIECE)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        double ss = 0;
        for (int64_t j = 0; j < D; j++) ss += (double)xr[j] * xr[j];
        /* the mean square in f32, as T5's and diffusers' RMS norms take it */
        float inv = 1.0f / sqrtf((float)(ss / (double)(D ? D : 1)) + eps);
        for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * inv * (w ? w[j] : 1.0f);
    }
}

void kk_attention_general(const float *q, const float *k, const float *v, const float *bias, const int64_t bs[4],
                          float *o, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, float scale,
                          int causal) {
    int64_t D = H * Dh;
    /* bias [Bb, Hb, Nq, Nk] with Bb in {1, B} and Hb in {1, H} */
    int64_t sbb = bias && bs[0] > 1 ? bs[1] * Nq * Nk : 0, sbh = bias && bs[1] > 1 ? Nq * Nk : 0;
#pragma omp parallel for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Nq; i++) {
                const float *qr = q + (b * Nq + i) * D + h * Dh;
                const float *br = bias ? bias + b * sbb + h * sbh + i * Nk : NULL;
                int64_t nk = causal && i + 1 < Nk ? i + 1 : Nk;
                double m = -INFINITY, sum = 0, acc[512];
                double *ac = Dh <= 512 ? acc : NULL;
                float *orow = o + (b * Nq + i) * D + h * Dh;
                if (!ac) { /* heads wider than 512: two passes, no scratch */
                    memset(orow, 0, sizeof(float) * (size_t)Dh);
                }
                for (int64_t d = 0; d < Dh && ac; d++) ac[d] = 0;
                for (int64_t j = 0; j < nk; j++) {
                    const float *kr = k + (b * Nk + j) * D + h * Dh;
                    double s = 0;
                    for (int64_t d = 0; d < Dh; d++) s += (double)qr[d] * kr[d];
                    s = s * scale + (br ? br[j] : 0);
                    if (s == -INFINITY) continue;
                    double mn = s > m ? s : m, c = exp(m - mn), e = exp(s - mn);
                    const float *vr = v + (b * Nk + j) * D + h * Dh;
                    sum = sum * c + e;
                    if (ac)
                        for (int64_t d = 0; d < Dh; d++) ac[d] = ac[d] * c + e * vr[d];
                    else
                        for (int64_t d = 0; d < Dh; d++) orow[d] = (float)(orow[d] * c + e * vr[d]);
                    m = mn;
                }
                for (int64_t d = 0; d < Dh; d++)
                    orow[d] = sum > 0 ? (float)((ac ? ac[d] : orow[d]) / sum) : 0.0f;
            }
}

void kk_unary(int op, const float *x, float *y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 2 * PIECE)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = op == KK_UN_GELU         ? (float)(0.5 * v * (1.0 + erf(v * 0.70710678118654752440)))
               : op == KK_UN_QUICK_GELU ? (float)(v / (1.0 + exp(-1.702 * (double)v)))
                                        : (v > 0 ? v : 0.0f); /* ReLU (T5 v1.0's feed-forward) */
    }
}

void kk_gather_rows(const float *table, int64_t V, int64_t D, const float *ids, int64_t n, float *y) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float f = ids[i];
        int64_t id = (int64_t)f;
        if (!(f >= 0) || (float)id != f || id >= V) {
            memset(y + i * D, 0, sizeof(float) * (size_t)D);
            if (!bad++) kb_defer_failure(KILN_ERR_RANGE, "gather: index %g at %lld is outside the table's %lld rows", (double)f,
                                         (long long)i, (long long)V);
            continue;
        }
        memcpy(y + i * D, table + id * D, sizeof(float) * (size_t)D);
    }
}

/* ---- the VAE's general kernels ---------------------------------------------- */

void kk_group_norm(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t C, int64_t S,
                   int64_t G, float eps, int silu, int nhwc) {
    int64_t cg = C / G, n = cg * S; /* channels per group, values per group */
    double *stat = malloc(sizeof(double) * 2 * (size_t)(B * G) + 1); /* mean, 1/sqrt(var + eps) per (b, g) */
    if (!stat) {
        kb_defer_failure(KILN_ERR_NOMEM, "group_norm: out of memory");
        return;
    }
    /* value (b, c, s) of either layout */
#define GN_AT(p, bb, c, s) (p)[nhwc ? ((bb) * S + (s)) * C + (c) : ((bb) * C + (c)) * S + (s)]
    /* two passes over each group (mean, then the centred sum of squares), in
     * double: what diffusers' float64 reference computes, without the
     * cancellation of a one-pass E[x^2] - E[x]^2; channel by channel, each
     * over every position, in both layouts (the same sums) */
#pragma omp parallel for schedule(static) if (B * C * S > 2 * PIECE)
    for (int64_t bg = 0; bg < B * G; bg++) {
        int64_t bb = bg / G, c0 = bg % G * cg;
        double mean = 0, var = 0;
        for (int64_t c = c0; c < c0 + cg; c++)
            for (int64_t i = 0; i < S; i++) mean += GN_AT(x, bb, c, i);
        mean /= (double)(n ? n : 1);
        for (int64_t c = c0; c < c0 + cg; c++)
            for (int64_t i = 0; i < S; i++) var += (GN_AT(x, bb, c, i) - mean) * (GN_AT(x, bb, c, i) - mean);
        var /= (double)(n ? n : 1);
        stat[2 * bg] = mean;
        stat[2 * bg + 1] = 1.0 / sqrt(var + (double)eps);
    }
#pragma omp parallel for schedule(static) if (B * C * S > 2 * PIECE)
    for (int64_t bc = 0; bc < B * C; bc++) {
        int64_t c = bc % C, bb = bc / C, bg = bb * G + c / cg;
        double mean = stat[2 * bg], inv = stat[2 * bg + 1], wc = w ? w[c] : 1.0, bias = b ? b[c] : 0.0;
        for (int64_t i = 0; i < S; i++) {
            double v = (GN_AT(x, bb, c, i) - mean) * inv * wc + bias;
            GN_AT(y, bb, c, i) = (float)(silu ? v / (1.0 + exp(-v)) : v);
        }
    }
#undef GN_AT
    free(stat);
}

void kk_conv_up2_weight(const float *w, int64_t Cout, int64_t Cin, float *out) {
    /* the kernel rows (or columns) tap t of parity a sums: [a][t] = {first, last} */
    static const int span[2][2][2] = {{{0, 0}, {1, 2}}, {{0, 1}, {2, 2}}};
    for (int a = 0; a < 2; a++)
        for (int bb = 0; bb < 2; bb++)
            for (int64_t co = 0; co < Cout; co++)
                for (int64_t ci = 0; ci < Cin; ci++) {
                    const float *k = w + (co * Cin + ci) * 9;
                    float *o = out + (((a * 2 + bb) * Cout + co) * Cin + ci) * 4;
                    for (int t = 0; t < 2; t++)
                        for (int u = 0; u < 2; u++) {
                            double acc = 0;
                            for (int ky = span[a][t][0]; ky <= span[a][t][1]; ky++)
                                for (int kx = span[bb][u][0]; kx <= span[bb][u][1]; kx++) acc += k[ky * 3 + kx];
                            o[t * 2 + u] = (float)acc;
                        }
                }
}

void kk_upsample_nearest(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W, int64_t f, int nhwc) {
    if (nhwc) { /* each position's C channels copied f x f times */
#pragma omp parallel for collapse(2) schedule(static) if (B * C * H * W * f * f > 2 * PIECE)
        for (int64_t bb = 0; bb < B; bb++)
            for (int64_t r = 0; r < H; r++) {
                const float *xr = x + (bb * H + r) * W * C;
                float *y0 = y + (bb * H * f + r * f) * W * f * C;
                for (int64_t c = 0; c < W; c++)
                    for (int64_t k = 0; k < f; k++) memcpy(y0 + (c * f + k) * C, xr + c * C, sizeof(float) * (size_t)C);
                for (int64_t k = 1; k < f; k++) memcpy(y0 + k * W * f * C, y0, sizeof(float) * (size_t)(W * f * C));
            }
        return;
    }
#pragma omp parallel for collapse(2) schedule(static) if (B * C * H * W * f * f > 2 * PIECE)
    for (int64_t bc = 0; bc < B * C; bc++)
        for (int64_t r = 0; r < H; r++) {
            const float *xr = x + (bc * H + r) * W;
            float *y0 = y + (bc * H * f + r * f) * W * f;
            for (int64_t c = 0; c < W; c++)
                for (int64_t k = 0; k < f; k++) y0[c * f + k] = xr[c];
            for (int64_t k = 1; k < f; k++) memcpy(y0 + k * W * f, y0, sizeof(float) * (size_t)(W * f));
        }
}

void kk_logvar_std(const float *x, float *y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 2 * PIECE)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i] < -30.0f ? -30.0 : x[i] > 20.0f ? 20.0 : (double)x[i];
        y[i] = (float)exp(0.5 * v);
    }
}

/* the pooled token of a text encoder (ops.def: select_token) */
void kk_select_token(const float *x, const float *ids, float *y, int64_t B, int64_t T, int64_t D, int64_t eos) {
    for (int64_t b = 0; b < B; b++) {
        const float *r = ids + b * T;
        int64_t t = 0;
        if (eos < 0) {
            for (int64_t j = 1; j < T; j++)
                if (r[j] > r[t]) t = j; /* strictly larger: the first maximum stays */
        } else {
            for (int64_t j = 0; j < T; j++)
                if (r[j] == (float)eos) {
                    t = j;
                    break;
                }
        }
        memcpy(y + b * D, x + (b * T + t) * D, sizeof(float) * (size_t)D);
    }
}

/* ---- T5's relative position bias ----------------------------------------- */

int64_t kk_rel_pos_bucket(int64_t rel, int64_t num_buckets, int64_t max_distance, int bidirectional) {
    int64_t nb = num_buckets, bucket = 0, n;
    if (bidirectional) {
        nb /= 2;
        if (rel > 0) bucket = nb;
        n = rel < 0 ? -rel : rel;
    } else {
        n = rel < 0 ? -rel : 0;
    }
    int64_t max_exact = nb / 2;
    if (n < max_exact) return bucket + n;
    /* torch: log(n.float() / max_exact) / math.log(max_distance / max_exact)
     * * (nb - max_exact), each step a float32 op (the python double divisor
     * rounded to float), then .to(long): truncation toward zero */
    float r = (float)n / (float)max_exact;
    float v = logf(r) / (float)log((double)max_distance / (double)max_exact) * (float)(nb - max_exact);
    int64_t large = max_exact + (v < (float)nb ? (int64_t)v : nb); /* (capped below; no overflow of the cast) */
    return bucket + (large < nb - 1 ? large : nb - 1);
}

void kk_rel_pos_bias(const float *table, int64_t num_buckets, int64_t H, int64_t Nq, int64_t Nk, int64_t max_distance,
                     int bidirectional, float *y) {
    /* the bucket depends on j - i alone: Nq + Nk - 1 of them, then each
     * (head, query) row written in order (one head's writes were Nq * Nk
     * floats apart, 2.4% of a T5-XXL-width encode at 256 tokens) */
    int64_t nr = Nq + Nk - 1;
    int64_t *bk = nr > 0 ? malloc(sizeof(int64_t) * (size_t)nr) : NULL;
    if (!bk) { /* out of memory (or nothing to write): bucket by bucket */
#pragma omp parallel for schedule(static) if (Nq * Nk * H > 2 * PIECE)
        for (int64_t i = 0; i < Nq; i++)
            for (int64_t j = 0; j < Nk; j++) {
                const float *row = table + kk_rel_pos_bucket(j - i, num_buckets, max_distance, bidirectional) * H;
                for (int64_t h = 0; h < H; h++) y[(h * Nq + i) * Nk + j] = row[h];
            }
        return;
    }
    for (int64_t r = 0; r < nr; r++) bk[r] = kk_rel_pos_bucket(r - (Nq - 1), num_buckets, max_distance, bidirectional);
#pragma omp parallel for collapse(2) schedule(static) if (Nq * Nk * H > 2 * PIECE)
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < Nq; i++) {
            float *yr = y + (h * Nq + i) * Nk;
            const int64_t *br = bk + (Nq - 1 - i); /* br[j]: the bucket of j - i */
            for (int64_t j = 0; j < Nk; j++) yr[j] = table[br[j] * H + h];
        }
    free(bk);
}

void kk_rope_table(float *y, int64_t T, int64_t h, int64_t w, const int64_t axes[3], float theta) {
    int64_t Dh = axes[0] + axes[1] + axes[2], N = T + h * w;
    for (int64_t n = 0; n < N; n++) {
        int64_t k = n - T, id[3] = {0, k >= 0 ? k / w : 0, k >= 0 ? k % w : 0};
        float *row = y + n * Dh;
        for (int a = 0, i = 0; a < 3; a++)
            for (int64_t j = 0; j < axes[a] / 2; j++, i++) {
                double ang = (double)id[a] / pow((double)theta, (double)(2 * j) / (double)axes[a]);
                row[2 * i] = (float)cos(ang);
                row[2 * i + 1] = (float)sin(ang);
            }
    }
}

void kk_rope(const float *x, const float *table, float *y, int64_t B, int64_t N, int64_t H, int64_t Dh) {
#pragma omp parallel for collapse(2) schedule(static) if (B * N * H * Dh > 2 * PIECE)
    for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++) {
            const float *t = table + n * Dh;
            for (int64_t hd = 0; hd < H; hd++) {
                const float *xr = x + ((b * N + n) * H + hd) * Dh;
                kk_rope_row(xr, t, y + ((b * N + n) * H + hd) * Dh, Dh);
            }
        }
}
