/* conv.c - the fast CPU backend's VAE kernels: 2-D convolutions on oneDNN's
 * convolution primitives and the group norm (+ SiLU). Kept apart from
 * fast.c's GEMMs and attentions, with a primitive table of its own; the
 * oneDNN engine, streams and work buffers are fast.c's (onednn.h). */
#include "base/base.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/onednn.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

/* the primitive table's lock (entries never move once made) */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- convolutions ------------------------------------------------------------------ */

/* oneDNN's convolution with x, w and y in the layouts its fastest
 * implementation picks (format "any": channels innermost, brgconv's nhwc on
 * AVX-512, where the plain nchw layout gives im2col + GEMM, "gemm:jit", at
 * ~95% of a decode): x [B,Cin,H,W] f32 is reordered (and in bf16 rounded,
 * nearest even) into this thread's scratch, the sums are f32 and y comes
 * back from the primitive's f32 layout to nchw (channels last: x may be
 * bf16 rows, read as they are, and y may be written as bf16 rows by the
 * primitive itself, p.y_bf16). The weights come packed at
 * conversion (kk_fast_conv_pack: the layout the primitive of a canonical
 * geometry picks, which is every stride-1 geometry's on the CPUs measured)
 * and are read in place, else reordered per call (from f32 [Cout,Cin,kh,kw]
 * row-major, or from a packed layout another geometry wants). One primitive
 * per geometry and dtype, kept, with its reorders. */
typedef struct {
    kk_conv p;
    int64_t pad_t; /* rows of zeros above x (p.pad_lo but in a band of an up2 conv); below: what makes Ho */
    int bf16;
    int res_after; /* p.residual, and oneDNN had no post-op add for it: added after the primitive */
    /* a reorder is NULL where the two layouts are the same */
    dnnl_primitive_t prim, xreorder, yreorder;
    dnnl_primitive_t wreorder[3]; /* into wei from: f32 row-major, packed f32, packed bf16 */
    int has_packed[2];            /* wpacked[i] is known (packed f32, packed bf16) */
    dnnl_memory_desc_t src, xplain, wei, wfrom[3], bias, dst, yplain, sp;
} conv_entry;

static conv_entry **g_convs; /* entries never move once made */
static size_t g_nconvs;

/* The packed layout of a conv weight [Cout,Cin,kh,kw] in dt: the weights
 * md oneDNN's convolution picks for x [1,Cin,64,64] at stride 1 with the
 * padding that keeps the size (kh / 2), x and y in format "any". */
static int pack_md(int64_t Cout, int64_t Cin, int64_t kh, int64_t kw, dnnl_data_type_t dt, dnnl_memory_desc_t *out) {
    const int64_t S = 64;
    dnnl_dims_t ds = {1, Cin, S, S}, dw = {Cout, Cin, kh, kw}, db = {Cout}, st = {1, 1}, pl = {kh / 2, kw / 2},
                pr = {kh - 1 - kh / 2, kw - 1 - kw / 2}, dd = {1, Cout, S, S};
    dnnl_memory_desc_t sany, wany, dany, bmd;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    int ok = Cout > 0 && Cin > 0 && kh > 0 && kw > 0 && kh <= S && kw <= S &&
             !dnnl_memory_desc_init_by_tag(&sany, 4, ds, dt, dnnl_format_tag_any) &&
             !dnnl_memory_desc_init_by_tag(&wany, 4, dw, dt, dnnl_format_tag_any) &&
             !dnnl_memory_desc_init_by_tag(&bmd, 1, db, dnnl_f32, dnnl_a) &&
             !dnnl_memory_desc_init_by_tag(&dany, 4, dd, dnnl_f32, dnnl_format_tag_any) &&
             !dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &sany, &wany,
                                                 &bmd, &dany, st, pl, pr) &&
             !dnnl_primitive_desc_create(&pd, &cd, NULL, kk_dnnl_engine(), NULL);
    if (ok) *out = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return ok;
}

static int make_reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to, dnnl_primitive_t *out) {
    dnnl_primitive_desc_t rpd = NULL;
    *out = NULL;
    if (dnnl_memory_desc_equal(from, to)) return 1;
    int ok = !dnnl_reorder_primitive_desc_create(&rpd, from, kk_dnnl_engine(), to, kk_dnnl_engine(), NULL) && !dnnl_primitive_create(out, rpd);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    return ok;
}

static void destroy_entry(conv_entry *e) {
    dnnl_primitive_t ps[6] = {e->prim, e->xreorder, e->yreorder, e->wreorder[0], e->wreorder[1], e->wreorder[2]};
    for (int i = 0; i < 6; i++)
        if (ps[i]) dnnl_primitive_destroy(ps[i]);
}

