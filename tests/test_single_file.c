/* test_single_file.c - SD3 as ONE safetensors file (the all-in-one layout
 * ComfyUI and A1111 load): sd3-pipeline-tiny's weights are written at test
 * time under the original names (model.diffusion_model.* MMDiT names with
 * fused qkv and swapped modulation halves, text_encoders.clip_l/clip_g/
 * t5xxl.transformer.*, first_stage_model.* LDM names with 1x1 conv attention
 * weights and reversed up blocks), then `kiln generate FILE --tokenizers DIR`
 * reproduces the case's final latents and image (DIR holding the configs);
 * with DIR holding only the tokenizers every config is inferred and checked
 * field by field against the real one; a cache miss then a hit, a changed
 * file a miss; info, encode and the bad inputs, each a clear error. */
#include "base/base.h"
#include "cli_util.h"
#include "ldm_names.h"
#include "golden_util.h"
#include "pipeline/component.h"
#include "pipeline_util.h"

#include <cjson/cJSON.h>
#include <unistd.h>

static char g_dir[128];

/* ---- writing the all-in-one file ------------------------------------------------
 * The inverse of what kiln reads: src/arch/sd3/sd3_names.c (MMDiT) and
 * src/arch/vae/vae_names.c (LDM), written out here on their own so that a
 * mistake in one is not repeated in the other. */

typedef struct {
    st_tensor *t;
    size_t n, cap;
} out_list;

/* the tensors of l written to path as one safetensors file, then freed */
static void write_list(const char *path, out_list *l) {
    CHECK_OK(st_write(path, l->t, l->n, NULL, 0));
    for (size_t i = 0; i < l->n; i++) {
        free((char *)l->t[i].name);
        free((void *)l->t[i].data);
    }
    free(l->t);
    memset(l, 0, sizeof *l);
}

static void put(out_list *l, const char *name, const st_tensor *src, const void *data, size_t nbytes, int ndim,
                const int64_t *shape) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->t = realloc(l->t, l->cap * sizeof *l->t);
    }
    st_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    t->name = kb_strdup(name);
    t->dtype = src->dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    void *copy = malloc(nbytes ? nbytes : 1);
    memcpy(copy, data, nbytes);
    t->data = copy;
    t->nbytes = nbytes;
}

static void put_same(out_list *l, const char *name, const st_tensor *src) {
    put(l, name, src, src->data, src->nbytes, src->ndim, src->shape);
}

/* (scale, shift) -> (shift, scale): the halves of dim 0 swapped back */
static void put_swapped(out_list *l, const char *name, const st_tensor *src) {
    size_t h = src->nbytes / 2;
    uint8_t *b = malloc(src->nbytes);
    memcpy(b, (const uint8_t *)src->data + h, h);
    memcpy(b + h, src->data, h);
    put(l, name, src, b, src->nbytes, src->ndim, src->shape);
    free(b);
}

static const struct {
    const char *orig, *diffusers;
    int swap;
} k_top[] = {
    {"x_embedder.proj.weight", "pos_embed.proj.weight", 0},
    {"x_embedder.proj.bias", "pos_embed.proj.bias", 0},
    {"pos_embed", "pos_embed.pos_embed", 0},
    {"t_embedder.mlp.0.weight", "time_text_embed.timestep_embedder.linear_1.weight", 0},
    {"t_embedder.mlp.0.bias", "time_text_embed.timestep_embedder.linear_1.bias", 0},
    {"t_embedder.mlp.2.weight", "time_text_embed.timestep_embedder.linear_2.weight", 0},
    {"t_embedder.mlp.2.bias", "time_text_embed.timestep_embedder.linear_2.bias", 0},
    {"y_embedder.mlp.0.weight", "time_text_embed.text_embedder.linear_1.weight", 0},
    {"y_embedder.mlp.0.bias", "time_text_embed.text_embedder.linear_1.bias", 0},
    {"y_embedder.mlp.2.weight", "time_text_embed.text_embedder.linear_2.weight", 0},
    {"y_embedder.mlp.2.bias", "time_text_embed.text_embedder.linear_2.bias", 0},
    {"context_embedder.weight", "context_embedder.weight", 0},
    {"context_embedder.bias", "context_embedder.bias", 0},
    {"final_layer.linear.weight", "proj_out.weight", 0},
    {"final_layer.linear.bias", "proj_out.bias", 0},
    {"final_layer.adaLN_modulation.1.weight", "norm_out.linear.weight", 1},
    {"final_layer.adaLN_modulation.1.bias", "norm_out.linear.bias", 1},
};

