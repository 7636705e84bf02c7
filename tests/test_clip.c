/* test_clip.c - the CLIP text encoder family "clip"
 * (CLIPTextModelWithProjection, CLIPTextModel) against the float64
 * transformers goldens clip-l-tiny (quick_gelu, f16 weights) and
 * clip-g-tiny (gelu, bf16 weights): the real loader, a cache miss then a
 * hit, and every execution path (eager, planned, reference kernels, a
 * dynamic package over the batch, a fixed package), in f32 (relative L2
 * within 1e-5) and bf16 (1e-2), every output of all four prompts (the
 * named four and hidden_states_0 .. L). Then the
 * refusals: config values, input shapes, ids outside the vocabulary; fewer
 * tokens than 77; int8 linears, converted and compiled. */
#include "arch/clip/clip.h"
#include "base/base.h"
#include "golden_util.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "test.h"

#include <pthread.h>
#include <stdint.h>

#define NOUT 4
static const char *k_out[NOUT] = {"last_hidden_state", "hidden_states_penultimate", "pooler_output", "text_embeds"};

static char g_tmp[512];

static const char *case_dir(const char *c) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/goldens/%s", test_data_dir(), c);
    return buf[k];
}

/* a golden case: input_ids as f32 [B,T] and the expected outputs */
typedef struct golden {
    kiln_tensor *t;
    size_t n;
    float *ids;
    int64_t B, T;
    const float *want[NOUT];
    size_t want_n[NOUT];
    int n_out; /* float tensors: the outputs, hidden_states_0 .. L among them */
} golden;

static int golden_open(const char *c, golden *g) {
    memset(g, 0, sizeof *g);
    char path[1100];
    snprintf(path, sizeof path, "%s/io.safetensors", case_dir(c));
    kiln_status st = kiln_tensors_read(path, &g->t, &g->n);
    CHECK_OK(st);
    if (st) return 0;
    const kiln_tensor *ids = kiln_tensors_find(g->t, g->n, "input_ids");
    CHECK(ids && ids->dtype == KILN_I64 && ids->ndim == 2);
    if (!ids) return 0;
    g->B = ids->shape[0], g->T = ids->shape[1];
    g->ids = malloc(sizeof(float) * (size_t)(g->B * g->T));
    for (int64_t i = 0; i < g->B * g->T; i++) g->ids[i] = (float)((const int64_t *)ids->data)[i];
    for (int k = 0; k < NOUT; k++) {
        const kiln_tensor *o = kiln_tensors_find(g->t, g->n, k_out[k]);
        CHECK_MSG(o && o->dtype == KILN_F32, "%s: golden output %s", c, k_out[k]);
        if (!o) return 0;
        g->want[k] = o->data;
        g->want_n[k] = 1;
        for (int d = 0; d < o->ndim; d++) g->want_n[k] *= (size_t)o->shape[d];
    }
    for (size_t i = 0; i < g->n; i++) g->n_out += g->t[i].dtype == KILN_F32;
    return 1;
}

static void golden_close(golden *g) {
    kiln_tensors_free(g->t);
    free(g->ids);
}

/* kiln_run of ids [B,T]: the first nout outputs, malloc'd into out[] */
static kiln_status run_ids(kiln_model *m, const float *ids, int64_t B, int64_t T, int nout, float **out) {
    kiln_tensor in = {.name = "input_ids", .dtype = KILN_F32, .ndim = 2, .shape = {B, T}, .data = ids};
    kiln_output o[NOUT];
    memset(o, 0, sizeof o);
    for (int k = 0; k < nout; k++) o[k].name = k_out[k];
    kiln_status st = kiln_run(m, &in, 1, o, (size_t)nout); /* the shapes first */
    if (st) return st;
    for (int k = 0; k < nout; k++) {
        size_t n = 1;
        for (int d = 0; d < o[k].ndim; d++) n *= (size_t)o[k].shape[d];
        out[k] = calloc(n, sizeof(float));
        o[k].data = out[k];
        o[k].capacity = n;
    }
    return kiln_run(m, &in, 1, o, (size_t)nout);
}

/* every output of m (nout of them: the four named ones, then
 * hidden_states_0 .. L) for the golden's prompts through m's current chain,
 * each against the golden's tensor of its name, within tol; the largest
 * error in *worst */
