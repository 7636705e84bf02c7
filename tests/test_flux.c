/* test_flux.c - the Flux.1 families (src/arch/flux/) against the flux-tiny
 * (dev style: guidance embedding) and flux-schnell-tiny goldens (diffusers'
 * FluxTransformer2DModel in float64 from bf16 weights): the configs and
 * their refusals; the rotary table against FluxPosEmbed's formula; the
 * model's own 2x2 packing against the cases' packed tensors; each case's
 * sample through the weight cache (a miss, then a hit) on every path
 * (eager, planned, reference kernels, a dynamic package, a fixed-shape
 * package) in f32 within 1e-5 and bf16 within 1e-2 relative L2; one dynamic
 * package over h, w and batch serving several sizes (non-square, the
 * smallest and largest of its range) bit for bit like the planned executor
 * (the same fused graph) and within 1e-6 of eager (unfused). */
#include "arch/flux/flux.h"
#include "base/base.h"
#include "golden_util.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "pipeline/component.h"
#include "pipeline/flux_pipeline.h"
#include "cli_util.h"
#include "ldm_names.h"
#include "test.h"

#include <math.h>
#include <unistd.h>

/* a case's inputs as the family takes them, and its expected sample */
typedef struct {
    kiln_tensor *t;
    size_t n;
    kiln_tensor in[5];
    int n_in;
    const kiln_tensor *want; /* sample_unpacked */
    size_t n_out;
} golden_io;

static int io_open(const char *c, golden_io *g) {
    memset(g, 0, sizeof *g);
    if (kiln_tensors_read(golden_path(c, "io.safetensors"), &g->t, &g->n)) return 0;
    const char *from[5] = {"latents_unpacked", "encoder_hidden_states", "pooled_projections", "timestep", "guidance"};
    const char *to[5] = {"latents", "encoder_hidden_states", "pooled_projections", "timestep", "guidance"};
    for (int k = 0; k < 5; k++) {
        const kiln_tensor *t = kiln_tensors_find(g->t, g->n, from[k]);
        if (!t) break;
        g->in[k] = *t;
        g->in[k].name = to[k];
        g->n_in = k + 1;
    }
    g->want = kiln_tensors_find(g->t, g->n, "sample_unpacked");
    if (!g->want || g->n_in < 4) return 0;
    g->n_out = ka_numel(g->want->ndim, g->want->shape);
    return 1;
}

static float *forward(kiln_model *m, const golden_io *io) {
    float *out = calloc(io->n_out, sizeof(float));
    kiln_output o = {.name = "sample", .data = out, .capacity = io->n_out};
    CHECK_OK(kiln_run(m, io->in, (size_t)io->n_in, &o, 1));
    return out;
}

static char *config_text(const char *c) {
    char *text = NULL;
    size_t len;
    CHECK_OK(kb_read_file(golden_path(c, "config.json"), &text, &len));
    return text;
}

TEST(configs_are_read_and_checked) {
    char *dev = config_text("flux-tiny"), *schnell = config_text("flux-schnell-tiny");
    CHECK(ka_for_config(dev) == &ka_flux && ka_for_config(schnell) == &ka_flux_schnell);
    CHECK(ka_find("flux") == &ka_flux && ka_find("flux-schnell") == &ka_flux_schnell);
    flux_config c;
    CHECK_OK(flux_config_parse(dev, &c));
    CHECK(c.in_channels == 64 && c.out_channels == 64 && c.num_layers == 2 && c.num_single_layers == 2 &&
          c.num_attention_heads == 2 && c.attention_head_dim == 16 && c.joint_attention_dim == 32 &&
          c.pooled_projection_dim == 32 && c.axes_dims_rope[0] == 4 && c.axes_dims_rope[1] == 4 &&
          c.axes_dims_rope[2] == 8 && c.guidance_embeds == 1);
    char *back = flux_config_to_json(&c);
    flux_config c2;
    CHECK(back && ka_for_config(back) == &ka_flux);
    CHECK_OK(flux_config_parse(back, &c2));
    CHECK(!memcmp(&c, &c2, sizeof c));
    free(back);
    /* the families' weight lists: schnell lacks the guidance embedder */
    ka_spec *s = NULL;
    size_t n = 0, n2 = 0;
    CHECK_OK(flux_weight_spec(&c, &s, &n));
    free(s);
    CHECK_OK(flux_config_parse(schnell, &c2));
    CHECK_OK(flux_weight_spec(&c2, &s, &n2));
    free(s);
    CHECK_MSG(n == 112 && n2 == 108, "%zu and %zu weights (the files hold 112 and 108)", n, n2);
    /* each family refuses the other's config */
    CHECK_FAILS(ka_flux.config_parse(schnell, &c), KILN_ERR_CONFIG, "guidance_embeds = false: that is the flux-schnell");
    CHECK_FAILS(ka_flux_schnell.config_parse(dev, &c), KILN_ERR_CONFIG, "guidance_embeds = true: that is the flux family");
    /* values named */
    CHECK_FAILS(flux_config_parse("{\"_class_name\": \"FluxTransformer2DModel\", \"axes_dims_rope\": [16, 56, 58]}", &c),
                KILN_ERR_CONFIG, "axes_dims_rope sum to 130, attention_head_dim is 128");
    CHECK_FAILS(flux_config_parse("{\"_class_name\": \"FluxTransformer2DModel\", \"axes_dims_rope\": [16, 56]}", &c),
                KILN_ERR_CONFIG, "must be a list of 3 integers");
    CHECK_FAILS(flux_config_parse("{\"_class_name\": \"FluxTransformer2DModel\", \"axes_dims_rope\": [15, 57, 56]}", &c),
                KILN_ERR_CONFIG, "axes_dims_rope[0] = 15 must be even");
    CHECK_FAILS(flux_config_parse("{\"_class_name\": \"FluxTransformer2DModel\", \"in_channels\": 62, \"out_channels\": 62}", &c),
                KILN_ERR_CONFIG, "a multiple of 4");
    CHECK_FAILS(flux_config_parse("{\"_class_name\": \"FluxTransformer2DModel\", \"patch_size\": 2}", &c), KILN_ERR_CONFIG,
                "patch_size = 2 is impossible");
    CHECK_FAILS(flux_config_parse("{\"_class_name\": \"FluxTransformer2DModel\", \"num_layers\": 0, \"num_single_layers\": 0}", &c),
                KILN_ERR_CONFIG, "no blocks");
    CHECK_FAILS(flux_config_parse("{\"_class_name\": \"FluxTransformer2DModel\", \"guidance_embeds\": 1}", &c),
                KILN_ERR_CONFIG, "\"guidance_embeds\" must be true or false");
    /* the released sizes are the defaults: Flux.1-schnell's config without guidance_embeds */
    CHECK_OK(flux_config_parse("{\"_class_name\": \"FluxTransformer2DModel\"}", &c));
    CHECK(c.num_layers == 19 && c.num_single_layers == 38 && c.attention_head_dim == 128 && c.joint_attention_dim == 4096 &&
          !c.guidance_embeds);
    free(dev);
    free(schnell);
}

/* FluxPosEmbed: ids (0, row, col) of each image patch after T text tokens
 * at 0; theta 10000; each axis's channel pairs rotated by id / theta^(2j/d) */
