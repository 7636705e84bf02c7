/* test_ops.c - the general forms of the op table (ops.def) that the next
 * model families need: add and mul with broadcasting, slice and concat along
 * any axis, layernorm with an affine weight and bias, RMS norm, attention
 * with a scale, an additive bias and a causal mask; a text encoder's pooled
 * token (select_token). Each against plain loops
 * in double, and the same graph through eager, the planned executor and a
 * compiled package with a symbolic dimension, bit for bit alike. */
#include "base/base.h"
#include "compile/compile.h"
#include "graph/graph.h"
#include "kernels/kernels.h"
#include "test.h"

#include <math.h>

/* the graph: inputs x [B,N,D], w [D], u [1,N,1]; symbol N (tokens) */
enum { B = 2, D = 32, H = 4 };

static void fill(float *v, size_t n, uint64_t seed) { kiln_noise(seed, v, n); }

/* The ops under test on x [B,N,D], w [D], u [B,1,N] (a bias along keys):
 *   a = layernorm_affine(x, w, w) * x + w        (mul, add with broadcasting)
 *   r = rmsnorm(a, w)
 *   c = concat(slice(r, axis 2, 8, 16), slice(r, axis 2, 0, 16), axis 2)
 *   o = attention_ex(c, r, r, heads H, scale 0.3, bias u [B,1,N,N] via mul, causal) */
static kiln_status build(void *user, const int64_t *s, kg_graph *g) {
    (void)user;
    int64_t N = s[0];
    kg_init(g, NULL, NULL);
    kg_id x = kg_input(g, "x", 3, (int64_t[]){B, N, D});
    kg_id w = kg_input(g, "w", 1, (int64_t[]){D});
    kg_id bias = kg_input(g, "bias", 4, (int64_t[]){B, 1, N, N});
    kg_id ln = kg_layernorm_affine(g, x, w, w, 1e-5f);
    kg_id a = kg_add(g, kg_mul(g, ln, x), w);
    kg_id r = kg_rmsnorm(g, a, w, 1e-6f);
    kg_id c = kg_concat(g, kg_slice(g, r, 2, 8, 16), kg_slice(g, r, 2, 0, 16), 2);
    c = kg_concat(g, c, kg_slice(g, r, 2, 16, 0), 2); /* an empty slice */
    /* the attention reads r as its keys and values: r's errors show in it
     * (a package has one output until the manifests name theirs) */
    kg_mark_output(g, kg_attention_ex(g, c, r, r, H, 0.3f, bias, 1));
    return g->status;
}

/* the same in plain loops, double */
static void direct(int64_t N, const float *x, const float *w, const float *bias, double *o, double *rr) {
    double *a = calloc((size_t)(B * N * D), sizeof *a), *c = calloc((size_t)(B * N * D), sizeof *c);
    for (int64_t t = 0; t < B * N; t++) {
        const float *xr = x + t * D;
        double m = 0, v = 0;
        for (int j = 0; j < D; j++) m += xr[j];
        m /= D;
        for (int j = 0; j < D; j++) v += (xr[j] - m) * (xr[j] - m);
        v /= D;
        for (int j = 0; j < D; j++) a[t * D + j] = ((xr[j] - m) / sqrt(v + 1e-5) * w[j] + w[j]) * xr[j] + w[j];
        double ss = 0;
        for (int j = 0; j < D; j++) ss += a[t * D + j] * a[t * D + j];
        for (int j = 0; j < D; j++) rr[t * D + j] = a[t * D + j] / sqrt(ss / D + 1e-6) * w[j];
        for (int j = 0; j < 16; j++) {
            c[t * D + j] = rr[t * D + 8 + j];
            c[t * D + 16 + j] = rr[t * D + j];
        }
    }
    int dh = D / H;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int64_t i = 0; i < N; i++) {
                double p[512], mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < dh; d++) s += c[(b * N + i) * D + h * dh + d] * rr[(b * N + j) * D + h * dh + d];
                    p[j] = 0.3 * s + bias[(b * N + i) * N + j];
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = 0; j <= i; j++) sum += p[j] = exp(p[j] - mx);
                for (int d = 0; d < dh; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= i; j++) acc += p[j] * rr[(b * N + j) * D + h * dh + d];
                    o[(b * N + i) * D + h * dh + d] = acc / sum;
                }
            }
    free(a);
    free(c);
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

