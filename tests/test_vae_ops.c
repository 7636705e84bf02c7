/* test_vae_ops.c - the VAE's ops (ops.def: conv2d, group_norm,
 * upsample_nearest, logvar_std): against plain loops in double, through eager, the
 * planned executor and a compiled package with a symbolic dimension, bit
 * for bit alike across the three; the fast backend's convolution (oneDNN)
 * against the reference kernel on the geometries the VAE has (3x3 stride 1
 * pad 1, 1x1, 3x3 stride 2 padded 0 / 1 as diffusers' downsample), in f32
 * and bf16; its group norm against the double-precision form; the
 * encoder's logvar_std; and the builders' refusals. */
#include "base/base.h"
#include "compile/compile.h"
#include "graph/graph.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "test.h"

#include <math.h>

enum { B = 2, C = 8, W = 7, C1 = 6, C2 = 5, C3 = 4 };

/* the inputs: x [B,C,h,W], the group norm's gw, gb [C], conv weights
 * w3 [C1,C,3,3] b3 [C1], w1 [C2,C1,1,1] b1 [C2], ws [C3,C2,3,3] (no bias) */
enum { IN_X, IN_GW, IN_GB, IN_W3, IN_B3, IN_W1, IN_B1, IN_WS, N_IN };
static const int64_t k_shapes[N_IN][4] = {{B, C, 0, W}, {C}, {C}, {C1, C, 3, 3}, {C1}, {C2, C1, 1, 1}, {C2}, {C3, C2, 3, 3}};
static const int k_nd[N_IN] = {4, 1, 1, 4, 1, 4, 1, 4};

static size_t numel(int k, int64_t h) {
    size_t n = 1;
    for (int d = 0; d < k_nd[k]; d++) n *= (size_t)(d == 2 && k == IN_X ? h : k_shapes[k][d]);
    return n;
}

/*   a  = silu(group_norm(x, 4 groups) * gw + gb)
 *   c1 = conv3x3(a, pad 1) ; u = upsample2(c1) ; c2 = conv1x1(u)
 *   c3 = conv3x3 stride 2 (pad 0 top/left, 1 bottom/right) of c2, no bias
 *   out = group_norm(c3, 2 groups, no affine) */
/* the weights (every input but x) are the graph's weights, by name: a
 * package takes at most 4 inputs; g_in points at this size's data */
static const char *k_names[N_IN] = {"x", "gw", "gb", "w3", "b3", "w1", "b1", "ws"};
static float *g_in[N_IN];
/* the conv weights' kernel views (f32 row-major, M = Cout, K = Cin kh kw): what
 * conv2d reads, as a model's unpacked weight */
static kk_weight g_kw[N_IN];

static const kk_weight *view_of(int k) {
    if (k_nd[k] != 4) return NULL;
    g_kw[k] = (kk_weight){.M = k_shapes[k][0], .K = k_shapes[k][1] * k_shapes[k][2] * k_shapes[k][3], .f32 = g_in[k],
                          .packed_dtype = KILN_F32};
    return &g_kw[k];
}

static int find(const char *name) {
    for (int k = 1; k < N_IN; k++)
        if (!strcmp(name, k_names[k])) return k;
    return -1;
}

static int resolve(void *user, const char *name, int *ndim, int64_t shape[4], const float **data, const kk_weight **kw) {
    (void)user;
    int k = find(name);
    if (k < 0) return 0;
    *ndim = k_nd[k];
    memcpy(shape, k_shapes[k], sizeof k_shapes[k]);
    *data = g_in[k];
    *kw = view_of(k);
    return 1;
}

static int bind(void *user, const char *name, kx_bound *b) {
    (void)user;
    int k = find(name);
    if (k < 0) return 0;
    memset(b, 0, sizeof *b);
    b->ndim = k_nd[k];
    memcpy(b->shape, k_shapes[k], sizeof b->shape);
    b->data = g_in[k];
    b->kw = view_of(k);
    b->dtype = KILN_F32;
    b->layout = "rowmajor";
    return 1;
}

/* the layout the graph's ops run in (KG_NCHW, KG_NHWC: x and the output
 * stay [B,C,H,W], turned channels last and back with patchify, reshape and
 * unpatchify as the VAE does) */
static int g_layout;

static kiln_status build(void *user, const int64_t *s, kg_graph *g) {
    (void)user;
    int64_t h = s[0], L = g_layout;
    kg_init(g, resolve, NULL);
    kg_id in[N_IN];
    in[IN_X] = kg_input(g, "x", 4, (int64_t[]){B, C, h, W});
    for (int k = 1; k < N_IN; k++) in[k] = kg_weight(g, k_names[k]);
    kg_id x = L == KG_NHWC ? kg_reshape(g, kg_patchify(g, in[IN_X], 1), 4, (int64_t[]){B, h, W, C}) : in[IN_X];
    kg_id a = kg_group_norm(g, x, in[IN_GW], in[IN_GB], 4, 1e-6f, 1, L);
    kg_id c1 = kg_conv2d(g, a, in[IN_W3], in[IN_B3], 1, 1, 1, L);
    kg_id c2 = kg_conv2d(g, kg_upsample_nearest(g, c1, 2, L), in[IN_W1], in[IN_B1], 1, 0, 0, L);
    kg_id c3 = kg_conv2d(g, c2, in[IN_WS], -1, 2, 0, 1, L);
    kg_id y = kg_group_norm(g, c3, -1, -1, 2, 1e-5f, 0, L);
    if (L == KG_NHWC && !g->status) {
        const int64_t *ys = g->nodes[y].shape; /* [B, Ho, Wo, C3] */
        y = kg_unpatchify(g, kg_reshape(g, y, 3, (int64_t[]){B, ys[1] * ys[2], C3}), 1, ys[1], ys[2], C3);
    }
    kg_mark_output(g, y);
    return g->status;
}

/* ---- the same in plain loops, double -------------------------------------------- */

static void conv_d(const double *x, int64_t Cin, int64_t H, int64_t Wd, const float *w, const float *b, int64_t Cout,
                   int64_t k, int64_t stride, int64_t lo, int64_t hi, double *y, int64_t *Ho, int64_t *Wo) {
    *Ho = (H + lo + hi - k) / stride + 1;
    *Wo = (Wd + lo + hi - k) / stride + 1;
    for (int64_t n = 0; n < B; n++)
        for (int64_t co = 0; co < Cout; co++)
            for (int64_t oy = 0; oy < *Ho; oy++)
                for (int64_t ox = 0; ox < *Wo; ox++) {
                    double acc = b ? b[co] : 0;
                    for (int64_t ci = 0; ci < Cin; ci++)
                        for (int64_t ky = 0; ky < k; ky++)
                            for (int64_t kx = 0; kx < k; kx++) {
                                int64_t iy = oy * stride - lo + ky, ix = ox * stride - lo + kx;
                                if (iy >= 0 && iy < H && ix >= 0 && ix < Wd)
                                    acc += x[((n * Cin + ci) * H + iy) * Wd + ix] * w[((co * Cin + ci) * k + ky) * k + kx];
                            }
                    y[((n * Cout + co) * *Ho + oy) * *Wo + ox] = acc;
                }
}