TEST(rotary_table_is_flux_pos_embed) {
    int axes[3] = {4, 4, 8};
    int64_t T = 3, h = 2, w = 5, Dh = 16, N = T + h * w;
    float *y = malloc(sizeof(float) * (size_t)(N * Dh));
    kk_rope_table(y, T, h, w, (int64_t[]){4, 4, 8}, 10000.0f);
    int bad = 0;
    for (int64_t n = 0; n < N; n++) {
        int64_t id[3] = {0, n < T ? 0 : (n - T) / w, n < T ? 0 : (n - T) % w};
        int i = 0;
        for (int a = 0; a < 3; a++)
            for (int j = 0; j < axes[a] / 2; j++, i++) {
                double ang = (double)id[a] * pow(10000.0, -2.0 * j / axes[a]);
                bad += fabs(y[n * Dh + 2 * i] - cos(ang)) > 1e-7 || fabs(y[n * Dh + 2 * i + 1] - sin(ang)) > 1e-7;
            }
    }
    CHECK_MSG(!bad, "%d table entries differ from the formula", bad);
    /* text rows do not rotate: x * 1 + rot * 0 */
    float x[16], r[16];
    for (int i = 0; i < 16; i++) x[i] = (float)i - 7.5f;
    kk_rope(x, y, r, 1, 1, 1, 16);
    CHECK(!memcmp(x, r, sizeof x));
    /* an image row turns each pair by its angle */
    kk_rope(x, y + (T + 6) * Dh, r, 1, 1, 1, 16);
    double ang = 1.0 * pow(10000.0, -2.0 * 1 / 8); /* axis 2 (col 1 of row 1), pair 1 */
    int i = (2 + 2 + 1) * 2;
    CHECK(fabs(r[i] - (x[i] * cos(ang) - x[i + 1] * sin(ang))) < 1e-6 && fabs(r[i + 1] - (x[i + 1] * cos(ang) + x[i] * sin(ang))) < 1e-6);
    free(y);
    /* the graph refuses what it cannot rotate */
    kg_graph g;
    kg_init(&g, NULL, NULL);
    CHECK(kg_rope_table(&g, 2, 2, 2, (int[]){3, 4, 8}, 10000.0f) < 0 && strstr(kiln_last_error(), "axis 0 has 3 channels"));
    kg_free(&g);
    kg_init(&g, NULL, NULL);
    kg_id t = kg_rope_table(&g, 2, 2, 2, (int[]){4, 4, 8}, 10000.0f);
    kg_id q = kg_input(&g, "q", 3, (int64_t[]){1, 5, 32});
    CHECK(kg_rope(&g, q, t, 2) < 0 && strstr(kiln_last_error(), "rope: x must be [B,N,2*Dh]"));
    kg_free(&g);
}

/* the model packs the latent as FluxPipeline._pack_latents: the case's
 * packed hidden_states from its latents_unpacked, through a graph of the
 * model's own patchify, and unpacks as _unpack_latents */
TEST(packing_is_flux_pipeline_s) {
    const char *cases[2] = {"flux-tiny", "flux-schnell-tiny"};
    for (int c = 0; c < 2; c++) {
        kiln_tensor *t = NULL;
        size_t n = 0;
        CHECK_OK(kiln_tensors_read(golden_path(cases[c], "io.safetensors"), &t, &n));
        if (!t) continue;
        const kiln_tensor *u = kiln_tensors_find(t, n, "latents_unpacked"), *p = kiln_tensors_find(t, n, "hidden_states");
        const kiln_tensor *su = kiln_tensors_find(t, n, "sample_unpacked"), *sp = kiln_tensors_find(t, n, "sample");
        CHECK(u && p && su && sp);
        if (u && p && su && sp) {
            int64_t B = u->shape[0], C = u->shape[1], H = u->shape[2], W = u->shape[3];
            kg_graph g;
            kg_init(&g, NULL, NULL);
            kg_mark_output(&g, kg_patchify(&g, kg_input(&g, "x", 4, u->shape), 2));
            kg_mark_output(&g, kg_unpatchify_cfirst(&g, kg_input(&g, "y", 3, sp->shape), 2, H / 2, W / 2, C));
            size_t np = ka_numel(3, p->shape), nu = ka_numel(4, u->shape);
            float *o[2] = {malloc(sizeof(float) * np), malloc(sizeof(float) * nu)};
            const float *in[2] = {u->data, sp->data};
            CHECK_OK(kg_run_eager(&g, kk_reference(), in, o));
            CHECK_MSG(!memcmp(o[0], p->data, sizeof(float) * np), "%s: packed latents differ", cases[c]);
            CHECK_MSG(!memcmp(o[1], su->data, sizeof(float) * nu), "%s: unpacked sample differs", cases[c]);
            CHECK(B == p->shape[0] && p->shape[1] == (H / 2) * (W / 2) && p->shape[2] == 4 * C);
            free(o[0]);
            free(o[1]);
            kg_free(&g);
        }
        kiln_tensors_free(t);
    }
}

typedef struct {
    const char *label;
    kiln_dtype dtype;
    int reference;
    const char *exec;
    double tol;
} mode;

/* f32 measured 2.8e-6 (flux-tiny) and 1.1e-6 (schnell); bf16 below 1e-2 */
static const mode k_modes[] = {
    {"f32 eager", KILN_F32, 0, "eager", 1e-5},
    {"f32 planned", KILN_F32, 0, "planned", 1e-5},
    {"f32 reference kernels", KILN_F32, 1, "eager", 1e-5},
    {"f32 dynamic package", KILN_F32, 0, "dynamic", 1e-5},
    {"f32 fixed package", KILN_F32, 0, "fixed", 1e-5},
    {"bf16 eager", KILN_BF16, 0, "eager", 1e-2},
    {"bf16 planned", KILN_BF16, 0, "planned", 1e-2},
    {"bf16 dynamic package", KILN_BF16, 0, "dynamic", 1e-2},
    {"bf16 fixed package", KILN_BF16, 0, "fixed", 1e-2},
};

static void golden_case(const char *c, const char *family) {
    char root[256], pkgs[300];
    test_tmpdir(root, sizeof root, "flux");
    snprintf(pkgs, sizeof pkgs, "%s/packages", root);
    golden_io io;
    CHECK(io_open(c, &io));
    if (!io.want) return;
    for (size_t k = 0; k < sizeof k_modes / sizeof *k_modes; k++) {
        const mode *md = &k_modes[k];
        if (md->dtype == KILN_BF16 && !kk_fast(KILN_BF16)) {
            fprintf(stderr, "  %s, %s: no bf16 GEMM on this CPU: skipped\n", c, md->label);
            continue;
        }
        kiln_load_opts o = kiln_load_defaults();
        o.model_name = c;
        o.component = "transformer";
        o.cache_root = root;
        o.source = golden_path(c, NULL);
        o.dtype = md->dtype;
        o.reference = md->reference;
        kiln_model *m = NULL;
        CHECK_OK(kiln_load_model(&o, &m));
        if (!m) continue;
        if (!strcmp(kiln_model_origin(m), "miss")) { /* the first load converts; the next maps */
            kiln_model_free(m);
            m = NULL;
            CHECK_OK(kiln_load_model(&o, &m));
            if (!m) continue;
        }
        CHECK_MSG(!strcmp(kiln_model_origin(m), "hit"), "%s: origin %s", md->label, kiln_model_origin(m));
        CHECK(!strcmp(kiln_model_family(m), family) && kiln_model_n_inputs(m) == io.n_in);
        CHECK_OK(kiln_model_set_package_dir(m, pkgs));
        if (!strcmp(md->exec, "dynamic")) {
            kiln_compile_opts co = kiln_compile_defaults();
            co.height = (int)io.in[0].shape[2];
            co.width = (int)io.in[0].shape[3];
            co.context_len = (int)io.in[1].shape[1];
            co.batch = (int)io.in[0].shape[0];
            co.dims = "batch=1:2,h_tok=2:8,w_tok=2:12";
            kiln_compile_result r;
            CHECK_OK(kiln_compile(m, &co, &r));
        }
        CHECK_OK(kiln_model_set_exec(m, md->exec));
        float *got = forward(m, &io);
        CHECK_MSG(!strcmp(kiln_model_last_exec(m), md->exec), "%s: ran by %s (%s)", md->label, kiln_model_last_exec(m),
                  kiln_model_exec_note(m));
        double err = rel_l2(got, io.want->data, io.n_out);
        fprintf(stderr, "  %s, %s: relative L2 error %.3g\n", c, md->label, err);
        CHECK_MSG(err <= md->tol, "%s %s: error %.3g > %.2g", c, md->label, err, md->tol);
        free(got);
        kiln_model_free(m);
    }
    kiln_tensors_free(io.t);
    test_rmrf(root);
}

