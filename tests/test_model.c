/* test_model.c - checkpoint loading and its failure paths: missing,
 * unexpected and misshapen tensors, impossible configs, latents outside the
 * position table, the original SD3 single-file layout, sharded folders. */
#include "base/base.h"
#include "golden_util.h"
#include "arch/sd3/sd3.h"

/* ---- helpers ---------------------------------------------------------------- */

static void copy_file(const char *from, const char *to) {
    char *data;
    size_t len;
    if (kb_read_file(from, &data, &len) || kb_write_file_atomic(to, data, len)) exit(2);
    free(data);
}

/* A model folder in dir: the golden's config and its weights edited by edit(). */
typedef void (*edit_fn)(st_tensor *t, size_t *n, void *scratch);

static void make_edited(const char *dir, const char *golden, edit_fn edit) {
    char path[1200];
    st_file *f = NULL;
    if (st_open(golden_path(golden, "diffusion_pytorch_model.safetensors"), &f)) exit(2);
    size_t n = st_count(f);
    st_tensor *t = calloc(n + 1, sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = *st_at(f, i);
    static float scratch[4096];
    edit(t, &n, scratch);
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    CHECK_OK(st_write(path, t, n, NULL, 0));
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(golden_path(golden, "config.json"), path);
    free(t);
    st_close(f);
}

static void drop_one(st_tensor *t, size_t *n, void *s) {
    (void)s;
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(t[i].name, "transformer_blocks.1.attn.to_k.weight")) {
            t[i] = t[--*n];
            return;
        }
}

static void add_extra(st_tensor *t, size_t *n, void *s) {
    memset(s, 0, 16);
    t[*n] = (st_tensor){.name = "transformer_blocks.9.bogus.weight", .dtype = KILN_F32, .ndim = 1,
                        .shape = {4}, .data = s, .nbytes = 16};
    ++*n;
}

static void misshape(st_tensor *t, size_t *n, void *s) {
    (void)s;
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(t[i].name, "context_embedder.weight")) { /* [32, 32] read as [16, 64] */
            t[i].shape[0] = 16;
            t[i].shape[1] = 64;
        }
}

/* ---- failure paths ------------------------------------------------------------ */

TEST(missing_tensor_is_named) {
    char dir[256];
    test_tmpdir(dir, sizeof dir, "missing");
    make_edited(dir, "sd3-tiny", drop_one);
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_model_open(dir, NULL, &m), KILN_ERR_MISSING, "transformer_blocks.1.attn.to_k.weight");
    CHECK(m == NULL);
    test_rmrf(dir);
}

TEST(unexpected_tensor_is_named) {
    char dir[256];
    test_tmpdir(dir, sizeof dir, "unexpected");
    make_edited(dir, "sd3-tiny", add_extra);
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_model_open(dir, NULL, &m), KILN_ERR_UNEXPECTED, "transformer_blocks.9.bogus.weight");
    test_rmrf(dir);
}

TEST(wrong_shape_is_named) {
    char dir[256];
    test_tmpdir(dir, sizeof dir, "shape");
    make_edited(dir, "sd3-tiny", misshape);
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_model_open(dir, NULL, &m), KILN_ERR_SHAPE, "context_embedder.weight has shape [16, 64]");
    test_rmrf(dir);
}

TEST(missing_files) {
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_model_open("/nonexistent/model", NULL, &m), KILN_ERR_IO, "/nonexistent/model");
    char dir[256], path[400];
    test_tmpdir(dir, sizeof dir, "nofiles");
    CHECK_FAILS(kiln_model_open(dir, NULL, &m), KILN_ERR_MISSING, "no weights");
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    copy_file(golden_path("sd3-tiny", "diffusion_pytorch_model.safetensors"), path);
    CHECK_FAILS(kiln_model_open(dir, NULL, &m), KILN_ERR_MISSING, "config.json");
    test_rmrf(dir);
}

