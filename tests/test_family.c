/* test_family.c - a model family defined entirely in this file (a toy MLP
 * with norms, two named outputs), registered at run time, and run through
 * everything the spine offers any family: the weight cache (miss, then a
 * mapped hit), kiln_compile into a dynamic package, a fixed-shape package
 * compiled on demand, the planned executor and eager - all equal, and equal
 * to the same math in double here. Nothing outside this file knows it. */
#include "base/base.h"
#include "model/model.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <unistd.h>

/* ---- the family ------------------------------------------------------------ */

typedef struct toy_config {
    int width, hidden, layers;
} toy_config;

#define TOY_EPS 1e-5f

static int toy_claims(const char *json) {
    cJSON *r = cJSON_Parse(json);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(r, "_class_name");
    int yes = cJSON_IsString(c) && !strcmp(c->valuestring, "KilnToyMLP");
    cJSON_Delete(r);
    return yes;
}

static kiln_status toy_parse(const char *json, void *cfg) {
    toy_config *c = cfg;
    *c = (toy_config){8, 16, 2};
    cJSON *r = cJSON_Parse(json);
    if (!r) return kb_fail(KILN_ERR_FORMAT, "toy config is not JSON");
    const char *keys[3] = {"width", "hidden", "layers"};
    int *f[3] = {&c->width, &c->hidden, &c->layers};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, keys[i]);
        if (cJSON_IsNumber(v)) *f[i] = v->valueint;
    }
    cJSON_Delete(r);
    return KILN_OK;
}

static kiln_status toy_validate(const void *cfg) {
    const toy_config *c = cfg;
    if (c->width < 1 || c->width > 4096 || c->hidden < 1 || c->hidden > 4096 || c->layers < 1 || c->layers > 16)
        return kb_fail(KILN_ERR_CONFIG, "toy config: width, hidden 1..4096, layers 1..16");
    return KILN_OK;
}

static char *toy_json(const void *cfg) {
    const toy_config *c = cfg;
    return kb_strfmt("{\"_class_name\": \"KilnToyMLP\", \"width\": %d, \"hidden\": %d, \"layers\": %d}", c->width,
                     c->hidden, c->layers);
}

static kiln_status toy_spec(const void *cfg, ka_spec **out, size_t *n) {
    const toy_config *c = cfg;
    ka_spec *s = NULL;
    size_t ns = 0, cap = 0;
    for (int l = 0; l < c->layers; l++) {
        int64_t w = c->width, h = c->hidden;
        int ok = ka_spec_add(&s, &ns, &cap, 1, (int64_t[]){w}, "mlp.%d.norm.weight", l) &&
                 ka_spec_add(&s, &ns, &cap, 1, (int64_t[]){w}, "mlp.%d.norm.bias", l) &&
                 ka_spec_add(&s, &ns, &cap, 2, (int64_t[]){h, w}, "mlp.%d.fc1.weight", l) &&
                 ka_spec_add(&s, &ns, &cap, 1, (int64_t[]){h}, "mlp.%d.fc1.bias", l) &&
                 ka_spec_add(&s, &ns, &cap, 2, (int64_t[]){w, h}, "mlp.%d.fc2.weight", l) &&
                 ka_spec_add(&s, &ns, &cap, 1, (int64_t[]){w}, "mlp.%d.fc2.bias", l);
        if (!ok) {
            free(s);
            return KILN_ERR_NOMEM;
        }
        /* the two GEMM weights (ka_spec_add may move the array: by index) */
        s[ns - 4].linear = s[ns - 2].linear = 1;
        for (size_t k = ns - 6; k < ns; k++) s[k].block = l;
    }
    *out = s;
    *n = ns;
    return KILN_OK;
}

/* y, y_norm, then h_1 .. h_{layers-1}: the input of every layer after the
 * first (as a text encoder gives every hidden state): a config's outputs */
static int toy_outputs(const void *cfg, ka_io *out, char (*names)[48]) {
    const toy_config *c = cfg;
    out[0] = (ka_io){"y", 3};
    out[1] = (ka_io){"y_norm", 3};
    for (int l = 1; l < c->layers; l++) {
        snprintf(names[l + 1], sizeof names[0], "h_%d", l);
        out[l + 1] = (ka_io){names[l + 1], 3};
    }
    return c->layers + 1;
}