static const conv_entry *get_conv_band(const kk_conv *p, int64_t pad_t, int bf16) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nconvs; i++)
        if (!memcmp(&g_convs[i]->p, p, sizeof *p) && g_convs[i]->pad_t == pad_t && g_convs[i]->bf16 == bf16) {
            pthread_mutex_unlock(&g_lock);
            return g_convs[i];
        }
    double t0 = kb_now();
    conv_entry e;
    memset(&e, 0, sizeof e);
    e.p = *p;
    e.pad_t = pad_t;
    e.bf16 = bf16;
    dnnl_data_type_t dt = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_dims_t ds = {p->B, p->Cin, p->H, p->W}, dw = {p->Cout, p->Cin, p->kh, p->kw}, db = {p->Cout},
                dd = {p->B, p->Cout, p->Ho, p->Wo}, st = {p->stride, p->stride}, pl = {pad_t, p->pad_lo};
    /* oneDNN's right padding is what makes its output size ours: the last
     * window may leave some of pad_hi unread, as PyTorch's does */
    dnnl_dims_t pr = {(p->Ho - 1) * p->stride + p->kh - p->H - pad_t, (p->Wo - 1) * p->stride + p->kw - p->W - p->pad_lo};
    dnnl_memory_desc_t sany, wany, dany;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    /* our layout of x and y: nchw, or nhwc (channels last, the primitive's own: no reorder of y, x only rounded) */
    dnnl_format_tag_t plain = p->nhwc ? dnnl_nhwc : dnnl_nchw;
    dnnl_data_type_t ydt = p->y_bf16 ? dnnl_bf16 : dnnl_f32;
    int ok = pr[0] >= 0 && pr[1] >= 0 && !(p->y_bf16 && (p->residual || !p->nhwc)) &&
             !dnnl_memory_desc_init_by_tag(&e.xplain, 4, ds, p->x_bf16 ? dnnl_bf16 : dnnl_f32, plain) &&
             !dnnl_memory_desc_init_by_tag(&sany, 4, ds, dt, dnnl_format_tag_any) &&
             !dnnl_memory_desc_init_by_tag(&e.wfrom[0], 4, dw, dnnl_f32, dnnl_oihw) &&
             !dnnl_memory_desc_init_by_tag(&wany, 4, dw, dt, dnnl_format_tag_any) &&
             !dnnl_memory_desc_init_by_tag(&e.bias, 1, db, dnnl_f32, dnnl_a) &&
             !dnnl_memory_desc_init_by_tag(&e.yplain, 4, dd, ydt, plain) &&
             !dnnl_memory_desc_init_by_tag(&dany, 4, dd, ydt, dnnl_format_tag_any) &&
             !dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &sany, &wany,
                                                 &e.bias, &dany, st, pl, pr) &&
             !dnnl_primitive_attr_create(&attr) &&
             !dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    ok = ok && !dnnl_primitive_desc_create(&pd, &cd, attr, kk_dnnl_engine(), NULL);
    /* oneDNN 2.6's AMX brgconv reads past a buffer of its own when it builds
     * the kernels of a convolution with fewer than 64 channels in and out,
     * not all multiples of 32 (tiny test VAEs; a SEGV in dnnl_primitive_create
     * under ASan about one test_vae_tiled run in 8 with two threads): the next
     * implementation for those. Real VAEs have 128 channels and more (their
     * conv_out, 128 -> 3, keeps brgconv: never seen to fail) */
    const char *first = "";
    int small_odd = p->Cin < 64 && p->Cout < 64 && (p->Cin % 32 || p->Cout % 32);
    if (ok && bf16 && small_odd && !dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &first) &&
        !strcmp(first, "brgconv:avx512_core_amx_bf16")) {
        /* the iterator starts at the implementation pd holds (that one): from the next on */
        dnnl_primitive_desc_iterator_t it = NULL;
        dnnl_primitive_desc_t alt = NULL;
        if (!dnnl_primitive_desc_iterator_create(&it, &cd, attr, kk_dnnl_engine(), NULL)) {
            while (!alt && dnnl_primitive_desc_iterator_next(it) == dnnl_success) {
                dnnl_primitive_desc_t c = dnnl_primitive_desc_iterator_fetch(it);
                const char *impl = "";
                if (c && !dnnl_primitive_desc_query(c, dnnl_query_impl_info_str, 0, &impl) &&
                    strncmp(impl, "brgconv:avx512_core_amx", 23))
                    alt = c;
                else if (c)
                    dnnl_primitive_desc_destroy(c);
            }
            dnnl_primitive_desc_iterator_destroy(it);
        }
        if (alt) {
            dnnl_primitive_desc_destroy(pd);
            pd = alt;
        }
    }
    /* a residual as the primitive's post-op add (src1 in our layout of y)
     * where oneDNN runs it in the same implementation writing y as it is
     * (brgconv f32 does; bf16 brgconv in oneDNN 2.6 falls back to gemm:jit
     * with y reordered, and the sum came out wrong there): else added after */
    if (ok && p->residual) {
        dnnl_post_ops_t po = NULL;
        dnnl_primitive_attr_t pa = NULL;
        dnnl_primitive_desc_t ppd = NULL;
        const char *impl = "", *pimpl = "";
        int po_ok = !dnnl_post_ops_create(&po) && !dnnl_post_ops_append_binary(po, dnnl_binary_add, &e.yplain) &&
                    !dnnl_primitive_attr_create(&pa) && !dnnl_primitive_attr_set_scratchpad_mode(pa, dnnl_scratchpad_mode_user) &&
                    !dnnl_primitive_attr_set_post_ops(pa, po) && !dnnl_primitive_desc_create(&ppd, &cd, pa, kk_dnnl_engine(), NULL) &&
                    !dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) &&
                    !dnnl_primitive_desc_query(ppd, dnnl_query_impl_info_str, 0, &pimpl) && !strcmp(impl, pimpl) &&
                    dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(ppd, dnnl_query_dst_md, 0), &e.yplain);
        if (po_ok) {
            dnnl_primitive_desc_destroy(pd);
            pd = ppd;
        } else {
            if (ppd) dnnl_primitive_desc_destroy(ppd);
            e.res_after = 1;
        }
        if (po) dnnl_post_ops_destroy(po);
        if (pa) dnnl_primitive_attr_destroy(pa);
    }
    if (ok) {
        e.src = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        e.wei = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        e.dst = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
        e.sp = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        const char *impl = "";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        kb_log(KILN_LOG_DEBUG, "conv2d %s %s%s [%lld,%lld,%lld,%lld] * [%lld,%lld,%lld,%lld] stride %lld: %s%s%s", bf16 ? "bf16" : "f32",
               p->nhwc ? "nhwc" : "nchw", p->y_bf16 ? " -> bf16 rows" : "", (long long)p->B,
               (long long)p->Cin, (long long)p->H, (long long)p->W, (long long)p->Cout, (long long)p->Cin,
               (long long)p->kh, (long long)p->kw, (long long)p->stride, impl,
               dnnl_memory_desc_equal(&e.xplain, &e.src) ? "" : ", x reordered",
               dnnl_memory_desc_equal(&e.yplain, &e.dst) ? "" : ", y reordered");
        dnnl_memory_desc_t wpk;
        if (pack_md(p->Cout, p->Cin, p->kh, p->kw, dt, &wpk) && !dnnl_memory_desc_equal(&wpk, &e.wei))
            kb_log(KILN_LOG_DEBUG, "conv2d: this geometry's weights are not the packed layout: reordered per call");
        ok = !dnnl_primitive_create(&e.prim, pd);
    }
    ok = ok && make_reorder(&e.wfrom[0], &e.wei, &e.wreorder[0]) && make_reorder(&e.xplain, &e.src, &e.xreorder) &&
         make_reorder(&e.dst, &e.yplain, &e.yreorder);
    /* from either packed layout (a bf16 model's weights in an f32 fallback too) */
    for (int k = 0; ok && k < 2; k++)
        e.has_packed[k] = pack_md(p->Cout, p->Cin, p->kh, p->kw, k ? dnnl_bf16 : dnnl_f32, &e.wfrom[1 + k]) &&
                          make_reorder(&e.wfrom[1 + k], &e.wei, &e.wreorder[1 + k]);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    conv_entry **nc = ok ? realloc(g_convs, (g_nconvs + 1) * sizeof *nc) : NULL;
    conv_entry *out = nc ? malloc(sizeof *out) : NULL;
    if (nc) g_convs = nc;
    if (out) {
        *out = e;
        g_convs[g_nconvs++] = out;
    } else
        destroy_entry(&e);
    pthread_mutex_unlock(&g_lock);
    kb_ledger_add("onednn_create", kb_now() - t0, "conv");
    return out;
}