static int no_weights(void *user, const char *name, kx_bound *b) {
    (void)user, (void)name, (void)b;
    return 0;
}

TEST(general_ops_match_loops_on_every_path) {
    const int64_t sizes[] = {5, 17, 40};
    char dir[256];
    test_tmpdir(dir, sizeof dir, "ops");
    /* one package over N in [4, 48] */
    kx_compile_req req = {.build = build, .weight = no_weights, .nsym = 1, .regional = 1, .root = dir, .family = "ops-test",
                          .dtype = "f32", .quant = "none"};
    req.sym[0] = (kx_sym){"n", 4, 48};
    kx_compile_info info;
    CHECK_OK(kx_compile(&req, &info));
    kx_package *pkg = NULL;
    CHECK_OK(kx_package_open(info.path, &pkg));
    const kk_backend *bes[2] = {kk_reference(), kk_fast(KILN_F32)};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t N = sizes[k], s[1] = {N};
        size_t nx = (size_t)(B * N * D), nb = (size_t)(B * N * N);
        float *x = malloc(sizeof(float) * nx), w[D], *bias = malloc(sizeof(float) * nb);
        fill(x, nx, 1 + (uint64_t)N);
        fill(w, D, 2);
        fill(bias, nb, 3);
        for (int j = 0; j < D; j++) w[j] = 1 + 0.2f * w[j];
        double *want = malloc(sizeof(double) * nx), *want_r = malloc(sizeof(double) * nx);
        direct(N, x, w, bias, want, want_r);
        const float *in[3] = {x, w, bias};
        float *out[4][2];
        for (int p = 0; p < 4; p++)
            for (int o = 0; o < 2; o++) out[p][o] = calloc(nx, sizeof(float));
        for (int bi = 0; bi < 2; bi++) {
            if (!bes[bi]) continue;
            kg_graph g;
            CHECK_OK(build(NULL, s, &g));
            CHECK_OK(kg_run_eager(&g, bes[bi], in, out[bi]));
            double e = rel_err_d(out[bi][0], want, nx);
            CHECK_MSG(e < 1e-5, "N %lld, %s backend: error %.3g", (long long)N, bes[bi]->name, e);
            kg_free(&g);
        }
        /* planned and compiled: the fast backend's graph, bit for bit its eager run */
        const kk_backend *be = bes[1] ? bes[1] : bes[0];
        kg_graph g;
        CHECK_OK(build(NULL, s, &g));
        kx_plan plan;
        CHECK_OK(kx_plan_graph(&g, &plan));
        void *arena = kb_alloc_aligned(plan.arena_bytes + 64);
        CHECK_OK(kx_run_planned(&g, &plan, be, arena, NULL, in, out[2]));
        int64_t shapes[3][4] = {{B, N, D}, {D}, {B, 1, N, N}}, sol[1];
        CHECK_OK(kx_package_solve(pkg, 3, (const int64_t(*)[4])shapes, sol));
        CHECK(sol[0] == N);
        CHECK_OK(kx_package_load(pkg, be, NULL, no_weights, NULL));
        CHECK_OK(kx_package_run(pkg, sol, in, out[3]));
        int eager = be == bes[1] ? 1 : 0;
        for (int o = 0; o < 1; o++) {
            CHECK_MSG(!memcmp(out[eager][o], out[2][o], sizeof(float) * nx), "N %lld: planned output %d differs from eager",
                      (long long)N, o);
            CHECK_MSG(!memcmp(out[2][o], out[3][o], sizeof(float) * nx), "N %lld: package output %d differs from planned",
                      (long long)N, o);
        }
        kb_free_aligned(arena);
        kx_plan_free(&plan);
        kg_free(&g);
        for (int p = 0; p < 4; p++)
            for (int o = 0; o < 2; o++) free(out[p][o]);
        free(x);
        free(bias);
        free(want);
        free(want_r);
    }
    kx_package_close(pkg);
    test_rmrf(dir);
}