static void toy_io(const void *cfg, const int64_t *s, int64_t in[][4], int64_t out[][4]) {
    const toy_config *c = cfg;
    int64_t sh[4] = {s[0], s[1], c->width, 0};
    memcpy(in[0], sh, sizeof sh);
    for (int k = 0; k < c->layers + 1; k++) memcpy(out[k], sh, sizeof sh);
}

static kiln_status toy_check(const void *cfg, const int64_t *s) {
    (void)cfg;
    if (s[0] < 1 || s[1] < 1 || s[1] > 64)
        return kb_fail(KILN_ERR_SHAPE, "toy: batch %lld and tokens %lld (1..64) must be positive", (long long)s[0],
                       (long long)s[1]);
    return KILN_OK;
}

static kiln_status toy_solve(const void *cfg, const int64_t (*in)[4], int64_t *s) {
    s[0] = in[0][0];
    s[1] = in[0][1];
    return toy_check(cfg, s);
}

static void toy_example(const void *cfg, int64_t *s) {
    (void)cfg;
    s[0] = 2;
    s[1] = 4;
}

static void toy_example_input(const void *cfg, int k, float *x, size_t n) {
    (void)cfg;
    kiln_noise(42 + (uint64_t)k, x, n);
}

static kiln_status toy_build(const void *cfg, kg_graph *g, const int64_t *s, const ka_par *par) {
    (void)par;
    const toy_config *c = cfg;
    kg_id x = kg_input(g, "x", 3, (int64_t[]){s[0], s[1], c->width});
    char a[64], b[64];
    kg_id hid[16];
    for (int l = 0; l < c->layers; l++) {
        hid[l] = x;
        kg_region_begin(g, l);
        snprintf(a, sizeof a, "mlp.%d.norm.weight", l);
        snprintf(b, sizeof b, "mlp.%d.norm.bias", l);
        kg_id h = kg_layernorm_affine(g, x, kg_weight(g, a), kg_weight(g, b), TOY_EPS);
        snprintf(a, sizeof a, "mlp.%d.fc1.weight", l);
        snprintf(b, sizeof b, "mlp.%d.fc1.bias", l);
        h = kg_gelu(g, kg_linear(g, h, kg_weight(g, a), kg_weight(g, b)));
        snprintf(a, sizeof a, "mlp.%d.fc2.weight", l);
        snprintf(b, sizeof b, "mlp.%d.fc2.bias", l);
        x = kg_add(g, x, kg_linear(g, h, kg_weight(g, a), kg_weight(g, b)));
        kg_region_end(g);
    }
    kg_output(g, x, "y");
    kg_output(g, kg_layernorm(g, x, TOY_EPS), "y_norm");
    for (int l = 1; l < c->layers; l++) {
        snprintf(a, sizeof a, "h_%d", l);
        kg_output(g, hid[l], a);
    }
    return g->status;
}

static const ka_arch toy_arch = {
    .name = "toy",
    .title = "a three-layer MLP with norms (tests/test_family.c)",
    .component = "mlp",
    .config_size = sizeof(toy_config),
    .claims = toy_claims,
    .config_parse = toy_parse,
    .config_validate = toy_validate,
    .config_to_json = toy_json,
    .weight_spec = toy_spec,
    .quant_layers = "mlp.*",
    .nsym = 2,
    .sym = {"batch", "tokens"},
    .n_in = 1,
    .n_out = 2,
    .in = {{"x", 3}},
    .out = {{"y", 3}, {"y_norm", 3}},
    .outputs = toy_outputs,
    .io_shapes = toy_io,
    .solve = toy_solve,
    .check = toy_check,
    .example = toy_example,
    .example_input = toy_example_input,
    .build = toy_build,
};

/* ---- the same math in double ---------------------------------------------------- */

static const float *weight(const kiln_tensor *t, size_t n, const char *fmt, int l) {
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    const kiln_tensor *w = kiln_tensors_find(t, n, name);
    return w ? w->data : NULL;
}

static void layernorm(const double *x, int W, const float *g, const float *b, double *y) {
    double mu = 0, var = 0;
    for (int i = 0; i < W; i++) mu += x[i];
    mu /= W;
    for (int i = 0; i < W; i++) var += (x[i] - mu) * (x[i] - mu);
    var /= W;
    for (int i = 0; i < W; i++) y[i] = (x[i] - mu) / sqrt(var + TOY_EPS) * (g ? g[i] : 1) + (b ? b[i] : 0);
}