TEST(flux_dev_golden_on_every_path) { golden_case("flux-tiny", "flux"); }
TEST(flux_schnell_golden_on_every_path) { golden_case("flux-schnell-tiny", "flux-schnell"); }

/* one package over batch, h and w serves each size bit for bit like the
 * planned executor, which runs the same fused graph (its rotary table made
 * from the symbols at run time, kept while the shape stays), and within
 * 1e-6 of eager (the model's ops unfused, one kernel each) */
TEST(one_package_serves_many_sizes) {
    char root[256], pkgs[300];
    test_tmpdir(root, sizeof root, "fluxsizes");
    snprintf(pkgs, sizeof pkgs, "%s/packages", root);
    kiln_open_opts oo = {.dtype = KILN_F32};
    kiln_model *eager = NULL, *planned = NULL, *pk = NULL;
    CHECK_OK(kiln_model_open(golden_path("flux-tiny", NULL), &oo, &eager));
    CHECK_OK(kiln_model_open(golden_path("flux-tiny", NULL), &oo, &planned));
    CHECK_OK(kiln_model_open(golden_path("flux-tiny", NULL), &oo, &pk));
    if (!eager || !planned || !pk) return;
    CHECK_OK(kiln_model_set_exec(eager, "eager"));
    CHECK_OK(kiln_model_set_exec(planned, "planned"));
    CHECK_OK(kiln_model_set_package_dir(pk, pkgs));
    kiln_compile_opts co = kiln_compile_defaults();
    co.batch = 1, co.height = 8, co.width = 8, co.context_len = 7;
    co.dims = "batch=1:3,h_tok=1:6,w_tok=1:9";
    kiln_compile_result r;
    CHECK_OK(kiln_compile(pk, &co, &r));
    CHECK_OK(kiln_model_set_exec(pk, "dynamic"));
    /* (B, H, W): the smallest, non-square both ways, the largest */
    const int64_t sizes[][3] = {{1, 2, 2}, {2, 4, 18}, {3, 12, 6}, {1, 12, 18}, {2, 6, 10}};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t B = sizes[k][0], H = sizes[k][1], W = sizes[k][2], T = 7;
        size_t nl = (size_t)(B * 16 * H * W), nc = (size_t)(B * T * 32);
        float *lat = malloc(sizeof(float) * nl), *ctx = malloc(sizeof(float) * nc), pool[3 * 32], ts[3] = {0.9f, 0.3f, 1.0f},
              gd[3] = {3.5f, 1.0f, 5.0f};
        kiln_noise(100 + k, lat, nl);
        kiln_noise(200 + k, ctx, nc);
        kiln_noise(300 + k, pool, (size_t)(B * 32));
        kiln_tensor in[5] = {{"latents", KILN_F32, 4, {B, 16, H, W}, lat},
                             {"encoder_hidden_states", KILN_F32, 3, {B, T, 32}, ctx},
                             {"pooled_projections", KILN_F32, 2, {B, 32}, pool},
                             {"timestep", KILN_F32, 1, {B}, ts},
                             {"guidance", KILN_F32, 1, {B}, gd}};
        float *a = calloc(nl, sizeof(float)), *b = calloc(nl, sizeof(float)), *e = calloc(nl, sizeof(float));
        kiln_output oa = {.name = "sample", .data = a, .capacity = nl}, ob = {.name = "sample", .data = b, .capacity = nl},
                    oe = {.name = "sample", .data = e, .capacity = nl};
        CHECK_OK(kiln_run(planned, in, 5, &oa, 1));
        CHECK_OK(kiln_run(pk, in, 5, &ob, 1));
        CHECK_OK(kiln_run(eager, in, 5, &oe, 1));
        CHECK_MSG(!strcmp(kiln_model_last_exec(pk), "dynamic"), "%lldx%lldx%lld: ran by %s (%s)", (long long)B, (long long)H,
                  (long long)W, kiln_model_last_exec(pk), kiln_model_exec_note(pk));
        CHECK_MSG(!memcmp(a, b, sizeof(float) * nl), "batch %lld, %lldx%lld: the package differs from planned", (long long)B,
                  (long long)H, (long long)W);
        double d = rel_l2(b, e, nl);
        CHECK_MSG(d <= 1e-6, "batch %lld, %lldx%lld: the package is %.3g from eager", (long long)B, (long long)H,
                  (long long)W, d);
        free(a), free(b), free(e), free(lat), free(ctx);
    }
    kiln_model_free(eager);
    kiln_model_free(planned);
    kiln_model_free(pk);
    test_rmrf(root);
}

/* The graph every planned and compiled executor runs: no rotation of its
 * own left (each attention rotates q and k as its kernel loads them, from
 * the table the symbols give), and each double block's attention reads the
 * text and image segments in place (the concatenations folded in too), on
 * one process and under sequence parallel's graph alike */
TEST(rope_rides_in_the_attention) {
    kiln_open_opts oo = {.dtype = KILN_F32};
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path("flux-tiny", NULL), &oo, &m));
    if (!m) return;
    const flux_config *c = m->cfg;
    for (int sp = 1; sp <= 2; sp++) {
        kg_graph g;
        kg_init(&g, km_resolve, m);
        int64_t s[FLUX_NSYM] = {[FLUX_SYM_BATCH] = 2, [FLUX_SYM_H] = 3, [FLUX_SYM_W] = 4, [FLUX_SYM_CTX] = 7};
        ka_par par = {1, sp, 0, 0};
        CHECK_OK(flux_build_forward(c, &g, s, &par));
        kg_fuse(&g);
        char *live = malloc((size_t)g.n);
        int *last = malloc(sizeof(int) * (size_t)g.n), ropes = 0, attn = 0, rotating = 0, joint = 0;
        kg_liveness(&g, live, last);
        for (int i = 0; i < g.n; i++) {
            const kg_node *n = &g.nodes[i];
            if (!live[i]) continue;
            ropes += n->op == KG_ROPE;
            if (n->op != KG_ATTENTION) continue;
            attn++;
            rotating += n->src[KG_ATTN_ROPE] >= 0 && g.nodes[n->src[KG_ATTN_ROPE]].op == KG_ROPE_TABLE;
            joint += n->iparam[1] != 0;
        }
        int blocks = c->num_layers + c->num_single_layers;
        CHECK_MSG(!ropes && attn == blocks && rotating == blocks,
                  "sp %d: %d rope ops left, %d of %d attentions (%d blocks) rotate q and k themselves", sp, ropes, rotating,
                  attn, blocks);
        /* the double blocks' always; the single blocks' too under sequence parallel (text and image apart) */
        CHECK_MSG(joint == (sp > 1 ? blocks : c->num_layers), "sp %d: %d joint attentions", sp, joint);
        free(live);
        free(last);
        kg_free(&g);
    }
    kiln_model_free(m);
}