static const struct {
    const char *orig, *diffusers;
} k_block[] = {
    {"x_block.attn.proj", "attn.to_out.0"},       {"context_block.attn.proj", "attn.to_add_out"},
    {"x_block.mlp.fc1", "ff.net.0.proj"},         {"x_block.mlp.fc2", "ff.net.2"},
    {"context_block.mlp.fc1", "ff_context.net.0.proj"}, {"context_block.mlp.fc2", "ff_context.net.2"},
    {"x_block.adaLN_modulation.1", "norm1.linear"}, {"context_block.adaLN_modulation.1", "norm1_context.linear"},
};

/* the transformer: MMDiT names, q k v fused, the modulations swapped back */
static void write_transformer(out_list *l, const st_file *f, int layers) {
    char name[256], a[160];
    for (size_t k = 0; k < sizeof k_top / sizeof k_top[0]; k++) {
        const st_tensor *t = st_find(f, k_top[k].diffusers);
        if (!t) continue;
        snprintf(name, sizeof name, "model.diffusion_model.%s", k_top[k].orig);
        if (k_top[k].swap) put_swapped(l, name, t);
        else put_same(l, name, t);
    }
    for (int b = 0; b < layers; b++) {
        for (size_t k = 0; k < sizeof k_block / sizeof k_block[0]; k++)
            for (int w = 0; w < 2; w++) {
                snprintf(a, sizeof a, "transformer_blocks.%d.%s.%s", b, k_block[k].diffusers, w ? "bias" : "weight");
                const st_tensor *t = st_find(f, a);
                if (!t) continue;
                snprintf(name, sizeof name, "model.diffusion_model.joint_blocks.%d.%s.%s", b, k_block[k].orig,
                         w ? "bias" : "weight");
                if (b == layers - 1 && !strcmp(k_block[k].diffusers, "norm1_context.linear")) put_swapped(l, name, t);
                else put_same(l, name, t);
            }
        static const char *const qkv[2][4] = {{"x_block.attn.qkv", "to_q", "to_k", "to_v"},
                                              {"context_block.attn.qkv", "add_q_proj", "add_k_proj", "add_v_proj"}};
        for (int q = 0; q < 2; q++)
            for (int w = 0; w < 2; w++) {
                const st_tensor *p[3];
                for (int i = 0; i < 3; i++) {
                    snprintf(a, sizeof a, "transformer_blocks.%d.attn.%s.%s", b, qkv[q][i + 1], w ? "bias" : "weight");
                    p[i] = st_find(f, a);
                }
                if (!p[0] || !p[1] || !p[2]) continue;
                size_t nb = p[0]->nbytes;
                uint8_t *cat = malloc(3 * nb);
                for (int i = 0; i < 3; i++) memcpy(cat + (size_t)i * nb, p[i]->data, nb);
                int64_t shape[2] = {3 * p[0]->shape[0], p[0]->ndim > 1 ? p[0]->shape[1] : 0};
                snprintf(name, sizeof name, "model.diffusion_model.joint_blocks.%d.%s.%s", b, qkv[q][0],
                         w ? "bias" : "weight");
                put(l, name, p[0], cat, 3 * nb, p[0]->ndim, shape);
                free(cat);
            }
    }
}

enum { OMIT_NONE = 0, OMIT_CLIP_L = 1 };