/* y and y_norm for rows [rows, W]; h1: the input of layer 1 (NULL: not kept) */
static void reference(const toy_config *c, const kiln_tensor *t, size_t nt, const float *x, size_t rows, double *y,
                      double *yn, double *h1) {
    int W = c->width, H = c->hidden;
    double *h = malloc(sizeof(double) * (size_t)W), *u = malloc(sizeof(double) * (size_t)H);
    for (size_t r = 0; r < rows; r++) {
        double *v = y + r * (size_t)W;
        for (int i = 0; i < W; i++) v[i] = x[r * (size_t)W + (size_t)i];
        for (int l = 0; l < c->layers; l++) {
            if (l == 1 && h1) memcpy(h1 + r * (size_t)W, v, sizeof(double) * (size_t)W);
            const float *g = weight(t, nt, "mlp.%d.norm.weight", l), *b = weight(t, nt, "mlp.%d.norm.bias", l),
                        *w1 = weight(t, nt, "mlp.%d.fc1.weight", l), *b1 = weight(t, nt, "mlp.%d.fc1.bias", l),
                        *w2 = weight(t, nt, "mlp.%d.fc2.weight", l), *b2 = weight(t, nt, "mlp.%d.fc2.bias", l);
            layernorm(v, W, g, b, h);
            for (int o = 0; o < H; o++) {
                double s = b1[o];
                for (int i = 0; i < W; i++) s += w1[o * W + i] * h[i];
                u[o] = 0.5 * s * (1 + erf(s / sqrt(2.0)));
            }
            for (int o = 0; o < W; o++) {
                double s = b2[o];
                for (int i = 0; i < H; i++) s += w2[o * H + i] * u[i];
                v[o] += s;
            }
        }
        layernorm(v, W, NULL, NULL, yn + r * (size_t)W);
    }
    free(h);
    free(u);
}

/* ---- the test --------------------------------------------------------------------- */

static char g_dir[256], g_model[300], g_cache[300], g_pkgs[300];
static const toy_config g_cfg = {8, 16, 3};
#define B 3
#define T 5
#define N ((size_t)B * T * 8)

static float g_h1[8][N]; /* h_1 of each run(), by its slot */
static int g_slot;

static kiln_status run(kiln_model *m, const char *chain, const float *x, int64_t b, int64_t t, float *y, float *yn) {
    kiln_status st = kiln_model_set_exec(m, chain);
    if (st) return st;
    kiln_tensor in = {"x", KILN_F32, 3, {b, t, g_cfg.width}, x};
    size_t n = (size_t)(b * t * g_cfg.width);
    kiln_output out[3] = {{"y_norm", yn, n, 0, {0}}, {"y", y, n, 0, {0}}, {"h_1", g_h1[g_slot++ % 8], N, 0, {0}}};
    return kiln_run(m, &in, 1, out, n <= N ? 3 : 2);
}

static double max_err(const float *a, const double *want, size_t n) {
    double e = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - want[i]);
        if (d > e) e = d;
        if (fabs(want[i]) > scale) scale = fabs(want[i]);
    }
    return e / (scale > 0 ? scale : 1);
}

TEST(registers_once) {
    CHECK(ka_find("toy") == &toy_arch);
    CHECK_FAILS(ka_register(&toy_arch), KILN_ERR_INVALID_ARG, "already known");
    ka_arch bad = toy_arch;
    bad.name = "toy2";
    bad.build = NULL;
    CHECK_FAILS(ka_register(&bad), KILN_ERR_INVALID_ARG, "lacks");
    CHECK(!strcmp(kiln_family_quant_layers("toy"), "mlp.*"));
    CHECK(kiln_family_quant_layers("no-such-family") == NULL);
}