/* wrong sizes and missing inputs are named */
TEST(bad_inputs_are_refused) {
    kiln_open_opts oo = {.dtype = KILN_F32};
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path("flux-tiny", NULL), &oo, &m));
    golden_io io;
    CHECK(io_open("flux-tiny", &io));
    if (!m || !io.want) return;
    float *out = calloc(io.n_out, sizeof(float));
    kiln_output o = {.name = "sample", .data = out, .capacity = io.n_out};
    CHECK_FAILS(kiln_run(m, io.in, 4, &o, 1), KILN_ERR_MISSING, "kiln_run: input guidance is missing");
    kiln_tensor bad[5];
    memcpy(bad, io.in, sizeof bad);
    bad[0].shape[3] = 23; /* an odd latent width */
    CHECK_FAILS(kiln_run(m, bad, 5, &o, 1), KILN_ERR_SHAPE, "must be even and positive");
    memcpy(bad, io.in, sizeof bad);
    bad[0].shape[1] = 15;
    CHECK_FAILS(kiln_run(m, bad, 5, &o, 1), KILN_ERR_SHAPE, "latents");
    free(out);
    kiln_tensors_free(io.t);
    kiln_model_free(m);
}

/* ---- FluxPipeline ------------------------------------------------------------- */

/* [B,C,H,W] -> [B,(H/2)(W/2),4C] as _pack_latents */
static void pack(const float *x, float *y, int64_t B, int64_t C, int64_t H, int64_t W) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < H / 2; r++)
            for (int64_t q = 0; q < W / 2; q++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t dy = 0; dy < 2; dy++)
                        for (int64_t dx = 0; dx < 2; dx++)
                            *y++ = x[((b * C + c) * H + 2 * r + dy) * W + 2 * q + dx];
}

typedef struct {
    float *steps[8];
    float *embeds, *pooled;
    size_t n_lat, n_emb, n_pool;
} run_rec;

static void rec_step(void *user, int step, int steps, double sigma, const float *latent) {
    (void)steps, (void)sigma;
    run_rec *r = user;
    if (step >= 1 && step <= 8 && (r->steps[step - 1] = malloc(sizeof(float) * r->n_lat)))
        memcpy(r->steps[step - 1], latent, sizeof(float) * r->n_lat);
}

static void rec_cond(void *user, const float *e, const int64_t es[3], const float *p, const int64_t ps[2], const float *ne,
                     const float *np) {
    (void)ne, (void)np;
    run_rec *r = user;
    r->n_emb = (size_t)(es[0] * es[1] * es[2]);
    r->n_pool = (size_t)(ps[0] * ps[1]);
    if ((r->embeds = malloc(sizeof(float) * r->n_emb))) memcpy(r->embeds, e, sizeof(float) * r->n_emb);
    if ((r->pooled = malloc(sizeof(float) * r->n_pool))) memcpy(r->pooled, p, sizeof(float) * r->n_pool);
}

/* FluxPipeline's schedule for the case (4 steps, 96 tokens): mu, sigmas and
 * timesteps as the golden stores them */
TEST(flux_schedule_is_the_pipeline_s) {
    kiln_tensor *t = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tensors_read(golden_path("flux-pipeline-tiny", "io.safetensors"), &t, &n));
    if (!t) return;
    const kiln_tensor *mu = kiln_tensors_find(t, n, "mu"), *ts = kiln_tensors_find(t, n, "timesteps"),
                      *sg = kiln_tensors_find(t, n, "sigmas");
    CHECK(mu && ts && sg && ts->shape[0] == 4 && sg->shape[0] == 5);
    if (mu && ts && sg) {
        kp_schedule s = {3.0, 1000, 1, 0.5, 1.15, 256, 4096};
        double m;
        float got_t[4], got_s[5];
        CHECK_OK(kp_flux_schedule(&s, 4, 96, &m, got_t, got_s));
        CHECK_MSG(fabs(m - ((const float *)mu->data)[0]) < 1e-7, "mu %.9g, the pipeline's %.9g", m, ((const float *)mu->data)[0]);
        CHECK_MSG(!memcmp(got_t, ts->data, sizeof got_t), "timesteps %g %g %g %g differ", got_t[0], got_t[1], got_t[2], got_t[3]);
        CHECK_MSG(!memcmp(got_s, sg->data, sizeof got_s), "sigmas %g %g %g %g %g differ", got_s[0], got_s[1], got_s[2],
                  got_s[3], got_s[4]);
    }
    kiln_tensors_free(t);
}

/* the whole FluxPipeline: the prompt's conditioning, every step's latents,
 * the decode and the image against the case, f32 */