static void config_fails(const char *json, kiln_status code, const char *substr) {
    kiln_config c;
    kiln_status s = sd3_config_parse(json, &c);
    CHECK_MSG(s == code, "config %s -> %s (want %s): %s", json, kiln_status_name(s), kiln_status_name(code),
              kiln_last_error());
    CHECK_MSG(strstr(kiln_last_error(), substr), "message \"%s\" lacks \"%s\"", kiln_last_error(), substr);
}

TEST(impossible_configs) {
    config_fails("{", KILN_ERR_FORMAT, "not valid JSON");
    config_fails("[1, 2]", KILN_ERR_FORMAT, "object");
    config_fails("{\"num_layers\": 0}", KILN_ERR_CONFIG, "num_layers");
    config_fails("{\"patch_size\": -2}", KILN_ERR_CONFIG, "patch_size");
    config_fails("{\"patch_size\": 1.5}", KILN_ERR_CONFIG, "patch_size");
    config_fails("{\"patch_size\": \"2\"}", KILN_ERR_CONFIG, "patch_size");
    config_fails("{\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"caption_projection_dim\": 48}",
                 KILN_ERR_CONFIG, "caption_projection_dim");
    config_fails("{\"num_layers\": 2, \"dual_attention_layers\": [2]}", KILN_ERR_CONFIG, "dual_attention_layers");
    config_fails("{\"qk_norm\": \"layer_norm\"}", KILN_ERR_CONFIG, "qk_norm");
    config_fails("{\"_class_name\": \"UNet2DConditionModel\"}", KILN_ERR_CONFIG, "UNet2DConditionModel");
    config_fails("{\"pos_embed_max_size\": 0}", KILN_ERR_CONFIG, "pos_embed_max_size");
    config_fails("{\"num_layers\": 100000}", KILN_ERR_CONFIG, "num_layers");
    /* defaults: an empty object is diffusers' default SD3 config */
    kiln_config c;
    CHECK_OK(sd3_config_parse("{\"num_attention_heads\": 18, \"out_channels\": null}", &c));
    CHECK(c.num_layers == 18 && c.out_channels == c.in_channels && c.caption_projection_dim == 1152);

    /* through the loader, the message names the file */
    char dir[256], path[400];
    test_tmpdir(dir, sizeof dir, "badcfg");
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    copy_file(golden_path("sd3-tiny", "diffusion_pytorch_model.safetensors"), path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *bad = "{\"num_layers\": 4, \"attention_head_dim\": 8, \"num_attention_heads\": -4}";
    CHECK_OK(kb_write_file_atomic(path, bad, strlen(bad)));
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_model_open(dir, NULL, &m), KILN_ERR_CONFIG, "num_attention_heads");
    CHECK(strstr(kiln_last_error(), dir) != NULL);
    test_rmrf(dir);
}

TEST(latent_outside_position_table) {
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path("sd3-wide", NULL), NULL, &m)); /* patch 2, table 64 */
    if (!m) return;
    const kiln_config *c = kiln_model_config(m);
    int B = 1, T = 3, H = 8, W = 130; /* 65 patches wide: one past the table */
    float *hs = calloc((size_t)c->in_channels * H * W, 4), *ctx = calloc((size_t)T * c->joint_attention_dim, 4);
    float *pooled = calloc((size_t)c->pooled_projection_dim, 4), t = 500, *out = calloc((size_t)c->out_channels * H * W, 4);
    kiln_forward_args a = {B, H, W, T, hs, ctx, pooled, &t};
    CHECK_FAILS(kiln_forward(m, &a, out), KILN_ERR_RANGE, "pos_embed_max_size");
    a.width = 128; /* exactly the table: fine */
    CHECK_OK(kiln_forward(m, &a, out));
    a.width = 7; /* not a multiple of the patch */
    CHECK_FAILS(kiln_forward(m, &a, out), KILN_ERR_SHAPE, "multiples of the patch size");
    a.batch = 0;
    a.width = 8;
    CHECK_FAILS(kiln_forward(m, &a, out), KILN_ERR_SHAPE, "batch");
    free(hs);
    free(ctx);
    free(pooled);
    free(out);
    kiln_model_free(m);
}

/* ---- the original SD3 single-file layout ------------------------------------ */