static const conv_entry *get_conv(const kk_conv *p, int bf16) { return get_conv_band(p, p->pad_lo, bf16); }

/* run reorder r: from (md f, data a) to (md t, data b) */
static int run_reorder(dnnl_primitive_t r, dnnl_stream_t strm, const dnnl_memory_desc_t *f, const void *a,
                       const dnnl_memory_desc_t *t, void *b) {
    dnnl_memory_t mf = NULL, mt = NULL;
    int ok = !dnnl_memory_create(&mf, f, kk_dnnl_engine(), (void *)a) && !dnnl_memory_create(&mt, t, kk_dnnl_engine(), b);
    dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mt}};
    ok = ok && !dnnl_primitive_execute(r, strm, 2, ra) && !dnnl_stream_wait(strm);
    if (mf) dnnl_memory_destroy(mf);
    if (mt) dnnl_memory_destroy(mt);
    return ok;
}

/* which of the entry's weight sources w is (0 f32 row-major, 1 packed f32, 2 packed bf16); -1 none */
static int weight_from(const conv_entry *e, const kk_weight *w) {
    if (!w->packed) return w->f32 ? 0 : -1;
    int k = w->packed_dtype == KILN_BF16 ? 1 : w->packed_dtype == KILN_F32 ? 0 : -1;
    return k >= 0 && e->has_packed[k] ? 1 + k : -1;
}