TEST(general_ops_refuse_bad_shapes) {
    kg_graph g;
    kg_init(&g, NULL, NULL);
    kg_id x = kg_input(&g, "x", 3, (int64_t[]){2, 5, 8}), y = kg_input(&g, "y", 2, (int64_t[]){3, 8});
    CHECK(kg_add(&g, x, y) < 0);
    CHECK(strstr(kiln_last_error(), "[3, 8] does not broadcast to [2, 5, 8]") != NULL);
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 3, (int64_t[]){2, 5, 8});
    CHECK(kg_slice(&g, x, 1, 3, 3) < 0);
    CHECK(strstr(kiln_last_error(), "slice: [3, 6) of axis 1 outside its 5") != NULL);
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 3, (int64_t[]){2, 5, 8});
    y = kg_input(&g, "y", 3, (int64_t[]){2, 4, 7});
    CHECK(kg_concat(&g, x, y, 1) < 0);
    CHECK(strstr(kiln_last_error(), "differ outside axis 1") != NULL);
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 3, (int64_t[]){2, 5, 8});
    kg_id b = kg_input(&g, "b", 4, (int64_t[]){2, 3, 5, 5});
    CHECK(kg_attention_ex(&g, x, x, x, 2, 0, b, 0) < 0);
    CHECK(strstr(kiln_last_error(), "bias [2, 3, 5, 5] is not [2 or 1, 2 or 1, 5, 5]") != NULL);
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    x = kg_input(&g, "x", 3, (int64_t[]){2, 5, 8});
    y = kg_input(&g, "w", 1, (int64_t[]){7});
    CHECK(kg_rmsnorm(&g, x, y, 1e-6f) < 0 && strstr(kiln_last_error(), "must be [8]"));
    kg_free(&g);
}

/* a backend that owns its memory (the check backend's, counted): every
 * activation buffer of an executor comes from it and goes back, and the
 * host never touches one (check.c: it would die) */
static long t_live, t_allocs;
static const kk_backend *t_check;
static void *count_alloc(size_t n) {
    t_live++, t_allocs++;
    return t_check->alloc(n);
}
static void count_free(void *p) {
    if (p) t_live--;
    t_check->free(p);
}

TEST(executors_take_memory_from_the_backend) {
    t_check = kk_backend_get("check", KILN_F32);
    kk_backend be = *t_check;
    be.name = "counting";
    be.alloc = count_alloc;
    be.free = count_free;
    int64_t N = 9, s[1] = {N};
    size_t nx = (size_t)(B * N * D), nb = (size_t)(B * N * N);
    float *x = calloc(nx, sizeof(float)), w[D], *bias = calloc(nb, sizeof(float)), *o1 = calloc(nx, sizeof(float)),
          *o2 = calloc(nx, sizeof(float));
    fill(x, nx, 5);
    fill(w, D, 6);
    /* the inputs and the output in the backend's memory, as a forward stages them */
    float *dx = kk_buf_alloc(&be, sizeof(float) * nx), *dw = kk_buf_alloc(&be, sizeof w),
          *db = kk_buf_alloc(&be, sizeof(float) * nb), *dy = kk_buf_alloc(&be, sizeof(float) * nx);
    kk_copy_from_host(&be, dx, x, sizeof(float) * nx);
    kk_copy_from_host(&be, dw, w, sizeof w);
    kk_copy_from_host(&be, db, bias, sizeof(float) * nb);
    const float *din[3] = {dx, dw, db}, *in[3] = {x, w, bias};
    long before = t_allocs;
    kg_graph g;
    CHECK_OK(build(NULL, s, &g));
    CHECK_OK(kg_run_eager(&g, &be, din, &dy));
    kk_copy_to_host(&be, o1, dy, sizeof(float) * nx);
    CHECK_MSG(t_allocs - before > 5 && t_live == 4, "%ld buffers from the backend, %ld not given back",
              t_allocs - before, t_live - 4);
    CHECK_OK(kg_run_eager(&g, kk_reference(), in, &o2));
    CHECK(!memcmp(o1, o2, sizeof(float) * nx));
    CHECK(kk_supports(&be, KG_ATTENTION, KK_FMT_F32, NULL) && !kk_host_memory(&be));
    kk_buf_free(&be, dx), kk_buf_free(&be, dw), kk_buf_free(&be, db), kk_buf_free(&be, dy);
    CHECK(t_live == 0);
    kg_free(&g);
    free(x), free(bias), free(o1), free(o2);
}