static void group_norm_d(double *x, int64_t Ch, int64_t S, int64_t G, double eps, const float *w, const float *b,
                         int silu) {
    int64_t n = Ch / G * S;
    for (int64_t bg = 0; bg < B * G; bg++) {
        double *v = x + bg * n, m = 0, var = 0;
        for (int64_t i = 0; i < n; i++) m += v[i];
        m /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (v[i] - m) * (v[i] - m);
        var /= (double)n;
        for (int64_t i = 0; i < n; i++) {
            int64_t c = (bg % G) * (Ch / G) + i / S;
            double t = (v[i] - m) / sqrt(var + eps) * (w ? w[c] : 1) + (b ? b[c] : 0);
            v[i] = silu ? t / (1 + exp(-t)) : t;
        }
    }
}

/* out [B, C3, Ho, Wo]; returns its element count */
static size_t direct(int64_t h, const float *const *in, double **out) {
    size_t nx = numel(IN_X, h);
    double *a = malloc(sizeof(double) * nx);
    for (size_t i = 0; i < nx; i++) a[i] = in[IN_X][i];
    group_norm_d(a, C, h * W, 4, 1e-6, in[IN_GW], in[IN_GB], 1);
    int64_t H1, W1, H2, W2, H3, W3;
    double *c1 = malloc(sizeof(double) * (size_t)(B * C1 * h * W));
    conv_d(a, C, h, W, in[IN_W3], in[IN_B3], C1, 3, 1, 1, 1, c1, &H1, &W1);
    double *u = malloc(sizeof(double) * (size_t)(B * C1 * 4 * H1 * W1));
    for (int64_t bc = 0; bc < B * C1; bc++)
        for (int64_t y = 0; y < 2 * H1; y++)
            for (int64_t x = 0; x < 2 * W1; x++) u[(bc * 2 * H1 + y) * 2 * W1 + x] = c1[(bc * H1 + y / 2) * W1 + x / 2];
    double *c2 = malloc(sizeof(double) * (size_t)(B * C2 * 4 * H1 * W1));
    conv_d(u, C1, 2 * H1, 2 * W1, in[IN_W1], in[IN_B1], C2, 1, 1, 0, 0, c2, &H2, &W2);
    double *c3 = malloc(sizeof(double) * (size_t)(B * C3 * H2 * W2));
    conv_d(c2, C2, H2, W2, in[IN_WS], NULL, C3, 3, 2, 0, 1, c3, &H3, &W3);
    group_norm_d(c3, C3, H3 * W3, 2, 1e-5, NULL, NULL, 0);
    free(a), free(c1), free(u), free(c2);
    *out = c3;
    return (size_t)(B * C3 * H3 * W3);
}

static double rel_err_d(const float *got, const double *want, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        e += (got[i] - want[i]) * (got[i] - want[i]);
        r += want[i] * want[i];
    }
    return sqrt(e / (r > 0 ? r : 1));
}

/* the graph in g_layout through every path; ref_out[k] (NULL: not kept)
 * gets the reference backend's eager output of size k */
static void every_path(float **ref_out) {
    const int64_t sizes[] = {3, 6, 11};
    char dir[256];
    test_tmpdir(dir, sizeof dir, g_layout == KG_NHWC ? "vae-ops-nhwc" : "vae-ops");
    kx_compile_req req = {.build = build, .weight = bind, .nsym = 1, .regional = 1, .root = dir,
                          .family = g_layout == KG_NHWC ? "vae-ops-test-nhwc" : "vae-ops-test", .dtype = "f32",
                          .quant = "none"};
    req.sym[0] = (kx_sym){"h", 2, 12};
    kx_compile_info info;
    for (int i = 1; i < N_IN; i++) { /* the weights, the same for every size */
        g_in[i] = malloc(sizeof(float) * numel(i, 0));
        kiln_noise(10 + (uint64_t)i, g_in[i], numel(i, 0));
    }
    for (size_t i = 0; i < C; i++) g_in[IN_GW][i] = 1 + 0.2f * g_in[IN_GW][i]; /* a norm's weight near 1 */
    CHECK_OK(kx_compile(&req, &info));
    kx_package *pkg = NULL;
    CHECK_OK(kx_package_open(info.path, &pkg));
    const kk_backend *bes[2] = {kk_reference(), kk_fast(KILN_F32)};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t h = sizes[k], s[1] = {h};
        float **in = g_in;
        in[IN_X] = malloc(sizeof(float) * numel(IN_X, h));
        kiln_noise(1 + (uint64_t)h, in[IN_X], numel(IN_X, h));
        double *want;
        size_t n = direct(h, (const float *const *)in, &want);
        float *out[4];
        for (int p = 0; p < 4; p++) out[p] = calloc(n, sizeof(float));
        for (int bi = 0; bi < 2; bi++) {
            if (!bes[bi]) continue;
            kg_graph g;
            CHECK_OK(build(NULL, s, &g));
            CHECK(kg_numel(&g.nodes[g.outputs[0]]) == (int64_t)n);
            CHECK_OK(kg_run_eager(&g, bes[bi], (const float *const *)in, &out[bi]));
            double e = rel_err_d(out[bi], want, n);
            fprintf(stderr, "  %s, h %lld, %s: relative L2 error %.3g\n", g_layout == KG_NHWC ? "nhwc" : "nchw",
                    (long long)h, bes[bi]->name, e);
            CHECK_MSG(e < 1e-5, "h %lld, %s backend: error %.3g", (long long)h, bes[bi]->name, e);
            kg_free(&g);
        }
        /* planned and compiled: the fast backend's graph, bit for bit its eager run */
        const kk_backend *be = bes[1] ? bes[1] : bes[0];
        kg_graph g;
        CHECK_OK(build(NULL, s, &g));
        kx_plan plan;
        CHECK_OK(kx_plan_graph(&g, &plan));
        void *arena = kb_alloc_aligned(plan.arena_bytes + 64);
        CHECK_OK(kx_run_planned(&g, &plan, be, arena, NULL, (const float *const *)in, &out[2]));
        int64_t shapes[1][4] = {{B, C, h, W}}, sol[1];
        CHECK_OK(kx_package_solve(pkg, 1, (const int64_t(*)[4])shapes, sol));
        CHECK(sol[0] == h);
        CHECK_OK(kx_package_load(pkg, be, NULL, bind, NULL));
        CHECK_OK(kx_package_run(pkg, sol, (const float *const *)in, &out[3]));
        int eager = be == bes[1] ? 1 : 0;
        CHECK_MSG(!memcmp(out[eager], out[2], sizeof(float) * n), "h %lld: planned differs from eager", (long long)h);
        CHECK_MSG(!memcmp(out[2], out[3], sizeof(float) * n), "h %lld: package differs from planned", (long long)h);
        kb_free_aligned(arena);
        kx_plan_free(&plan);
        kg_free(&g);
        if (ref_out) ref_out[k] = out[0], out[0] = NULL;
        for (int p = 0; p < 4; p++) free(out[p]);
        free(in[IN_X]);
        free(want);
    }
    for (int i = 1; i < N_IN; i++) free(g_in[i]);
    kx_package_close(pkg);
    test_rmrf(dir);
}