/* y += r over n values (a residual oneDNN could not add as a post-op) */
KK_CLONES static void add_residual(float *y, const float *r, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (size_t i = 0; i < n; i++) y[i] += r[i];
}

static int conv_run(const conv_entry *e, const void *x, const kk_weight *w, const float *b, const float *res, void *y) {
    dnnl_stream_t strm = kk_dnnl_stream();
    int from = weight_from(e, w);
    if (!strm || from < 0) return 0;
    const void *wsrc = from ? w->packed : (const void *)w->f32;
    /* scratch: 0 weights, 1 the primitive's scratchpad, 2 a zero bias, 3 x, 4 y */
    size_t spbytes = dnnl_memory_desc_get_size(&e->sp);
    dnnl_primitive_t wr = e->wreorder[from];
    void *wbuf = wr ? kk_scratch_must(KK_SCRATCH_CONV + 0, dnnl_memory_desc_get_size(&e->wei)) : (void *)wsrc;
    void *sp = spbytes ? kk_scratch_must(KK_SCRATCH_CONV + 1, spbytes) : NULL;
    void *src = e->xreorder ? kk_scratch_must(KK_SCRATCH_CONV + 3, dnnl_memory_desc_get_size(&e->src)) : (void *)x;
    void *dst = e->yreorder ? kk_scratch_must(KK_SCRATCH_CONV + 4, dnnl_memory_desc_get_size(&e->dst)) : (void *)y;
    if (!wbuf || (spbytes && !sp) || !src || !dst) return 0;
    if (wr && !run_reorder(wr, strm, &e->wfrom[from], wsrc, &e->wei, wbuf)) return 0;
    if (e->xreorder && !run_reorder(e->xreorder, strm, &e->xplain, x, &e->src, src)) return 0;
    /* no bias given: zeros (the primitive was made with one) */
    const float *bias = b;
    if (!bias) {
        float *z = kk_scratch_must(KK_SCRATCH_CONV + 2, sizeof(float) * (size_t)e->p.Cout);
        if (!z) return 0;
        memset(z, 0, sizeof(float) * (size_t)e->p.Cout);
        bias = z;
    }
    if (e->p.residual && !res) return 0;
    dnnl_memory_t m[6] = {NULL};
    dnnl_exec_arg_t args[6] = {{DNNL_ARG_SRC, NULL}, {DNNL_ARG_WEIGHTS, NULL}, {DNNL_ARG_BIAS, NULL}, {DNNL_ARG_DST, NULL}};
    const dnnl_memory_desc_t *md[6] = {&e->src, &e->wei, &e->bias, &e->dst};
    void *data[6] = {src, wbuf, (void *)bias, dst};
    int n = 4, ok = 1;
    if (spbytes) args[n].arg = DNNL_ARG_SCRATCHPAD, md[n] = &e->sp, data[n++] = sp;
    if (e->p.residual && !e->res_after) /* the post-op's addend, in our layout of y */
        args[n].arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, md[n] = &e->yplain, data[n++] = (void *)res;
    for (int i = 0; i < n && ok; i++) {
        ok = !dnnl_memory_create(&m[i], md[i], kk_dnnl_engine(), data[i]);
        args[i].memory = m[i];
    }
    if (ok) ok = !dnnl_primitive_execute(e->prim, strm, n, args) && !dnnl_stream_wait(strm);
    for (int i = 0; i < 6; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    if (ok && e->yreorder) ok = run_reorder(e->yreorder, strm, &e->dst, dst, &e->yplain, y);
    if (ok && e->res_after) add_residual((float *)y, res, (size_t)(e->p.B * e->p.Cout * e->p.Ho * e->p.Wo));
    return ok;
}

/* A packed weight back to f32 [Cout,Cin,kh,kw] row-major (the reference
 * kernel's fallback), into out */
static int unpack_conv(const kk_weight *w, const kk_conv *p, float *out) {
    dnnl_memory_desc_t from, to;
    dnnl_dims_t dw = {w->M, p->Cin, p->kh, p->kw}; /* M: p->Cout, or 4 Cout for up2 */
    dnnl_primitive_t r = NULL;
    dnnl_stream_t strm = kk_dnnl_stream();
    int ok = strm && (w->packed_dtype == KILN_F32 || w->packed_dtype == KILN_BF16) &&
             pack_md(w->M, p->Cin, p->kh, p->kw, w->packed_dtype == KILN_BF16 ? dnnl_bf16 : dnnl_f32, &from) &&
             !dnnl_memory_desc_init_by_tag(&to, 4, dw, dnnl_f32, dnnl_oihw) && make_reorder(&from, &to, &r);
    if (ok) ok = r ? run_reorder(r, strm, &from, w->packed, &to, out)
                   : (memcpy(out, w->packed, sizeof(float) * (size_t)(w->M * w->K)), 1);
    if (r) dnnl_primitive_destroy(r);
    return ok;
}

/* An up2 conv (kernels.h: the sub-pixel 2x2 form of upsample + 3x3 conv)
 * as one 2x2 convolution of x to 4 Cout phase channels on the grid of
 * (H+1) x (W+1) window positions (pad 1 all round): position (r, q) reads
 * x rows r-1, r and columns q-1, q, and phase (a, b)'s output (2i+a, 2j+b)
 * is position (i+a, j+b). Run in bands of grid rows whose phases fit
 * UP2_BAND_BYTES (each band a convolution of its x rows, with the row
 * above as halo and the zero row at an edge as its padding: in NHWC a band
 * of x is a pointer into it), each band's phases then shuffled into y with
 * the bias (and in bf16 rows rounded, p->y_bf16). y never exists
 * upsampled-and-unconvolved: 16/36 of the multiplies, and no 4x-sized
 * activation. */
#define UP2_BAND_BYTES ((size_t)8 << 20)

/* one output pixel of an up2 band: y [n] = s + b, or in bf16 rows rounded
 * (the f32 sum's bits, as the f32 path stores them) */
KK_CLONES static void up2_store(const float *s, const float *b, float *y, int64_t n) {
    for (int64_t c = 0; c < n; c++) y[c] = s[c] + b[c];
}
KK_CLONES static void up2_store_bf16(const float *s, const float *b, uint16_t *y, int64_t n) {
    if (b)
        for (int64_t c = 0; c < n; c++) y[c] = bf16_of(s[c] + b[c]);
    else
        for (int64_t c = 0; c < n; c++) y[c] = bf16_of(s[c]);
}

static int up2_run(int bf16, const float *x, const kk_weight *w, const float *b, void *y, const kk_conv *p) {
    const int64_t H = p->H, W = p->W, Cin = p->Cin, Co = p->Cout, C4 = 4 * Co;
    if (w->M != C4 || p->Ho != 2 * H || p->Wo != 2 * W || p->kh != 2 || p->kw != 2) return 0;
    int64_t R = (int64_t)(UP2_BAND_BYTES / (sizeof(float) * (size_t)((W + 1) * C4)));
    R = R < 1 ? 1 : R > H + 1 ? H + 1 : R;
    float *ph = kk_scratch_must(KK_SCRATCH_CONV + 5, sizeof(float) * (size_t)(R * (W + 1) * C4));
    if (!ph) return 0;
    for (int64_t n = 0; n < p->B; n++)
        for (int64_t p0 = 0; p0 <= H; p0 += R) {
            int64_t p1 = p0 + R < H + 1 ? p0 + R : H + 1; /* grid rows [p0, p1) */
            int64_t r0 = p0 ? p0 - 1 : 0, r1 = p1 < H ? p1 : H; /* x rows [r0, r1) */
            kk_conv band = {1, Cin, r1 - r0, W, C4, 2, 2, p1 - p0, W + 1, 1, 1, 1, 1, 0, 0, 0, 0};
            const conv_entry *e = get_conv_band(&band, p0 ? 0 : 1, bf16);
            if (!e || !conv_run(e, x + (n * H + r0) * W * Cin, w, NULL, NULL, ph)) return 0;
            const int64_t nr = p1 - p0;
#pragma omp parallel for collapse(2) schedule(static) if (nr * W * C4 > (1 << 15))
            for (int64_t r = 0; r < nr; r++)
                for (int a = 0; a < 2; a++) {
                    int64_t i = p0 + r - a; /* the output row 2i + a */
                    if (i < 0 || i >= H) continue;
                    int64_t yr = ((n * 2 * H) + 2 * i + a) * 2 * W * Co; /* y's row 2i + a */
                    for (int64_t j = 0; j < W; j++)
                        for (int bb = 0; bb < 2; bb++) {
                            const float *src = ph + (r * (W + 1) + j + bb) * C4 + (2 * a + bb) * Co;
                            int64_t at = yr + (2 * j + bb) * Co;
                            if (p->y_bf16)
                                up2_store_bf16(src, b, (uint16_t *)y + at, Co);
                            else if (b)
                                up2_store(src, b, (float *)y + at, Co);
                            else
                                memcpy((float *)y + at, src, sizeof(float) * (size_t)Co);
                        }
                }
        }
    return 1;
}

/* In bf16 where the backend is bf16 and the weight is not one the model
 * keeps f32 (packed f32 in a bf16 model: ka_spec.keep_f32), and oneDNN has
 * the primitive; else in f32; the reference's loops where it has neither. */
static void fast_conv(int bf16, const float *x, const kk_weight *w, const float *b, const float *res, float *y,
                      const kk_conv *p) {
    if (w->packed && w->packed_dtype == KILN_F32) bf16 = 0;
    /* bf16 rows in (a group norm's) or out (kk_fast_conv_bf16_io): only oneDNN reads
     * and writes them, and the up2 bands write them */
    if (p->x_bf16 || p->y_bf16) {
        int ok = p->nhwc && !(p->up2 && p->x_bf16) && kk_dnnl_engine();
        const conv_entry *e = ok && !p->up2 ? get_conv(p, bf16) : NULL;
        if (ok && p->up2) ok = !p->residual && (up2_run(bf16, x, w, b, y, p) || (bf16 && up2_run(0, x, w, b, y, p)));
        else ok = e && conv_run(e, x, w, b, res, y);
        if (!ok) kb_defer_failure(KILN_ERR_UNSUPPORTED, "conv2d: oneDNN did not run a convolution of bf16 activations");
        return;
    }
    if (p->up2) {
        if (!p->residual && p->nhwc && kk_dnnl_engine() && (up2_run(bf16, x, w, b, y, p) || (bf16 && up2_run(0, x, w, b, y, p))))
            return;
    } else {
        const conv_entry *e = kk_dnnl_engine() ? get_conv(p, bf16) : NULL;
        if (!e && bf16) {
            kb_log(KILN_LOG_DEBUG, "conv2d: oneDNN has no bf16 convolution for this geometry, f32 runs");
            e = get_conv(p, 0);
        }
        if (e && conv_run(e, x, w, b, res, y)) return;
    }
    kb_log(KILN_LOG_DEBUG, "conv2d: oneDNN declined, the reference kernel runs");
    if (!w->packed) {
        kk_reference()->conv2d(x, w, b, res, y, p);
        return;
    }
    float *wf = kk_dnnl_engine() ? kb_alloc_aligned(sizeof(float) * (size_t)(w->M * w->K)) : NULL;
    if (!wf || !unpack_conv(w, p, wf)) {
        kb_free_aligned(wf);
        kb_defer_failure(KILN_ERR_UNSUPPORTED, "conv2d: oneDNN ran neither this convolution nor its weight's unpacking");
        return;
    }
    kk_weight f = {.M = w->M, .K = w->K, .f32 = wf, .packed_dtype = KILN_F32};
    kk_reference()->conv2d(x, &f, b, res, y, p);
    kb_free_aligned(wf);
}

void kk_fast_conv2d_f32(const float *x, const kk_weight *w, const float *b, const float *res, float *y, const kk_conv *p) {
    fast_conv(0, x, w, b, res, y, p);
}
void kk_fast_conv2d_bf16(const float *x, const kk_weight *w, const float *b, const float *res, float *y, const kk_conv *p) {
    fast_conv(1, x, w, b, res, y, p);
}

int kk_fast_conv_bf16_io(const kk_weight *w) { return w && w->packed && w->packed_dtype == KILN_BF16; }

/* ---- packing at conversion ------------------------------------------------------ */

static int conv_dt(kiln_dtype dt, dnnl_data_type_t *out) {
    *out = dt == KILN_BF16 ? dnnl_bf16 : dnnl_f32;
    return dt == KILN_F32 || dt == KILN_BF16;
}

/* the layout's identity: its blocking (dims, padding, strides, inner blocks) */
static uint64_t layout_id(const dnnl_memory_desc_t *md) {
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    int64_t v[4 * DNNL_MAX_NDIMS + 4] = {0};
    int n = 0;
    v[n++] = md->ndims;
    v[n++] = md->data_type;
    v[n++] = bd->inner_nblks;
    for (int i = 0; i < md->ndims; i++) v[n++] = md->padded_dims[i], v[n++] = bd->strides[i];
    for (int i = 0; i < bd->inner_nblks; i++) v[n++] = bd->inner_blks[i], v[n++] = bd->inner_idxs[i];
    return XXH3_64bits(v, sizeof(int64_t) * (size_t)n);
}

kiln_status kk_fast_conv_layout(int64_t Cout, int64_t Cin, int64_t kh, int64_t kw, kiln_dtype dt, char layout[40],
                                size_t *bytes) {
    dnnl_data_type_t t;
    dnnl_memory_desc_t md;
    if (!conv_dt(dt, &t) || !kk_dnnl_engine() || !pack_md(Cout, Cin, kh, kw, t, &md))
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN has no %s convolution for a weight [%lld, %lld, %lld, %lld] on this machine",
                       kiln_dtype_name(dt), (long long)Cout, (long long)Cin, (long long)kh, (long long)kw);
    snprintf(layout, 40, "conv-%016llx", (unsigned long long)layout_id(&md));
    *bytes = dnnl_memory_desc_get_size(&md);
    return KILN_OK;
}

