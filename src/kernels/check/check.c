/* check.c - the checking backend: the reference kernels on memory the host
 * cannot touch. Every buffer it hands out (activations, arenas, inputs,
 * mapped weights) is its own mmap'd region kept PROT_NONE; a slot opens
 * the regions its arguments lie in, runs the reference kernel, and closes
 * them again. Host code that reads or writes one of its buffers behind the
 * interface (an executor peeking at an activation, a weight read where it
 * should be mapped) dies with SIGSEGV, and a slot handed memory that is not
 * one of its buffers (a host array where a backend buffer belongs) aborts
 * naming the slot. So a test suite run on it (KILN_BACKEND=check) proves
 * that everything above src/kernels/ moves values only through the backend,
 * as a device backend needs. Slots run one at a time (one lock). */
#include "base/base.h"
#include "kernels/kernels.h"

#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct region {
    char *base;
    size_t len;
} region;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static region *g_reg; /* sorted by base */
static size_t g_n, g_cap;
/* the regions the running slot opened */
static region *g_open[16];
static int g_n_open;

static size_t page_round(size_t bytes) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + pg - 1) / pg * pg;
}

/* the region holding p (NULL: none) */
static region *find(const void *p) {
    size_t lo = 0, hi = g_n;
    const char *c = p;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < g_reg[mid].base) hi = mid;
        else if (c >= g_reg[mid].base + g_reg[mid].len) lo = mid + 1;
        else return &g_reg[mid];
    }
    return NULL;
}

static void die(const char *slot, const void *p) {
    fprintf(stderr, "kiln check backend: %s was handed %p, which is not one of its buffers (host memory where a "
                    "backend buffer belongs); called from:\n", slot, p);
    void *frames[32];
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
    abort();
}

/* open the region of p for the running slot (NULL p: nothing) */
static void open_ptr(const char *slot, const void *p) {
    if (!p) return;
    region *r = find(p);
    if (!r) die(slot, p);
    for (int i = 0; i < g_n_open; i++)
        if (g_open[i] == r) return;
    if (g_n_open == (int)(sizeof g_open / sizeof *g_open)) die(slot, p);
    if (mprotect(r->base, r->len, PROT_READ | PROT_WRITE)) abort();
    g_open[g_n_open++] = r;
}

static void close_all(void) {
    for (int i = 0; i < g_n_open; i++)
        if (mprotect(g_open[i]->base, g_open[i]->len, PROT_NONE)) abort();
    g_n_open = 0;
}

static void open_w(const char *slot, const kk_weight *w) {
    if (!w) return;
    open_ptr(slot, w->f32);
    open_ptr(slot, w->packed);
}

/* ---- memory ------------------------------------------------------------------ */

static void *check_alloc(size_t bytes) {
    size_t len = page_round(bytes ? bytes : 1);
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    pthread_mutex_lock(&g_lock);
    if (g_n == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 256;
        region *r = realloc(g_reg, cap * sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&g_lock);
            munmap(p, len);
            return NULL;
        }
        g_reg = r;
        g_cap = cap;
    }
    size_t at = 0;
    while (at < g_n && g_reg[at].base < (char *)p) at++;
    memmove(g_reg + at + 1, g_reg + at, (g_n - at) * sizeof *g_reg);
    g_reg[at] = (region){p, len};
    g_n++;
    pthread_mutex_unlock(&g_lock);
    return p;
}

static void check_free(void *p) {
    pthread_mutex_lock(&g_lock);
    region *r = find(p);
    if (!r || r->base != (char *)p) die("free", p);
    munmap(r->base, r->len);
    size_t at = (size_t)(r - g_reg);
    memmove(g_reg + at, g_reg + at + 1, (g_n - at - 1) * sizeof *g_reg);
    g_n--;
    pthread_mutex_unlock(&g_lock);
}