/* both layouts on every path; the reference kernels sum in the same order
 * in both, so their outputs are the same bits */
TEST(vae_ops_match_loops_on_every_path) {
    float *nchw[3] = {NULL}, *nhwc[3] = {NULL};
    g_layout = KG_NCHW;
    every_path(nchw);
    g_layout = KG_NHWC;
    every_path(nhwc);
    g_layout = KG_NCHW;
    const int64_t sizes[] = {3, 6, 11};
    for (int k = 0; k < 3; k++) {
        kg_graph g;
        CHECK_OK(build(NULL, &sizes[k], &g));
        size_t n = (size_t)kg_numel(&g.nodes[g.outputs[0]]);
        kg_free(&g);
        CHECK_MSG(nchw[k] && nhwc[k] && !memcmp(nchw[k], nhwc[k], sizeof(float) * n),
                  "h %lld: the reference's channels-last result differs from its channels-first one", (long long)sizes[k]);
        free(nchw[k]), free(nhwc[k]);
    }
}

/* x channels last -> conv A (3x3) -> a group norm and a 1x1 conv B, both outputs */
static kiln_status build_shared(void *user, const int64_t *s, kg_graph *g) {
    (void)user;
    int64_t h = s[0];
    kg_init(g, resolve, NULL);
    kg_id x = kg_input(g, "x", 4, (int64_t[]){B, C, h, W}), w3 = kg_weight(g, "w3"), b3 = kg_weight(g, "b3");
    kg_id w1 = kg_weight(g, "w1"), b1 = kg_weight(g, "b1");
    kg_id xl = kg_reshape(g, kg_patchify(g, x, 1), 4, (int64_t[]){B, h, W, C});
    kg_id a = kg_conv2d(g, xl, w3, b3, 1, 1, 1, KG_NHWC);
    kg_mark_output(g, kg_group_norm(g, a, -1, -1, 3, 1e-6f, 1, KG_NHWC));
    kg_mark_output(g, kg_conv2d(g, a, w1, b1, 1, 0, 0, KG_NHWC));
    return g->status;
}

/* the bf16 backend's formats, with a convolution that takes bf16 on any weight */
static const kk_backend *g_f16;
static int any_weight(int slot, int fmt, const kk_weight *w) {
    return slot == KK_SLOT_CONV2D && fmt == KK_FMT_BF16 ? 1 : g_f16->supports(slot, fmt, w);
}

/* kg_plan_bf16's convolution outputs: bf16 rows where a conv reads one as x
 * and every other reader is a channels-last group norm (build_shared's A;
 * build's 1x1 conv, which only the strided conv reads), f32 where a norm
 * alone (build's strided conv) or another op (build's first conv, read by
 * the upsample) reads it, or it is an output; the planned run in those
 * formats within bf16 rounding of eager's f32. The backend is the bf16 one
 * with a convolution that takes bf16 on any weight (the test's are f32
 * row-major, which its convolutions read too). */
TEST(plan_bf16_conv_outputs) {
    const kk_backend *f16 = kk_fast(KILN_BF16);
    if (!f16 || !kk_supports(f16, KK_SLOT_CONV2D, KK_FMT_BF16, NULL)) {
        fprintf(stderr, "  no fast bf16 backend on this machine: skipped\n");
        return;
    }
    kk_backend be = *f16;
    g_f16 = f16;
    be.supports = any_weight;
    const int64_t h = 6;
    for (int i = 0; i < N_IN; i++) {
        g_in[i] = malloc(sizeof(float) * numel(i, h));
        kiln_noise(20 + (uint64_t)i, g_in[i], numel(i, h));
    }
    g_layout = KG_NHWC;
    kiln_status (*builds[2])(void *, const int64_t *, kg_graph *) = {build, build_shared};
    /* the convs in graph order: the formats wanted */
    const int want[2][3] = {{KK_FMT_F32, KK_FMT_BF16, KK_FMT_F32}, {KK_FMT_BF16, KK_FMT_F32, -1}};
    for (int v = 0; v < 2; v++) {
        kg_graph g0, g;
        CHECK_OK(builds[v](NULL, &h, &g0));
        CHECK_OK(builds[v](NULL, &h, &g));
        kg_fuse(&g);
        kg_plan_bf16(&g, &be);
        int k = 0;
        for (int i = 0; i < g.n; i++) {
            if (g.nodes[i].op != KG_CONV2D) continue;
            CHECK_MSG(k < 3 && g.nodes[i].out_bf16 == want[v][k], "graph %d, conv %d: format %d, wanted %d", v, k,
                      g.nodes[i].out_bf16, k < 3 ? want[v][k] : -1);
            k++;
        }
        CHECK(k == (v ? 2 : 3));
        float *o0[2] = {NULL}, *o1[2] = {NULL};
        for (int o = 0; o < g.n_outputs; o++) {
            size_t n = (size_t)kg_numel(&g.nodes[g.outputs[o]]);
            o0[o] = calloc(n, sizeof(float)), o1[o] = calloc(n, sizeof(float));
        }
        CHECK_OK(kg_run_eager(&g0, kk_fast(KILN_F32), (const float *const *)g_in, o0));
        kx_plan plan;
        CHECK_OK(kx_plan_graph(&g, &plan));
        void *arena = kb_alloc_aligned(plan.arena_bytes + 64);
        CHECK_OK(kx_run_planned(&g, &plan, &be, arena, NULL, (const float *const *)g_in, o1));
        for (int o = 0; o < g.n_outputs; o++) {
            double e = rel_l2(o1[o], o0[o], (size_t)kg_numel(&g.nodes[g.outputs[o]]));
            fprintf(stderr, "  graph %d, output %d: planned with bf16 rows vs eager f32 %.3g\n", v, o, e);
            CHECK_MSG(e < 1e-2 && e > 0, "graph %d, output %d: error %.3g", v, o, e);
            free(o0[o]), free(o1[o]);
        }
        kb_free_aligned(arena);
        kx_plan_free(&plan);
        kg_free(&g0);
        kg_free(&g);
    }
    g_layout = KG_NCHW;
    for (int i = 0; i < N_IN; i++) free(g_in[i]);
}