kiln_status kk_fast_conv_pack(const float *w, int64_t Cout, int64_t Cin, int64_t kh, int64_t kw, kiln_dtype dt,
                              void *out) {
    dnnl_data_type_t t;
    dnnl_memory_desc_t from, to;
    dnnl_dims_t dw = {Cout, Cin, kh, kw};
    dnnl_primitive_t r = NULL;
    dnnl_stream_t strm = kk_dnnl_engine() ? kk_dnnl_stream() : NULL;
    int ok = conv_dt(dt, &t) && strm && pack_md(Cout, Cin, kh, kw, t, &to) &&
             !dnnl_memory_desc_init_by_tag(&from, 4, dw, dnnl_f32, dnnl_oihw) && make_reorder(&from, &to, &r);
    /* the padded part of a blocked layout (channels up to the block) must be zeros */
    if (ok) memset(out, 0, dnnl_memory_desc_get_size(&to));
    if (ok) ok = r ? run_reorder(r, strm, &from, w, &to, out) : (memcpy(out, w, sizeof(float) * (size_t)(Cout * Cin * kh * kw)), 1);
    if (r) dnnl_primitive_destroy(r);
    if (!ok)
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN could not pack a %s convolution weight [%lld, %lld, %lld, %lld]",
                       kiln_dtype_name(dt), (long long)Cout, (long long)Cin, (long long)kh, (long long)kw);
    return KILN_OK;
}