typedef struct {
    st_tensor *t;
    size_t n;
    void *owned[512];
    int nowned;
} tset;

static void *concat3(tset *ts, const st_tensor *a, const st_tensor *b, const st_tensor *c) {
    uint8_t *p = malloc(a->nbytes * 3);
    memcpy(p, a->data, a->nbytes);
    memcpy(p + a->nbytes, b->data, b->nbytes);
    memcpy(p + 2 * a->nbytes, c->data, c->nbytes);
    ts->owned[ts->nowned++] = p;
    return p;
}

static void *swapped(tset *ts, const st_tensor *a) { /* (scale, shift) -> (shift, scale) */
    uint8_t *p = malloc(a->nbytes);
    size_t h = a->nbytes / 2;
    memcpy(p, (const uint8_t *)a->data + h, h);
    memcpy(p + h, a->data, h);
    ts->owned[ts->nowned++] = p;
    return p;
}

static void put(tset *ts, const char *name, const st_tensor *like, const void *data, int64_t rows) {
    st_tensor t = *like;
    t.name = kb_strdup(name);
    ts->owned[ts->nowned++] = (void *)t.name;
    t.data = data;
    t.shape[0] = rows;
    t.nbytes = like->nbytes / (size_t)like->shape[0] * (size_t)rows;
    ts->t[ts->n++] = t;
}

/* diffusers names -> the names of sd3_medium.safetensors, written by hand
 * here (independently of the loader's table) */