/* x [B,C,S] -> [B,S,C] (channels last) or back (last set), a new buffer */
static float *transpose_c(const float *x, int64_t B_, int64_t C_, int64_t S, int last) {
    float *y = malloc(sizeof(float) * (size_t)(B_ * C_ * S) + 1);
    for (int64_t b = 0; b < B_; b++)
        for (int64_t c = 0; c < C_; c++)
            for (int64_t i = 0; i < S; i++) {
                int64_t f = (b * C_ + c) * S + i, l = (b * S + i) * C_ + c;
                y[last ? l : f] = x[last ? f : l];
            }
    return y;
}

/* the fast backend's convolution against the reference kernel: the VAE's
 * geometries at channel counts where oneDNN's blocking shows */
TEST(fast_conv_matches_reference) {
    const kk_backend *fast = kk_fast(KILN_F32);
    if (!fast) {
        fprintf(stderr, "  no fast f32 backend on this machine: skipped\n");
        return;
    }
    struct {
        int64_t B, Cin, H, W, Cout, k, stride, lo, hi;
        int bias;
    } geo[] = {
        {1, 64, 20, 17, 32, 3, 1, 1, 1, 1}, /* a resnet's conv */
        {2, 3, 16, 24, 16, 3, 1, 1, 1, 1},  /* conv_in of an image */
        {1, 48, 9, 13, 96, 1, 1, 0, 0, 1},  /* conv_shortcut */
        {2, 32, 16, 22, 32, 3, 2, 0, 1, 1}, /* the encoder's downsample */
        {1, 16, 7, 5, 3, 3, 1, 1, 1, 0},    /* conv_out, no bias */
    };
    for (size_t i = 0; i < sizeof geo / sizeof geo[0]; i++) {
        kk_conv p = {geo[i].B, geo[i].Cin, geo[i].H, geo[i].W, geo[i].Cout, geo[i].k, geo[i].k, 0, 0,
                     geo[i].stride, geo[i].lo, geo[i].hi, 0, 0, 0, 0, 0};
        p.Ho = (p.H + p.pad_lo + p.pad_hi - p.kh) / p.stride + 1;
        p.Wo = (p.W + p.pad_lo + p.pad_hi - p.kw) / p.stride + 1;
        size_t nx = (size_t)(p.B * p.Cin * p.H * p.W), nw = (size_t)(p.Cout * p.Cin * p.kh * p.kw),
               ny = (size_t)(p.B * p.Cout * p.Ho * p.Wo);
        float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw), *b = malloc(sizeof(float) * (size_t)p.Cout);
        float *y0 = malloc(sizeof(float) * ny), *y1 = malloc(sizeof(float) * ny), *y2 = malloc(sizeof(float) * ny);
        kiln_noise(100 + i, x, nx);
        kiln_noise(200 + i, w, nw);
        kiln_noise(300 + i, b, (size_t)p.Cout);
        kk_weight wv = {.M = p.Cout, .K = p.Cin * p.kh * p.kw, .f32 = w, .packed_dtype = KILN_F32};
        kk_reference()->conv2d(x, &wv, geo[i].bias ? b : NULL, NULL, y0, &p);
        unsigned long mark = kb_deferred_mark();
        fast->conv2d(x, &wv, geo[i].bias ? b : NULL, NULL, y1, &p);
        fast->conv2d(x, &wv, geo[i].bias ? b : NULL, NULL, y2, &p); /* the kept primitive, again */
        CHECK_OK(kb_deferred_since(mark));
        CHECK_MSG(!memcmp(y1, y2, sizeof(float) * ny), "geometry %zu: a second call differs", i);
        /* the weight packed as at conversion: the same sums, bit for bit */
        char layout[40];
        size_t pbytes;
        CHECK_OK(kk_fast_conv_layout(p.Cout, p.Cin, p.kh, p.kw, KILN_F32, layout, &pbytes));
        CHECK(!strncmp(layout, "conv-", 5));
        void *packed = kb_alloc_aligned(pbytes);
        CHECK_OK(kk_fast_conv_pack(w, p.Cout, p.Cin, p.kh, p.kw, KILN_F32, packed));
        kk_weight pv = {.M = p.Cout, .K = p.Cin * p.kh * p.kw, .packed = packed, .packed_dtype = KILN_F32};
        fast->conv2d(x, &pv, geo[i].bias ? b : NULL, NULL, y2, &p);
        CHECK_OK(kb_deferred_since(mark));
        CHECK_MSG(!memcmp(y1, y2, sizeof(float) * ny), "geometry %zu: the packed f32 weight's result differs", i);
        kb_free_aligned(packed);
        double e = rel_l2(y1, y0, ny);
        fprintf(stderr, "  conv [%lld,%lld,%lld,%lld] * %lldx%lld stride %lld pad %lld/%lld -> %lldx%lld: fast vs reference %.3g\n",
                (long long)p.B, (long long)p.Cin, (long long)p.H, (long long)p.W, (long long)p.kh, (long long)p.kw,
                (long long)p.stride, (long long)p.pad_lo, (long long)p.pad_hi, (long long)p.Ho, (long long)p.Wo, e);
        CHECK_MSG(e < 1e-5, "geometry %zu: fast conv error %.3g", i, e);
        {   /* channels last: the reference's bits are the channels-first ones; fast within 1e-5, bf16 1e-2 */
            kk_conv pl = p;
            pl.nhwc = 1;
            float *xl = transpose_c(x, p.B, p.Cin, p.H * p.W, 1), *yl = malloc(sizeof(float) * ny);
            kk_reference()->conv2d(xl, &wv, geo[i].bias ? b : NULL, NULL, yl, &pl);
            float *yb = transpose_c(yl, p.B, p.Cout, p.Ho * p.Wo, 0);
            CHECK_MSG(!memcmp(yb, y0, sizeof(float) * ny), "geometry %zu: the reference's channels-last conv differs", i);
            free(yb);
            /* a residual added as it writes (kg_fuse's resnet add): the conv's values + r */
            float *r = malloc(sizeof(float) * ny), *yr = malloc(sizeof(float) * ny), *ys = malloc(sizeof(float) * ny);
            kiln_noise(1000 + i, r, ny);
            kk_conv pr = pl;
            pr.residual = 1;
            kk_reference()->conv2d(xl, &wv, geo[i].bias ? b : NULL, r, yr, &pr);
            size_t off = 0;
            for (size_t k = 0; k < ny; k++) off += yr[k] != yl[k] + r[k];
            CHECK_MSG(!off, "geometry %zu: %zu of the reference's residual sums are not conv + r", i, off);
            for (int dt = 0; dt < 2; dt++) {
                const kk_backend *be = dt ? kk_fast(KILN_BF16) : fast;
                if (!be) continue;
                be->conv2d(xl, &wv, geo[i].bias ? b : NULL, NULL, yl, &pl);
                CHECK_OK(kb_deferred_since(mark));
                yb = transpose_c(yl, p.B, p.Cout, p.Ho * p.Wo, 0);
                double el = rel_l2(yb, y0, ny);
                fprintf(stderr, "    channels last, %s: %.3g\n", dt ? "bf16" : "f32", el);
                CHECK_MSG(dt ? el < 1e-2 : el < 1e-5, "geometry %zu: channels-last %s conv error %.3g", i,
                          dt ? "bf16" : "f32", el);
                free(yb);
                be->conv2d(xl, &wv, geo[i].bias ? b : NULL, r, ys, &pr);
                CHECK_OK(kb_deferred_since(mark));
                for (size_t k = 0; k < ny; k++) yl[k] += r[k];
                double er = rel_l2(ys, yl, ny);
                fprintf(stderr, "    + residual, %s: %.3g against conv then add\n", dt ? "bf16" : "f32", er);
                CHECK_MSG(er < 1e-6, "geometry %zu: the %s conv's residual sum is %.3g from conv then add", i,
                          dt ? "bf16" : "f32", er);
            }
            free(r), free(yr), free(ys);
            /* bf16 rows in (a group norm's): the bits of the f32 x rounded by the conv itself */
            const kk_backend *f16 = kk_fast(KILN_BF16);
            if (f16 && kk_supports(f16, KK_SLOT_CONV2D, KK_FMT_BF16, NULL)) {
                uint16_t *xh = malloc(sizeof(uint16_t) * nx);
                float *y3 = malloc(sizeof(float) * ny);
                for (size_t k = 0; k < nx; k++) xh[k] = kt_f32_to_bf16(xl[k]);
                char lay[40];
                size_t pb;
                CHECK_OK(kk_fast_conv_layout(p.Cout, p.Cin, p.kh, p.kw, KILN_BF16, lay, &pb));
                void *pk = kb_alloc_aligned(pb);
                CHECK_OK(kk_fast_conv_pack(w, p.Cout, p.Cin, p.kh, p.kw, KILN_BF16, pk));
                kk_weight hv = {.M = p.Cout, .K = p.Cin * p.kh * p.kw, .packed = pk, .packed_dtype = KILN_BF16};
                CHECK(kk_supports(f16, KK_SLOT_CONV2D, KK_FMT_BF16, &hv) && !kk_supports(f16, KK_SLOT_CONV2D, KK_FMT_BF16, &wv));
                f16->conv2d(xl, &hv, geo[i].bias ? b : NULL, NULL, yl, &pl);
                kk_conv ph = pl;
                ph.x_bf16 = 1;
                f16->conv2d((const float *)xh, &hv, geo[i].bias ? b : NULL, NULL, y3, &ph);
                CHECK_OK(kb_deferred_since(mark));
                CHECK_MSG(!memcmp(yl, y3, sizeof(float) * ny), "geometry %zu: the conv of bf16 rows differs", i);
                /* bf16 rows out (a conv another conv reads, kg_plan_bf16), from f32 or bf16 x: the
                 * primitive's own rounding of its f32 sums, within a unit of the last place of
                 * rounding the f32 result (its blocking may sum in another order) */
                uint16_t *yh = malloc(sizeof(uint16_t) * ny);
                for (int xin = 0; xin < 2; xin++) {
                    kk_conv py = xin ? ph : pl;
                    py.y_bf16 = 1;
                    f16->conv2d(xin ? (const float *)xh : xl, &hv, geo[i].bias ? b : NULL, NULL, (float *)yh, &py);
                    CHECK_OK(kb_deferred_since(mark));
                    size_t far = 0, same = 0;
                    for (size_t k = 0; k < ny; k++) {
                        uint16_t r = kt_f32_to_bf16(yl[k]);
                        int d = (int)yh[k] - (int)r;
                        same += d == 0;
                        far += d > 1 || d < -1;
                    }
                    fprintf(stderr, "    bf16 rows out%s: %zu of %zu values the f32 result's rounding\n",
                            xin ? " of bf16 rows" : "", same, ny);
                    CHECK_MSG(!far && same * 10 > ny * 9, "geometry %zu: bf16 rows out: %zu values off by more than one unit, %zu the same", i, far, same);
                }
                /* a residual is an f32 sum: bf16 rows out with one are refused */
                kk_conv pq = pl;
                pq.y_bf16 = 1, pq.residual = 1;
                unsigned long m1 = kb_deferred_mark();
                f16->conv2d(xl, &hv, NULL, y3, (float *)yh, &pq);
                CHECK_FAILS(kb_deferred_since(m1), KILN_ERR_UNSUPPORTED, "bf16 activations");
                free(yh);
                /* bf16 rows channels first (no backend makes them): refused, not read as f32 */
                kk_conv pn = p;
                pn.x_bf16 = 1;
                unsigned long m2 = kb_deferred_mark();
                f16->conv2d((const float *)xh, &hv, NULL, NULL, y3, &pn);
                CHECK_FAILS(kb_deferred_since(m2), KILN_ERR_UNSUPPORTED, "bf16 activations");
                kb_free_aligned(pk);
                free(xh), free(y3);
            }
            free(xl), free(yl);
        }
        const kk_backend *f16 = kk_fast(KILN_BF16); /* bf16 inputs and weights, f32 sums: within bf16 rounding */
        if (f16) {
            unsigned long m16 = kb_deferred_mark(); /* (the refusals above are deferred failures too) */
            f16->conv2d(x, &wv, geo[i].bias ? b : NULL, NULL, y1, &p);
            double e16 = rel_l2(y1, y0, ny);
            fprintf(stderr, "    bf16: %.3g\n", e16);
            CHECK_MSG(e16 < 1e-2 && e16 > 0, "geometry %zu: bf16 conv error %.3g", i, e16);
            /* packed bf16 (a bf16 model's cache) gives the per-call rounding's bits; a
             * packed f32 weight in the bf16 backend (keep_f32) runs in f32 */
            CHECK_OK(kk_fast_conv_layout(p.Cout, p.Cin, p.kh, p.kw, KILN_BF16, layout, &pbytes));
            packed = kb_alloc_aligned(pbytes);
            CHECK_OK(kk_fast_conv_pack(w, p.Cout, p.Cin, p.kh, p.kw, KILN_BF16, packed));
            pv = (kk_weight){.M = p.Cout, .K = p.Cin * p.kh * p.kw, .packed = packed, .packed_dtype = KILN_BF16};
            f16->conv2d(x, &pv, geo[i].bias ? b : NULL, NULL, y2, &p);
            CHECK_MSG(!memcmp(y1, y2, sizeof(float) * ny), "geometry %zu: the packed bf16 weight's result differs", i);
            kb_free_aligned(packed);
            CHECK_OK(kk_fast_conv_layout(p.Cout, p.Cin, p.kh, p.kw, KILN_F32, layout, &pbytes));
            packed = kb_alloc_aligned(pbytes);
            CHECK_OK(kk_fast_conv_pack(w, p.Cout, p.Cin, p.kh, p.kw, KILN_F32, packed));
            pv = (kk_weight){.M = p.Cout, .K = p.Cin * p.kh * p.kw, .packed = packed, .packed_dtype = KILN_F32};
            f16->conv2d(x, &pv, geo[i].bias ? b : NULL, NULL, y2, &p);
            CHECK_MSG(rel_l2(y2, y0, ny) < 1e-5, "geometry %zu: a kept-f32 weight in the bf16 backend: %.3g", i,
                      rel_l2(y2, y0, ny));
            kb_free_aligned(packed);
            CHECK_OK(kb_deferred_since(m16));
        }
        free(x), free(w), free(b), free(y0), free(y1), free(y2);
    }
}