TEST(every_path_equal) {
    kiln_tensor *wt = NULL;
    size_t nt = 0;
    char path[400];
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", g_model);
    CHECK_OK(kiln_tensors_read(path, &wt, &nt));
    float x[N], y[5][N], yn[5][N];
    double want[N], want_n[N];
    kiln_noise(7, x, N);
    double want_h1[N];
    reference(&g_cfg, wt, nt, x, (size_t)B * T, want, want_n, want_h1);

    /* the cache: a miss converts and publishes, the next load maps it */
    kiln_load_opts o = kiln_load_defaults();
    o.source = g_model;
    o.model_name = "toy";
    o.component = "mlp";
    o.cache_root = g_cache;
    o.dtype = KILN_F32;
    kiln_model *miss = NULL, *hit = NULL;
    CHECK_OK(kiln_load_model(&o, &miss));
    if (!miss) goto done;
    CHECK(!strcmp(kiln_model_origin(miss), "miss"));
    CHECK(!strcmp(kiln_model_family(miss), "toy"));
    CHECK(kiln_model_config(miss) == NULL); /* not an SD3 model */
    char *js = kiln_model_config_json(miss);
    CHECK(js && strstr(js, "KilnToyMLP") && strstr(js, "\"hidden\": 16"));
    free(js);
    CHECK(kiln_model_n_inputs(miss) == 1 && kiln_model_n_outputs(miss) == 4); /* y, y_norm, h_1, h_2 */
    CHECK(!strcmp(kiln_model_input_name(miss, 0), "x") && !strcmp(kiln_model_output_name(miss, 1), "y_norm"));
    CHECK(!strcmp(kiln_model_output_name(miss, 3), "h_2") && kiln_model_output_name(miss, 4) == NULL);
    CHECK(kiln_model_input_name(miss, 1) == NULL);
    kiln_model_free(miss);
    CHECK_OK(kiln_load_model(&o, &hit)); /* a fresh load: the registry dropped the first */
    if (!hit) goto done;
    CHECK(!strcmp(kiln_model_origin(hit), "hit"));

    CHECK_OK(run(hit, "eager", x, B, T, y[0], yn[0]));
    CHECK_OK(run(hit, "planned", x, B, T, y[1], yn[1]));
    kiln_compile_opts co = kiln_compile_defaults();
    co.dims = "batch=1:4,tokens=1:8";
    co.package_dir = g_pkgs;
    co.capture = 1;
    kiln_compile_result cr;
    CHECK_OK(kiln_compile(hit, &co, &cr));
    /* regional: the three layers are fewer kinds of block, each emitted once */
    CHECK_MSG(cr.block_kinds >= 1 && cr.block_kinds < cr.regions && cr.regions == g_cfg.layers, "%d kinds, %d regions",
              cr.block_kinds, cr.regions);
    CHECK_OK(run(hit, "dynamic", x, B, T, y[2], yn[2]));
    CHECK(!strcmp(kiln_model_last_exec(hit), "dynamic"));
    /* fixed: compiled on demand for this shape (the family has been compiled here) */
    CHECK_OK(run(hit, "fixed", x, B, T, y[3], yn[3]));
    CHECK(!strcmp(kiln_model_last_exec(hit), "fixed"));
    CHECK_OK(kiln_model_set_package_dir(hit, g_pkgs));
    CHECK_OK(run(hit, "dynamic,fixed,planned,eager", x, B, T, y[4], yn[4]));

    for (int p = 0; p < 5; p++) {
        double e = max_err(y[p], want, N), en = max_err(yn[p], want_n, N), eh = max_err(g_h1[p], want_h1, N);
        CHECK_MSG(e < 1e-5 && en < 1e-5 && eh < 1e-5, "path %d: y %.3g, y_norm %.3g, h_1 %.3g against double", p, e,
                  en, eh);
    }
    for (int p = 2; p < 5; p++) CHECK(!memcmp(g_h1[p], g_h1[1], sizeof g_h1[1]));
    /* the planned executor and both packages run the same fused graph: bit for bit */
    for (int p = 2; p < 5; p++) CHECK(!memcmp(y[p], y[1], sizeof y[1]) && !memcmp(yn[p], yn[1], sizeof yn[1]));
    /* eager runs the ops as written (no fusion): equal to 1e-6 */
    for (size_t i = 0; i < N; i++) CHECK_MSG(fabs(y[0][i] - y[1][i]) <= 1e-6 * (1 + fabs(y[1][i])), "eager %zu", i);

    /* another shape inside the package's ranges */
    float x2[2 * 7 * 8], y2[2 * 7 * 8], n2[2 * 7 * 8];
    double w2[2 * 7 * 8], wn2[2 * 7 * 8];
    kiln_noise(8, x2, 2 * 7 * 8);
    reference(&g_cfg, wt, nt, x2, 14, w2, wn2, NULL);
    CHECK_OK(run(hit, "dynamic", x2, 2, 7, y2, n2));
    CHECK(max_err(y2, w2, 2 * 7 * 8) < 1e-5 && max_err(n2, wn2, 2 * 7 * 8) < 1e-5);
    /* outside them (tokens 9 > 8): dynamic refuses, naming the guard */
    float x3[9 * 8], y3[9 * 8], n3[9 * 8];
    kiln_noise(9, x3, 9 * 8);
    CHECK(run(hit, "dynamic", x3, 1, 9, y3, n3) != KILN_OK);
    CHECK_MSG(strstr(kiln_last_error(), "tokens"), "%s", kiln_last_error());
    CHECK_OK(run(hit, "dynamic,planned", x3, 1, 9, y3, n3));
    CHECK(!strcmp(kiln_model_last_exec(hit), "planned"));
done:
    kiln_model_free(hit);
    kiln_tensors_free(wt);
}