/* Group norm: each group's mean and variance summed in double, then
 * (x - mean) * (w / sqrt(var + eps)) + b and SiLU in f32 through exp_f.
 * Channels first: eight partial sums a pass over each group's values (a
 * fixed order, so the loop vectorizes without reassociation). Channels
 * last: one pass of per-channel shifted sums over chunks of GN_CHUNK
 * positions, the chunks' sums combined in order (the same bits whatever
 * the thread count); x may be bf16 rows there (a convolution's, kg_plan_bf16),
 * each chunk widened to f32 into its thread's buffer first, so both forms
 * run the same sums on the same values. */
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

#define GN_CHUNK 512

/* s1 [C] += x - k, s2 [C] += (x - k)^2 over x [rows,C] per channel, k [C]
 * the chunk's first row (a shift near the data: no cancellation) */
KK_CLONES static void gn_rows_sum(const float *x, int64_t rows, int64_t C, const float *k, double *s1, double *s2) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        for (int64_t c = 0; c < C; c++) {
            double d = (double)xr[c] - (double)k[c];
            s1[c] += d;
            s2[c] += d * d;
        }
    }
}

/* y [rows,C] = (x - mean [C]) * a [C] + c [C], SiLU after when silu */
KK_CLONES static void gn_rows_apply(const float *x, float *y, int64_t rows, int64_t C, const float *mean, const float *a,
                                    const float *cc, int silu) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C;
        if (silu)