TEST(flux_pipeline_golden) {
    const char *c = "flux-pipeline-tiny";
    kiln_tensor *t = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tensors_read(golden_path(c, "io.safetensors"), &t, &n));
    if (!t) return;
    const kiln_tensor *noise = kiln_tensors_find(t, n, "noise_unpacked"), *pe = kiln_tensors_find(t, n, "prompt_embeds"),
                      *pp = kiln_tensors_find(t, n, "pooled_prompt_embeds"), *dec = kiln_tensors_find(t, n, "image_decoded"),
                      *img = kiln_tensors_find(t, n, "image");
    CHECK(noise && pe && pp && dec && img);
    kiln_load_opts lo = kiln_load_defaults();
    char root[256];
    test_tmpdir(root, sizeof root, "fluxpipe");
    lo.cache_root = root;
    lo.model_name = c;
    lo.dtype = KILN_F32;
    kiln_pipeline *p = NULL;
    CHECK_OK(kiln_pipeline_open(golden_path(c, NULL), &lo, &p));
    if (!p || !noise || !pe || !pp || !dec || !img) {
        kiln_pipeline_free(p);
        kiln_tensors_free(t);
        return;
    }
    CHECK(!strcmp(kiln_pipeline_class(p), "FluxPipeline") && kiln_pipeline_vae_scale(p) == 2);
    kiln_pipeline_opts o = kiln_pipeline_defaults_of(p);
    CHECK(o.guidance == 3.5 && o.max_sequence_length == 512 && o.steps == 28);
    const char *prompt = "a tiny astronaut hatching from an egg on the moon";
    o.prompts = &prompt;
    o.n_prompts = 1;
    o.height = 32, o.width = 48, o.steps = 4, o.max_sequence_length = 32;
    o.noise = noise->data;
    run_rec r = {.n_lat = ka_numel(4, noise->shape)};
    o.on_step = rec_step, o.on_cond = rec_cond, o.user = &r;
    float *lat = NULL;
    int64_t sh[4];
    CHECK_OK(kiln_pipeline_generate(p, &o, &lat, sh));
    if (lat) {
        CHECK(sh[0] == 1 && sh[1] == 16 && sh[2] == 16 && sh[3] == 24);
        double e1 = r.embeds ? rel_l2(r.embeds, pe->data, r.n_emb) : 1, e2 = r.pooled ? rel_l2(r.pooled, pp->data, r.n_pool) : 1;
        fprintf(stderr, "  flux pipeline: prompt_embeds %.3g, pooled_prompt_embeds %.3g\n", e1, e2);
        CHECK_MSG(e1 <= 1e-5 && e2 <= 1e-5, "conditioning: %.3g and %.3g", e1, e2);
        float packed[96 * 64];
        for (int k = 0; k < 4; k++) {
            char name[32];
            snprintf(name, sizeof name, "latents_step%d", k + 1);
            const kiln_tensor *want = kiln_tensors_find(t, n, name);
            CHECK(want && r.steps[k]);
            if (!want || !r.steps[k]) continue;
            pack(r.steps[k], packed, 1, 16, 16, 24);
            double e = rel_l2(packed, want->data, 96 * 64);
            fprintf(stderr, "  flux pipeline: step %d latents %.3g\n", k + 1, e);
            CHECK_MSG(e <= 1e-5, "step %d: %.3g", k + 1, e);
        }
        /* the decode (latents / 0.3611 + 0.1159 from the VAE's config) and the image */
        size_t ni = (size_t)(32 * 48 * 3);
        float *sample = malloc(sizeof(float) * ni);
        uint8_t *rgb = malloc(ni);
        kiln_vae_opts vo = kiln_vae_defaults();
        CHECK_OK(kiln_vae_decode_rgb(kiln_pipeline_vae(p), lat, sh, &vo, rgb, sample, NULL));
        double ed = rel_l2(sample, dec->data, ni);
        fprintf(stderr, "  flux pipeline: image_decoded %.3g\n", ed);
        CHECK_MSG(ed <= 1e-5, "image_decoded: %.3g", ed);
        int off = 0, worst = 0;
        for (size_t i = 0; i < ni; i++) {
            int want = (int)lrint((double)((const float *)img->data)[i] * 255.0), d = abs((int)rgb[i] - want);
            off += d > 0;
            if (d > worst) worst = d;
        }
        fprintf(stderr, "  flux pipeline: %d of %zu pixel values off by at most %d\n", off, ni, worst);
        CHECK_MSG(worst <= 1 && off <= (int)(ni / 1000) + 1, "%d pixel values differ (at most %d levels)", off, worst);
        free(sample);
        free(rgb);
    }
    for (int k = 0; k < 8; k++) free(r.steps[k]);
    free(r.embeds);
    free(r.pooled);
    free(lat);
    /* what a Flux pipeline refuses, by name */
    o.on_step = NULL, o.on_cond = NULL;
    o.negative_prompt = "blurry";
    CHECK_FAILS(kiln_pipeline_generate(p, &o, &lat, sh), KILN_ERR_UNSUPPORTED, "negative prompt");
    o.negative_prompt = NULL;
    o.shift = 3;
    CHECK_FAILS(kiln_pipeline_generate(p, &o, &lat, sh), KILN_ERR_UNSUPPORTED, "use_dynamic_shifting");
    o.shift = 0;
    o.width = 50;
    CHECK_FAILS(kiln_pipeline_generate(p, &o, &lat, sh), KILN_ERR_SHAPE, "must be a multiple of 4");
    kiln_pipeline_free(p);
    kiln_tensors_free(t);
    test_rmrf(root);
}

/* kiln generate on the FluxPipeline folder: --noise (unpacked, kiln packs
 * it), the case's prompt and settings, a PNG whose pixels are the case's
 * image; what a Flux pipeline refuses, named, with nothing written */
TEST(flux_generate_cli) {
    const char *c = "flux-pipeline-tiny";
    char dir[256], noise[400], png[400], cache[400];
    test_tmpdir(dir, sizeof dir, "fluxcli");
    snprintf(noise, sizeof noise, "%s/noise.safetensors", dir);
    snprintf(png, sizeof png, "%s/out.png", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    kiln_tensor *t = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tensors_read(golden_path(c, "io.safetensors"), &t, &n));
    const kiln_tensor *nu = t ? kiln_tensors_find(t, n, "noise_unpacked") : NULL, *img = t ? kiln_tensors_find(t, n, "image") : NULL;
    CHECK(nu && img);
    if (!nu || !img) {
        kiln_tensors_free(t);
        return;
    }
    kiln_tensor nt = *nu;
    nt.name = "noise";
    CHECK_OK(kiln_tensors_write(noise, 1, &nt));
    char *o = NULL;
    int rc = run_kiln(&o, "generate '%s' --prompt 'a tiny astronaut hatching from an egg on the moon' --noise '%s' --steps 4 "
                      "--max-sequence-length 32 --output '%s' --cache-dir '%s' --dtype f32", golden_path(c, NULL), noise, png, cache);
    CHECK_MSG(rc == 0 && o && strstr(o, "guidance 3.5"), "rc %d: %s", rc, o ? o : "");
    free(o);
    uint8_t *rgb = NULL;
    int h = 0, w = 0;
    CHECK_OK(kiln_png_read(png, &rgb, &h, &w));
    if (rgb) {
        CHECK(h == 32 && w == 48);
        int off = 0, worst = 0;
        for (int i = 0; i < h * w * 3 && h == 32 && w == 48; i++) {
            int d = abs((int)rgb[i] - (int)lrint((double)((const float *)img->data)[i] * 255.0));
            off += d > 0;
            worst = d > worst ? d : worst;
        }
        CHECK_MSG(worst <= 1 && off <= 5, "%d pixel values differ, by up to %d", off, worst);
        free(rgb);
    }
    /* refusals: a negative prompt, a shift, a size off the grid; no file written */
    unlink(png);
    rc = run_kiln(&o, "generate '%s' --prompt x --negative-prompt blurry --steps 1 --output '%s' --cache-dir '%s'",
                  golden_path(c, NULL), png, cache);
    CHECK_MSG(rc == 1 && o && strstr(o, "a Flux pipeline samples without one"), "rc %d: %s", rc, o ? o : "");
    free(o);
    rc = run_kiln(&o, "generate '%s' --prompt x --shift 2 --steps 1 --output '%s' --cache-dir '%s'", golden_path(c, NULL), png, cache);
    CHECK_MSG(rc == 1 && o && strstr(o, "use_dynamic_shifting"), "rc %d: %s", rc, o ? o : "");
    free(o);
    rc = run_kiln(&o, "generate '%s' --prompt x --width 50 --height 32 --steps 1 --output '%s' --cache-dir '%s'",
                  golden_path(c, NULL), png, cache);
    CHECK_MSG(rc == 1 && o && strstr(o, "width 50 px: must be a multiple of 4"), "rc %d: %s", rc, o ? o : "");
    free(o);
    /* ... from the configs, before anything converts: a fresh cache root stays empty */
    char fresh[450];
    snprintf(fresh, sizeof fresh, "%s/fresh-cache", dir);
    rc = run_kiln(&o, "generate '%s' --prompt x --width 48 --height 30 --steps 1 --output '%s' --cache-dir '%s'",
                  golden_path(c, NULL), png, fresh);
    CHECK_MSG(rc == 1 && o && strstr(o, "height 30 px: must be a multiple of 4"), "rc %d: %s", rc, o ? o : "");
    CHECK_MSG(!kb_is_dir(fresh), "a refused size converted components into %s", fresh);
    free(o);
    CHECK(access(png, F_OK) != 0);
    /* --low-memory: the text encoders go after each batch's encode and come back for the next (two
     * batches: other step counts), the images those of a run that keeps them */
    char pf[450], lm[2][450];
    snprintf(pf, sizeof pf, "%s/prompts.txt", dir);
    FILE *pfile = fopen(pf, "w");
    if (pfile) {
        fputs("a red fox\n{\"prompt\": \"a lighthouse\", \"steps\": 1}\n", pfile);
        fclose(pfile);
    }
    for (int k = 0; k < 2; k++) {
        snprintf(lm[k], sizeof lm[k], "%s/lm%d.png", dir, k);
        rc = run_kiln(&o, "generate '%s' --prompts-file '%s' --steps 2 --max-sequence-length 16 --seed 3 --output '%s' "
                      "--cache-dir '%s' --dtype f32 --timings%s", golden_path(c, NULL), pf, lm[k], cache,
                      k ? " --low-memory" : "");
        CHECK_MSG(rc == 0 && o && (!k || strstr(o, "load text encoders")), "rc %d: %s", rc, o ? o : "");
        free(o);
    }
    for (int i = 0; i < 2; i++) {
        char a[500], b[500];
        snprintf(a, sizeof a, "%s/lm0-%d.png", dir, i);
        snprintf(b, sizeof b, "%s/lm1-%d.png", dir, i);
        uint8_t *x = NULL, *y = NULL;
        int xh = 0, xw = 0, yh = 0, yw = 0;
        CHECK_OK(kiln_png_read(a, &x, &xh, &xw));
        CHECK_OK(kiln_png_read(b, &y, &yh, &yw));
        CHECK_MSG(x && y && xh == yh && xw == yw && !memcmp(x, y, (size_t)(xh * xw * 3)),
                  "image %d with --low-memory differs", i);
        free(x);
        free(y);
    }
    /* a FluxPipeline folder whose transformer is SD3's: refused by its family, before a step runs */
    char mixed[450], cmd[2600];
    snprintf(mixed, sizeof mixed, "%s/mixed", dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && rm -rf '%s/transformer' && cp -r '%s' '%s/transformer'",
             golden_path(c, NULL), mixed, mixed, golden_path("sd3-pipeline-tiny", "transformer"), mixed);
    CHECK(system(cmd) == 0);
    rc = run_kiln(&o, "generate '%s' --prompt x --steps 1 --output '%s' --cache-dir '%s'", mixed, png, cache);
    CHECK_MSG(rc == 1 && o && strstr(o, "transformer is a sd3 model; a FluxPipeline runs flux"), "rc %d: %s", rc,
              o ? o : "");
    free(o);
    CHECK(access(png, F_OK) != 0);
    /* kiln encode writes SD3's conditioning: a Flux folder is refused, saying where its embeddings are */
    rc = run_kiln(&o, "encode '%s' --prompt x --output '%s/e.safetensors' --cache-dir '%s'", golden_path(c, NULL), dir, cache);
    CHECK_MSG(rc == 1 && o && strstr(o, "is a FluxPipeline folder") && strstr(o, "--tensor-output"), "rc %d: %s", rc, o ? o : "");
    free(o);
    kiln_tensors_free(t);
    test_rmrf(dir);
}