/* a quantized model of the family is published only after the gate, which
 * for a family that does not sample compares the example's outputs */
TEST(quality_gate) {
    kiln_open_opts bo = {.dtype = KILN_BF16}, qo = {.dtype = KILN_BF16, .quant = KILN_QUANT_INT8};
    kiln_model *base = NULL, *q = NULL;
    CHECK_OK(kiln_model_open(g_model, &bo, &base));
    kiln_status st = kiln_model_open(g_model, &qo, &q);
    if (st == KILN_ERR_UNSUPPORTED) { /* no VNNI or bf16 GEMM here */
        printf("  (int8 not available on this CPU: %s)\n", kiln_last_error());
        kiln_model_free(base);
        return;
    }
    CHECK_OK(st);
    if (!base || !q) goto done;
    kiln_quality_report rep;
    CHECK_OK(kiln_quality_check(base, q, NULL, &rep));
    CHECK_MSG(rep.pass && rep.rel_l2 > 0 && rep.rel_l2 < 0.03, "int8 against bf16: %.3g", rep.rel_l2);
    char pk[400];
    snprintf(pk, sizeof pk, "%s/gate-packages", g_dir);
    kiln_compile_opts co = kiln_compile_defaults();
    co.package_dir = pk;
    co.quality_base = base;
    co.max_rel_l2 = rep.rel_l2 / 2; /* a gate it cannot pass */
    kiln_compile_result cr;
    CHECK_FAILS(kiln_compile(q, &co, &cr), KILN_ERR_RANGE, "outputs on the example differ");
    co.max_rel_l2 = 0;
    CHECK_OK(kiln_compile(q, &co, &cr));
    CHECK(fabs(cr.quality_rel_l2 - rep.rel_l2) < 1e-12);
    kiln_model *other = NULL;
    char od[400];
    snprintf(od, sizeof od, "%s/two-layers", g_dir);
    toy_config two = {8, 16, 2};
    CHECK_OK(km_write_seeded(&toy_arch, &two, od, 11, KILN_F32));
    CHECK_OK(kiln_model_open(od, &bo, &other));
    CHECK_FAILS(kiln_quality_check(other, q, NULL, &rep), KILN_ERR_INVALID_ARG, "different configs");
    kiln_model_free(other);
done:
    kiln_model_free(base);
    kiln_model_free(q);
}

/* kiln_run keeps the buffers of outputs a call does not ask for from call
 * to call (run.c): growing them for a larger batch, then a smaller one,
 * every asked output stays what a call asking for all of them gives */
TEST(unasked_outputs_kept) {
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(g_model, NULL, &m));
    if (!m) return;
    CHECK_OK(kiln_model_set_exec(m, "planned"));
    enum { W = 8, BIG = 4 * T * W };
    static float x[BIG], all[4][BIG], one[BIG];
    kiln_noise(5, x, BIG);
    const char *names[4] = {"y", "y_norm", "h_1", "h_2"};
    int64_t batches[] = {1, 4, 2, 1, 4};
    for (int r = 0; r < 5; r++) {
        int64_t b = batches[r];
        size_t n = (size_t)(b * T * W);
        kiln_tensor in = {"x", KILN_F32, 3, {b, T, W}, x};
        kiln_output every[4];
        for (int k = 0; k < 4; k++) every[k] = (kiln_output){names[k], all[k], BIG, 0, {0}};
        CHECK_OK(kiln_run(m, &in, 1, every, 4));
        for (int k = 0; k < 4; k++) { /* each alone: the other three go to kept buffers */
            memset(one, 0, sizeof one);
            kiln_output o = {names[k], one, BIG, 0, {0}};
            CHECK_OK(kiln_run(m, &in, 1, &o, 1));
            CHECK(!memcmp(one, all[k], sizeof(float) * n));
        }
    }
    kiln_model_free(m);
}