/* the case's five components in one file at path */
static void write_all_in_one(const char *path, int omit) {
    static const char *const comp[5][2] = {
        {"text_encoder/model.safetensors", "text_encoders.clip_l.transformer."},
        {"text_encoder_2/model.safetensors", "text_encoders.clip_g.transformer."},
        {"text_encoder_3/model.safetensors", "text_encoders.t5xxl.transformer."},
        {"transformer/diffusion_pytorch_model.safetensors", NULL},
        {"vae/diffusion_pytorch_model.safetensors", NULL},
    };
    out_list l = {0};
    for (int c = 0; c < 5; c++) {
        if (c == 0 && omit == OMIT_CLIP_L) continue;
        st_file *f = NULL;
        CHECK_OK(st_open(golden_path(PIPELINE_CASE, comp[c][0]), &f));
        if (!f) continue;
        char name[256];
        if (comp[c][1]) {
            for (size_t i = 0; i < st_count(f); i++) {
                snprintf(name, sizeof name, "%s%s", comp[c][1], st_at(f, i)->name);
                put_same(&l, name, st_at(f, i));
            }
            /* what real files carry beside: T5's tied embedding copy, CLIP's position_ids buffer */
            const st_tensor *shared = st_find(f, "shared.weight");
            if (shared) {
                snprintf(name, sizeof name, "%sencoder.embed_tokens.weight", comp[c][1]);
                put_same(&l, name, shared);
            }
            if (c == 0) {
                int64_t ids[77], shape[2] = {1, 77};
                for (int i = 0; i < 77; i++) ids[i] = i;
                st_tensor pos = {.dtype = KILN_I64};
                snprintf(name, sizeof name, "%stext_model.embeddings.position_ids", comp[c][1]);
                put(&l, name, &pos, ids, sizeof ids, 2, shape);
            }
        } else if (c == 3) {
            write_transformer(&l, f, 2);
        } else {
            int n_up = 0;
            for (size_t i = 0; i < st_count(f); i++) {
                int b;
                if (sscanf(st_at(f, i)->name, "decoder.up_blocks.%d.", &b) == 1 && b + 1 > n_up) n_up = b + 1;
            }
            for (size_t i = 0; i < st_count(f); i++) {
                const st_tensor *t = st_at(f, i);
                int conv = 0;
                ldm_name("first_stage_model.", t->name, n_up, name, sizeof name, &conv);
                int64_t shape[4] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0, 1, 1};
                if (conv) put(&l, name, t, t->data, t->nbytes, 4, shape); /* Linear [C, C] as a 1x1 conv */
                else put_same(&l, name, t);
            }
        }
        st_close(f);
    }
    write_list(path, &l);
}

/* ---- the tests --------------------------------------------------------------------- */

static char g_file[256], g_full[256], g_tok[256];

/* DIR with the tokenizers, the configs and the scheduler (as the diffusers repository) */
static void make_dirs(void) {
    snprintf(g_file, sizeof g_file, "%s/sd3_tiny_all_in_one.safetensors", g_dir);
    snprintf(g_full, sizeof g_full, "%s/configs", g_dir);
    snprintf(g_tok, sizeof g_tok, "%s/tokenizers", g_dir);
    write_all_in_one(g_file, OMIT_NONE);
    const char *c = golden_path(PIPELINE_CASE, NULL);
    char *out = NULL;
    int rc = kiln_sh(&out,
                     "set -e; mkdir -p '%s' '%s'; cd '%s'; cp model_index.json '%s/'; cp -r scheduler tokenizer "
                     "tokenizer_2 tokenizer_3 '%s/'; for d in text_encoder text_encoder_2 text_encoder_3 transformer vae; "
                     "do mkdir -p '%s/'$d; cp $d/config.json '%s/'$d/; done; cp -r tokenizer tokenizer_2 tokenizer_3 '%s/'",
                     g_full, g_tok, c, g_full, g_full, g_full, g_full, g_tok);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
}

/* the components found, their names mapped as views: the layout each reads
 * (T5's: its tied encoder.embed_tokens copy left out) */