/* kiln quality on a Flux transformer: one forward of its example, int8 and
 * fp8 against bf16 (where this CPU runs them), PASS within the gate */
TEST(flux_quality_gate) {
    const char *scheme[2] = {"int8", "fp8"};
    kiln_quant q[2] = {KILN_QUANT_INT8, KILN_QUANT_FP8};
    for (int k = 0; k < 2; k++) {
        if (!quant_runs_here(q[k], "flux quality")) continue;
        char *o = NULL;
        int rc = run_kiln(&o, "quality '%s' --quant %s", golden_path("flux-tiny", NULL), scheme[k]);
        CHECK_MSG(rc == 0 && o && strstr(o, "one forward of the flux family's example") && strstr(o, "PASS"), "%s: rc %d: %s",
                  scheme[k], rc, o ? o : "");
        free(o);
    }
    char *o = NULL;
    int rc = run_kiln(&o, "quality '%s' --quant int8 --cond /nonexistent.safetensors", golden_path("flux-tiny", NULL));
    CHECK_MSG(rc == 1 && o && strstr(o, "--cond is for an SD3 backbone"), "rc %d: %s", rc, o ? o : "");
    free(o);
}

/* ---- Black Forest Labs' single file ----------------------------------------- */

/* a diffusers tensor of the case as f32 (malloc'd; its row count in *rows, row width in *cols) */
static float *case_tensor(kiln_tensor *t, size_t n, const char *name, int64_t *rows, int64_t *cols) {
    const kiln_tensor *x = kiln_tensors_find(t, n, name);
    if (!x) {
        fprintf(stderr, "  no %s\n", name);
        return NULL;
    }
    size_t cnt = ka_numel(x->ndim, x->shape);
    float *f = malloc(sizeof(float) * cnt);
    if (f && x->dtype == KILN_F32) memcpy(f, x->data, sizeof(float) * cnt);
    else if (f) /* bf16 */
        for (size_t i = 0; i < cnt; i++) {
            uint32_t u = (uint32_t)((const uint16_t *)x->data)[i] << 16;
            memcpy(&f[i], &u, 4);
        }
    *rows = x->shape[0];
    *cols = x->ndim > 1 ? x->shape[1] : 1;
    return f;
}

typedef struct {
    kiln_tensor t[1024];
    float *data[1024];
    int n;
} out_file;

/* parts (diffusers names) stacked along dim 0 into one tensor named name;
 * swap: the two halves exchanged (diffusers' (scale, shift) back to (shift, scale)) */
static void put(out_file *o, kiln_tensor *t, size_t n, const char *name, int k, const char *const *parts, int swap) {
    int64_t rows[4], cols = 0, total = 0;
    float *p[4];
    for (int i = 0; i < k; i++) {
        p[i] = case_tensor(t, n, parts[i], &rows[i], &cols);
        total += rows[i];
    }
    float *d = malloc(sizeof(float) * (size_t)(total * cols));
    int64_t at = 0;
    for (int i = 0; i < k; i++) {
        if (p[i]) memcpy(d + at * cols, p[i], sizeof(float) * (size_t)(rows[i] * cols));
        at += rows[i];
        free(p[i]);
    }
    if (swap) {
        float *h = malloc(sizeof(float) * (size_t)(total * cols));
        memcpy(h, d + total / 2 * cols, sizeof(float) * (size_t)(total / 2 * cols));
        memcpy(h + total / 2 * cols, d, sizeof(float) * (size_t)(total / 2 * cols));
        free(d);
        d = h;
    }
    char *nm = kb_strfmt("model.diffusion_model.%s", name);
    o->data[o->n] = d;
    o->t[o->n++] = (kiln_tensor){nm, KILN_F32, cols > 1 ? 2 : 1,
                                 {total, cols}, d};
    if (o->t[o->n - 1].ndim == 1) o->t[o->n - 1].shape[1] = 0;
}

/* a case's transformer weights t (2 double and 2 single blocks) under BFL's
 * names, model.diffusion_model.* (fused qkv, linear1, the final modulation
 * swapped), as Black Forest Labs' flux1-dev.safetensors holds them */
