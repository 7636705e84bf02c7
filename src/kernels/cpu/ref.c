/* ref.c - reference CPU kernels: the oracle. Loops are plain; sums are in
 * double so they sit as close to diffusers' float64 goldens as f32 storage
 * allows. OpenMP splits independent rows; no reduction crosses threads, so
 * results do not depend on the thread count. */
#include "base/base.h"
#include "kernels/kernels.h"
#include "kernels/cpu/host_ops.h"

#include <math.h>
#include <stdlib.h>

static double gelu_tanh(double v) {
    const double c = 0.79788456080286535588; /* sqrt(2 / pi) */
    return 0.5 * v * (1.0 + tanh(c * (v + 0.044715 * v * v * v)));
}

/* needs w->f32: the reference never reads packed layouts */
static void ref_linear(const float *x, const kk_weight *kw, const float *b, float *y, int64_t rows, int act) {
    const float *w = kw->f32;
    int64_t K = kw->K, M = kw->M;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t m = 0; m < M; m++) {
            const float *xr = x + r * K, *wm = w + m * K;
            double acc = b ? (double)b[m] : 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)xr[k] * (double)wm[k];
            y[r * M + m] = (float)(act == KK_ACT_GELU_TANH ? gelu_tanh(acc) : acc);
        }
}

static void ref_silu(const float *x, float *y, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        y[i] = (float)(v / (1.0 + exp(-v)));
    }
}

static void ref_gelu_tanh(const float *x, float *y, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = (float)gelu_tanh(x[i]);
}

static void ref_modulate(const float *x, const float *shift, const float *scale, float *y,
                         int64_t B, int64_t N, int64_t D);

static void ref_layernorm(const float *x, float *y, int64_t rows, int64_t D, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < D; i++) mean += xr[i];
        mean /= (double)D;
        for (int64_t i = 0; i < D; i++) var += (xr[i] - mean) * (xr[i] - mean);
        var /= (double)D;
        double inv = 1.0 / sqrt(var + (double)eps);
        for (int64_t i = 0; i < D; i++) y[r * D + i] = (float)((xr[i] - mean) * inv);
    }
}

/* the reference keeps the two steps: layernorm rounded to f32, then modulate */
static void ref_layernorm_modulate(const float *x, const float *shift, const float *scale, float *y,
                                   int64_t B, int64_t N, int64_t D, float eps) {
    ref_layernorm(x, y, B * N, D, eps);
    ref_modulate(y, shift, scale, y, B, N, D);
}

static void ref_rmsnorm_heads(const float *x, const float *w, float *y, int64_t rows, int64_t H,
                              int64_t Dh, float eps) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < H; h++) {
            const float *xh = x + (r * H + h) * Dh;
            float *yh = y + (r * H + h) * Dh;
            double ss = 0;
            for (int64_t i = 0; i < Dh; i++) ss += (double)xh[i] * xh[i];
            double inv = 1.0 / sqrt(ss / (double)Dh + (double)eps);
            for (int64_t i = 0; i < Dh; i++) yh[i] = (float)(xh[i] * inv * w[i]);
        }
}

static void ref_modulate(const float *x, const float *shift, const float *scale, float *y,
                         int64_t B, int64_t N, int64_t D) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t d = 0; d < D; d++) {
                int64_t i = (b * N + n) * D + d;
                y[i] = (float)((double)x[i] * (1.0 + (double)scale[b * D + d]) + shift[b * D + d]);
            }
}

static void ref_gate_add(const float *res, const float *gate, const float *v, float *y, int64_t B,
                         int64_t N, int64_t D) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t d = 0; d < D; d++) {
                int64_t i = (b * N + n) * D + d;
                y[i] = (float)((double)res[i] + (double)gate[b * D + d] * v[i]);
            }
}