TEST(file_is_all_in_one) {
    CHECK(kiln_is_single_file(g_file));
    CHECK(!kiln_is_single_file(golden_path(PIPELINE_CASE, "transformer/diffusion_pytorch_model.safetensors")));
    static const char *const comps[] = {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"};
    static const char *const layout[] = {"sd3-single-file", "diffusers", "diffusers", "t5-embed-tokens", "ldm-vae"};
    for (int k = 0; k < 5; k++) {
        kc_checkpoint *c = NULL;
        CHECK_OK(kc_open_part(g_file, kp_component_prefix(g_file, comps[k]), NULL, NULL, ka_renamers(), &c));
        if (c) CHECK_MSG(!strcmp(c->layout, layout[k]), "%s: layout %s", comps[k], c->layout);
        kc_close(c);
    }
}

/* the VAE alone in LDM names (a standalone LDM VAE file, first_stage_model.*)
 * opens as the vae-decoder family and decodes vae-sd3-tiny's latent as the
 * diffusers folder does */
TEST(ldm_vae_file) {
    char path[256];
    snprintf(path, sizeof path, "%s/ldm_vae.safetensors", g_dir);
    st_file *all = NULL;
    CHECK_OK(st_open(g_file, &all));
    out_list l = {0};
    for (size_t i = 0; all && i < st_count(all); i++)
        if (!strncmp(st_at(all, i)->name, "first_stage_model.", 18)) put_same(&l, st_at(all, i)->name, st_at(all, i));
    write_list(path, &l);
    st_close(all);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/config.json", golden_path("vae-sd3-tiny", NULL));
    kiln_open_opts o = {.config_path = cfg, .dtype = KILN_F32};
    kiln_model *m = NULL;
    CHECK_OK(kiln_model_open(path, &o, &m));
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path("vae-sd3-tiny", "io.safetensors"), &io));
    if (m && io) {
        CHECK(!strcmp(kiln_model_family(m), "vae-decoder"));
        size_t n = 0, k = 0;
        float *lat = golden_tensor(io, "decode_input", NULL), *want = golden_tensor(io, "decode_sample", &n);
        float *got = calloc(n, sizeof(float));
        kiln_tensor in = {"latent", KILN_F32, 4, {1, 16, 8, 12}, lat};
        kiln_output out = {"sample", got, n, 0, {0}};
        CHECK_OK(kiln_run(m, &in, 1, &out, 1));
        k = (size_t)out.shape[0] * out.shape[1] * out.shape[2] * out.shape[3];
        double e = k == n ? kb_rel_l2(got, want, n) : INFINITY;
        printf("  a standalone LDM VAE file: decode %.3g relative L2\n", e);
        CHECK(e < 1e-5);
        free(lat);
        free(want);
        free(got);
    }
    kiln_model_free(m);
    st_close(io);
}

TEST(generate_matches_diffusers) {
    char lat[256], png[256], tens[256];
    snprintf(lat, sizeof lat, "%s/latents.safetensors", g_dir);
    snprintf(png, sizeof png, "%s/image.png", g_dir);
    snprintf(tens, sizeof tens, "%s/tensors.safetensors", g_dir);
    char *out = NULL;
    int rc = run_kiln(&out, "generate '%s' --tokenizers '%s' " PIPELINE_ARGS " --noise '%s' --latents-output '%s' "
                      "--tensor-output '%s' --output '%s'", g_file, g_full, golden_path(PIPELINE_CASE, "io.safetensors"),
                      lat, tens, png);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    CHECK(out && strstr(out, "1 image 48x32, 4 steps"));
    free(out);
    pipeline_check_case("kiln generate FILE --tokenizers DIR", lat, tens, png);
}

/* a config through the family's parser and back: the one form to compare */
static cJSON *canonical(const char *json) {
    const ka_arch *a = NULL;
    void *cfg = NULL;
    if (km_config_parse(json, NULL, &a, &cfg)) return NULL;
    char *s = a->config_to_json(cfg);
    cJSON *j = cJSON_Parse(s);
    free(s);
    free(cfg);
    return j;
}

/* inference from the shapes against the real configs, field by field: only
 * what no shape holds may differ (listed in docs/cli.md) */