static void check_to_host(void *host, const void *buf, size_t bytes) {
    pthread_mutex_lock(&g_lock);
    open_ptr("to_host", buf);
    if (find((const char *)buf + bytes - 1) != find(buf)) die("to_host", buf);
    memcpy(host, buf, bytes);
    close_all();
    pthread_mutex_unlock(&g_lock);
}

static void check_from_host(void *buf, const void *host, size_t bytes) {
    pthread_mutex_lock(&g_lock);
    open_ptr("from_host", buf);
    if (find((char *)buf + bytes - 1) != find(buf)) die("from_host", buf);
    memcpy(buf, host, bytes);
    close_all();
    pthread_mutex_unlock(&g_lock);
}

static void *check_map(const void *host, size_t bytes) {
    void *p = check_alloc(bytes);
    if (p && bytes) check_from_host(p, host, bytes);
    return p;
}

/* ---- the slots: open the arguments' regions, run the reference kernel ---------- */

#define R kk_reference()
#define ENTER(name) \
    const char *slot_ = name; \
    pthread_mutex_lock(&g_lock)
#define O(p) open_ptr(slot_, p)
#define LEAVE() \
    close_all(); \
    pthread_mutex_unlock(&g_lock)

static void c_linear(const float *x, const kk_weight *w, const float *b, float *y, int64_t rows, int act) {
    ENTER("linear");
    O(x), open_w(slot_, w), O(b), O(y);
    R->linear(x, w, b, y, rows, act);
    LEAVE();
}
static void c_silu(const float *x, float *y, int64_t n) {
    ENTER("silu");
    O(x), O(y);
    R->silu(x, y, n);
    LEAVE();
}
static void c_gelu_tanh(const float *x, float *y, int64_t n) {
    ENTER("gelu_tanh");
    O(x), O(y);
    R->gelu_tanh(x, y, n);
    LEAVE();
}
static void c_layernorm(const float *x, float *y, int64_t rows, int64_t D, float eps) {
    ENTER("layernorm");
    O(x), O(y);
    R->layernorm(x, y, rows, D, eps);
    LEAVE();
}
static void c_layernorm_modulate(const float *x, const float *shift, const float *scale, float *y, int64_t B,
                                 int64_t N, int64_t D, float eps) {
    ENTER("layernorm_modulate");
    O(x), O(shift), O(scale), O(y);
    R->layernorm_modulate(x, shift, scale, y, B, N, D, eps);
    LEAVE();
}
static void c_rmsnorm_heads(const float *x, const float *w, float *y, int64_t rows, int64_t H, int64_t Dh, float eps) {
    ENTER("rmsnorm_heads");
    O(x), O(w), O(y);
    R->rmsnorm_heads(x, w, y, rows, H, Dh, eps);
    LEAVE();
}
static void c_modulate(const float *x, const float *shift, const float *scale, float *y, int64_t B, int64_t N,
                       int64_t D) {
    ENTER("modulate");
    O(x), O(shift), O(scale), O(y);
    R->modulate(x, shift, scale, y, B, N, D);
    LEAVE();
}
static void c_gate_add(const float *res, const float *gate, const float *v, float *y, int64_t B, int64_t N, int64_t D) {
    ENTER("gate_add");
    O(res), O(gate), O(v), O(y);
    R->gate_add(res, gate, v, y, B, N, D);
    LEAVE();
}
static void c_attention(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq, int64_t Nk,
                        int64_t H, int64_t Dh, const float *rope) {
    ENTER("attention");
    O(q), O(k), O(v), O(o), O(rope);
    R->attention(q, k, v, o, B, Nq, Nk, H, Dh, rope);
    LEAVE();
}
static void c_attention_joint(const float *qa, const float *ka, const float *va, const float *qb, const float *kb,
                              const float *vb, float *o, int64_t B, int64_t Na, int64_t Nb, int64_t H, int64_t Dh,
                              const float *rope) {
    ENTER("attention_joint");
    O(qa), O(ka), O(va), O(qb), O(kb), O(vb), O(o), O(rope);
    R->attention_joint(qa, ka, va, qb, kb, vb, o, B, Na, Nb, H, Dh, rope);
    LEAVE();
}
static void c_linear_gate_add(const void *x, int x_fmt, const kk_weight *w, const float *b, const float *res,
                              const float *gate, int64_t gate_ld, float *y, int64_t B, int64_t N) {
    ENTER("linear_gate_add");
    O(x), open_w(slot_, w), O(b), O(res), O(gate), O(y);
    R->linear_gate_add(x, x_fmt, w, b, res, gate, gate_ld, y, B, N);
    LEAVE();
}
static void c_conv2d(const float *x, const kk_weight *w, const float *b, const float *res, float *y, const kk_conv *p) {
    ENTER("conv2d");
    O(x), open_w(slot_, w), O(b), O(res), O(y);
    R->conv2d(x, w, b, res, y, p);
    LEAVE();
}
static void c_group_norm(const float *x, const float *w, const float *b, float *y, int64_t B, int64_t C, int64_t S,
                         int64_t G, float eps, int silu, int nhwc, int x_bf16, int y_bf16) {
    ENTER("group_norm");
    O(x), O(w), O(b), O(y);
    R->group_norm(x, w, b, y, B, C, S, G, eps, silu, nhwc, x_bf16, y_bf16);
    LEAVE();
}
static void c_attention_ex(const float *q, const float *k, const float *v, const float *bias, const int64_t bs[4],
                           float *o, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, float scale, int causal) {
    ENTER("attention_ex");
    O(q), O(k), O(v), O(bias), O(o);
    R->attention_ex(q, k, v, bias, bs, o, B, Nq, Nk, H, Dh, scale, causal);
    LEAVE();
}
static void c_unary(int op, const float *x, float *y, int64_t n) {
    ENTER("unary");
    O(x), O(y);
    R->unary(op, x, y, n);
    LEAVE();
}
static void c_binary(int op, const float *a, const int64_t as[4], const float *b, const int64_t bs[4], float *y,
                     const int64_t ys[4]) {
    ENTER("binary");
    O(a), O(b), O(y);
    R->binary(op, a, as, b, bs, y, ys);
    LEAVE();
}
static void c_gather_rows(const float *table, int64_t V, int64_t D, const float *ids, int64_t n, float *y) {
    ENTER("gather_rows");
    O(table), O(ids), O(y);
    R->gather_rows(table, V, D, ids, n, y);
    LEAVE();
}
static void c_affine_rows(float *y, const float *w, const float *b, int64_t rows, int64_t D) {
    ENTER("affine_rows");
    O(y), O(w), O(b);
    R->affine_rows(y, w, b, rows, D);
    LEAVE();
}
static void c_rmsnorm_rows(const float *x, const float *w, float *y, int64_t rows, int64_t D, float eps) {
    ENTER("rmsnorm_rows");
    O(x), O(w), O(y);
    R->rmsnorm_rows(x, w, y, rows, D, eps);
    LEAVE();
}
static void c_slice_rows(const float *x, float *y, int64_t rows, int64_t stride, int64_t off, int64_t len) {
    ENTER("slice_rows");
    O(x), O(y);
    R->slice_rows(x, y, rows, stride, off, len);
    LEAVE();
}
static void c_concat_rows(const float *a, int64_t na, const float *b, int64_t nb, float *y, int64_t rows) {
    ENTER("concat_rows");
    O(a), O(b), O(y);
    R->concat_rows(a, na, b, nb, y, rows);
    LEAVE();
}
static void c_patchify(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W, int64_t p) {
    ENTER("patchify");
    O(x), O(y);
    R->patchify(x, y, B, C, H, W, p);
    LEAVE();
}
static void c_unpatchify(const float *x, float *y, int64_t B, int64_t p, int64_t h, int64_t w, int64_t C, int cfirst) {
    ENTER("unpatchify");
    O(x), O(y);
    R->unpatchify(x, y, B, p, h, w, C, cfirst);
    LEAVE();
}
static void c_timestep_proj(const float *t, float *y, int64_t B, int64_t dim, float scale) {
    ENTER("timestep_proj");
    O(t), O(y);
    R->timestep_proj(t, y, B, dim, scale);
    LEAVE();
}
static void c_pos_crop(const float *table, float *y, int64_t M, int64_t h, int64_t w, int64_t D) {
    ENTER("pos_crop");
    O(table), O(y);
    R->pos_crop(table, y, M, h, w, D);
    LEAVE();
}
static void c_rope_table(float *y, int64_t T, int64_t h, int64_t w, const int64_t axes[3], float theta) {
    ENTER("rope_table");
    O(y);
    R->rope_table(y, T, h, w, axes, theta);
    LEAVE();
}
static void c_rope(const float *x, const float *table, float *y, int64_t B, int64_t N, int64_t H, int64_t Dh) {
    ENTER("rope");
    O(x), O(table), O(y);
    R->rope(x, table, y, B, N, H, Dh);
    LEAVE();
}
static void c_upsample_nearest(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W, int64_t f,
                               int nhwc) {
    ENTER("upsample_nearest");
    O(x), O(y);
    R->upsample_nearest(x, y, B, C, H, W, f, nhwc);
    LEAVE();
}
static void c_logvar_std(const float *x, float *y, int64_t n) {
    ENTER("logvar_std");
    O(x), O(y);
    R->logvar_std(x, y, n);
    LEAVE();
}
static void c_select_token(const float *x, const float *ids, float *y, int64_t B, int64_t T, int64_t D, int64_t eos) {
    ENTER("select_token");
    O(x), O(ids), O(y);
    R->select_token(x, ids, y, B, T, D, eos);
    LEAVE();
}
static void c_rel_pos_bias(const float *table, int64_t num_buckets, int64_t H, int64_t Nq, int64_t Nk,
                           int64_t max_distance, int bidirectional, float *y) {
    ENTER("rel_pos_bias");
    O(table), O(y);
    R->rel_pos_bias(table, num_buckets, H, Nq, Nk, max_distance, bidirectional, y);
    LEAVE();
}
static void c_copy(void *dst, const void *src, size_t bytes) {
    ENTER("copy");
    O(dst), O(src);
    R->copy(dst, src, bytes);
    LEAVE();
}