TEST(gather_and_gelus) {
    enum { V = 11, E = 6, T = 5 };
    float table[V * E], ids[2 * T] = {0, 3, 10, 3, 7, 1, 1, 2, 9, 4}, y[2 * T * E], y2[2 * T * E];
    fill(table, V * E, 9);
    kg_graph g;
    kg_init(&g, NULL, NULL);
    kg_id t = kg_input(&g, "table", 2, (int64_t[]){V, E}), i = kg_input(&g, "ids", 2, (int64_t[]){2, T});
    kg_id e = kg_gather(&g, t, i);
    kg_mark_output(&g, kg_quick_gelu(&g, kg_gelu(&g, e)));
    CHECK_OK(g.status);
    CHECK(g.nodes[e].ndim == 3 && g.nodes[e].shape[2] == E);
    const float *in[2] = {table, ids};
    float *out[1] = {y};
    unsigned long mark = kb_deferred_mark();
    CHECK_OK(kg_run_eager(&g, kk_reference(), in, out));
    CHECK_OK(kb_deferred_since(mark));
    double err = 0;
    for (int r = 0; r < 2 * T; r++)
        for (int k = 0; k < E; k++) {
            double v = table[(int)ids[r] * E + k];
            v = 0.5 * v * (1 + erf(v / sqrt(2.0)));
            v = v / (1 + exp(-1.702 * v));
            err = fmax(err, fabs(v - y[r * E + k]));
        }
    CHECK_MSG(err < 1e-6, "gather + gelu + quick_gelu: error %.3g", err);
    kx_plan plan;
    CHECK_OK(kx_plan_graph(&g, &plan));
    void *arena = kb_alloc_aligned(plan.arena_bytes + 64);
    out[0] = y2;
    CHECK_OK(kx_run_planned(&g, &plan, kk_reference(), arena, NULL, in, out));
    CHECK(!memcmp(y, y2, sizeof y));
    /* an index outside the table fails the run */
    ids[3] = 11;
    mark = kb_deferred_mark();
    CHECK_OK(kg_run_eager(&g, kk_reference(), in, out));
    CHECK_FAILS(kb_deferred_since(mark), KILN_ERR_RANGE, "index 11 at 3 is outside the table's 11 rows");
    kb_free_aligned(arena);
    kx_plan_free(&plan);
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    t = kg_input(&g, "table", 1, (int64_t[]){V});
    CHECK(kg_gather(&g, t, t) < 0 && strstr(kiln_last_error(), "must be [V, D]"));
    kg_free(&g);
}

/* select_token on x [B,N,D], ids [B,N]: output 0 by the largest id (ties:
 * the first), output 1 by the first id 7 (row 1 holds none: position 0) */
static kiln_status build_select(void *user, const int64_t *s, kg_graph *g) {
    (void)user;
    int64_t N = s[0];
    kg_init(g, NULL, NULL);
    kg_id x = kg_input(g, "x", 3, (int64_t[]){B, N, D});
    kg_id ids = kg_input(g, "ids", 2, (int64_t[]){B, N});
    kg_output(g, kg_select_token(g, x, ids, -1), "by_argmax");
    kg_output(g, kg_select_token(g, x, ids, 7), "by_eos");
    return g->status;
}