TEST(inferred_configs) {
    static const struct {
        const char *component, *differ; /* the fields inference cannot know for this tiny case */
    } k[] = {
        {"text_encoder", "num_attention_heads"},    /* head width 8, inference assumes 64 */
        {"text_encoder_2", "num_attention_heads"},
        {"text_encoder_3", ""},                      /* every field from a shape */
        {"vae", "norm_num_groups,sample_size"},      /* 8 groups (32 assumed, 16 the largest that fits) */
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char *json = NULL, *real = NULL, path[512];
        int inferred = 0;
        CHECK_OK(kp_part_config(g_file, k[i].component, g_tok, &json, &inferred));
        CHECK(inferred);
        snprintf(path, sizeof path, "%s/config.json", golden_path(PIPELINE_CASE, k[i].component));
        CHECK_OK(kb_read_file(path, &real, NULL));
        cJSON *a = json ? canonical(json) : NULL, *b = real ? canonical(real) : NULL;
        CHECK_MSG(a && b, "%s: %s", k[i].component, kiln_last_error());
        char differ[256] = "";
        const cJSON *e;
        cJSON_ArrayForEach(e, b) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(a, e->string);
            if (!v || !cJSON_Compare(v, e, 1))
                snprintf(differ + strlen(differ), sizeof differ - strlen(differ), "%s%s", differ[0] ? "," : "", e->string);
        }
        printf("  %s inferred: differs from the real config in {%s}\n", k[i].component, differ);
        CHECK_MSG(!strcmp(differ, k[i].differ), "%s: differs in {%s}, expected {%s}", k[i].component, differ,
                  k[i].differ);
        /* the same fields of the original checkpoint's conventions: CLIP-L quick_gelu, CLIP-G gelu */
        if (a && i < 2) {
            const cJSON *act = cJSON_GetObjectItemCaseSensitive(a, "hidden_act");
            CHECK(cJSON_IsString(act) && !strcmp(act->valuestring, i == 0 ? "quick_gelu" : "gelu"));
        }
        cJSON_Delete(a);
        cJSON_Delete(b);
        free(json);
        free(real);
    }
    /* the tiny transformer's width 32 is no multiple of SD3's head width 64 */
    char *json = NULL;
    CHECK_FAILS(kp_part_config(g_file, "transformer", g_tok, &json, NULL), KILN_ERR_CONFIG, "transformer/config.json");
    free(json);
}

/* DIR with the tokenizers alone: inference for all but the transformer,
 * whose heads it cannot know, so its config.json is added to DIR */
TEST(generate_inferred) {
    char *out = NULL, png[256], lat[256];
    snprintf(png, sizeof png, "%s/inferred.png", g_dir);
    snprintf(lat, sizeof lat, "%s/inferred.safetensors", g_dir);
    CHECK_RUN_WITH(run_kiln, 1, "width 32 is not a multiple of 64",
                   "generate '%s' --tokenizers '%s' --prompt x --steps 1 --output '%s'", g_file, g_tok, png);
    int rc = kiln_sh(&out, "mkdir -p '%s/transformer' && cp '%s/config.json' '%s/transformer/'", g_tok,
                     golden_path(PIPELINE_CASE, "transformer"), g_tok);
    CHECK(rc == 0);
    free(out);
    /* a size from the file's configs (the VAE's inferred) before anything loads */
    CHECK_FAILS(kiln_pipeline_check_size_early(g_file, g_tok, 50, 32), KILN_ERR_SHAPE,
                "height 50 px: must be a multiple of 4 (VAE factor 2 x patch 2)");
    CHECK_OK(kiln_pipeline_check_size_early(g_file, g_tok, 32, 48));
    rc = run_kiln(&out, "generate '%s' --tokenizers '%s' " PIPELINE_ARGS " --noise '%s' --latents-output '%s' "
                  "--output '%s'", g_file, g_tok, golden_path(PIPELINE_CASE, "io.safetensors"), lat, png);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    free(out);
    size_t n = 0;
    float *x = pipeline_read_latents(lat, &n);
    CHECK(x && n == 16 * 16 * 24);
    int finite = 1;
    for (size_t i = 0; x && i < n; i++) finite &= isfinite(x[i]) != 0;
    CHECK(finite);
    free(x);
    rc = kiln_sh(&out, "rm -r '%s/transformer'", g_tok);
    free(out);
}