TEST(vae_ops_refuse_bad_shapes) {
    kg_graph g;
    kg_init(&g, NULL, NULL);
    kg_id x = kg_input(&g, "x", 4, (int64_t[]){1, 8, 5, 5}), w = kg_input(&g, "w", 4, (int64_t[]){4, 6, 3, 3});
    CHECK(kg_conv2d(&g, x, w, -1, 1, 1, 1, KG_NCHW) < 0);
    CHECK(strstr(kiln_last_error(), "input [1, 8, 5, 5] and weight [4, 6, 3, 3] are not [B, Cin, H, W] and [Cout, Cin, kh, kw]"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 8, 2, 5});
    w = kg_input(&g, "w", 4, (int64_t[]){4, 8, 3, 3});
    CHECK(kg_conv2d(&g, x, w, -1, 1, 0, 0, KG_NCHW) < 0 && strstr(kiln_last_error(), "is smaller than the kernel"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 8, 5, 5});
    w = kg_input(&g, "w", 4, (int64_t[]){4, 8, 3, 3});
    kg_id b = kg_input(&g, "b", 1, (int64_t[]){5});
    CHECK(kg_conv2d(&g, x, w, b, 1, 1, 1, KG_NCHW) < 0 && strstr(kiln_last_error(), "the bias must be [4]"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 8, 5, 5});
    w = kg_input(&g, "w", 4, (int64_t[]){4, 8, 3, 3});
    CHECK(kg_conv2d(&g, x, w, -1, 0, 1, 1, KG_NCHW) < 0 && strstr(kiln_last_error(), "stride 0 must be positive"));
    kg_free(&g);
    kg_init(&g, NULL, NULL); /* shapes right, but the weight is an input: no kernel view to read */
    x = kg_input(&g, "x", 4, (int64_t[]){1, 8, 5, 5});
    w = kg_input(&g, "w", 4, (int64_t[]){4, 8, 3, 3});
    CHECK(kg_conv2d(&g, x, w, -1, 1, 1, 1, KG_NCHW) < 0 && strstr(kiln_last_error(), "has no kernel view"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 12, 5, 5});
    CHECK(kg_group_norm(&g, x, -1, -1, 8, 1e-6f, 0, KG_NCHW) < 0 &&
          strstr(kiln_last_error(), "input [1, 12, 5, 5] is not [B, C, ...] with C a multiple of 8 groups"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 12, 5, 5});
    w = kg_input(&g, "w", 1, (int64_t[]){8});
    CHECK(kg_group_norm(&g, x, w, -1, 4, 1e-6f, 0, KG_NCHW) < 0 && strstr(kiln_last_error(), "weight and bias must be [12]"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 3, (int64_t[]){1, 12, 5});
    CHECK(kg_upsample_nearest(&g, x, 2, KG_NCHW) < 0 && strstr(kiln_last_error(), "input [1, 12, 5] is not [B, C, H, W]"));
    kg_free(&g);
    /* channels last: the channels are the last dim */
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 5, 5, 8});
    w = kg_input(&g, "w", 4, (int64_t[]){4, 5, 3, 3});
    CHECK(kg_conv2d(&g, x, w, -1, 1, 1, 1, KG_NHWC) < 0 && strstr(kiln_last_error(), "are not [B, H, W, Cin] and [Cout, Cin, kh, kw]"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 5, 5, 12});
    CHECK(kg_group_norm(&g, x, -1, -1, 8, 1e-6f, 0, KG_NHWC) < 0 &&
          strstr(kiln_last_error(), "input [1, 5, 5, 12] is not [B, ..., C] with C a multiple of 8 groups"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 5, 5, 12});
    CHECK(kg_upsample_nearest(&g, x, 2, 7) < 0 && strstr(kiln_last_error(), "is not [B, C, H, W]")); /* no layout 7 */
    kg_free(&g);
    /* an up2 conv wants the sub-pixel weight [4 Cout, Cin, 2, 2], not the 3x3 one */
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 5, 5, 8});
    w = kg_input(&g, "w", 4, (int64_t[]){4, 8, 3, 3});
    CHECK(kg_conv2d_up2(&g, x, w, -1) < 0 && strstr(kiln_last_error(), "are not [B, H, W, Cin] and a sub-pixel [4 Cout, Cin, 2, 2]"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 5, 5, 8});
    w = kg_input(&g, "w", 4, (int64_t[]){16, 8, 2, 2});
    b = kg_input(&g, "b", 1, (int64_t[]){16});
    CHECK(kg_conv2d_up2(&g, x, w, b) < 0 && strstr(kiln_last_error(), "the bias must be [4]"));
    kg_free(&g);
    /* reshape keeps the count */
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 5, 5, 8});
    CHECK(kg_reshape(&g, x, 3, (int64_t[]){1, 24, 8}) < 0 && strstr(kiln_last_error(), "(192 values, not 200)"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 4, (int64_t[]){1, 5, 5, 8});
    CHECK(kg_reshape(&g, x, 5, (int64_t[]){1, 1, 5, 5, 8}) < 0 && strstr(kiln_last_error(), "5 dims (a tensor has 1 to 4)"));
    kg_free(&g);
}