TEST(named_tensor_errors) {
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(g_model, NULL, &m));
    if (!m) return;
    CHECK(!strcmp(kiln_model_family(m), "toy"));
    kiln_open_opts fo = {.family = "no-such-family"};
    kiln_model *f = NULL;
    CHECK_FAILS(kiln_model_open(g_model, &fo, &f), KILN_ERR_INVALID_ARG, "model family no-such-family is unknown (the families: sd3");
    fo.family = "toy";
    CHECK_OK(kiln_model_open(g_model, &fo, &f));
    kiln_model_free(f);
    float x[N], y[N], yn[N];
    kiln_noise(1, x, N);
    kiln_tensor in = {"x", KILN_F32, 3, {B, T, 8}, x};
    kiln_output out[2] = {{"y", NULL, 0, 0, {0}}, {"h_2", NULL, 0, 0, {0}}};
    /* data NULL: the shapes only */
    CHECK_OK(kiln_run(m, &in, 1, out, 2));
    CHECK(out[0].ndim == 3 && out[0].shape[0] == B && out[0].shape[1] == T && out[0].shape[2] == 8);
    kiln_tensor wrong = {"hidden", KILN_F32, 3, {B, T, 8}, x};
    CHECK_FAILS(kiln_run(m, &wrong, 1, out, 2), KILN_ERR_INVALID_ARG, "toy model has no input hidden (its inputs: x)");
    CHECK_FAILS(kiln_run(m, NULL, 0, out, 2), KILN_ERR_MISSING, "input x is missing");
    kiln_tensor twice[2] = {in, in};
    CHECK_FAILS(kiln_run(m, twice, 2, out, 2), KILN_ERR_INVALID_ARG, "given twice");
    kiln_tensor narrow = {"x", KILN_F32, 3, {B, T, 7}, x};
    CHECK_FAILS(kiln_run(m, &narrow, 1, out, 2), KILN_ERR_SHAPE, "input x has shape [3, 5, 7], the model needs [3, 5, 8]");
    kiln_tensor flat = {"x", KILN_F32, 2, {B, T}, x};
    CHECK_FAILS(kiln_run(m, &flat, 1, out, 2), KILN_ERR_SHAPE, "input x has 2 dimensions, the model needs 3");
    kiln_output unknown = {"logits", y, N, 0, {0}};
    CHECK_FAILS(kiln_run(m, &in, 1, &unknown, 1), KILN_ERR_INVALID_ARG, "no output logits (its outputs: y, y_norm, h_1, h_2)");
    kiln_output small = {"y", y, N - 1, 0, {0}};
    CHECK_FAILS(kiln_run(m, &in, 1, &small, 1), KILN_ERR_INVALID_ARG, "output y needs 120 floats, its buffer holds 119");
    /* one output asked for: the other is computed and dropped */
    kiln_output one = {"y_norm", yn, N, 0, {0}};
    CHECK_OK(kiln_run(m, &in, 1, &one, 1));
    x[17] = NAN;
    kiln_output both[2] = {{"y", y, N, 0, {0}}, {"y_norm", yn, N, 0, {0}}};
    CHECK_FAILS(kiln_run(m, &in, 1, both, 2), KILN_ERR_NONFINITE, "kiln_run: input x");
    kiln_forward_args fa = {1, 8, 8, 4, x, x, x, x};
    CHECK_FAILS(kiln_forward(m, &fa, y), KILN_ERR_UNSUPPORTED, "this is a toy model: use kiln_run");
    kiln_model_free(m);
}

int main(void) {
    kiln_set_log_level(KILN_LOG_ERROR);
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln-family-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    snprintf(g_model, sizeof g_model, "%s/model", g_dir);
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_dir);
    snprintf(g_pkgs, sizeof g_pkgs, "%s/packages", g_dir);
    if (ka_register(&toy_arch) || km_write_seeded(&toy_arch, &g_cfg, g_model, 11, KILN_F32)) {
        fprintf(stderr, "setup: %s\n", kiln_last_error());
        return 1;
    }
    RUN(registers_once);
    RUN(every_path_equal);
    RUN(quality_gate);
    RUN(named_tensor_errors);
    RUN(unasked_outputs_kept);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_SUMMARY();
}