/* every component under its own key: a miss, then a hit; a changed file a miss */
TEST(cache_miss_then_hit) {
    char *out = NULL;
    int rc = run_kiln(&out, "cache build '%s' --tokenizers '%s' --dtype f32 --cache-dir '%s/cache'", g_file, g_full, g_dir);
    CHECK_MSG(rc == 0 && strstr(out, "transformer     miss") && strstr(out, "text_encoder_3  miss") &&
              strstr(out, "vae             miss"), "%s", out);
    free(out);
    rc = run_kiln(&out, "cache build '%s' --tokenizers '%s' --dtype f32 --cache-dir '%s/cache'", g_file, g_full, g_dir);
    CHECK_MSG(rc == 0 && strstr(out, "transformer     hit") && strstr(out, "vae             hit") && !strstr(out, "miss"),
              "%s", out);
    free(out);
    /* generate maps the same caches */
    char lat[256], png[256];
    snprintf(lat, sizeof lat, "%s/hit.safetensors", g_dir);
    snprintf(png, sizeof png, "%s/hit.png", g_dir);
    rc = run_kiln(&out, "generate '%s' --tokenizers '%s' " PIPELINE_ARGS " --noise '%s' --latents-output '%s' "
                  "--output '%s' --cache-dir '%s/cache' --timings", g_file, g_full,
                  golden_path(PIPELINE_CASE, "io.safetensors"), lat, png, g_dir);
    CHECK_MSG(rc == 0 && strstr(out, "hit") && !strstr(out, "miss:"), "%s", out); /* the ledger: every load a hit */
    free(out);
    pipeline_check_case("kiln generate FILE, cache hit", lat, NULL, png);
    CHECK_RUN_WITH(run_kiln, 0, "cached", "info '%s' --cache-dir '%s/cache'", g_file, g_dir);
    /* a changed file (another mtime) is another source: a miss */
    rc = kiln_sh(&out, "touch -d '2001-01-01' '%s'", g_file);
    free(out);
    rc = run_kiln(&out, "cache build '%s' --tokenizers '%s' --dtype f32 --cache-dir '%s/cache'", g_file, g_full, g_dir);
    CHECK_MSG(rc == 0 && strstr(out, "transformer     miss"), "%s", out);
    free(out);
}

TEST(info_lists_components) {
    char *out = NULL;
    int rc = run_kiln(&out, "info '%s'", g_file);
    CHECK_MSG(rc == 0 && strstr(out, "all-in-one") && strstr(out, "text_encoders.t5xxl.transformer.*") &&
              strstr(out, "F16 x 21") && strstr(out, "first_stage_model.*"), "%s", out);
    printf("%s", out);
    free(out);
}

/* kiln encode FILE --tokenizers DIR: the case's conditioning */
TEST(encode_matches) {
    char emb[256];
    snprintf(emb, sizeof emb, "%s/cond.safetensors", g_dir);
    char *out = NULL;
    int rc = run_kiln(&out, "encode '%s' --tokenizers '%s' --prompt '" PIPELINE_PROMPT "' --dtype f32 --output '%s'",
                      g_file, g_full, emb);
    CHECK_MSG(rc == 0, "%s", out);
    free(out);
    st_file *f = NULL, *io = NULL;
    CHECK_OK(st_open(emb, &f));
    CHECK_OK(st_open(golden_path(PIPELINE_CASE, "io.safetensors"), &io));
    if (f && io) {
        size_t n = 0, m = 0;
        float *x = golden_tensor(f, "prompt_embeds", &n), *want = golden_tensor(io, "prompt_embeds", &m);
        double e = n == m ? kb_rel_l2(x, want, n) : INFINITY;
        printf("  kiln encode FILE: prompt_embeds %.3g relative L2\n", e);
        CHECK(e < 1e-5);
        free(x);
        free(want);
    }
    st_close(f);
    st_close(io);
}

/* --low-memory releases the encoders after a batch; the next batch (other
 * settings) maps them again from the file, with its tokenizers */
TEST(low_memory_batches) {
    char pf[256], png[256];
    snprintf(pf, sizeof pf, "%s/prompts.jsonl", g_dir);
    snprintf(png, sizeof png, "%s/lm.png", g_dir);
    FILE *f = fopen(pf, "w");
    if (!f) return;
    fputs("a red fox\n{\"prompt\": \"a lighthouse\", \"steps\": 2, \"guidance\": 1}\n", f);
    fclose(f);
    CHECK_RUN_WITH(run_kiln, 0, "load text encoders", "generate '%s' --tokenizers '%s' --prompts-file '%s' --steps 1 "
                   "--low-memory --timings --output '%s'", g_file, g_full, pf, png);
}

/* kiln compile FILE: every component's packages for the request; the next generate starts from them */
TEST(compile_file) {
    char *out = NULL, png[256];
    snprintf(png, sizeof png, "%s/cc.png", g_dir);
    CHECK_RUN_WITH(run_kiln, 0, "packages published under", "compile '%s' --tokenizers '%s' --cache-dir '%s/cc'",
                   g_file, g_full, g_dir);
    int rc = run_kiln(&out, "generate '%s' --tokenizers '%s' --prompt 'a cat' --steps 2 --cache-dir '%s/cc' --output '%s' "
                      "--timings", g_file, g_full, g_dir, png);
    CHECK_MSG(rc == 0 && strstr(out, "(backbone: fixed)") && !strstr(out, "compile "), "%s", out);
    free(out);
}