static void ref_attention(const float *q, const float *k, const float *v, float *o, int64_t B,
                          int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, const float *rope) {
    const int64_t D = H * Dh;
    if (rope) { /* q and k rotated first (kk_rope), on copies */
        float *qr = malloc(sizeof(float) * (size_t)(B * Nq * D) + 1), *kr = malloc(sizeof(float) * (size_t)(B * Nk * D) + 1);
        if (qr && kr) {
            kk_rope(q, rope, qr, B, Nq, H, Dh);
            kk_rope(k, rope, kr, B, Nk, H, Dh);
            ref_attention(qr, kr, v, o, B, Nq, Nk, H, Dh, NULL);
        } else {
            kb_defer_failure(KILN_ERR_NOMEM, "reference attention: out of memory");
        }
        free(qr);
        free(kr);
        return;
    }
    const double scale = 1.0 / sqrt((double)Dh);
    kb_run *run = kb_run_current(); /* the forward's, for the worker threads' failures */
#pragma omp parallel
    {
        double *p = malloc(sizeof(double) * (size_t)(Nk > 0 ? Nk : 1));
        double *acc = malloc(sizeof(double) * (size_t)Dh);
        if (!p || !acc) kb_run_fail(run, KILN_ERR_NOMEM, "reference attention: out of memory");
#pragma omp for collapse(3) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Nq; i++) {
                    if (!p || !acc) continue; /* allocation failed: deferred above */
                    const float *qi = q + (b * Nq + i) * D + h * Dh;
                    double mx = -INFINITY, sum = 0;
                    for (int64_t j = 0; j < Nk; j++) {
                        const float *kj = k + (b * Nk + j) * D + h * Dh;
                        double s = 0;
                        for (int64_t d = 0; d < Dh; d++) s += (double)qi[d] * kj[d];
                        p[j] = s * scale;
                        if (p[j] > mx) mx = p[j];
                    }
                    for (int64_t j = 0; j < Nk; j++) {
                        p[j] = exp(p[j] - mx);
                        sum += p[j];
                    }
                    for (int64_t d = 0; d < Dh; d++) acc[d] = 0;
                    for (int64_t j = 0; j < Nk; j++) {
                        const float *vj = v + (b * Nk + j) * D + h * Dh;
                        for (int64_t d = 0; d < Dh; d++) acc[d] += p[j] * vj[d];
                    }
                    float *oi = o + (b * Nq + i) * D + h * Dh;
                    for (int64_t d = 0; d < Dh; d++) oi[d] = (float)(acc[d] / sum);
                }
        free(p);
        free(acc);
    }
}

/* the linear, then gate_add over its output (x is f32: the reference has no linear_io) */
static void ref_linear_gate_add(const void *x, int x_bf16, const kk_weight *w, const float *b, const float *res,
                                const float *gate, int64_t gate_ld, float *y, int64_t B, int64_t N) {
    kk_linear_then_gate_add(kk_reference(), x, x_bf16, w, b, res, gate, gate_ld, y, B, N);
}

static void ref_attention_joint(const float *qa, const float *ka, const float *va, const float *qb, const float *kb,
                                const float *vb, float *o, int64_t B, int64_t Na, int64_t Nb, int64_t H, int64_t Dh,
                                const float *rope) {
    float *work = malloc(sizeof(float) * 3 * (size_t)(B * (Na + Nb) * H * Dh) + 1);
    if (!work) {
        kb_defer_failure(KILN_ERR_NOMEM, "reference attention: out of memory");
        return;
    }
    kk_attention_joint_concat(kk_reference(), qa, ka, va, qb, kb, vb, o, B, Na, Nb, H, Dh, work, rope);
    free(work);
}

/* y [B,Cout,Ho,Wo] (nhwc: [B,Ho,Wo,Cout]): each output a double sum over
 * Cin x kh x kw in that order whatever the layout, positions outside x (the
 * padding) skipped */