#pragma omp simd
            for (int64_t c = 0; c < C; c++) {
                float v = (xr[c] - mean[c]) * a[c] + cc[c];
                yr[c] = v / (1.0f + exp_f(-v));
            }
        else
#pragma omp simd
            for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - mean[c]) * a[c] + cc[c];
    }
}

KK_CLONES static void widen_bf16(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f32_of(x[i]);
}

/* chunk k's rows of batch entry xb [S,C] (f32, or bf16 rows when tb) as
 * f32: in place, or widened into this thread's GN_CHUNK x C part of tb */
static const float *gn_chunk(const void *xb, float *tb, int64_t k, int64_t S, int64_t C) {
    int64_t r0 = k * GN_CHUNK, nr = S - r0 < GN_CHUNK ? S - r0 : GN_CHUNK;
    if (!tb) return (const float *)xb + r0 * C;
    float *buf = tb + (size_t)omp_get_thread_num() * GN_CHUNK * (size_t)C;
    widen_bf16((const uint16_t *)xb + r0 * C, buf, nr * C);
    return buf;
}

/* The channels-last moments of batch entry xb [S,C] in one pass: each
 * chunk's shifted per-channel sums into part [chunks][2][C] (the shift, the
 * chunk's first row, into shift [chunks][C]), then per group g the mean[g]
 * and the variance var[g] (Chan et al.'s combination of the chunks' shifted
 * sums, in double) */