static void check_golden(kiln_model *m, const golden *g, int nout, double tol, const char *what, double *worst) {
    enum { MAX = 64 };
    int n = kiln_model_n_outputs(m);
    CHECK_MSG(n == nout && n <= MAX, "%s: the model has %d outputs, want %d", what, n, nout);
    if (n > MAX) return;
    kiln_tensor in = {.name = "input_ids", .dtype = KILN_F32, .ndim = 2, .shape = {g->B, g->T}, .data = g->ids};
    kiln_output o[MAX];
    const kiln_tensor *want[MAX];
    memset(o, 0, sizeof o);
    for (int k = 0; k < n; k++) {
        o[k].name = kiln_model_output_name(m, k);
        want[k] = kiln_tensors_find(g->t, g->n, o[k].name);
        CHECK_MSG(want[k] != NULL, "%s: output %s is not in the golden", what, o[k].name);
        if (!want[k]) return;
        o[k].capacity = 1;
        for (int d = 0; d < want[k]->ndim; d++) o[k].capacity *= (size_t)want[k]->shape[d];
        o[k].data = calloc(o[k].capacity, sizeof(float));
    }
    kiln_status st = kiln_run(m, &in, 1, o, (size_t)n);
    CHECK_MSG(st == KILN_OK, "%s: %s", what, kiln_last_error());
    for (int k = 0; !st && k < n; k++) {
        double e = rel_l2(o[k].data, want[k]->data, o[k].capacity);
        CHECK_MSG(e <= tol, "%s: %s relative L2 %.3g (bar %.0e)", what, o[k].name, e, tol);
        if (worst && e > *worst) *worst = e;
    }
    for (int k = 0; k < n; k++) free(o[k].data);
}

static kiln_load_opts load_opts(const char *c, const char *root, kiln_dtype dt) {
    kiln_load_opts o = kiln_load_defaults();
    o.model_name = c;
    o.component = "text_encoder";
    o.cache_root = root;
    o.source = case_dir(c);
    o.dtype = dt;
    return o;
}

/* One case on every path at one precision: a cache miss then a hit, eager,
 * planned, a dynamic package over batch 1..4, a fixed package; reference
 * kernels at f32. */
static void case_paths(const char *c, kiln_dtype dt) {
    golden g;
    if (!golden_open(c, &g)) return;
    const char *dn = dt == KILN_F32 ? "f32" : "bf16";
    double tol = dt == KILN_F32 ? 1e-5 : 1e-2;
    char root[700], pkg[700], what[128];
    snprintf(root, sizeof root, "%s/cache-%s-%s", g_tmp, c, dn);
    snprintf(pkg, sizeof pkg, "%s/pkg-%s-%s", g_tmp, c, dn);
    kb_mkdir_p(pkg);

    kiln_load_opts o = load_opts(c, root, dt);
    kiln_model *m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    if (!m) goto out;
    CHECK_MSG(!strcmp(kiln_model_origin(m), "miss"), "%s: first load %s", c, kiln_model_origin(m));
    CHECK(!strcmp(kiln_model_family(m), "clip") && kiln_model_n_outputs(m) == g.n_out);
    double e_miss = 0;
    kiln_model_set_exec(m, "eager");
    snprintf(what, sizeof what, "%s %s converted, eager", c, dn);
    check_golden(m, &g, g.n_out, tol, what, &e_miss);
    kiln_model_free(m);

    /* the second start maps the cache */
    m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    if (!m) goto out;
    CHECK_MSG(!strcmp(kiln_model_origin(m), "hit"), "%s: second load %s", c, kiln_model_origin(m));
    CHECK_OK(kiln_model_set_package_dir(m, pkg));
    const char *chains[] = {"eager", "planned"};
    double worst[4] = {0};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(kiln_model_set_exec(m, chains[i]));
        snprintf(what, sizeof what, "%s %s cache hit, %s", c, dn, chains[i]);
        check_golden(m, &g, g.n_out, tol, what, &worst[i]);
        CHECK(!strcmp(kiln_model_last_exec(m), chains[i]));
    }
    /* a package with a dynamic batch (tokens static at 77) */
    kiln_compile_opts co = kiln_compile_defaults();
    co.dims = "batch=1:4";
    kiln_compile_result r;
    double t0 = kb_now();
    CHECK_OK(kiln_compile(m, &co, &r));
    double tc = kb_now() - t0;
    CHECK_OK(kiln_model_set_exec(m, "dynamic"));
    snprintf(what, sizeof what, "%s %s dynamic package", c, dn);
    check_golden(m, &g, g.n_out, tol, what, &worst[2]);
    CHECK_MSG(!strcmp(kiln_model_last_exec(m), "dynamic"), "ran by %s (%s)", kiln_model_last_exec(m), kiln_model_exec_note(m));
    /* batch 3 (inside the range) gives the first three prompts' rows */
    float *part[NOUT] = {0};
    CHECK_OK(run_ids(m, g.ids, 3, g.T, NOUT, part));
    for (int k = 0; k < NOUT && part[k]; k++) {
        double e = rel_l2(part[k], g.want[k], g.want_n[k] / 4 * 3);
        CHECK_MSG(e <= tol, "%s: batch 3, %s relative L2 %.3g", what, k_out[k], e);
        free(part[k]);
    }
    /* a fixed-shape package, compiled on demand for this model compiled here before */
    CHECK_OK(kiln_model_set_exec(m, "fixed"));
    snprintf(what, sizeof what, "%s %s fixed package", c, dn);
    t0 = kb_now();
    check_golden(m, &g, g.n_out, tol, what, &worst[3]);
    double tf = kb_now() - t0;
    CHECK_MSG(!strcmp(kiln_model_last_exec(m), "fixed"), "ran by %s (%s)", kiln_model_last_exec(m), kiln_model_exec_note(m));
    fprintf(stderr, "  %s %s: worst relative L2 converted %.2e, eager %.2e, planned %.2e, dynamic %.2e, fixed %.2e "
            "(compile %.1f s, fixed %.1f s)\n", c, dn, e_miss, worst[0], worst[1], worst[2], worst[3], tc, tf);
    kiln_model_free(m);

    if (dt == KILN_F32) { /* the reference kernels (plain loops, double sums), no cache */
        kiln_open_opts ro = {.dtype = KILN_F32, .reference = 1};
        m = NULL;
        CHECK_OK(kiln_model_open(case_dir(c), &ro, &m));
        if (m) {
            double e = 0;
            kiln_model_set_exec(m, "eager");
            snprintf(what, sizeof what, "%s reference, eager", c);
            check_golden(m, &g, g.n_out, tol, what, &e);
            kiln_model_set_exec(m, "planned");
            snprintf(what, sizeof what, "%s reference, planned", c);
            check_golden(m, &g, g.n_out, tol, what, &e);
            fprintf(stderr, "  %s reference: worst relative L2 %.2e\n", c, e);
            kiln_model_free(m);
        }
    }