static void write_sd3_original(const char *golden, const char *out_path, int layers) {
    st_file *f = NULL;
    if (st_open(golden_path(golden, "diffusion_pytorch_model.safetensors"), &f)) exit(2);
    tset ts = {calloc(st_count(f) + 8, sizeof(st_tensor)), 0, {0}, 0};
    static const char *top[][2] = {
        {"pos_embed.proj.weight", "x_embedder.proj.weight"}, {"pos_embed.proj.bias", "x_embedder.proj.bias"},
        {"pos_embed.pos_embed", "pos_embed"},
        {"time_text_embed.timestep_embedder.linear_1.weight", "t_embedder.mlp.0.weight"},
        {"time_text_embed.timestep_embedder.linear_1.bias", "t_embedder.mlp.0.bias"},
        {"time_text_embed.timestep_embedder.linear_2.weight", "t_embedder.mlp.2.weight"},
        {"time_text_embed.timestep_embedder.linear_2.bias", "t_embedder.mlp.2.bias"},
        {"time_text_embed.text_embedder.linear_1.weight", "y_embedder.mlp.0.weight"},
        {"time_text_embed.text_embedder.linear_1.bias", "y_embedder.mlp.0.bias"},
        {"time_text_embed.text_embedder.linear_2.weight", "y_embedder.mlp.2.weight"},
        {"time_text_embed.text_embedder.linear_2.bias", "y_embedder.mlp.2.bias"},
        {"context_embedder.weight", "context_embedder.weight"}, {"context_embedder.bias", "context_embedder.bias"},
        {"proj_out.weight", "final_layer.linear.weight"}, {"proj_out.bias", "final_layer.linear.bias"},
    };
    static const char *blk[][2] = {
        {"attn.to_out.0", "x_block.attn.proj"}, {"attn.to_add_out", "context_block.attn.proj"},
        {"attn.norm_q", "x_block.attn.ln_q"}, {"attn.norm_k", "x_block.attn.ln_k"},
        {"attn.norm_added_q", "context_block.attn.ln_q"}, {"attn.norm_added_k", "context_block.attn.ln_k"},
        {"attn2.to_out.0", "x_block.attn2.proj"}, {"attn2.norm_q", "x_block.attn2.ln_q"},
        {"attn2.norm_k", "x_block.attn2.ln_k"}, {"ff.net.0.proj", "x_block.mlp.fc1"},
        {"ff.net.2", "x_block.mlp.fc2"}, {"ff_context.net.0.proj", "context_block.mlp.fc1"},
        {"ff_context.net.2", "context_block.mlp.fc2"}, {"norm1.linear", "x_block.adaLN_modulation.1"},
        {"norm1_context.linear", "context_block.adaLN_modulation.1"},
    };
    static const char *qkv[][4] = {
        {"attn.to_q", "attn.to_k", "attn.to_v", "x_block.attn.qkv"},
        {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "context_block.attn.qkv"},
        {"attn2.to_q", "attn2.to_k", "attn2.to_v", "x_block.attn2.qkv"},
    };
    char a[200], b[200];
    size_t fused = 0;
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++) {
        const st_tensor *t = st_find(f, top[i][0]);
        snprintf(a, sizeof a, "model.diffusion_model.%s", top[i][1]);
        put(&ts, a, t, t->data, t->shape[0]);
    }
    for (int wb = 0; wb < 2; wb++) {
        const char *sfx = wb ? "bias" : "weight";
        snprintf(a, sizeof a, "norm_out.linear.%s", sfx);
        const st_tensor *t = st_find(f, a);
        snprintf(b, sizeof b, "model.diffusion_model.final_layer.adaLN_modulation.1.%s", sfx);
        put(&ts, b, t, swapped(&ts, t), t->shape[0]);
        for (int l = 0; l < layers; l++) {
            for (size_t k = 0; k < sizeof blk / sizeof blk[0]; k++) {
                snprintf(a, sizeof a, "transformer_blocks.%d.%s.%s", l, blk[k][0], sfx);
                const st_tensor *s = st_find(f, a);
                if (!s) continue;
                snprintf(b, sizeof b, "model.diffusion_model.joint_blocks.%d.%s.%s", l, blk[k][1], sfx);
                int swap = l == layers - 1 && !strcmp(blk[k][0], "norm1_context.linear");
                put(&ts, b, s, swap ? swapped(&ts, s) : s->data, s->shape[0]);
            }
            for (size_t k = 0; k < 3; k++) {
                const st_tensor *q, *kk, *v;
                snprintf(a, sizeof a, "transformer_blocks.%d.%s.%s", l, qkv[k][0], sfx);
                if (!(q = st_find(f, a))) continue;
                snprintf(a, sizeof a, "transformer_blocks.%d.%s.%s", l, qkv[k][1], sfx);
                kk = st_find(f, a);
                snprintf(a, sizeof a, "transformer_blocks.%d.%s.%s", l, qkv[k][2], sfx);
                v = st_find(f, a);
                snprintf(b, sizeof b, "model.diffusion_model.joint_blocks.%d.%s.%s", l, qkv[k][3], sfx);
                put(&ts, b, q, concat3(&ts, q, kk, v), 3 * q->shape[0]);
                fused += 2; /* three tensors became one */
            }
        }
    }
    CHECK_MSG(ts.n + fused == st_count(f), "converted %zu + %zu fused of %zu tensors", ts.n, fused,
              st_count(f));
    CHECK_OK(st_write(out_path, ts.t, ts.n, NULL, 0));
    for (int i = 0; i < ts.nowned; i++) free(ts.owned[i]);
    free(ts.t);
    st_close(f);
}

static void single_file_matches(const char *golden, int layers) {
    char dir[256], path[400];
    test_tmpdir(dir, sizeof dir, "single");
    snprintf(path, sizeof path, "%s/sd3_original.safetensors", dir);
    write_sd3_original(golden, path, layers);
    kiln_model *ref = NULL, *m = NULL;
    CHECK_OK(kiln_model_open(golden_path(golden, NULL), NULL, &ref));
    /* head_dim 8: the heads cannot be inferred, so the config is required */
    CHECK_FAILS(kiln_model_open(path, NULL, &m), KILN_ERR_CONFIG, "--config");
    kiln_open_opts o = {.config_path = golden_path(golden, "config.json")};
    CHECK_OK(kiln_model_open(path, &o, &m));
    if (ref && m) {
        kiln_model_info info;
        kiln_model_get_info(m, &info);
        CHECK(!strcmp(info.layout, "sd3-single-file"));
        size_t n1, n2;
        float *a = golden_forward(ref, golden, &n1), *b = golden_forward(m, golden, &n2);
        CHECK(a && b && n1 == n2 && !memcmp(a, b, n1 * sizeof(float)));
        free(a);
        free(b);
    }
    kiln_model_free(ref);
    kiln_model_free(m);
    test_rmrf(dir);
}