/* ---- a first_stage_model.* file whose shapes or names lie (review, issue 28) ----
 * Each a copy of the case's LDM VAE with one change; opening it (the case's
 * config, or the config inferred from the shapes) is an error naming the
 * tensor, never a crash or a model. */
enum { LIE_Q_WIDTH, LIE_Q_3X3, LIE_ZERO, LIE_UP_MISSING, LIE_UP_EXTRA, LIE_COLLIDE, LIE_EMPTY_CONV_IN, LIE_N };

static void write_lying_vae(const char *path, int lie) {
    st_file *all = NULL;
    CHECK_OK(st_open(g_file, &all));
    out_list l = {0};
    static float zeros[4096];
    for (size_t i = 0; all && i < st_count(all); i++) {
        const st_tensor *t = st_at(all, i);
        const char *n = t->name;
        if (strncmp(n, "first_stage_model.", 18)) continue;
        if (lie == LIE_UP_MISSING && strstr(n, "decoder.up.1.")) continue; /* a middle up block gone */
        if (!strcmp(n, "first_stage_model.decoder.mid.attn_1.q.weight") && (lie == LIE_Q_WIDTH || lie == LIE_Q_3X3)) {
            /* [C, C, 1, 1] as [C, C/2, 1, 1] (half the bytes), or as [C/9 x 9 ...]: a 3x3 conv of the same bytes */
            int64_t c = t->shape[0];
            int64_t sh_w[4] = {c, c / 2, 1, 1}, sh_3[4] = {c, c / 9 ? c / 9 : 1, 3, 3};
            const int64_t *sh = lie == LIE_Q_WIDTH ? sh_w : sh_3;
            size_t bytes = (size_t)(sh[0] * sh[1] * sh[2] * sh[3]) * 4;
            put(&l, n, t, t->data, bytes <= t->nbytes ? bytes : t->nbytes, 4, sh);
            continue;
        }
        if (lie == LIE_ZERO && !strcmp(n, "first_stage_model.decoder.mid.attn_1.k.bias")) {
            int64_t sh[1] = {0};
            put(&l, n, t, zeros, 0, 1, sh);
            continue;
        }
        if (lie == LIE_EMPTY_CONV_IN && !strcmp(n, "first_stage_model.encoder.conv_in.weight")) {
            int64_t sh[4] = {t->shape[0], 0, 3, 3};
            put(&l, n, t, zeros, 0, 4, sh);
            continue;
        }
        put_same(&l, n, t);
        if (lie == LIE_COLLIDE && !strcmp(n, "first_stage_model.decoder.norm_out.weight"))
            put_same(&l, "first_stage_model.decoder.conv_norm_out.weight", t); /* both names of one tensor */
        if (lie == LIE_UP_EXTRA && !strcmp(n, "first_stage_model.decoder.up.0.block.0.norm1.weight"))
            put_same(&l, "first_stage_model.decoder.up.7.block.0.norm1.weight", t); /* an up block past the others */
    }
    write_list(path, &l);
    st_close(all);
}