TEST(select_token_on_every_path) {
    char dir[256];
    test_tmpdir(dir, sizeof dir, "ops-select");
    kx_compile_req req = {.build = build_select, .weight = no_weights, .nsym = 1, .regional = 1, .root = dir,
                          .family = "ops-select-test", .dtype = "f32", .quant = "none"};
    req.sym[0] = (kx_sym){"n", 4, 48};
    kx_compile_info info;
    CHECK_OK(kx_compile(&req, &info));
    kx_package *pkg = NULL;
    CHECK_OK(kx_package_open(info.path, &pkg));
    const int64_t sizes[] = {5, 13, 48};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t N = sizes[k], s[1] = {N};
        size_t nx = (size_t)(B * N * D);
        float *x = malloc(sizeof(float) * nx), *ids = malloc(sizeof(float) * (size_t)(B * N));
        fill(x, nx, 11 + (uint64_t)N);
        for (int64_t i = 0; i < B * N; i++) ids[i] = (float)((i * 5 + 3) % 7); /* 0..6: no 7 */
        ids[2] = ids[N - 1] = 50; /* row 0: the largest twice, the first wins */
        ids[1] = ids[3] = 7;      /* row 0: eos twice */
        ids[N + N - 1] = 60;      /* row 1: the largest last, no eos */
        int64_t want_arg[B] = {2, N - 1}, want_eos[B] = {1, 0};
        const float *in[2] = {x, ids};
        float *out[3][2];
        for (int p = 0; p < 3; p++)
            for (int o = 0; o < 2; o++) out[p][o] = calloc((size_t)(B * D), sizeof(float));
        kg_graph g;
        CHECK_OK(build_select(NULL, s, &g));
        CHECK_OK(kg_run_eager(&g, kk_reference(), in, out[0]));
        for (int b = 0; b < B; b++) {
            CHECK_MSG(!memcmp(out[0][0] + b * D, x + (b * N + want_arg[b]) * D, sizeof(float) * D),
                      "N %lld row %d: not the first largest id's token", (long long)N, b);
            CHECK_MSG(!memcmp(out[0][1] + b * D, x + (b * N + want_eos[b]) * D, sizeof(float) * D),
                      "N %lld row %d: not the first eos token", (long long)N, b);
        }
        kx_plan plan;
        CHECK_OK(kx_plan_graph(&g, &plan));
        void *arena = kb_alloc_aligned(plan.arena_bytes + 64);
        CHECK_OK(kx_run_planned(&g, &plan, kk_reference(), arena, NULL, in, out[1]));
        int64_t shapes[2][4] = {{B, N, D}, {B, N}}, sol[1];
        CHECK_OK(kx_package_solve(pkg, 2, (const int64_t(*)[4])shapes, sol));
        CHECK(sol[0] == N);
        CHECK_OK(kx_package_load(pkg, kk_reference(), NULL, no_weights, NULL));
        CHECK_OK(kx_package_run(pkg, sol, in, out[2]));
        for (int o = 0; o < 2; o++) {
            CHECK_MSG(!memcmp(out[0][o], out[1][o], sizeof(float) * B * D), "N %lld: planned output %d differs", (long long)N, o);
            CHECK_MSG(!memcmp(out[0][o], out[2][o], sizeof(float) * B * D), "N %lld: package output %d differs", (long long)N, o);
        }
        kb_free_aligned(arena);
        kx_plan_free(&plan);
        kg_free(&g);
        for (int p = 0; p < 3; p++)
            for (int o = 0; o < 2; o++) free(out[p][o]);
        free(x);
        free(ids);
    }
    kx_package_close(pkg);
    test_rmrf(dir);
    /* the shapes it refuses, named */
    kg_graph g;
    kg_init(&g, NULL, NULL);
    kg_id x = kg_input(&g, "x", 3, (int64_t[]){2, 5, 8}), ids = kg_input(&g, "ids", 2, (int64_t[]){2, 4});
    CHECK(kg_select_token(&g, x, ids, -1) < 0);
    CHECK(strstr(kiln_last_error(), "select_token: x [2, 5, 8] must be [B, T, D] and ids [2, 4] [B, T]") != NULL);
    kg_free(&g);
}

/* ---- shape constants: computed once per shape, kept between forwards ---- */

static float t_table[64 * D];
static int t_varies, t_silu_runs;
static void count_silu(const float *x, float *y, int64_t n) {
    t_silu_runs++;
    kk_reference()->silu(x, y, n);
}
static int table_resolve(void *user, const char *name, int *ndim, int64_t shape[4], const float **data,
                         const kk_weight **kw) {
    (void)user;
    if (strcmp(name, "table")) return 0;
    *ndim = 3;
    shape[0] = 1, shape[1] = 64, shape[2] = D;
    *data = t_table;
    *kw = NULL;
    return t_varies ? 2 : 1;
}
/* y = x + silu(table[:, :N]): the silu of the slice depends on the weight and N alone */
static kiln_status const_graph(int64_t N, kg_graph *g) {
    kg_init(g, table_resolve, NULL);
    kg_id x = kg_input(g, "x", 3, (int64_t[]){B, N, D});
    kg_mark_output(g, kg_add(g, x, kg_silu(g, kg_slice(g, kg_weight(g, "table"), 1, 0, N))));
    return g->status;
}

static kiln_status const_build(void *user, const int64_t *s, kg_graph *g) {
    (void)user;
    return const_graph(s[0], g);
}
static int table_bind(void *user, const char *name, kx_bound *b) {
    (void)user;
    memset(b, 0, sizeof *b);
    const kk_weight *kw;
    if (!table_resolve(NULL, name, &b->ndim, b->shape, &b->data, &kw)) return 0;
    b->dtype = KILN_F32;
    b->layout = "rowmajor";
    return 1;
}