TEST(single_file_sd3_layout) { single_file_matches("sd3-tiny", 4); }
TEST(single_file_sd35_layout) { single_file_matches("sd35-tiny", 4); }

TEST(single_file_infers_config) {
    /* heads of 64, as every real SD3 release: the architecture is inferred */
    char dir[256], model[300], file[400];
    test_tmpdir(dir, sizeof dir, "infer");
    snprintf(model, sizeof model, "%s/model", dir);
    kiln_config c = kiln_config_demo();
    c.attention_head_dim = 64;
    c.num_attention_heads = 2;
    c.caption_projection_dim = 128;
    c.dual_attention_mask = 2;
    CHECK_OK(kiln_write_seeded_model(model, &c, 5, KILN_F16));
    kiln_model *a = NULL, *b = NULL;
    CHECK_OK(kiln_model_open(model, NULL, &a));
    /* the same weights as one file with diffusers names and no config */
    snprintf(file, sizeof file, "%s/model/diffusion_pytorch_model.safetensors", dir);
    CHECK_OK(kiln_model_open(file, NULL, &b));
    if (a && b) {
        const kiln_config *ca = kiln_model_config(a), *cb = kiln_model_config(b);
        CHECK(ca->num_attention_heads == cb->num_attention_heads && ca->num_layers == cb->num_layers &&
              ca->dual_attention_mask == cb->dual_attention_mask && ca->qk_norm_rms == cb->qk_norm_rms &&
              ca->pos_embed_max_size == cb->pos_embed_max_size && ca->out_channels == cb->out_channels);
    }
    kiln_model_free(a);
    kiln_model_free(b);
    test_rmrf(dir);
}

/* ---- sharded folders ---------------------------------------------------------- */

TEST(sharded_folder_matches) {
    char dir[256], path[400];
    test_tmpdir(dir, sizeof dir, "shards");
    st_file *f = NULL;
    CHECK_OK(st_open(golden_path("sd35-tiny", "diffusion_pytorch_model.safetensors"), &f));
    if (!f) return;
    size_t n = st_count(f), half = n / 2;
    st_tensor *t = calloc(n, sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = *st_at(f, i);
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model-00001-of-00002.safetensors", dir);
    CHECK_OK(st_write(path, t, half, NULL, 0));
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model-00002-of-00002.safetensors", dir);
    CHECK_OK(st_write(path, t + half, n - half, NULL, 0));
    size_t cap = 64 + n * 200, len = 0;
    char *idx = malloc(cap);
    len += (size_t)snprintf(idx + len, cap - len, "{\"metadata\": {}, \"weight_map\": {");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(idx + len, cap - len, "%s\"%s\": \"diffusion_pytorch_model-0000%d-of-00002.safetensors\"",
                                i ? ", " : "", t[i].name, i < half ? 1 : 2);
    len += (size_t)snprintf(idx + len, cap - len, "}}");
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
    CHECK_OK(kb_write_file_atomic(path, idx, len));
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(golden_path("sd35-tiny", "config.json"), path);
    kiln_model *ref = NULL, *m = NULL;
    CHECK_OK(kiln_model_open(golden_path("sd35-tiny", NULL), NULL, &ref));
    CHECK_OK(kiln_model_open(dir, NULL, &m));
    if (ref && m) {
        size_t n1, n2;
        float *a = golden_forward(ref, "sd35-tiny", &n1), *b = golden_forward(m, "sd35-tiny", &n2);
        CHECK(a && b && n1 == n2 && !memcmp(a, b, n1 * sizeof(float)));
        free(a);
        free(b);
    }
    kiln_model_free(ref);
    kiln_model_free(m);
    free(idx);
    free(t);
    st_close(f);
    test_rmrf(dir);
}

/* ---- sampler arguments and noise ---------------------------------------------- */

TEST(generate_argument_errors) {
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(golden_path("sampler-sd3-tiny", NULL), NULL, &m));
    if (!m) return;
    float cond[20 * 32] = {0}, pooled[64] = {0}, out[4 * 16 * 16];
    kiln_generate_opts o = kiln_generate_defaults();
    o.latent_h = o.latent_w = 16;
    o.context_len = 20;
    o.cond = cond;
    o.cond_pooled = pooled;
    o.guidance = 5.0;
    CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_INVALID_ARG, "negative_prompt_embeds");
    o.guidance = 1.0;
    o.steps = 0;
    CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_INVALID_ARG, "steps");
    o.steps = 2;
    o.shift = -1;
    CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_INVALID_ARG, "shift");
    o.shift = 3;
    o.latent_w = 200;
    CHECK_FAILS(kiln_generate(m, &o, out), KILN_ERR_RANGE, "pos_embed_max_size");
    o.latent_w = 16;
    CHECK_OK(kiln_generate(m, &o, out)); /* guidance 1: cond only */
    kiln_model_free(m);
}