TEST(lying_vae_files) {
    static const char *const what[LIE_N] = {"q as [C, C/2, 1, 1]", "q as a 3x3 conv", "k.bias of 0 elements",
                                            "up.1 missing", "an up.7 past the others", "norm_out under both names",
                                            "conv_in of 0 elements"};
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/config.json", golden_path("vae-sd3-tiny", NULL));
    for (int lie = 0; lie < LIE_N; lie++) {
        char path[256];
        snprintf(path, sizeof path, "%s/lie%d.safetensors", g_dir, lie);
        write_lying_vae(path, lie);
        kiln_open_opts o = {.config_path = cfg, .dtype = KILN_F32};
        kiln_model *m = NULL;
        kiln_status st = kiln_model_open(path, &o, &m);
        printf("  %-28s %s\n", what[lie], st ? kiln_last_error() : "opened");
        CHECK_MSG(st != KILN_OK && m == NULL, "%s: a model", what[lie]);
        CHECK_MSG(st == KILN_OK || strstr(kiln_last_error(), "lie") != NULL, "%s: the error names no file: %s", what[lie],
                  kiln_last_error());
        kiln_model_free(m);
        /* the config inferred from these shapes, then the model from it */
        char *json = NULL;
        int inferred = 0;
        st = kp_part_config(path, "vae", NULL, &json, &inferred);
        char ip[300];
        snprintf(ip, sizeof ip, "%s.json", path);
        FILE *f = !st ? fopen(ip, "w") : NULL;
        if (f) {
            fputs(json, f);
            fclose(f);
            kiln_open_opts oi = {.config_path = ip, .dtype = KILN_F32};
            st = kiln_model_open(path, &oi, &m);
            CHECK_MSG(st != KILN_OK && m == NULL, "%s (inferred config): a model", what[lie]);
            kiln_model_free(m);
        }
        printf("  %-28s (inferred) %s\n", what[lie], st ? kiln_last_error() : "opened");
        free(json);
    }
}

TEST(bad_inputs) {
    char png[256], bad[256];
    snprintf(png, sizeof png, "%s/bad.png", g_dir);
    /* no tokenizers: which folder, and how to pass it */
    CHECK_RUN_WITH(run_kiln, 1, "pass --tokenizers DIR", "generate '%s' --prompt x --output '%s'", g_file, png);
    CHECK_RUN_WITH(run_kiln, 1, "has no tokenizer/ folder", "generate '%s' --tokenizers '%s/scheduler' --prompt x "
                   "--output '%s'", g_file, g_full, png);
    kiln_pipeline *p = NULL;
    CHECK_FAILS(kiln_pipeline_open_file(g_file, NULL, NULL, &p), KILN_ERR_MISSING, "--tokenizers DIR");
    CHECK_FAILS(kiln_pipeline_open_file(golden_path(PIPELINE_CASE, NULL), g_tok, NULL, &p), KILN_ERR_INVALID_ARG,
                "is for an all-in-one single file");
    /* a file without CLIP-L */
    snprintf(bad, sizeof bad, "%s/no_clip_l.safetensors", g_dir);
    write_all_in_one(bad, OMIT_CLIP_L);
    CHECK_RUN_WITH(run_kiln, 1, "needs text_encoders.clip_l.transformer.* (text_encoder)",
                   "generate '%s' --tokenizers '%s' --prompt x --output '%s'", bad, g_full, png);
    /* a plain transformer file is no pipeline */
    CHECK_RUN_WITH(run_kiln, 1, "is not an all-in-one file",
                   "generate '%s' --tokenizers '%s' --prompt x --output '%s'",
                   golden_path(PIPELINE_CASE, "transformer/diffusion_pytorch_model.safetensors"), g_full, png);
    /* a truncated file */
    snprintf(bad, sizeof bad, "%s/truncated.safetensors", g_dir);
    char *out = NULL;
    int rc = kiln_sh(&out, "head -c 300000 '%s' > '%s'", g_file, bad);
    CHECK(rc == 0);
    free(out);
    CHECK_RUN_WITH(run_kiln, 1, "truncated.safetensors", "generate '%s' --tokenizers '%s' --prompt x --output '%s'", bad,
                   g_full, png);
    CHECK_FAILS(kiln_pipeline_open_file(bad, g_full, NULL, &p), KILN_ERR_FORMAT, "neither a pipeline folder nor a readable");
    CHECK(access(png, F_OK) != 0); /* no partial output */
}

int main(void) {
    kiln_set_log_level(KILN_LOG_ERROR);
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln-single-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    make_dirs();
    RUN(file_is_all_in_one);
    RUN(ldm_vae_file);
    RUN(generate_matches_diffusers);
    RUN(inferred_configs);
    RUN(generate_inferred);
    RUN(cache_miss_then_hit);
    RUN(info_lists_components);
    RUN(encode_matches);
    RUN(compile_file);
    RUN(low_memory_batches);
    RUN(lying_vae_files);
    RUN(bad_inputs);
    char *out = NULL;
    if (kiln_sh(&out, "rm -rf '%s'", g_dir)) fprintf(stderr, "could not remove %s\n", g_dir);
    free(out);
    return TEST_SUMMARY();
}