out:
    golden_close(&g);
}

TEST(clip_l_f32) { case_paths("clip-l-tiny", KILN_F32); }
TEST(clip_g_f32) { case_paths("clip-g-tiny", KILN_F32); }
TEST(clip_l_bf16) {
    if (!kk_fast(KILN_BF16)) {
        fprintf(stderr, "  no bf16 GEMM on this CPU: skipped\n");
        return;
    }
    case_paths("clip-l-tiny", KILN_BF16);
}
TEST(clip_g_bf16) {
    if (!kk_fast(KILN_BF16)) {
        fprintf(stderr, "  no bf16 GEMM on this CPU: skipped\n");
        return;
    }
    case_paths("clip-g-tiny", KILN_BF16);
}

/* Causal attention: with the first T tokens only, every position's state
 * is the golden's (a later token never reaches an earlier one), and the
 * pooled token of "a photo of a cat" (its eos at position 6) is inside;
 * run by a package over a range of token counts. */
TEST(fewer_tokens) {
    golden g;
    if (!golden_open("clip-l-tiny", &g)) return;
    kiln_open_opts oo = {.dtype = KILN_F32};
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(case_dir("clip-l-tiny"), &oo, &m));
    if (!m) goto out;
    enum { T = 10 };
    float ids[T], *out[NOUT] = {0}, *want[2];
    memcpy(ids, g.ids, sizeof ids);
    int64_t D = (int64_t)(g.want_n[0] / (size_t)(g.B * g.T));
    /* through a package whose token count is dynamic too */
    char pkg[700];
    snprintf(pkg, sizeof pkg, "%s/pkg-tokens", g_tmp);
    kb_mkdir_p(pkg);
    CHECK_OK(kiln_model_set_package_dir(m, pkg));
    kiln_compile_opts co = kiln_compile_defaults();
    co.dims = "batch=1:4,tokens=8:77";
    kiln_compile_result r;
    CHECK_OK(kiln_compile(m, &co, &r));
    CHECK_OK(kiln_model_set_exec(m, "dynamic"));
    CHECK_OK(run_ids(m, ids, 1, T, NOUT, out));
    CHECK_MSG(!strcmp(kiln_model_last_exec(m), "dynamic"), "ran by %s (%s)", kiln_model_last_exec(m), kiln_model_exec_note(m));
    for (int k = 0; k < 2; k++) want[k] = malloc(sizeof(float) * T * (size_t)D);
    for (int k = 0; k < 2; k++) memcpy(want[k], g.want[k], sizeof(float) * T * (size_t)D);
    for (int k = 0; k < 2 && out[k]; k++) {
        double e = rel_l2(out[k], want[k], (size_t)(T * D));
        CHECK_MSG(e < 1e-5, "%d tokens: %s relative L2 %.3g", T, k_out[k], e);
    }
    for (int k = 2; k < NOUT && out[k]; k++) {
        double e = rel_l2(out[k], g.want[k], g.want_n[k] / (size_t)g.B);
        CHECK_MSG(e < 1e-5, "%d tokens: %s relative L2 %.3g", T, k_out[k], e);
    }
    for (int k = 0; k < NOUT; k++) free(out[k]);
    for (int k = 0; k < 2; k++) free(want[k]);
    kiln_model_free(m);