TEST(noise_is_seeded_standard_normal) {
    size_t n = 100001;
    float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
    kiln_noise(42, a, n);
    kiln_noise(42, b, n);
    kiln_noise(43, c, n);
    CHECK(!memcmp(a, b, n * 4));
    CHECK(memcmp(a, c, n * 4) != 0);
    double mean = 0, var = 0;
    for (size_t i = 0; i < n; i++) mean += a[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (a[i] - mean) * (a[i] - mean);
    var /= (double)n;
    CHECK_MSG(fabs(mean) < 0.02 && fabs(var - 1) < 0.02, "mean %g var %g", mean, var);
    /* a prefix is the same noise whatever the length asked for */
    kiln_noise(42, c, 7);
    CHECK(!memcmp(a, c, 7 * 4));
    free(a);
    free(b);
    free(c);
}

TEST(schedule_edge_cases) {
    double t[2], s[2];
    CHECK_OK(kiln_flow_schedule(1, 3.0, 1000, t, s));
    CHECK(t[0] == 1000.0 && s[0] == 1.0 && s[1] == 0.0);
    CHECK_FAILS(kiln_flow_schedule(2, 3.0, 0, t, s), KILN_ERR_INVALID_ARG, "num_train_timesteps");
}

/* A safetensors file with no tensors at all (found by fuzz_safetensors: the
 * checkpoint layer passed NULL to qsort, undefined behaviour that UBSan
 * reports): it opens as an empty checkpoint, finds nothing, and a model
 * from it names the first missing weight. */
TEST(checkpoint_with_no_tensors) {
    char dir[256], path[400];
    test_tmpdir(dir, sizeof dir, "empty-ckpt");
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    CHECK_OK(st_write(path, NULL, 0, NULL, 0));
    kc_checkpoint *c = NULL;
    CHECK_OK(kc_open(path, NULL, ka_renamers(), &c));
    if (c) {
        CHECK(c->n == 0);
        CHECK(kc_find(c, "pos_embed.pos_embed") == NULL);
        kc_close(c);
    }
    kiln_model *m = NULL;
    kiln_status st = kiln_model_open(path, NULL, &m);
    CHECK_MSG(st != KILN_OK && kiln_last_error()[0], "%s", kiln_last_error());
    kiln_model_free(m);
    test_rmrf(dir);
}

int main(void) {
    RUN(missing_tensor_is_named);
    RUN(unexpected_tensor_is_named);
    RUN(wrong_shape_is_named);
    RUN(missing_files);
    RUN(impossible_configs);
    RUN(latent_outside_position_table);
    RUN(single_file_sd3_layout);
    RUN(single_file_sd35_layout);
    RUN(single_file_infers_config);
    RUN(sharded_folder_matches);
    RUN(generate_argument_errors);
    RUN(noise_is_seeded_standard_normal);
    RUN(schedule_edge_cases);
    RUN(checkpoint_with_no_tensors);
    return TEST_SUMMARY();
}