static const kk_backend k_check = {
    .name = "check",
    .linear = c_linear,
    .silu = c_silu,
    .gelu_tanh = c_gelu_tanh,
    .layernorm = c_layernorm,
    .layernorm_modulate = c_layernorm_modulate,
    .rmsnorm_heads = c_rmsnorm_heads,
    .modulate = c_modulate,
    .gate_add = c_gate_add,
    .attention = c_attention,
    .attention_joint = c_attention_joint,
    .linear_gate_add = c_linear_gate_add,
    .alloc = check_alloc,
    .free = check_free,
    .to_host = check_to_host,
    .from_host = check_from_host,
    .map = check_map,
    .unmap = check_free,
    .conv2d = c_conv2d,
    .group_norm = c_group_norm,
    .attention_ex = c_attention_ex,
    .unary = c_unary,
    .binary = c_binary,
    .gather_rows = c_gather_rows,
    .affine_rows = c_affine_rows,
    .rmsnorm_rows = c_rmsnorm_rows,
    .slice_rows = c_slice_rows,
    .concat_rows = c_concat_rows,
    .patchify = c_patchify,
    .unpatchify = c_unpatchify,
    .timestep_proj = c_timestep_proj,
    .pos_crop = c_pos_crop,
    .rope_table = c_rope_table,
    .rope = c_rope,
    .upsample_nearest = c_upsample_nearest,
    .logvar_std = c_logvar_std,
    .select_token = c_select_token,
    .rel_pos_bias = c_rel_pos_bias,
    .copy = c_copy,
};

const kk_backend *kk_check(void) { return &k_check; }