out:
    golden_close(&g);
}

/* CLIPTextModel (Flux.1's text_encoder, the clip-l-tiny weights without the
 * projection, the text_model. prefix kept): no text_embeds */
TEST(text_model_without_projection) {
    golden g;
    if (!golden_open("clip-l-tiny", &g)) return;
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/clip-text", g_tmp);
    kb_mkdir_p(dir);
    kiln_tensor *w = NULL;
    size_t n = 0, k = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", case_dir("clip-l-tiny"));
    CHECK_OK(kiln_tensors_read(path, &w, &n));
    for (size_t i = 0; i < n; i++)
        if (strcmp(w[i].name, "text_projection.weight")) w[k++] = w[i];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(kiln_tensors_write(path, k, w)); /* the f16 values, exactly, as f32 */
    kiln_tensors_free(w);
    char *cfg = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", case_dir("clip-l-tiny"));
    CHECK_OK(kb_read_file(path, &cfg, &len));
    char *at = cfg ? strstr(cfg, "CLIPTextModelWithProjection") : NULL;
    CHECK(at != NULL);
    if (at) memmove(at + strlen("CLIPTextModel"), at + strlen("CLIPTextModelWithProjection"),
                    strlen(at + strlen("CLIPTextModelWithProjection")) + 1);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (cfg) CHECK_OK(kb_write_file_atomic(path, cfg, strlen(cfg)));
    free(cfg);
    kiln_open_opts oo = {.dtype = KILN_F32};
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(dir, &oo, &m));
    if (m) {
        CHECK(!strcmp(kiln_model_family(m), "clip") && kiln_model_n_outputs(m) == 6);
        CHECK(!strcmp(kiln_model_output_name(m, 2), "pooler_output") && !strcmp(kiln_model_output_name(m, 3), "hidden_states_0"));
        kiln_model_set_exec(m, "planned");
        check_golden(m, &g, g.n_out - 1, 1e-5, "CLIPTextModel planned", NULL); /* no text_embeds */
        kiln_model_free(m);
    }
    /* the model with its projection is refused as a CLIPTextModel: the tensor is named */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char src[800];
    snprintf(src, sizeof src, "%s/model.safetensors", case_dir("clip-l-tiny"));
    char *data = NULL;
    CHECK_OK(kb_read_file(src, &data, &len));
    if (data) CHECK_OK(kb_write_file_atomic(path, data, len));
    free(data);
    CHECK_FAILS(kiln_model_open(dir, &oo, &m), KILN_ERR_UNEXPECTED, "text_projection.weight");
    golden_close(&g);
}

/* transformers 5.25 saves a CLIPTextModel without the text_model. prefix
 * (embeddings.*, encoder.layers.*, final_layer_norm.*): the case's weights
 * written so read as the same model, bit for bit */