TEST(shape_constants_once_per_shape) {
    fill(t_table, 64 * D, 11);
    kk_backend be = *kk_reference();
    be.silu = count_silu;
    kx_consts consts = {0};
    const int64_t Ns[5] = {5, 5, 7, 7, 5}, runs[5] = {1, 1, 2, 2, 3};
    for (int k = 0; k < 5; k++) {
        int64_t N = Ns[k];
        size_t n = (size_t)(B * N * D);
        float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        fill(x, n, 12 + (uint64_t)k);
        kg_graph g;
        kx_plan plan;
        CHECK_OK(const_graph(N, &g));
        CHECK_OK(kx_plan_graph(&g, &plan));
        int nc = 0;
        for (int i = 0; i < g.n; i++) nc += plan.place[i].kind == KX_CONST;
        CHECK_MSG(nc == 2 && plan.const_bytes >= sizeof(float) * (size_t)(2 * N * D), "%d constants in %zu bytes", nc,
                  plan.const_bytes);
        void *arena = kb_alloc_aligned(plan.arena_bytes + 64);
        const float *in[1] = {x};
        CHECK_OK(kx_run_planned(&g, &plan, &be, arena, &consts, in, &y));
        CHECK_MSG(t_silu_runs == runs[k], "forward %d (N %lld): the constant was computed %d times, want %lld", k,
                  (long long)N, t_silu_runs, (long long)runs[k]);
        CHECK_OK(kg_run_eager(&g, kk_reference(), in, &want));
        CHECK(!memcmp(y, want, sizeof(float) * n));
        kb_free_aligned(arena);
        kx_plan_free(&plan);
        kg_free(&g);
        free(x), free(y), free(want);
    }
    kx_consts_free(&consts, &be);
    /* a package computes them once per shape too (kiln_pkg_consts) */
    char dir[256];
    test_tmpdir(dir, sizeof dir, "consts");
    kx_compile_req req = {.build = const_build, .weight = table_bind, .nsym = 1, .regional = 1, .root = dir,
                          .family = "consts-test", .dtype = "f32", .quant = "none"};
    req.sym[0] = (kx_sym){"tokens", 4, 16};
    kx_compile_info info;
    kx_package *pkg = NULL;
    CHECK_OK(kx_compile(&req, &info));
    CHECK_OK(kx_package_open(info.path, &pkg));
    CHECK_OK(kx_package_load(pkg, &be, NULL, table_bind, NULL));
    t_silu_runs = 0;
    for (int k = 0; pkg && k < 5; k++) {
        int64_t N = Ns[k], shapes[1][4] = {{B, N, D}}, sol[1];
        size_t n = (size_t)(B * N * D);
        float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        fill(x, n, 12 + (uint64_t)k);
        const float *in[1] = {x};
        CHECK_OK(kx_package_solve(pkg, 1, (const int64_t(*)[4])shapes, sol));
        CHECK_OK(kx_package_run(pkg, sol, in, &y));
        CHECK_MSG(t_silu_runs == runs[k], "package forward %d (N %lld): the constant was computed %d times, want %lld", k,
                  (long long)N, t_silu_runs, (long long)runs[k]);
        kg_graph g;
        CHECK_OK(const_graph(N, &g));
        CHECK_OK(kg_run_eager(&g, kk_reference(), in, &want));
        CHECK(!memcmp(y, want, sizeof(float) * n));
        kg_free(&g);
        free(x), free(y), free(want);
    }
    kx_package_close(pkg);
    test_rmrf(dir);
    /* a weight whose data changes during a forward (an FSDP block's) makes no constant */
    t_varies = 1;
    kg_graph g;
    kx_plan plan;
    CHECK_OK(const_graph(5, &g));
    CHECK_OK(kx_plan_graph(&g, &plan));
    for (int i = 0; i < g.n; i++) CHECK(plan.place[i].kind != KX_CONST);
    CHECK(plan.const_bytes == 0);
    kx_plan_free(&plan);
    kg_free(&g);
    t_varies = 0;
}

int main(void) {
    RUN(gather_and_gelus);
    RUN(executors_take_memory_from_the_backend);
    RUN(general_ops_match_loops_on_every_path);
    RUN(general_ops_refuse_bad_shapes);
    RUN(select_token_on_every_path);
    RUN(shape_constants_once_per_shape);
    return TEST_SUMMARY();
}