/* the encoder's std: exp(0.5 * clamp(logvar, -30, 20)), planned as eager */
TEST(logvar_std) {
    float x[6] = {-45, -30, -1.5f, 0, 19, 33}, y[6], y2[6];
    kg_graph g;
    kg_init(&g, NULL, NULL);
    kg_mark_output(&g, kg_logvar_std(&g, kg_input(&g, "x", 2, (int64_t[]){2, 3})));
    CHECK_OK(g.status);
    const float *in[1] = {x};
    float *out[1] = {y};
    CHECK_OK(kg_run_eager(&g, kk_reference(), in, out));
    for (int i = 0; i < 6; i++) {
        double v = x[i] < -30 ? -30 : x[i] > 20 ? 20 : x[i], want = exp(0.5 * v);
        CHECK_MSG(fabs(y[i] - want) <= 1e-7 * want, "logvar %g: std %.9g, want %.9g", (double)x[i], (double)y[i], want);
    }
    kx_plan plan;
    CHECK_OK(kx_plan_graph(&g, &plan));
    void *arena = kb_alloc_aligned(plan.arena_bytes + 64);
    out[0] = y2;
    CHECK_OK(kx_run_planned(&g, &plan, kk_reference(), arena, NULL, in, out));
    CHECK(!memcmp(y, y2, sizeof y));
    kb_free_aligned(arena);
    kx_plan_free(&plan);
    kg_free(&g);
}