TEST(names_without_text_model_prefix) {
    golden g;
    if (!golden_open("clip-l-tiny", &g)) return;
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/clip-unprefixed", g_tmp);
    kb_mkdir_p(dir);
    kiln_tensor *w = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", case_dir("clip-l-tiny"));
    CHECK_OK(kiln_tensors_read(path, &w, &n));
    kiln_tensor *u = calloc(n + 1, sizeof *u);
    for (size_t i = 0; u && i < n; i++) {
        u[i] = w[i];
        if (!strncmp(w[i].name, "text_model.", 11)) u[i].name = w[i].name + 11;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (u) CHECK_OK(kiln_tensors_write(path, n, u));
    free(u);
    kiln_tensors_free(w);
    char *cfg = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", case_dir("clip-l-tiny"));
    CHECK_OK(kb_read_file(path, &cfg, &len));
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (cfg) CHECK_OK(kb_write_file_atomic(path, cfg, len));
    free(cfg);
    kiln_open_opts oo = {.dtype = KILN_F32};
    kiln_model *a = NULL, *b = NULL;
    CHECK_OK(kiln_model_open(dir, &oo, &a));
    CHECK_OK(kiln_model_open(case_dir("clip-l-tiny"), &oo, &b));
    if (a && b) {
        kiln_model_info info;
        CHECK_OK(kiln_model_get_info(a, &info));
        CHECK_MSG(info.layout && !strcmp(info.layout, "clip-unprefixed"), "layout %s", info.layout ? info.layout : "?");
        float *x[NOUT] = {0}, *y[NOUT] = {0};
        CHECK_OK(run_ids(a, g.ids, g.B, g.T, 3, x));
        CHECK_OK(run_ids(b, g.ids, g.B, g.T, 3, y));
        for (int k = 0; k < 3; k++) {
            size_t m = (size_t)(k == 2 ? g.B * 32 : g.B * g.T * 32); /* clip-l-tiny is 32 wide */
            CHECK_MSG(x[k] && y[k] && !memcmp(x[k], y[k], sizeof(float) * m), "output %d differs", k);
            free(x[k]);
            free(y[k]);
        }
    }
    kiln_model_free(a);
    kiln_model_free(b);
    golden_close(&g);
}

/* A copy of case c's folder whose config.json has from replaced by to
 * (once); the folder's path in dir. */
static int edited_copy(const char *c, const char *tag, const char *from, const char *to, char *dir, size_t cap) {
    char path[800], src[800], *cfg = NULL, *data = NULL;
    size_t len;
    snprintf(dir, cap, "%s/%s", g_tmp, tag);
    kb_mkdir_p(dir);
    snprintf(path, sizeof path, "%s/config.json", case_dir(c));
    CHECK_OK(kb_read_file(path, &cfg, &len));
    char *at = cfg ? strstr(cfg, from) : NULL;
    CHECK_MSG(at != NULL, "%s: config.json lacks %s", c, from);
    if (!at) {
        free(cfg);
        return 0;
    }
    size_t head = (size_t)(at - cfg), nf = strlen(from), nt = strlen(to);
    char *out = malloc(len + nt + 1);
    memcpy(out, cfg, head);
    memcpy(out + head, to, nt);
    memcpy(out + head + nt, at + nf, len - head - nf + 1);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK_OK(kb_write_file_atomic(path, out, strlen(out)));
    free(out);
    free(cfg);
    snprintf(src, sizeof src, "%s/model.safetensors", case_dir(c));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(kb_read_file(src, &data, &len));
    if (data) CHECK_OK(kb_write_file_atomic(path, data, len));
    free(data);
    return 1;
}

/* eos_token_id 49407 (the real configs') pools the first 49407: the same
 * token as the legacy argmax (49407 is the largest id), also with CLIP-G's
 * padding by 0 */
TEST(eos_rule) {
    const char *cases[] = {"clip-l-tiny", "clip-g-tiny"};
    for (int i = 0; i < 2; i++) {
        golden g;
        if (!golden_open(cases[i], &g)) return;
        char dir[700], tag[64];
        snprintf(tag, sizeof tag, "eos-%s", cases[i]);
        if (edited_copy(cases[i], tag, "\"eos_token_id\": 2,", "\"eos_token_id\": 49407,", dir, sizeof dir)) {
            kiln_open_opts oo = {.dtype = KILN_F32};
            kiln_model *m = NULL;
            CHECK_OK(kiln_model_open(dir, &oo, &m));
            if (m) {
                kiln_model_set_exec(m, "planned");
                check_golden(m, &g, g.n_out, 1e-5, "eos_token_id 49407", NULL);
                /* and with no 49407 in a row, transformers takes position 0 */
                float *ids = malloc(sizeof(float) * (size_t)(g.B * g.T)), *out[NOUT] = {0};
                memcpy(ids, g.ids, sizeof(float) * (size_t)(g.B * g.T));
                for (int64_t t = 0; t < g.T; t++)
                    if (ids[t] == 49407) ids[t] = 320;
                CHECK_OK(run_ids(m, ids, g.B, g.T, NOUT, out));
                size_t D = g.want_n[2] / (size_t)g.B;
                if (out[0] && out[2]) CHECK(!memcmp(out[2], out[0], sizeof(float) * D)); /* row 0's token 0 */
                for (int k = 0; k < NOUT; k++) free(out[k]);
                free(ids);
                kiln_model_free(m);
            }
        }
        golden_close(&g);
    }
}

/* which family claims which config.json */
TEST(claims) {
    CHECK(clip_config_kind("{\"architectures\": [\"CLIPTextModelWithProjection\"]}") == 1);
    CHECK(clip_config_kind("{\"architectures\": [\"CLIPTextModel\"]}") == 0);
    CHECK(clip_config_kind("{\"model_type\": \"clip_text_model\"}") == 0);
    CHECK(clip_config_kind("{\"architectures\": [\"T5EncoderModel\"], \"model_type\": \"clip_text_model\"}") == -1);
    CHECK(clip_config_kind("{\"_class_name\": \"SD3Transformer2DModel\"}") == -1);
    CHECK(clip_config_kind("not json") == -1);
    CHECK(ka_find("clip") == &ka_clip);
    CHECK(ka_for_config("{\"architectures\": [\"CLIPTextModelWithProjection\"]}") == &ka_clip);
    CHECK(ka_for_config("{\"architectures\": [\"CLIPTextModel\"]}") == &ka_clip);
    /* the config written for caches and packages is claimed and parsed back the same */
    clip_config c, back;
    const char *models[2] = {"CLIPTextModel", "CLIPTextModelWithProjection"};
    for (int w = 0; w < 2; w++) {
        char in[300];
        snprintf(in, sizeof in, "{\"architectures\": [\"%s\"], \"hidden_act\": \"gelu\", \"hidden_size\": 48, "
                 "\"num_attention_heads\": 4, \"eos_token_id\": 2}", models[w]);
        CHECK_OK(clip_config_parse(in, &c));
        CHECK(c.with_projection == w && c.hidden_act == CLIP_ACT_GELU && c.hidden_size == 48);
        char *j = clip_config_to_json(&c);
        CHECK(j && ka_for_config(j) == &ka_clip);
        memset(&back, 0x55, sizeof back);
        CHECK_OK(clip_config_parse(j ? j : "", &back));
        CHECK(!memcmp(&c, &back, sizeof c));
        free(j);
    }
    /* the outputs: the named four (three without the projection), then every hidden state */
    ka_io io[KA_MAX_OUT];
    char names[KA_MAX_OUT][48];
    c.num_hidden_layers = 32; /* CLIP-G */
    CHECK(clip_outputs(&c, io, names) == 4 + 33 && !strcmp(io[3].name, "text_embeds") && !strcmp(io[36].name, "hidden_states_32"));
    c.with_projection = 0;
    CHECK(clip_outputs(&c, io, names) == 3 + 33 && !strcmp(io[3].name, "hidden_states_0"));
    CHECK(!strcmp(kiln_family_quant_layers("clip"), "text_model.encoder.layers.*"));
}

/* config values that cannot be, each named */
TEST(bad_configs) {
    static const struct {
        const char *json, *msg;
        kiln_status code;
    } cases[] = {
        {"{\"hidden_act\": \"relu\"}", "hidden_act is \"relu\"", KILN_ERR_CONFIG},
        {"{\"hidden_act\": 3}", "hidden_act is not a string", KILN_ERR_CONFIG},
        {"{\"hidden_size\": 30, \"num_attention_heads\": 4}", "hidden_size = 30 is not a multiple of num_attention_heads = 4",
         KILN_ERR_CONFIG},
        {"{\"num_hidden_layers\": 0}", "num_hidden_layers = 0 is impossible", KILN_ERR_CONFIG},
        {"{\"num_hidden_layers\": 76}", "num_hidden_layers = 76 is impossible (allowed 1..75)", KILN_ERR_CONFIG},
        {"{\"vocab_size\": 16777217}", "vocab_size = 16777217 is impossible", KILN_ERR_CONFIG},
        {"{\"max_position_embeddings\": 1.5}", "\"max_position_embeddings\" must be an integer", KILN_ERR_CONFIG},
        {"{\"layer_norm_eps\": -1}", "layer_norm_eps = -1 is impossible", KILN_ERR_CONFIG},
        {"{\"layer_norm_eps\": \"small\"}", "\"layer_norm_eps\" must be a number", KILN_ERR_CONFIG},
        {"{\"eos_token_id\": 49408}", "eos_token_id = 49408 is outside the vocabulary", KILN_ERR_CONFIG},
        {"{\"model_type\": \"clip\"}", "model_type is clip", KILN_ERR_CONFIG},
        {"[1, 2]", "must hold a JSON object", KILN_ERR_FORMAT},
        {"{", "not valid JSON", KILN_ERR_FORMAT},
    };
    clip_config c;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_FAILS(clip_config_parse(cases[i].json, &c), cases[i].code, cases[i].msg);

    /* through the loader: a folder whose config.json has a bad value */
    char dir[700];
    if (!edited_copy("clip-g-tiny", "bad-config", "\"gelu\"", "\"gelx\"", dir, sizeof dir)) return;
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_model_open(dir, NULL, &m), KILN_ERR_CONFIG, "hidden_act is \"gelx\"");
    CHECK(m == NULL);
}

