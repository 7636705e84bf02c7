/* conv.c - the fast CPU backend's VAE kernels: 2-D convolutions on oneDNN's
 * convolution primitives and the group norm (+ SiLU). Kept apart from
 * fast.c's GEMMs and attentions; this file has its own oneDNN engine,
 * streams, primitive table and scratch. */
#include "base/base.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- oneDNN engine, per-thread streams and scratch ------------------------------ */

static dnnl_engine_t g_eng;
static _Thread_local dnnl_stream_t t_stream;
static int g_ok;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void init_engine(void) { g_ok = dnnl_engine_create(&g_eng, dnnl_cpu, 0) == dnnl_success; }

static int engine(void) {
    pthread_once(&g_once, init_engine);
    return g_ok;
}

static dnnl_stream_t stream(void) {
    if (!t_stream && dnnl_stream_create(&t_stream, g_eng, dnnl_stream_default_flags) != dnnl_success) t_stream = NULL;
    return t_stream;
}

/* A per-thread buffer per slot that only grows; NULL defers an
 * out-of-memory failure to the forward (kb_defer_failure). Slots: 0
 * reordered weights, 1 the primitive's scratchpad, 2 a zero bias, 3 x in
 * bf16. */
static void *scratch_must(int slot, size_t bytes) {
    static _Thread_local void *buf[4];
    static _Thread_local size_t cap[4];
    if (cap[slot] < bytes) {
        kb_free_aligned(buf[slot]);
        buf[slot] = kb_alloc_aligned(bytes);
        cap[slot] = buf[slot] ? bytes : 0;
    }
    if (!buf[slot]) kb_defer_failure(KILN_ERR_NOMEM, "out of memory for a %zu-byte convolution work buffer", bytes);
    return buf[slot];
}

KK_CLONES static void to_bf16_chunk(const float *x, uint16_t *y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = bf16_of(x[i]);
}

/* f32 -> bf16 (nearest even), in parallel chunks */
static void to_bf16_par(const float *x, uint16_t *y, int64_t n) {
    int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static) if (n > chunk)
    for (int64_t c = 0; c < n; c += chunk) to_bf16_chunk(x + c, y + c, n - c < chunk ? n - c : chunk);
}

/* ---- convolutions ------------------------------------------------------------------ */

/* oneDNN's convolution on x and y as they are (nchw f32) with the weights in
 * the primitive's own layout: a reorder from [Cout,Cin,kh,kw] row-major
 * into this thread's scratch each call (the VAE's weights are small next to
 * its activations; packing them once at conversion needs a model-layer
 * hook). One primitive per geometry and dtype, kept. In bf16 (the bf16
 * backend) x is rounded to bf16 first (nearest even), the weights by the
 * reorder; sums in f32, y f32. */
typedef struct {
    kk_conv p;
    int bf16;
    dnnl_primitive_t prim, wreorder; /* wreorder NULL: the plain weights are the primitive's */
    dnnl_memory_desc_t src, wplain, wei, bias, dst, sp;
} conv_entry;

static conv_entry **g_convs; /* entries never move once made */
static size_t g_nconvs;