static void ref_conv2d(const float *x, const kk_weight *wt, const float *b, const float *res, float *y, const kk_conv *p) {
    const float *w = wt->f32;
    if (!w) { /* a packed weight: the fast backend's (conv.c unpacks for its own fallback) */
        kb_defer_failure(KILN_ERR_UNSUPPORTED, "conv2d: the reference kernel needs f32 weights, not a packed layout");
        return;
    }
    const int64_t Cin = p->Cin, Cout = p->Cout, H = p->H, W = p->W, kh = p->kh, kw = p->kw, Ho = p->Ho, Wo = p->Wo;
    if (p->up2 && !p->nhwc) {
        kb_defer_failure(KILN_ERR_UNSUPPORTED, "conv2d: an up2 convolution is channels last only");
        return;
    }
    if (p->up2) { /* y [B,2H,2W,Cout]: output (2i+a, 2j+b) sums phase (a, b)'s 2x2 taps at x rows i+a-1.. */
#pragma omp parallel for collapse(3) schedule(static)
        for (int64_t n = 0; n < p->B; n++)
            for (int64_t oy = 0; oy < Ho; oy++)
                for (int64_t ox = 0; ox < Wo; ox++) {
                    int64_t a = oy & 1, bb = ox & 1, i = oy >> 1, j = ox >> 1;
                    for (int64_t co = 0; co < Cout; co++) {
                        const float *wp = w + ((a * 2 + bb) * Cout + co) * Cin * 4;
                        double acc = b ? (double)b[co] : 0.0;
                        for (int64_t ci = 0; ci < Cin; ci++)
                            for (int t = 0; t < 2; t++) {
                                int64_t iy = i + a - 1 + t;
                                if (iy < 0 || iy >= H) continue;
                                for (int u = 0; u < 2; u++) {
                                    int64_t ix = j + bb - 1 + u;
                                    if (ix >= 0 && ix < W)
                                        acc += (double)x[((n * H + iy) * W + ix) * Cin + ci] * (double)wp[ci * 4 + t * 2 + u];
                                }
                            }
                        size_t at = (size_t)(((n * Ho + oy) * Wo + ox) * Cout + co);
                        y[at] = (float)acc;
                        if (res) y[at] += res[at]; /* rounded, then added: an add op's bits */
                    }
                }
        return;
    }
    /* strides of a channel and a position in x and y */
    const int64_t xc = p->nhwc ? 1 : H * W, xs = p->nhwc ? Cin : 1, yc = p->nhwc ? 1 : Ho * Wo, ys = p->nhwc ? Cout : 1;
#pragma omp parallel for collapse(3) schedule(static)
    for (int64_t n = 0; n < p->B; n++)
        for (int64_t co = 0; co < Cout; co++)
            for (int64_t oy = 0; oy < Ho; oy++)
                for (int64_t ox = 0; ox < Wo; ox++) {
                    double acc = b ? (double)b[co] : 0.0;
                    int64_t iy0 = oy * p->stride - p->pad_lo, ix0 = ox * p->stride - p->pad_lo;
                    for (int64_t ci = 0; ci < Cin; ci++) {
                        const float *xn = x + n * Cin * H * W + ci * xc, *wc = w + (co * Cin + ci) * kh * kw;
                        for (int64_t ky = 0; ky < kh; ky++) {
                            int64_t iy = iy0 + ky;
                            if (iy < 0 || iy >= H) continue;
                            for (int64_t kx = 0; kx < kw; kx++) {
                                int64_t ix = ix0 + kx;
                                if (ix >= 0 && ix < W) acc += (double)xn[(iy * W + ix) * xs] * (double)wc[ky * kw + kx];
                            }
                        }
                    }
                    size_t at = (size_t)(n * Cout * Ho * Wo + co * yc + (oy * Wo + ox) * ys);
                    y[at] = (float)acc;
                    if (res) y[at] += res[at];
                }
}

/* the double-precision group norm; f32 rows in and out only */
static void ref_group_norm(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t C, int64_t S,
                           int64_t G, float eps, int silu, int nhwc, int x_bf16, int y_bf16) {
    if (x_bf16 || y_bf16) {
        kb_defer_failure(KILN_ERR_UNSUPPORTED, "group_norm: the reference kernel reads and writes f32 only");
        return;
    }
    kk_group_norm(x, w, b, y, B, C, S, G, eps, silu, nhwc);
}

static const kk_backend k_ref = {
    .name = "reference",
    .linear = ref_linear,
    .silu = ref_silu,
    .gelu_tanh = ref_gelu_tanh,
    .layernorm = ref_layernorm,
    .layernorm_modulate = ref_layernorm_modulate,
    .rmsnorm_heads = ref_rmsnorm_heads,
    .modulate = ref_modulate,
    .gate_add = ref_gate_add,
    .attention = ref_attention,
    .attention_joint = ref_attention_joint,
    .linear_gate_add = ref_linear_gate_add,
    .conv2d = ref_conv2d,
    .group_norm = ref_group_norm,
    .attention_ex = kk_attention_general,
    .unary = kk_unary,
    KK_HOST_OPS,
};

const kk_backend *kk_reference(void) { return &k_ref; }