/* the fast backend's group norm against the double-precision general form,
 * with and without SiLU and affine, on groups of a size where the partial
 * sums and the tails both show; an offset mean as activations have */
TEST(fast_group_norm_matches_reference) {
    const kk_backend *fast = kk_fast(KILN_F32);
    if (!fast || !fast->group_norm) {
        fprintf(stderr, "  no fast group norm on this machine: skipped\n");
        return;
    }
    struct {
        int64_t B, C, S, G;
        int silu, affine;
    } geo[] = {{1, 64, 33 * 17, 32, 1, 1}, {2, 12, 5, 3, 0, 1}, {1, 32, 4096, 8, 1, 0}, {2, 16, 7, 16, 0, 0},
               {2, 128, 40 * 37, 32, 1, 1}}; /* (the last: channels last in several chunks and threads) */
    for (size_t i = 0; i < sizeof geo / sizeof geo[0]; i++) {
        size_t n = (size_t)(geo[i].B * geo[i].C * geo[i].S);
        float *x = malloc(sizeof(float) * n), *y0 = malloc(sizeof(float) * n), *y1 = malloc(sizeof(float) * n);
        float *w = malloc(sizeof(float) * (size_t)geo[i].C), *b = malloc(sizeof(float) * (size_t)geo[i].C);
        kiln_noise(400 + i, x, n);
        for (size_t k = 0; k < n; k++) x[k] = 3.0f + 2.0f * x[k];
        kiln_noise(500 + i, w, (size_t)geo[i].C);
        kiln_noise(600 + i, b, (size_t)geo[i].C);
        const float *wp = geo[i].affine ? w : NULL, *bp = geo[i].affine ? b : NULL;
        kk_group_norm(x, wp, bp, y0, geo[i].B, geo[i].C, geo[i].S, geo[i].G, 1e-6f, geo[i].silu, 0);
        fast->group_norm(x, wp, bp, y1, geo[i].B, geo[i].C, geo[i].S, geo[i].G, 1e-6f, geo[i].silu, 0, 0, 0);
        double e = rel_l2(y1, y0, n);
        fprintf(stderr, "  group norm [%lld,%lld,%lld] / %lld groups%s%s: fast vs reference %.3g\n", (long long)geo[i].B,
                (long long)geo[i].C, (long long)geo[i].S, (long long)geo[i].G, geo[i].silu ? ", silu" : "",
                geo[i].affine ? ", affine" : "", e);
        CHECK_MSG(e < 1e-6, "geometry %zu: fast group norm error %.3g", i, e);
        /* channels last: the reference's bits are the channels-first ones; the fast form within 1e-6 */
        int64_t Bg = geo[i].B, Cg = geo[i].C, Sg = geo[i].S;
        float *xl = transpose_c(x, Bg, Cg, Sg, 1), *yl = malloc(sizeof(float) * n);
        kk_group_norm(xl, wp, bp, yl, Bg, Cg, Sg, geo[i].G, 1e-6f, geo[i].silu, 1);
        float *yb = transpose_c(yl, Bg, Cg, Sg, 0);
        CHECK_MSG(!memcmp(yb, y0, sizeof(float) * n), "geometry %zu: the reference's channels-last norm differs", i);
        free(yb);
        fast->group_norm(xl, wp, bp, yl, Bg, Cg, Sg, geo[i].G, 1e-6f, geo[i].silu, 1, 0, 0);
        yb = transpose_c(yl, Bg, Cg, Sg, 0);
        double el = rel_l2(yb, y0, n);
        fprintf(stderr, "    channels last: fast vs reference %.3g\n", el);
        CHECK_MSG(el < 1e-6, "geometry %zu: fast channels-last group norm error %.3g", i, el);
        /* bf16 rows (a conv's input): the f32 values rounded, nearest even */
        const kk_backend *f16 = kk_fast(KILN_BF16);
        if (f16 && kk_supports(f16, KK_SLOT_GROUP_NORM, KK_FMT_BF16, NULL)) {
            uint16_t *yh = malloc(sizeof(uint16_t) * n);
            f16->group_norm(xl, wp, bp, (float *)yh, Bg, Cg, Sg, geo[i].G, 1e-6f, geo[i].silu, 1, 0, 1);
            size_t off = 0;
            for (size_t k = 0; k < n; k++) off += yh[k] != kt_f32_to_bf16(yl[k]);
            CHECK_MSG(!off, "geometry %zu: %zu bf16 group norm values are not the f32 ones rounded", i, off);
            /* bf16 rows in (a convolution's, kg_plan_bf16): the sums of the f32 form on the widened values */
            uint16_t *xh = malloc(sizeof(uint16_t) * n);
            float *xr = malloc(sizeof(float) * n), *y2 = malloc(sizeof(float) * n), *y3 = malloc(sizeof(float) * n);
            for (size_t k = 0; k < n; k++) xh[k] = kt_f32_to_bf16(xl[k]), xr[k] = kt_bf16_to_f32(xh[k]);
            f16->group_norm(xr, wp, bp, y2, Bg, Cg, Sg, geo[i].G, 1e-6f, geo[i].silu, 1, 0, 0);
            f16->group_norm((const float *)xh, wp, bp, y3, Bg, Cg, Sg, geo[i].G, 1e-6f, geo[i].silu, 1, 1, 0);
            CHECK_MSG(!memcmp(y2, y3, sizeof(float) * n), "geometry %zu: the group norm of bf16 rows differs", i);
            f16->group_norm((const float *)xh, wp, bp, (float *)yh, Bg, Cg, Sg, geo[i].G, 1e-6f, geo[i].silu, 1, 1, 1);
            off = 0;
            for (size_t k = 0; k < n; k++) off += yh[k] != kt_f32_to_bf16(y2[k]);
            CHECK_MSG(!off, "geometry %zu: %zu values of bf16 rows in and out are not the f32 ones rounded", i, off);
            /* bf16 rows are a channels-last form: channels first is refused, not written wrong */
            unsigned long mark = kb_deferred_mark();
            f16->group_norm(x, wp, bp, (float *)yh, Bg, Cg, Sg, geo[i].G, 1e-6f, geo[i].silu, 0, 0, 1);
            CHECK_FAILS(kb_deferred_since(mark), KILN_ERR_UNSUPPORTED, "channels last only");
            mark = kb_deferred_mark();
            f16->group_norm((const float *)xh, wp, bp, y3, Bg, Cg, Sg, geo[i].G, 1e-6f, geo[i].silu, 0, 1, 0);
            CHECK_FAILS(kb_deferred_since(mark), KILN_ERR_UNSUPPORTED, "channels last only");
            free(yh), free(xh), free(xr), free(y2), free(y3);
        }
        free(xl), free(yl), free(yb);
        free(x), free(y0), free(y1), free(w), free(b);
    }
}