static const conv_entry *get_conv(const kk_conv *p, int bf16) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nconvs; i++)
        if (!memcmp(&g_convs[i]->p, p, sizeof *p) && g_convs[i]->bf16 == bf16) {
            pthread_mutex_unlock(&g_lock);
            return g_convs[i];
        }
    conv_entry e;
    memset(&e, 0, sizeof e);
    e.p = *p;
    e.bf16 = bf16;
    dnnl_data_type_t dt = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_dims_t ds = {p->B, p->Cin, p->H, p->W}, dw = {p->Cout, p->Cin, p->kh, p->kw}, db = {p->Cout},
                dd = {p->B, p->Cout, p->Ho, p->Wo}, st = {p->stride, p->stride}, pl = {p->pad_lo, p->pad_lo};
    /* oneDNN's right padding is what makes its output size ours: the last
     * window may leave some of pad_hi unread, as PyTorch's does */
    dnnl_dims_t pr = {(p->Ho - 1) * p->stride + p->kh - p->H - p->pad_lo, (p->Wo - 1) * p->stride + p->kw - p->W - p->pad_lo};
    dnnl_memory_desc_t wany;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL, rpd = NULL;
    int ok = pr[0] >= 0 && pr[1] >= 0 && !dnnl_memory_desc_init_by_tag(&e.src, 4, ds, dt, dnnl_nchw) &&
             !dnnl_memory_desc_init_by_tag(&e.wplain, 4, dw, dnnl_f32, dnnl_oihw) &&
             !dnnl_memory_desc_init_by_tag(&wany, 4, dw, dt, dnnl_format_tag_any) &&
             !dnnl_memory_desc_init_by_tag(&e.bias, 1, db, dnnl_f32, dnnl_a) &&
             !dnnl_memory_desc_init_by_tag(&e.dst, 4, dd, dnnl_f32, dnnl_nchw) &&
             !dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &e.src, &wany,
                                                 &e.bias, &e.dst, st, pl, pr) &&
             !dnnl_primitive_attr_create(&attr) &&
             !dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) &&
             !dnnl_primitive_desc_create(&pd, &cd, attr, g_eng, NULL);
    if (ok) {
        e.wei = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        e.sp = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        const char *impl = "";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        kb_log(KILN_LOG_DEBUG, "conv2d %s [%lld,%lld,%lld,%lld] * [%lld,%lld,%lld,%lld] stride %lld: %s", bf16 ? "bf16" : "f32", (long long)p->B,
               (long long)p->Cin, (long long)p->H, (long long)p->W, (long long)p->Cout, (long long)p->Cin,
               (long long)p->kh, (long long)p->kw, (long long)p->stride, impl);
        ok = !dnnl_primitive_create(&e.prim, pd);
    }
    if (ok && !dnnl_memory_desc_equal(&e.wei, &e.wplain))
        ok = !dnnl_reorder_primitive_desc_create(&rpd, &e.wplain, g_eng, &e.wei, g_eng, NULL) &&
             !dnnl_primitive_create(&e.wreorder, rpd);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    conv_entry **nc = ok ? realloc(g_convs, (g_nconvs + 1) * sizeof *nc) : NULL;
    conv_entry *out = nc ? malloc(sizeof *out) : NULL;
    if (nc) g_convs = nc;
    if (out) {
        *out = e;
        g_convs[g_nconvs++] = out;
    } else {
        if (e.prim) dnnl_primitive_destroy(e.prim);
        if (e.wreorder) dnnl_primitive_destroy(e.wreorder);
    }
    pthread_mutex_unlock(&g_lock);
    return out;
}

static int conv_run(const conv_entry *e, const float *x, const float *w, const float *b, float *y) {
    const void *src = x;
    if (e->bf16) { /* x in bf16 rows, this thread's scratch */
        int64_t n = e->p.B * e->p.Cin * e->p.H * e->p.W;
        uint16_t *xb = scratch_must(3, sizeof(uint16_t) * (size_t)n);
        if (!xb) return 0;
        to_bf16_par(x, xb, n);
        src = xb;
    }
    size_t wbytes = e->wreorder ? dnnl_memory_desc_get_size(&e->wei) : 0, spbytes = dnnl_memory_desc_get_size(&e->sp);
    void *wbuf = wbytes ? scratch_must(0, wbytes) : (void *)w, *sp = spbytes ? scratch_must(1, spbytes) : NULL;
    dnnl_stream_t strm = stream();
    if (!wbuf || (spbytes && !sp) || !strm) return 0;
    if (e->wreorder) {
        dnnl_memory_t mf, mt;
        if (dnnl_memory_create(&mf, &e->wplain, g_eng, (void *)w)) return 0;
        dnnl_memory_create(&mt, &e->wei, g_eng, wbuf);
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mt}};
        int ok = !dnnl_primitive_execute(e->wreorder, strm, 2, ra) && !dnnl_stream_wait(strm);
        dnnl_memory_destroy(mf);
        dnnl_memory_destroy(mt);
        if (!ok) return 0;
    }
    /* no bias given: zeros (the primitive was made with one) */
    const float *bias = b;
    if (!bias) {
        float *z = scratch_must(2, sizeof(float) * (size_t)e->p.Cout);
        if (!z) return 0;
        memset(z, 0, sizeof(float) * (size_t)e->p.Cout);
        bias = z;
    }
    dnnl_memory_t m[5] = {NULL};
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, NULL}, {DNNL_ARG_WEIGHTS, NULL}, {DNNL_ARG_BIAS, NULL},
                               {DNNL_ARG_DST, NULL}, {DNNL_ARG_SCRATCHPAD, NULL}};
    const dnnl_memory_desc_t *md[5] = {&e->src, &e->wei, &e->bias, &e->dst, &e->sp};
    void *data[5] = {(void *)src, wbuf, (void *)bias, y, sp};
    int n = spbytes ? 5 : 4, ok = 1;
    for (int i = 0; i < n && ok; i++) {
        ok = !dnnl_memory_create(&m[i], md[i], g_eng, data[i]);
        args[i].memory = m[i];
    }
    if (ok) ok = !dnnl_primitive_execute(e->prim, strm, n, args) && !dnnl_stream_wait(strm);
    for (int i = 0; i < 5; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    return ok;
}

