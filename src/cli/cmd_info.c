/* cmd_info.c - kiln info MODEL | PIPELINE */
#include "arch/arch.h"
#include "base/base.h"
#include "cli.h"
#include "cache/cache.h"
#include "format/checkpoint.h"
#include "pipeline/component.h"

#include <limits.h>

#include <stdlib.h>
#include <string.h>

static const char k_usage[] = "kiln info MODEL|PIPELINE|FILE [--config FILE] [--tokenizers DIR] [--cache-dir DIR] [--name NAME]";

/* the caches of a component under the root: complete key folders of
 * <name>/<component>/ whose manifest names source (a component folder, or
 * an all-in-one file's prefix); *which the last one found */
static int cached(const kcache_item *items, size_t n, const char *name, const char *component, const char *source,
                  const char **which) {
    char rel[256];
    snprintf(rel, sizeof rel, "%s/%s/", name, component);
    int k = 0;
    for (size_t i = 0; i < n; i++)
        if (items[i].complete && !strncmp(items[i].rel, rel, strlen(rel)) && !strcmp(items[i].source, source)) {
            *which = items[i].rel;
            k++;
        }
    return k;
}

/* A pipeline folder: every component, from its config and file headers
 * alone (nothing converts: T5-XXL's 9.5 GB are only mapped). */