/* inputs that do not fit: named, never a crash */
TEST(bad_inputs) {
    golden g;
    if (!golden_open("clip-l-tiny", &g)) return;
    kiln_open_opts oo = {.dtype = KILN_F32};
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(case_dir("clip-l-tiny"), &oo, &m));
    if (!m) goto out;
    kiln_model_set_exec(m, "eager");
    float *out[NOUT] = {0}, *ids = calloc(4 * 78, sizeof(float));
    CHECK_FAILS(run_ids(m, ids, 4, 78, NOUT, out), KILN_ERR_SHAPE, "input_ids dimension 1 (tokens) is 78, the model takes 1 to 77");
    CHECK_FAILS(run_ids(m, ids, 0, 77, NOUT, out), KILN_ERR_SHAPE, "input_ids dimension 0 (batch) is 0");
    kiln_tensor in3 = {.name = "input_ids", .dtype = KILN_F32, .ndim = 3, .shape = {4, 77, 1}, .data = ids};
    kiln_output o = {.name = "pooler_output"};
    CHECK_FAILS(kiln_run(m, &in3, 1, &o, 1), KILN_ERR_SHAPE, "input input_ids has 3 dimensions, the model needs 2");
    kiln_tensor wrong = {.name = "hidden_states", .dtype = KILN_F32, .ndim = 2, .shape = {4, 77}, .data = ids};
    CHECK_FAILS(kiln_run(m, &wrong, 1, &o, 1), KILN_ERR_INVALID_ARG, "has no input hidden_states (its inputs: input_ids)");
    kiln_tensor good = {.name = "input_ids", .dtype = KILN_F32, .ndim = 2, .shape = {4, 77}, .data = ids};
    o.name = "sample";
    CHECK_FAILS(kiln_run(m, &good, 1, &o, 1), KILN_ERR_INVALID_ARG, "has no output sample (its outputs: last_hidden_state, "
                "hidden_states_penultimate, pooler_output, text_embeds, hidden_states_0, hidden_states_1, hidden_states_2)");
    /* an id outside the vocabulary (transformers: an index error): refused,
     * the id and its position named (row 1, token 5: flat index 82) */
    memcpy(ids, g.ids, sizeof(float) * 4 * 77);
    ids[77 + 5] = 49408;
    CHECK_FAILS(run_ids(m, ids, 4, 77, NOUT, out), KILN_ERR_RANGE, "index 49408 at 82 is outside the table's 49408 rows");
    for (int k = 0; k < NOUT; k++) free(out[k]), out[k] = NULL;
    ids[77 + 5] = -1;
    CHECK_FAILS(run_ids(m, ids, 4, 77, NOUT, out), KILN_ERR_RANGE, "index -1 at 82");
    for (int k = 0; k < NOUT; k++) free(out[k]), out[k] = NULL;
    ids[77 + 5] = 2.5f;
    CHECK_FAILS(run_ids(m, ids, 4, 77, NOUT, out), KILN_ERR_RANGE, "index 2.5 at 82");
    for (int k = 0; k < NOUT; k++) free(out[k]), out[k] = NULL;
    ids[77 + 5] = NAN;
    CHECK_FAILS(run_ids(m, ids, 4, 77, NOUT, out), KILN_ERR_NONFINITE, "input_ids");
    for (int k = 0; k < NOUT; k++) free(out[k]), out[k] = NULL;
    /* and the same model still runs the good ones */
    check_golden(m, &g, g.n_out, 1e-5, "after refusals", NULL);
    free(ids);
    kiln_model_free(m);