static out_file *bfl_tensors(kiln_tensor *t, size_t n) {
    out_file *o = calloc(1, sizeof *o);
    const char *wb[2] = {"weight", "bias"};
    for (int k = 0; k < 2; k++) {
        char a[8][160], b[160];
        const char *pp[4];
#define P1(from, to)                                                                                                   \
    do {                                                                                                               \
        snprintf(a[0], sizeof a[0], "%s.%s", to, wb[k]);                                                               \
        snprintf(b, sizeof b, "%s.%s", from, wb[k]);                                                                   \
        pp[0] = a[0];                                                                                                  \
        put(o, t, n, b, 1, pp, 0);                                                                                     \
    } while (0)
        P1("img_in", "x_embedder");
        P1("txt_in", "context_embedder");
        P1("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1");
        P1("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2");
        P1("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1");
        P1("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2");
        P1("vector_in.in_layer", "time_text_embed.text_embedder.linear_1");
        P1("vector_in.out_layer", "time_text_embed.text_embedder.linear_2");
        P1("final_layer.linear", "proj_out");
        snprintf(a[0], sizeof a[0], "norm_out.linear.%s", wb[k]);
        snprintf(b, sizeof b, "final_layer.adaLN_modulation.1.%s", wb[k]);
        pp[0] = a[0];
        put(o, t, n, b, 1, pp, 1);
        for (int i = 0; i < 2; i++) {
            char from[96], to[96];
            static const char *const dbl[][2] = {{"img_mod.lin", "norm1.linear"}, {"txt_mod.lin", "norm1_context.linear"},
                                                 {"img_attn.proj", "attn.to_out.0"}, {"txt_attn.proj", "attn.to_add_out"},
                                                 {"img_mlp.0", "ff.net.0.proj"}, {"img_mlp.2", "ff.net.2"},
                                                 {"txt_mlp.0", "ff_context.net.0.proj"}, {"txt_mlp.2", "ff_context.net.2"}};
            for (size_t d = 0; d < sizeof dbl / sizeof *dbl; d++) {
                snprintf(from, sizeof from, "double_blocks.%d.%s", i, dbl[d][0]);
                snprintf(to, sizeof to, "transformer_blocks.%d.%s", i, dbl[d][1]);
                P1(from, to);
            }
            static const char *const qkv[2][3] = {{"to_q", "to_k", "to_v"}, {"add_q_proj", "add_k_proj", "add_v_proj"}};
            for (int side = 0; side < 2; side++) {
                for (int j = 0; j < 3; j++) {
                    snprintf(a[j], sizeof a[j], "transformer_blocks.%d.attn.%s.%s", i, qkv[side][j], wb[k]);
                    pp[j] = a[j];
                }
                snprintf(b, sizeof b, "double_blocks.%d.%s_attn.qkv.%s", i, side ? "txt" : "img", wb[k]);
                put(o, t, n, b, 3, pp, 0);
            }
            static const char *const sgl[3] = {"to_q", "to_k", "to_v"};
            for (int j = 0; j < 3; j++) {
                snprintf(a[j], sizeof a[j], "single_transformer_blocks.%d.attn.%s.%s", i, sgl[j], wb[k]);
                pp[j] = a[j];
            }
            snprintf(a[3], sizeof a[3], "single_transformer_blocks.%d.proj_mlp.%s", i, wb[k]);
            pp[3] = a[3];
            snprintf(b, sizeof b, "single_blocks.%d.linear1.%s", i, wb[k]);
            put(o, t, n, b, 4, pp, 0);
            snprintf(from, sizeof from, "single_blocks.%d.linear2", i);
            snprintf(to, sizeof to, "single_transformer_blocks.%d.proj_out", i);
            P1(from, to);
            snprintf(from, sizeof from, "single_blocks.%d.modulation.lin", i);
            snprintf(to, sizeof to, "single_transformer_blocks.%d.norm.linear", i);
            P1(from, to);
        }
#undef P1
    }
    /* the q/k norm scales */
    for (int i = 0; i < 2; i++) {
        static const char *const nm[][2] = {{"img_attn.norm.query_norm.scale", "attn.norm_q.weight"},
                                            {"img_attn.norm.key_norm.scale", "attn.norm_k.weight"},
                                            {"txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"},
                                            {"txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"}};
        char from[128], to[128];
        const char *pp[1] = {to};
        for (int j = 0; j < 4; j++) {
            snprintf(from, sizeof from, "double_blocks.%d.%s", i, nm[j][0]);
            snprintf(to, sizeof to, "transformer_blocks.%d.%s", i, nm[j][1]);
            put(o, t, n, from, 1, pp, 0);
        }
        for (int j = 0; j < 2; j++) {
            snprintf(from, sizeof from, "single_blocks.%d.norm.%s_norm.scale", i, j ? "key" : "query");
            snprintf(to, sizeof to, "single_transformer_blocks.%d.attn.norm_%s.weight", i, j ? "k" : "q");
            put(o, t, n, from, 1, pp, 0);
        }
    }
    return o;
}

static void free_out(out_file *o) {
    for (int i = 0; o && i < o->n; i++) {
        free((char *)o->t[i].name);
        free(o->data[i]);
    }
    free(o);
}

/* flux-tiny's weights under BFL's names give bit for bit the diffusers
 * folder's sample (f32) */
TEST(bfl_single_file) {
    kiln_tensor *t = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tensors_read(golden_path("flux-tiny", "diffusion_pytorch_model.safetensors"), &t, &n));
    if (!t) return;
    out_file *o = bfl_tensors(t, n);
    char dir[256], file[400];
    test_tmpdir(dir, sizeof dir, "fluxbfl");
    snprintf(file, sizeof file, "%s/flux1-tiny.safetensors", dir);
    CHECK_OK(kiln_tensors_write(file, (size_t)o->n, o->t));
    CHECK_MSG(o->n == 2 * (10 + 2 * (8 + 2 + 1 + 2)) + 2 * 6, "%d tensors", o->n); /* as BFL: 84 for 2 + 2 blocks */
    /* its config from the case; without one, the axes cannot be read from heads of 16 */
    kiln_open_opts fo = {.dtype = KILN_F32, .config_path = golden_path("flux-tiny", "config.json")}, folder = {.dtype = KILN_F32};
    kiln_model *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(kiln_model_open(file, &fo, &a));
    CHECK_OK(kiln_model_open(golden_path("flux-tiny", NULL), &folder, &b));
    kiln_open_opts bare = {.dtype = KILN_F32};
    CHECK_FAILS(kiln_model_open(file, &bare, &c), KILN_ERR_CONFIG, "the rotary axes cannot be read");
    golden_io io;
    CHECK(io_open("flux-tiny", &io));
    if (a && b && io.want) {
        CHECK(!strcmp(kiln_model_family(a), "flux"));
        kiln_model_info info;
        CHECK_OK(kiln_model_get_info(a, &info));
        CHECK_MSG(info.layout && !strcmp(info.layout, "flux-single-file"), "layout %s", info.layout ? info.layout : "?");
        CHECK_OK(kiln_model_set_exec(a, "eager"));
        CHECK_OK(kiln_model_set_exec(b, "eager"));
        float *x = forward(a, &io), *y = forward(b, &io);
        CHECK_MSG(!memcmp(x, y, sizeof(float) * io.n_out), "the single file's sample differs from the folder's (%.3g)",
                  rel_l2(x, y, io.n_out));
        free(x);
        free(y);
    }
    kiln_model_free(a);
    kiln_model_free(b);
    kiln_tensors_free(io.t);
    free_out(o);
    kiln_tensors_free(t);
    test_rmrf(dir);
}

/* a model file's tensors into o, each under prefix; ldm: a VAE's, under
 * its original (LDM) names, attention weights as 1x1 convolutions */