static int info_pipeline(const char *dir, const cli_common *com) {
    static const char *const comps[] = {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"};
    char *index = kb_path_join(dir, "model_index.json"), *text = NULL;
    if (!index || kb_read_file(index, &text, NULL)) {
        free(index);
        return cli_fail("info", KILN_ERR_IO);
    }
    printf("pipeline:       %s\n", dir);
    const char *cls = strstr(text, "\"_class_name\"");
    if (cls) {
        const char *q = strchr(cls + 13, '"');
        const char *e = q ? strchr(q + 1, '"') : NULL;
        if (q && e) printf("class:          %.*s\n", (int)(e - q - 1), q + 1);
    }
    free(text);
    free(index);
    /* the cache state under the name kiln generate and kiln cache build
     * would use (--name, else the one derived from the folder) */
    char name[128];
    cli_model_name(dir, name, sizeof name);
    if (com->name) snprintf(name, sizeof name, "%s", com->name);
    const char *root = kcache_root(com->cache_dir);
    kcache_item *items = NULL;
    size_t n_items = 0;
    if (root && kcache_list(root, &items, &n_items)) n_items = 0;
    printf("cache name:     %s%s%s\n", name, root ? " under " : " (no cache root: --cache-dir DIR or KILN_CACHE_DIR)",
           root ? root : "");
    int64_t total = 0;
    for (size_t k = 0; k < sizeof comps / sizeof comps[0]; k++) {
        char *cd = kb_path_join(dir, comps[k]);
        kc_checkpoint *c = NULL;
        if (!cd || !kb_is_dir(cd)) {
            printf("%-16s (none)\n", comps[k]);
            free(cd);
            continue;
        }
        kiln_status s = kc_open(cd, NULL, ka_renamers(), &c);
        if (s) {
            printf("%-16s %s\n", comps[k], kiln_last_error());
            free(cd);
            continue;
        }
        const ka_arch *a = c->config_json ? ka_for_config(c->config_json) : NULL;
        int64_t params = 0, by[KILN_DTYPE_COUNT] = {0};
        for (size_t i = 0; i < c->n; i++) {
            params += kc_numel(&c->t[i]);
            by[c->t[i].dtype]++;
        }
        char size[32];
        printf("%-16s %s: %.2f M parameters in %zu tensors,", comps[k], a ? a->name : "(no kiln family)",
               (double)params / 1e6, c->n);
        for (int t = 1; t < KILN_DTYPE_COUNT; t++)
            if (by[t]) printf(" %s x %lld", kiln_dtype_name((kiln_dtype)t), (long long)by[t]);
        printf(", %s", kb_human_bytes((double)c->bytes_on_disk, size, sizeof size));
        /* a component's caches name its folder's absolute path as their source */
        char real[PATH_MAX];
        const char *which = NULL;
        int nc = root ? cached(items, n_items, name, comps[k], realpath(cd, real) ? real : cd, &which) : 0;
        if (nc) printf(", cached (%s%s)\n", which, nc > 1 ? " and others" : "");
        else printf(", %s\n", root ? "not cached" : "no cache root");
        total += c->bytes_on_disk;
        kc_close(c);
        free(cd);
    }
    free(items);
    char size[32];
    printf("size on disk:   %s\n", kb_human_bytes((double)total, size, sizeof size));
    printf("kernels:        bf16: %s\n                f32: %s\n", kiln_kernels(KILN_BF16), kiln_kernels(KILN_F32));
    return 0;
}

/* An all-in-one file: every component under its prefix, from the header
 * alone (nothing converts), its config's source and its cache state */
static int info_single_file(const char *file, const cli_common *com) {
    static const char *const comps[] = {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"};
    kp_source src;
    kiln_status s = kp_source_init(file, com->tokenizers, &src);
    if (s) return cli_fail("info", s);
    char name[128], real[PATH_MAX];
    cli_model_name(file, name, sizeof name);
    if (com->name) snprintf(name, sizeof name, "%s", com->name);
    if (!realpath(file, real)) snprintf(real, sizeof real, "%s", file);
    const char *root = kcache_root(com->cache_dir);
    kcache_item *items = NULL;
    size_t n_items = 0;
    if (root && kcache_list(root, &items, &n_items)) n_items = 0;
    printf("all-in-one:     %s\n", file);
    printf("tokenizers:     %s\n", com->tokenizers ? com->tokenizers : "(none: kiln generate needs --tokenizers DIR)");
    printf("cache name:     %s%s%s\n", name, root ? " under " : " (no cache root: --cache-dir DIR or KILN_CACHE_DIR)",
           root ? root : "");
    int64_t total = 0;
    for (size_t k = 0; k < sizeof comps / sizeof comps[0]; k++) {
        const char *prefix = kp_component_prefix(file, comps[k]);
        if (!prefix) continue; /* not a part of this kind of file (a Flux file has no text_encoder_3) */
        kc_checkpoint *c = NULL;
        if (!kp_has_component(&src, comps[k])) {
            printf("%-16s %s* (none)\n", comps[k], prefix);
            continue;
        }
        if ((s = kc_open_part(file, prefix, NULL, NULL, ka_renamers(), &c))) {
            printf("%-16s %s* %s\n", comps[k], prefix, kiln_last_error());
            continue;
        }
        int64_t params = 0, by[KILN_DTYPE_COUNT] = {0};
        for (size_t i = 0; i < c->n; i++) {
            params += kc_numel(&c->t[i]);
            by[c->t[i].dtype]++;
        }
        char *json = NULL, size[32], source[PATH_MAX + 128];
        int inferred = 0;
        const ka_arch *a = NULL;
        if (kp_part_config(file, comps[k], com->tokenizers, &json, &inferred)) json = NULL;
        if (json) a = ka_for_config(json);
        printf("%-16s %s* %s: %.2f M parameters in %zu tensors,", comps[k], prefix, a ? a->name : "(no config)",
               (double)params / 1e6, c->n);
        for (int t = 1; t < KILN_DTYPE_COUNT; t++)
            if (by[t]) printf(" %s x %lld", kiln_dtype_name((kiln_dtype)t), (long long)by[t]);
        printf(", %s, %s names", kb_human_bytes((double)c->bytes_on_disk, size, sizeof size),
               strcmp(c->layout, "diffusers") ? c->layout : "stored"); /* renamed by a family's renamer, or as stored */
        if (json) printf(", config %s", inferred ? "inferred from the shapes" : "from --tokenizers");
        else printf(", no config (%s)", kiln_last_error());
        snprintf(source, sizeof source, "%s#%s", real, prefix);
        const char *which = NULL;
        int nc = root ? cached(items, n_items, name, comps[k], source, &which) : 0;
        if (nc) printf(", cached (%s%s)\n", which, nc > 1 ? " and others" : "");
        else printf(", %s\n", root ? "not cached" : "no cache root");
        total += c->bytes_on_disk;
        free(json);
        kc_close(c);
    }
    free(items);
    char size[32];
    printf("size on disk:   %s\n", kb_human_bytes((double)total, size, sizeof size));
    return 0;
}

int cmd_info(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            printf("usage: %s\n\nPrints the architecture, parameter count, weight dtypes and size on "
                   "disk of MODEL\n(a diffusers folder or a single safetensors checkpoint).\n\n"
                   "  --config FILE   config.json for a single-file checkpoint whose heads cannot be inferred\n"
                   "  --cache-dir DIR the cache root whose state is listed (default: KILN_CACHE_DIR, else\n"
                   "                  $XDG_CACHE_HOME/kiln or ~/.cache/kiln)\n"
                   "  --name NAME     the model name the caches are under (default: derived from PIPELINE)\n"
                   "  --tokenizers DIR an all-in-one file's tokenizer*/ folders and optional configs, laid\n"
                   "                  out as a diffusers pipeline folder\n"
                   "A pipeline folder, or an all-in-one single file (SD3 with its text encoders and VAE;\n"
                   "--tokenizers DIR), lists its components with sizes, dtypes, their cache state under\n"
                   "--cache-dir / KILN_CACHE_DIR and, for a single file, where their configs come from\n"
                   "(--tokenizers DIR, else inferred).\n",
                   k_usage);
            return 0;
        }
        if ((r = cli_common_opt("info", argc, argv, &i, &com))) {
            if (r < 0) return 2;
            continue;
        }
        if (argv[i][0] == '-') return cli_usage_error("info", k_usage, "unknown option %s", argv[i]);
        if (model) return cli_usage_error("info", k_usage, "more than one MODEL given");
        model = argv[i];
    }
    if (!model) return cli_usage_error("info", k_usage, "MODEL is required");
    if (kb_is_file(model) && cli_is_pipeline(model, &com)) { /* an all-in-one file */
        int rc = info_single_file(model, &com);
        cli_common_finish(&com);
        return rc;
    }
    char *index = kb_is_dir(model) ? kb_path_join(model, "model_index.json") : NULL;
    int pipeline = index && kb_is_file(index);
    free(index);
    if (pipeline) {
        int rc = info_pipeline(model, &com);
        cli_common_finish(&com);
        return rc;
    }
    kiln_model *m;
    kiln_open_opts o = {.config_path = com.config, .reference = 1}; /* no packing: info only reads */
    kiln_status s = kiln_model_open(model, &o, &m);
    if (s) return cli_fail("info", s);
    const kiln_config *c = kiln_model_config(m);
    kiln_model_info inf;
    kiln_model_get_info(m, &inf);
    char size[32];
    printf("model:          %s\n", model);
    printf("layout:         %s\n", inf.layout);
    printf("family:         %s\n", kiln_model_family(m));
    if (c) { /* an SD3 backbone: what its config says */
        printf("architecture:   SD3Transformer2DModel (MMDiT%s%s)\n", c->qk_norm_rms ? ", RMS qk-norm" : "",
               c->dual_attention_mask ? ", dual attention" : "");
        printf("layers:         %d joint blocks", c->num_layers);
        if (c->dual_attention_mask) {
            printf(" (attn2 in");
            for (int i = 0; i < c->num_layers; i++)
                if (c->dual_attention_mask >> i & 1) printf(" %d", i);
            printf(")");
        }
        printf("\nwidth:          %d = %d heads x %d\n", c->num_attention_heads * c->attention_head_dim,
               c->num_attention_heads, c->attention_head_dim);
        printf("patch:          %d, in %d / out %d channels, position table %dx%d patches\n",
               c->patch_size, c->in_channels, c->out_channels, c->pos_embed_max_size, c->pos_embed_max_size);
        printf("conditioning:   context %d -> %d, pooled %d\n", c->joint_attention_dim,
               c->caption_projection_dim, c->pooled_projection_dim);
        printf("latent range:   up to %dx%d (multiples of %d)\n", c->pos_embed_max_size * c->patch_size,
               c->pos_embed_max_size * c->patch_size, c->patch_size);
    } else { /* any other family: its config as it writes it */
        char *js = kiln_model_config_json(m);
        printf("config:         %s\n", js ? js : "?");
        free(js);
    }
    printf("inputs:        ");
    for (int i = 0; i < kiln_model_n_inputs(m); i++) printf("%s %s", i ? "," : "", kiln_model_input_name(m, i));
    printf("\noutputs:       ");
    for (int i = 0; i < kiln_model_n_outputs(m); i++) printf("%s %s", i ? "," : "", kiln_model_output_name(m, i));
    printf("\nquant layers:   %s (the --quant default)\n", kiln_family_quant_layers(kiln_model_family(m)));
    printf("parameters:     %lld (%.2f M) in %lld tensors\n", (long long)inf.n_params,
           (double)inf.n_params / 1e6, (long long)inf.n_tensors);
    printf("dtypes:        ");
    for (int t = 1; t < KILN_DTYPE_COUNT; t++)
        if (inf.n_by_dtype[t]) printf(" %s x %lld", kiln_dtype_name((kiln_dtype)t), (long long)inf.n_by_dtype[t]);
    printf("\nsize on disk:   %s\n", kb_human_bytes((double)inf.bytes_on_disk, size, sizeof size));
    printf("kernels:        bf16: %s\n                f32: %s\n", kiln_kernels(KILN_BF16), kiln_kernels(KILN_F32));
    kiln_model_free(m);
    cli_common_finish(&com);
    return 0;
}