out:
    golden_close(&g);
}

/* two models in one process, forwards at once on two threads: a kernel's
 * failure (an id outside the vocabulary, found by the gather) fails the
 * forward that ran it and never the other model's (kb_run: a run's
 * failures are its own, not the process's) */
typedef struct two_arg {
    kiln_model *m;
    const float *ids;
    kiln_status want;
    int wrong;
    char why[300];
} two_arg;

static void *two_runs(void *p) {
    two_arg *a = p;
    for (int i = 0; i < 60; i++) {
        float *out[NOUT] = {0};
        kiln_status st = run_ids(a->m, a->ids, 4, 77, 1, out);
        if (st != a->want && !a->wrong++) snprintf(a->why, sizeof a->why, "%s", kiln_last_error());
        free(out[0]);
    }
    return NULL;
}

TEST(two_models_keep_their_failures) {
    golden g;
    if (!golden_open("clip-l-tiny", &g)) return;
    kiln_open_opts oo = {.dtype = KILN_F32};
    kiln_model *good = NULL, *bad = NULL;
    CHECK_OK(kiln_model_open(case_dir("clip-l-tiny"), &oo, &good));
    CHECK_OK(kiln_model_open(case_dir("clip-l-tiny"), &oo, &bad));
    float *ids = malloc(sizeof(float) * 4 * 77);
    memcpy(ids, g.ids, sizeof(float) * 4 * 77);
    ids[77 + 5] = 49408;
    if (good && bad) {
        kiln_model_set_exec(good, "eager"), kiln_model_set_exec(bad, "eager");
        two_arg a[2] = {{good, g.ids, KILN_OK, 0, ""}, {bad, ids, KILN_ERR_RANGE, 0, ""}};
        pthread_t t[2];
        for (int k = 0; k < 2; k++) CHECK(pthread_create(&t[k], NULL, two_runs, &a[k]) == 0);
        for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
        CHECK_MSG(!a[0].wrong, "the good model failed %d of 60 forwards: %s", a[0].wrong, a[0].why);
        CHECK_MSG(!a[1].wrong, "the bad ids passed %d of 60 forwards: %s", a[1].wrong, a[1].why);
    }
    free(ids);
    kiln_model_free(good);
    kiln_model_free(bad);
    golden_close(&g);
}

