/* cmd_demo.c - kiln demo: the README's main job on an embedded default.
 * Makes a tiny SD3.5-style model from seeded weights, writes it as a
 * diffusers folder, generates at two widths and prints where the time went. */
#include "arch/sd3/sd3.h"
#include "base/base.h"
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char k_usage[] = "kiln demo [--dir DIR] [--steps N] [--threads N]";

static int help(void) {
    printf("usage: %s\n\n"
           "Writes an embedded tiny SD3.5-architecture model (seeded weights) to DIR/model as a\n"
           "diffusers folder, seeded conditioning to DIR/cond.safetensors, then generates latents at\n"
           "two widths (DIR/demo-HxW.safetensors + .png) and prints the timing ledger. The weights go\n"
           "through the weight cache (KILN_CACHE_DIR, or DIR/cache): the first run converts and\n"
           "publishes, later runs map it. The backbone is compiled once into a package with a\n"
           "dynamic width (beside the cache); later runs find it and start from it.\n\n"
           "  --dir DIR     where to put everything (default: kiln-demo)\n"
           "  --steps N     sampler steps (default 8)\n",
           k_usage);
    return 0;
}

int cmd_demo(int argc, char **argv) {
    const char *dir = "kiln-demo", *v;
    long steps = 8;
    cli_common com = cli_common_defaults();
    com.timings = 1;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if ((r = cli_common_opt("demo", argc, argv, &i, &com)) ||
            (r = cli_opt("demo", argc, argv, &i, "--dir", &dir))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("demo", argc, argv, &i, "--steps", &v))) {
            if (r < 0 || cli_parse_int("demo", "--steps", v, 1, 1000, &steps)) return 2;
            continue;
        }
        return cli_usage_error("demo", k_usage, "unknown argument %s", argv[i]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep stdout and the stderr progress in order */
    kiln_config cfg = kiln_config_demo();
    char *model = kb_path_join(dir, "model"), *cond = kb_path_join(dir, "cond.safetensors");
    char *cfg_file = model ? kb_path_join(model, "config.json") : NULL;
    int rc = 1;
    kiln_model *m = NULL;
    st_file *cf = NULL;
    if (!model || !cond || !cfg_file) goto done;
    kiln_status s;
    printf("kiln demo: tiny SD3.5-style MMDiT (%d blocks, width %d, RMS qk-norm, dual attention in block 0)\n",
           cfg.num_layers, cfg.num_attention_heads * cfg.attention_head_dim);
    double t0 = kb_now();
    if (kb_is_file(cfg_file)) {
        printf("  model:  %s (already there)\n", model);
    } else {
        if ((s = kiln_write_seeded_model(model, &cfg, 2026, KILN_BF16))) {
            rc = cli_fail("demo", s);
            goto done;
        }
        kb_ledger_add("demo_write_model", kb_now() - t0, "seeded bf16 weights");
        printf("  model:  %s (written from seed 2026, bf16 weights)\n", model);
    }
    if ((s = cli_write_seeded_cond(cond, &cfg, 32, 101))) {
        rc = cli_fail("demo", s);
        goto done;
    }
    printf("  cond:   %s (seeded prompt embeddings, 32 tokens)\n", cond);
    /* the weight cache: KILN_CACHE_DIR, or DIR/cache; a miss on the first run, a hit after */
    char *cache = NULL;
    if (!com.cache_dir && !(getenv("KILN_CACHE_DIR") && *getenv("KILN_CACHE_DIR")))
        com.cache_dir = cache = kb_path_join(dir, "cache");
    if (!com.name) com.name = "kiln-demo-tiny";
    double tl = kb_now();
    s = cli_load_model(model, &com, &m);
    free(cache);
    com.cache_dir = NULL;
    if (s || (s = st_open(cond, &cf))) {
        rc = cli_fail("demo", s);
        goto done;
    }
    const char *origin = kiln_model_origin(m);
    printf("  weights: %s in %.1f ms: %s\n         %s\n", origin, (kb_now() - tl) * 1e3,
           !strcmp(origin, "hit") ? "mapped the cache, no conversion"
                                  : "converted the checkpoint and published the cache (the next run maps it)",
           kiln_model_cache_path(m));
    /* the backbone: compiled once into a package with a dynamic width (published beside the
     * weights); a later process finds it and starts from it */
    kiln_compile_opts co = kiln_compile_defaults();
    char dims[64]; /* the latent width over 32..48: patch columns 16..24 */
    snprintf(dims, sizeof dims, "%s=16:24", ka_sd3.sym[SD3_SYM_W]);
    co.dims = dims;
    co.batch = 2;
    co.height = 32;
    co.width = 32;
    co.context_len = 32;
    kiln_compile_result cr;
    double tc = kb_now();
    if ((s = kiln_compile(m, &co, &cr))) {
        printf("  package: not available (%s); running the planned executor\n", kiln_last_error());
    } else {
        printf("  package: %s in %.1f ms: %s\n           %s\n", cr.reused ? "found" : "compiled", (kb_now() - tc) * 1e3,
               cr.reused ? "published by an earlier run; this process starts from it"
                         : "the backbone with a dynamic width (latent 32..48) as C, built into a weightless package",
               cr.path);
    }
    fflush(stdout);
    int widths[2] = {32, 48};
    for (int k = 0; k < 2; k++) {
        int64_t sh[3];
        kiln_generate_opts o = kiln_generate_defaults();
        o.steps = (int)steps;
        o.guidance = 5.0;
        o.latent_h = 32;
        o.latent_w = widths[k];
        o.seed = 7;
        o.cond = cli_tensor("demo", cf, "prompt_embeds", 3, sh);
        o.cond_pooled = cli_tensor("demo", cf, "pooled_prompt_embeds", 2, sh);
        o.uncond = cli_tensor("demo", cf, "negative_prompt_embeds", 3, sh);
        o.uncond_pooled = cli_tensor("demo", cf, "negative_pooled_prompt_embeds", 2, sh);
        o.context_len = 32;
        char *out = kb_strfmt("%s/demo-%dx%d.safetensors", dir, o.latent_h, o.latent_w);
        rc = out && o.cond && o.cond_pooled && o.uncond && o.uncond_pooled
                 ? cli_generate_run("demo", m, &o, out, 0)
                 : 1;
        free(out);
        free((void *)o.cond);
        free((void *)o.cond_pooled);
        free((void *)o.uncond);
        free((void *)o.uncond_pooled);
        if (rc) goto done;
    }
    const char *env_cache = getenv("KILN_CACHE_DIR");
    /* the demo's cache and name, and a width inside the package's range
     * (latent 32..48), so that the next run maps the weights
     * and runs the compiled package */
    char cache_opt[1100] = "";
    if (!(env_cache && *env_cache)) snprintf(cache_opt, sizeof cache_opt, " --cache-dir %s/cache", dir);
    printf("\nnext:  kiln info %s\n"
           "       kiln generate %s --name %s%s --cond %s --latent 32x40 --guidance 5 --output %s/out.safetensors\n"
           "       kiln package ls%s\n",
           model, model, com.name, cache_opt, cond, dir, cache_opt);
done:
    free(model);
    free(cond);
    free(cfg_file);
    st_close(cf);
    kiln_model_free(m);
    cli_common_finish(&com);
    return rc;
}