/* in bf16 where oneDNN has the primitive, else in f32; the reference's
 * loops where it has neither */
static void fast_conv(int bf16, const float *x, const float *w, const float *b, float *y, const kk_conv *p) {
    const conv_entry *e = engine() ? get_conv(p, bf16) : NULL;
    if (!e && bf16) {
        kb_log(KILN_LOG_DEBUG, "conv2d: oneDNN has no bf16 convolution for this geometry, f32 runs");
        e = get_conv(p, 0);
    }
    if (e && conv_run(e, x, w, b, y)) return;
    kb_log(KILN_LOG_DEBUG, "conv2d: oneDNN declined, the reference kernel runs");
    kk_reference()->conv2d(x, w, b, y, p);
}

void kk_fast_conv2d_f32(const float *x, const float *w, const float *b, float *y, const kk_conv *p) {
    fast_conv(0, x, w, b, y, p);
}
void kk_fast_conv2d_bf16(const float *x, const float *w, const float *b, float *y, const kk_conv *p) {
    fast_conv(1, x, w, b, y, p);
}

/* Group norm: each group's mean and variance summed in double over eight
 * partial sums a pass (a fixed order, so the loop vectorizes without
 * reassociation), then (x - mean) * (w / sqrt(var + eps)) + b and SiLU in
 * f32 through exp_f. */
KK_CLONES static void gn_moments(const float *x, int64_t n, double *mean, double *var) {
    double s[8] = {0}, t = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += x[i + k];
    for (int k = 0; k < 8; k++) t += s[k];
    for (; i < n; i++) t += x[i];
    double m = t / (double)(n ? n : 1);
    for (int k = 0; k < 8; k++) s[k] = 0;
    t = 0;
    for (i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += (x[i + k] - m) * (x[i + k] - m);
    for (int k = 0; k < 8; k++) t += s[k];
    for (; i < n; i++) t += (x[i] - m) * (x[i] - m);
    *mean = m;
    *var = t / (double)(n ? n : 1);
}

KK_CLONES static void gn_apply(const float *x, float *y, int64_t n, float mean, float a, float c, int silu) {
    if (silu)
        for (int64_t i = 0; i < n; i++) {
            float v = (x[i] - mean) * a + c;
            y[i] = v / (1.0f + exp_f(-v));
        }
    else
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * a + c;
}

void kk_fast_group_norm(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t C, int64_t S,
                        int64_t G, float eps, int silu) {
    int64_t cg = C / G, n = cg * S;
    double *stat = malloc(sizeof(double) * 2 * (size_t)(B * G) + 1);
    if (!stat) {
        kb_defer_failure(KILN_ERR_NOMEM, "group_norm: out of memory");
        return;
    }
#pragma omp parallel for schedule(dynamic, 1) if (B * C * S > (1 << 16))
    for (int64_t bg = 0; bg < B * G; bg++) gn_moments(x + bg * n, n, &stat[2 * bg], &stat[2 * bg + 1]);
#pragma omp parallel for schedule(static) if (B * C * S > (1 << 16))
    for (int64_t bc = 0; bc < B * C; bc++) {
        int64_t ch = bc % C, bg = bc / C * G + ch / cg;
        double inv = 1.0 / sqrt(stat[2 * bg + 1] + (double)eps);
        gn_apply(x + bc * S, y + bc * S, S, (float)stat[2 * bg], (float)(inv * (w ? w[ch] : 1.0)), b ? b[ch] : 0.0f,
                 silu);
    }
    free(stat);
}