/* conv2d_up2 (upsample 2x + 3x3 conv in one, the weight's sub-pixel form):
 * the reference kernel against upsample-then-conv by the reference (1e-6:
 * the folded weights are sums), the fast kernel in f32 and bf16 against the
 * reference, with row-major and packed weights, in one band and in several */
TEST(fast_conv_up2_matches_upsample_then_conv) {
    struct {
        int64_t B, Cin, H, W, Co;
    } geo[] = {{2, 16, 5, 7, 24}, {1, 8, 150, 40, 128}}; /* the second: phases of 2 bands (conv.c UP2_BAND_BYTES) */
    for (size_t i = 0; i < sizeof geo / sizeof geo[0]; i++) {
        int64_t Bq = geo[i].B, Ci = geo[i].Cin, H = geo[i].H, Wd = geo[i].W, Co = geo[i].Co;
        size_t nx = (size_t)(Bq * H * Wd * Ci), nu = 4 * nx, ny = (size_t)(Bq * 4 * H * Wd * Co);
        float *x = malloc(sizeof(float) * nx), *u = malloc(sizeof(float) * nu), *w = malloc(sizeof(float) * (size_t)(Co * Ci * 9));
        float *w2 = malloc(sizeof(float) * (size_t)(16 * Co * Ci)), *b = malloc(sizeof(float) * (size_t)Co);
        float *y0 = malloc(sizeof(float) * ny), *y1 = malloc(sizeof(float) * ny), *y2 = malloc(sizeof(float) * ny);
        kiln_noise(700 + i, x, nx);
        kiln_noise(800 + i, w, (size_t)(Co * Ci * 9));
        kiln_noise(900 + i, b, (size_t)Co);
        kk_upsample_nearest(x, u, Bq, Ci, H, Wd, 2, 1);
        kk_conv pc = {Bq, Ci, 2 * H, 2 * Wd, Co, 3, 3, 2 * H, 2 * Wd, 1, 1, 1, 1, 0, 0, 0, 0};
        kk_weight wv = {.M = Co, .K = Ci * 9, .f32 = w, .packed_dtype = KILN_F32};
        kk_reference()->conv2d(u, &wv, b, NULL, y0, &pc);
        kk_conv_up2_weight(w, Co, Ci, w2);
        kk_conv pu = {Bq, Ci, H, Wd, Co, 2, 2, 2 * H, 2 * Wd, 1, 1, 1, 1, 1, 0, 0, 0};
        kk_weight wu = {.M = 4 * Co, .K = Ci * 4, .f32 = w2, .packed_dtype = KILN_F32};
        kk_reference()->conv2d(x, &wu, b, NULL, y1, &pu);
        {   /* up2 is channels last only: channels first is refused */
            kk_conv pn = pu;
            pn.nhwc = 0;
            unsigned long m0 = kb_deferred_mark();
            kk_reference()->conv2d(x, &wu, b, NULL, y2, &pn);
            CHECK_FAILS(kb_deferred_since(m0), KILN_ERR_UNSUPPORTED, "channels last only");
        }
        double e = rel_l2(y1, y0, ny);
        fprintf(stderr, "  up2 conv [%lld,%lld,%lld,%lld] -> %lld: reference folded vs upsample + conv %.3g\n", (long long)Bq,
                (long long)H, (long long)Wd, (long long)Ci, (long long)Co, e);
        CHECK_MSG(e < 1e-6, "geometry %zu: the folded reference differs by %.3g", i, e);
        unsigned long mark = kb_deferred_mark();
        for (int dt = 0; dt < 2; dt++) {
            const kk_backend *be = kk_fast(dt ? KILN_BF16 : KILN_F32);
            if (!be) {
                fprintf(stderr, "  no fast %s backend on this machine: skipped\n", dt ? "bf16" : "f32");
                continue;
            }
            be->conv2d(x, &wu, b, NULL, y2, &pu);
            CHECK_OK(kb_deferred_since(mark));
            double ef = rel_l2(y2, y0, ny);
            fprintf(stderr, "    fast %s: %.3g\n", dt ? "bf16" : "f32", ef);
            CHECK_MSG(dt ? ef < 1e-2 : ef < 1e-5, "geometry %zu: fast %s up2 conv error %.3g", i, dt ? "bf16" : "f32", ef);
            char layout[40];
            size_t pbytes;
            kiln_dtype pdt = dt ? KILN_BF16 : KILN_F32;
            CHECK_OK(kk_fast_conv_layout(4 * Co, Ci, 2, 2, pdt, layout, &pbytes));
            void *packed = kb_alloc_aligned(pbytes);
            CHECK_OK(kk_fast_conv_pack(w2, 4 * Co, Ci, 2, 2, pdt, packed));
            kk_weight pv = {.M = 4 * Co, .K = Ci * 4, .packed = packed, .packed_dtype = pdt};
            be->conv2d(x, &pv, b, NULL, y1, &pu);
            CHECK_OK(kb_deferred_since(mark));
            CHECK_MSG(!memcmp(y1, y2, sizeof(float) * ny), "geometry %zu: the packed %s weight's result differs", i,
                      dt ? "bf16" : "f32");
            /* bf16 rows out (kg_plan_bf16: an up2 a shortcut conv reads): the f32 result rounded */
            kk_conv ph = pu;
            ph.y_bf16 = 1;
            uint16_t *yh = malloc(sizeof(uint16_t) * ny);
            be->conv2d(x, &pv, b, NULL, (float *)yh, &ph);
            CHECK_OK(kb_deferred_since(mark));
            size_t off = 0;
            for (size_t k = 0; k < ny; k++) off += yh[k] != kt_f32_to_bf16(y1[k]);
            CHECK_MSG(!off, "geometry %zu: %zu of the %s up2's bf16 rows are not its f32 result rounded", i, off,
                      dt ? "bf16" : "f32");
            /* an up2 reads f32 x only (its bands are pointers into x): bf16 rows in are refused */
            kk_conv pb = pu;
            pb.x_bf16 = 1;
            unsigned long m1 = kb_deferred_mark();
            be->conv2d(x, &pv, b, NULL, (float *)yh, &pb);
            CHECK_FAILS(kb_deferred_since(m1), KILN_ERR_UNSUPPORTED, "bf16 activations");
            mark = kb_deferred_mark(); /* (the refusal is a deferred failure: later checks start after it) */
            free(yh);
            kb_free_aligned(packed);
        }
        free(x), free(u), free(w), free(w2), free(b), free(y0), free(y1), free(y2);
    }
}

int main(void) {
    RUN(logvar_std);
    RUN(fast_group_norm_matches_reference);
    RUN(vae_ops_refuse_bad_shapes);
    RUN(fast_conv_matches_reference);
    RUN(fast_conv_up2_matches_upsample_then_conv);
    RUN(vae_ops_match_loops_on_every_path);
    RUN(plan_bf16_conv_outputs);
    return TEST_SUMMARY();
}