static void add_part(out_file *o, const char *path, const char *prefix, int ldm) {
    kiln_tensor *t = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tensors_read(path, &t, &n));
    int n_up = 0;
    for (size_t i = 0; ldm && i < n; i++) {
        int b;
        if (sscanf(t[i].name, "decoder.up_blocks.%d.", &b) == 1 && b + 1 > n_up) n_up = b + 1;
    }
    for (size_t i = 0; i < n && o->n < 1024; i++) {
        char name[256];
        int conv = 0;
        if (ldm) ldm_name(prefix, t[i].name, n_up, name, sizeof name, &conv);
        else snprintf(name, sizeof name, "%s%s", prefix, t[i].name);
        size_t bytes = ka_numel(t[i].ndim, t[i].shape) * (t[i].dtype == KILN_I64 ? 8 : 4);
        void *d = malloc(bytes ? bytes : 1);
        memcpy(d, t[i].data, bytes);
        kiln_tensor x = t[i];
        x.name = kb_strdup(name);
        x.data = d;
        if (conv) x.ndim = 4, x.shape[2] = x.shape[3] = 1;
        o->data[o->n] = d;
        o->t[o->n++] = x;
    }
    kiln_tensors_free(t);
}

/* The flux-pipeline-tiny case as one file the way ComfyUI saves Flux.1
 * (model.diffusion_model.* in BFL's names, text_encoders.clip_l.* and
 * text_encoders.t5xxl.*, vae.* in LDM's names) with its tokenizers and
 * configs beside: `kiln generate FILE --tokenizers DIR` makes the folder's
 * image bit for bit; the file says it is Flux's, its inferred VAE config
 * takes FluxPipeline's latent scale and shift, and a tokenizers folder of
 * another pipeline class is refused */
TEST(all_in_one_file) {
    const char *c = "flux-pipeline-tiny";
    kiln_tensor *t = NULL;
    size_t n = 0;
    CHECK_OK(kiln_tensors_read(golden_path(c, "transformer/diffusion_pytorch_model.safetensors"), &t, &n));
    if (!t) return;
    out_file *o = bfl_tensors(t, n);
    kiln_tensors_free(t);
    add_part(o, golden_path(c, "text_encoder/model.safetensors"), "text_encoders.clip_l.transformer.", 0);
    add_part(o, golden_path(c, "text_encoder_2/model.safetensors"), "text_encoders.t5xxl.transformer.", 0);
    add_part(o, golden_path(c, "vae/diffusion_pytorch_model.safetensors"), "vae.", 1);
    char dir[256], file[400], tok[400], noise[400], png[2][400], cache[400];
    test_tmpdir(dir, sizeof dir, "fluxaio");
    snprintf(file, sizeof file, "%s/flux1-tiny-aio.safetensors", dir);
    snprintf(tok, sizeof tok, "%s/tokenizers", dir);
    snprintf(noise, sizeof noise, "%s/noise.safetensors", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    for (int k = 0; k < 2; k++) snprintf(png[k], sizeof png[k], "%s/out%d.png", dir, k);
    CHECK_OK(kiln_tensors_write(file, (size_t)o->n, o->t));
    free_out(o);
    char cmd[2400];
    const char *g = golden_path(c, NULL);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cd '%s' && cp -r tokenizer tokenizer_2 scheduler model_index.json '%s/' && "
             "for d in transformer text_encoder text_encoder_2 vae; do mkdir -p '%s'/$d && cp $d/config.json '%s'/$d/; done",
             tok, g, tok, tok, tok);
    CHECK(system(cmd) == 0);
    CHECK(kiln_is_single_file(file) && kp_file_is_flux(file));
    const char *prefix = NULL, *fam = NULL;
    CHECK(kp_part_lookup(file, "transformer", &prefix, &fam, NULL) && !strcmp(fam, "flux"));
    CHECK(kp_part_lookup(file, "text_encoder_2", &prefix, &fam, NULL) && !strcmp(prefix, "text_encoders.t5xxl.transformer.") &&
          !strcmp(fam, "t5"));
    CHECK(!kp_part_lookup(file, "text_encoder_3", NULL, NULL, NULL));
    char *json = NULL;
    int inferred = 0;
    CHECK_OK(kp_part_config(file, "vae", NULL, &json, &inferred));
    CHECK_MSG(inferred && json && strstr(json, "0.3611") && strstr(json, "0.1159"), "%s", json ? json : "");
    free(json);
    /* the image: the folder's, bit for bit */
    CHECK_OK(kiln_tensors_read(golden_path(c, "io.safetensors"), &t, &n));
    const kiln_tensor *nu = t ? kiln_tensors_find(t, n, "noise_unpacked") : NULL;
    CHECK(nu != NULL);
    if (nu) {
        kiln_tensor nt = *nu;
        nt.name = "noise";
        CHECK_OK(kiln_tensors_write(noise, 1, &nt));
    }
    kiln_tensors_free(t);
    char *out = NULL;
    for (int k = 0; k < 2; k++) {
        char src[900];
        if (k) snprintf(src, sizeof src, "'%s' --tokenizers '%s'", file, tok);
        else snprintf(src, sizeof src, "'%s'", g);
        int rc = run_kiln(&out, "generate %s --prompt 'a tiny astronaut hatching from an egg on the moon' --noise '%s' "
                          "--steps 4 --max-sequence-length 32 --output '%s' --cache-dir '%s' --dtype f32", src, noise, png[k],
                          cache);
        CHECK_MSG(rc == 0, "%s: rc %d: %s", k ? "the file" : "the folder", rc, out ? out : "");
        free(out);
    }
    uint8_t *rgb[2] = {NULL, NULL};
    int h[2] = {0}, w[2] = {0};
    for (int k = 0; k < 2; k++) CHECK_OK(kiln_png_read(png[k], &rgb[k], &h[k], &w[k]));
    CHECK_MSG(rgb[0] && rgb[1] && h[0] == h[1] && w[0] == w[1] && !memcmp(rgb[0], rgb[1], (size_t)(h[0] * w[0] * 3)),
              "the all-in-one file's image differs from the folder's");
    free(rgb[0]);
    free(rgb[1]);
    /* kiln info lists its four parts */
    int rc = run_kiln(&out, "info '%s' --tokenizers '%s' --cache-dir '%s'", file, tok, cache);
    CHECK_MSG(rc == 0 && out && strstr(out, "vae.*") && strstr(out, "text_encoders.t5xxl.transformer.*") &&
              !strstr(out, "text_encoder_3"), "rc %d: %s", rc, out ? out : "");
    free(out);
    /* an SD3 pipeline's tokenizers folder beside a Flux file: refused, nothing written */
    unlink(png[1]);
    rc = run_kiln(&out, "generate '%s' --tokenizers '%s' --prompt x --steps 1 --output '%s' --cache-dir '%s'", file,
                  golden_path("sd3-pipeline-tiny", NULL), png[1], cache);
    CHECK_MSG(rc == 1 && out && strstr(out, "holds a Flux transformer") && strstr(out, "StableDiffusion3Pipeline"),
              "rc %d: %s", rc, out ? out : "");
    CHECK(access(png[1], F_OK) != 0);
    free(out);
    test_rmrf(dir);
}

int main(void) {
    RUN(configs_are_read_and_checked);
    RUN(rotary_table_is_flux_pos_embed);
    RUN(packing_is_flux_pipeline_s);
    RUN(flux_dev_golden_on_every_path);
    RUN(flux_schnell_golden_on_every_path);
    RUN(one_package_serves_many_sizes);
    RUN(rope_rides_in_the_attention);
    RUN(bad_inputs_are_refused);
    RUN(flux_schedule_is_the_pipeline_s);
    RUN(flux_pipeline_golden);
    RUN(flux_generate_cli);
    RUN(flux_quality_gate);
    RUN(bfl_single_file);
    RUN(all_in_one_file);
    return TEST_SUMMARY();
}