static void gn_nhwc_moments(const void *xb, float *tb, int64_t S, int64_t C, int64_t G, double *part, float *shift,
                            double *mean, double *var) {
    int64_t nch = (S + GN_CHUNK - 1) / GN_CHUNK, cg = C / G;
#pragma omp parallel for schedule(static) if (C * S > (1 << 16))
    for (int64_t k = 0; k < nch; k++) {
        double *p = part + k * 2 * C;
        int64_t r0 = k * GN_CHUNK, nr = S - r0 < GN_CHUNK ? S - r0 : GN_CHUNK;
        const float *rows = gn_chunk(xb, tb, k, S, C);
        memset(p, 0, sizeof(double) * 2 * (size_t)C);
        memcpy(shift + k * C, rows, sizeof(float) * (size_t)C);
        gn_rows_sum(rows, nr, C, rows, p, p + C);
    }
    double N = (double)(cg * S > 0 ? cg * S : 1);
    for (int64_t g = 0; g < G; g++) {
        double t = 0, m2 = 0;
        for (int64_t k = 0; k < nch; k++) {
            double nk = (double)(S - k * GN_CHUNK < GN_CHUNK ? S - k * GN_CHUNK : GN_CHUNK);
            for (int64_t c = g * cg; c < (g + 1) * cg; c++) t += part[k * 2 * C + c] + nk * shift[k * C + c];
        }
        double m = t / N;
        for (int64_t k = 0; k < nch; k++) {
            double nk = (double)(S - k * GN_CHUNK < GN_CHUNK ? S - k * GN_CHUNK : GN_CHUNK);
            for (int64_t c = g * cg; c < (g + 1) * cg; c++) {
                double dk = (double)shift[k * C + c] - m, s1 = part[k * 2 * C + c], s2 = part[k * 2 * C + C + c];
                m2 += s2 + 2 * dk * s1 + nk * dk * dk;
            }
        }
        mean[g] = m;
        var[g] = m2 > 0 ? m2 / N : 0;
    }
}

/* gn_rows_apply's values rounded to bf16 (nearest even): each row in f32
 * first, then rounded (two loops the compiler vectorizes; one with both did
 * not) */
KK_CLONES static void round_bf16(const float *x, uint16_t *y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = bf16_of(x[i]);
}

static void gn_rows_apply_bf16(const float *x, uint16_t *y, int64_t rows, int64_t C, const float *mean,
                               const float *a, const float *cc, int silu) {
    float row[1024];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c0 = 0; c0 < C; c0 += 1024) {
            int64_t n = C - c0 < 1024 ? C - c0 : 1024;
            /* a slice of the channels as one row of n */
            gn_rows_apply(x + r * C + c0, row, 1, n, mean + c0, a + c0, cc + c0, silu);
            round_bf16(row, y + r * C + c0, n);
        }
}

static void gn_nhwc(const void *x, const float *w, const float *b, void *y, int64_t B, int64_t C, int64_t S,
                    int64_t G, float eps, int silu, int x_bf16, int y_bf16) {
    int64_t nch = (S + GN_CHUNK - 1) / GN_CHUNK, cg = C / G;
    double *part = malloc(sizeof(double) * (size_t)(2 * nch * C + 2 * G) + 1);
    float *f = malloc(sizeof(float) * (size_t)(3 + nch) * (size_t)C + 1);
    /* bf16 rows in: a chunk's f32 rows per thread */
    float *tb = x_bf16 ? kb_alloc_aligned(sizeof(float) * (size_t)omp_get_max_threads() * GN_CHUNK * (size_t)C) : NULL;
    if (!part || !f || (x_bf16 && !tb)) {
        free(part);
        free(f);
        kb_free_aligned(tb);
        kb_defer_failure(KILN_ERR_NOMEM, "group_norm: out of memory");
        return;
    }
    double *mean = part + 2 * nch * C, *var = mean + G;
    float *mf = f, *a = f + C, *cc = f + 2 * C, *shift = f + 3 * C;
    size_t xe = x_bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int64_t bb = 0; bb < B; bb++) {
        const void *xb = (const char *)x + (size_t)(bb * S * C) * xe;
        float *yb = y_bf16 ? NULL : (float *)y + bb * S * C;
        uint16_t *yh = y_bf16 ? (uint16_t *)y + bb * S * C : NULL;
        gn_nhwc_moments(xb, tb, S, C, G, part, shift, mean, var);
        for (int64_t c = 0; c < C; c++) {
            double inv = 1.0 / sqrt(var[c / cg] + (double)eps);
            mf[c] = (float)mean[c / cg];
            a[c] = (float)(inv * (w ? w[c] : 1.0));
            cc[c] = b ? b[c] : 0.0f;
        }
#pragma omp parallel for schedule(static) if (C * S > (1 << 16))
        for (int64_t k = 0; k < nch; k++) {
            int64_t r0 = k * GN_CHUNK, nr = S - r0 < GN_CHUNK ? S - r0 : GN_CHUNK;
            const float *rows = gn_chunk(xb, tb, k, S, C);
            if (yh) gn_rows_apply_bf16(rows, yh + r0 * C, nr, C, mf, a, cc, silu);
            else gn_rows_apply(rows, yb + r0 * C, nr, C, mf, a, cc, silu);
        }
    }
    free(part);
    free(f);
    kb_free_aligned(tb);
}

void kk_fast_group_norm(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t C, int64_t S,
                        int64_t G, float eps, int silu, int nhwc, int x_bf16, int y_bf16) {
    if (nhwc) {
        gn_nhwc(x, w, b, y, B, C, S, G, eps, silu, x_bf16, y_bf16);
        return;
    }
    if (x_bf16 || y_bf16) {
        kb_defer_failure(KILN_ERR_UNSUPPORTED, "group_norm: bf16 rows are channels last only");
        return;
    }
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