/* --quant int8 on the encoder layers' linears: runs and stays close */
TEST(int8_linears) {
    if (!quant_runs_here(KILN_QUANT_INT8, "clip int8")) return;
    const char *cases[] = {"clip-l-tiny", "clip-g-tiny"};
    for (int i = 0; i < 2; i++) {
        golden g;
        if (!golden_open(cases[i], &g)) return;
        char root[700];
        snprintf(root, sizeof root, "%s/cache-int8-%s", g_tmp, cases[i]);
        kiln_load_opts o = load_opts(cases[i], root, KILN_DTYPE_INVALID);
        o.quant = KILN_QUANT_INT8;
        kiln_model *m = NULL;
        CHECK_OK(kiln_load_model(&o, &m));
        if (m) {
            kiln_model_info info;
            CHECK_OK(kiln_model_get_info(m, &info));
            int64_t layers = cases[i][5] == 'l' ? 2 : 3;
            CHECK_MSG(info.n_quantized == 6 * layers, "%s: %lld linears quantized, want %lld", cases[i],
                      (long long)info.n_quantized, (long long)(6 * layers));
            double e = 0;
            kiln_model_set_exec(m, "planned");
            check_golden(m, &g, g.n_out, 5e-2, "int8", &e);
            /* compiled: the quality gate is the SD3 sampler's, so forced past it */
            kiln_compile_opts co = kiln_compile_defaults();
            co.dims = "batch=1:4";
            co.force = 1;
            kiln_compile_result r;
            CHECK_OK(kiln_compile(m, &co, &r));
            double ep = 0;
            kiln_model_set_exec(m, "dynamic");
            check_golden(m, &g, g.n_out, 5e-2, "int8 dynamic package", &ep);
            CHECK_MSG(!strcmp(kiln_model_last_exec(m), "dynamic"), "ran by %s (%s)", kiln_model_last_exec(m),
                      kiln_model_exec_note(m));
            fprintf(stderr, "  %s int8: worst relative L2 planned %.2e, dynamic package %.2e\n", cases[i], e, ep);
            kiln_model_free(m);
        }
        golden_close(&g);
    }
}

int main(void) {
    test_tmpdir(g_tmp, sizeof g_tmp, "clip");
    char pkg[600];
    snprintf(pkg, sizeof pkg, "%s/packages", g_tmp);
    setenv("KILN_PACKAGE_DIR", pkg, 1);
    RUN(claims);
    RUN(bad_configs);
    RUN(bad_inputs);
    RUN(two_models_keep_their_failures);
    RUN(fewer_tokens);
    RUN(text_model_without_projection);
    RUN(names_without_text_model_prefix);
    RUN(eos_rule);
    RUN(clip_l_f32);
    RUN(clip_g_f32);
    RUN(clip_l_bf16);
    RUN(clip_g_bf16);
    RUN(int8_linears);
    test_rmrf(g_tmp);
    return TEST_SUMMARY();
}
