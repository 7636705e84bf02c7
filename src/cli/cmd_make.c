/* cmd_make.c - kiln make-model: a seeded model of any family's config (and
 * matching inputs; an SD3 conditioning file), for benchmarks, tests and
 * trying kiln without weights. */
#include "base/base.h"
#include "cli.h"
#include "arch/sd3/sd3.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char k_usage[] =
    "kiln make-model DIR [--config FILE | --demo] [--weights bf16|f16|f32] [--seed N] [--force]\n"
    "                     [--inputs FILE --latent HxW --context T --batch B] [--cond FILE --context T]\n"
    "       kiln make-model DIR --inputs-only --inputs FILE [--latent HxW --context T --batch B]";

static int help(void) {
    printf("usage: %s\n\n"
           "Writes a model folder DIR (config.json + diffusion_pytorch_model.safetensors, or model.safetensors\n"
           "for the transformers families CLIP and T5) with seeded\n"
           "random weights for the architecture in --config, a config.json of any family kiln runs:\n"
           "SD3Transformer2DModel (with diffusers' sin-cos position table), CLIPTextModelWithProjection,\n"
           "T5EncoderModel, AutoencoderKL (its decoder), FluxTransformer2DModel; --demo: the demo's tiny\n"
           "SD3 model. With --inputs, also writes a `kiln forward` inputs file: the family's inputs by name\n"
           "(SD3: hidden_states, encoder_hidden_states, pooled_projections, timestep; Flux: latents [B,16,H,W]\n"
           "unpacked, encoder_hidden_states, pooled_projections, timestep, guidance for dev), seeded, of the\n"
           "given latent size, context length (defaults: the family's example) and batch; with\n"
           "--inputs-only, for the model already in DIR (nothing else is written).\n"
           "With an SD3 config, --cond writes a `kiln generate` conditioning file (prompt_embeds,\n"
           "pooled_prompt_embeds, negative_prompt_embeds, negative_pooled_prompt_embeds) of T tokens.\n"
           "DIR must be new or empty: a folder that holds anything is refused (a mistyped path would lose\n"
           "a model), unless --force, which overwrites config.json and the weights file in it.\n",
           k_usage);
    return 0;
}

/* 1 (and the first entry's name in first) when dir holds anything */
static int dir_holds(const char *dir, char *first, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int any = 0;
    while (!any && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(first, cap, "%s", e->d_name);
            any = 1;
        }
    closedir(d);
    return any;
}

/* the family's example inputs for dir's config.json, sized as asked (context 0: the example's) */
static int write_inputs(const char *dir, const char *inputs, int B, int H, int W, int T) {
    char *cp = kb_path_join(dir, "config.json"), *json = NULL;
    kiln_status s = cp ? kb_read_file(cp, &json, NULL) : KILN_ERR_NOMEM;
    if (!s) s = kiln_write_example_inputs(json, inputs, B, H, W, T);
    free(cp);
    free(json);
    if (s) return cli_fail("make-model", kb_wrap(s, "--inputs %s", inputs));
    printf("inputs: %s (batch %d", inputs, B);
    if (H) printf(", latent %dx%d", H, W);
    if (T) printf(", %d context tokens", T);
    printf(")\n");
    return 0;
}

int cmd_make(int argc, char **argv) {
    const char *dir = NULL, *config = NULL, *inputs = NULL, *cond = NULL, *v;
    int demo = 0, force = 0, inputs_only = 0, H = 0, W = 0;
    long T = 77, B = 1;
    int T_given = 0; /* --inputs: 0 takes the family's example context */
    uint64_t seed = 1;
    kiln_dtype wdt = KILN_BF16;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if (cli_flag(argv, i, "--demo")) {
            demo = 1;
            continue;
        }
        if (cli_flag(argv, i, "--force")) {
            force = 1;
            continue;
        }
        if (cli_flag(argv, i, "--inputs-only")) {
            inputs_only = 1;
            continue;
        }
        if ((r = cli_opt("make-model", argc, argv, &i, "--config", &config)) ||
            (r = cli_opt("make-model", argc, argv, &i, "--inputs", &inputs)) ||
            (r = cli_opt("make-model", argc, argv, &i, "--cond", &cond))) {
            if (r < 0) return 2;
        } else if ((r = cli_opt("make-model", argc, argv, &i, "--weights", &v))) {
            if (r < 0) return 2;
            if (!strcmp(v, "bf16")) wdt = KILN_BF16;
            else if (!strcmp(v, "f16")) wdt = KILN_F16;
            else if (!strcmp(v, "f32")) wdt = KILN_F32;
            else return cli_usage_error("make-model", k_usage, "--weights %s: expected bf16, f16 or f32", v);
        } else if ((r = cli_opt("make-model", argc, argv, &i, "--seed", &v))) {
            if (r < 0 || cli_parse_u64("make-model", "--seed", v, &seed)) return 2;
        } else if ((r = cli_opt("make-model", argc, argv, &i, "--latent", &v))) {
            if (r < 0 || cli_parse_hw("make-model", "--latent", v, &H, &W)) return 2;
        } else if ((r = cli_opt("make-model", argc, argv, &i, "--context", &v))) {
            if (r < 0 || cli_parse_int("make-model", "--context", v, 1, 1 << 16, &T)) return 2;
            T_given = 1;
        } else if ((r = cli_opt("make-model", argc, argv, &i, "--batch", &v))) {
            if (r < 0 || cli_parse_int("make-model", "--batch", v, 1, 64, &B)) return 2;
        } else if (argv[i][0] == '-') {
            return cli_usage_error("make-model", k_usage, "unknown option %s", argv[i]);
        } else if (dir) {
            return cli_usage_error("make-model", k_usage, "more than one DIR given");
        } else {
            dir = argv[i];
        }
    }
    if (inputs_only) { /* DIR's model stays as it is: only the inputs file is written */
        if (!dir || !inputs || config || demo || cond || force)
            return cli_usage_error("make-model", k_usage, "--inputs-only takes DIR (a model folder) and --inputs FILE, and "
                                   "none of --config, --demo, --cond, --force");
        char *cp = kb_path_join(dir, "config.json");
        int there = cp && kb_is_file(cp);
        free(cp);
        if (!there) return cli_error("make-model", "%s holds no model (no config.json): --inputs-only writes inputs for "
                                     "the model already in DIR", dir);
        return write_inputs(dir, inputs, (int)B, H, W, T_given ? (int)T : 0) ? 1 : 0;
    }
    if (!dir || (!config && !demo)) return cli_usage_error("make-model", k_usage, "DIR and --config (or --demo) are required");
    char first[256];
    if (kb_is_file(dir)) return cli_error("make-model", "%s is a file; DIR is the folder the model is written to", dir);
    if (!force && dir_holds(dir, first, sizeof first))
        return cli_error("make-model", "%s is not empty (it holds %s): give a new or empty folder, or --force to "
                         "overwrite its config.json and weights", dir, first);
    if (force) /* the weights an earlier model left under another name would win over the new ones */
        for (int k = 0; k < 2; k++) {
            char *p = kb_path_join(dir, k ? "model.safetensors" : "diffusion_pytorch_model.safetensors");
            if (p) unlink(p);
            free(p);
        }
    kiln_config c = kiln_config_demo();
    kiln_status s = KILN_OK;
    const char *family = "sd3";
    if (config) { /* any family's config: the one that claims it writes it */
        char *json = NULL;
        s = kb_read_file(config, &json, NULL);
        if (!s) {
            const char *f = kiln_config_family(json);
            int sd3 = f && !strcmp(f, "sd3");
            if (f && !sd3 && cond) {
                free(json);
                return cli_usage_error("make-model", k_usage, "--cond is for an SD3 transformer's config; %s "
                                       "is another model's", config);
            }
            if (sd3) s = sd3_config_parse(json, &c); /* the SD3 fields --cond sizes */
            if (!s) s = kiln_write_seeded_model_json(dir, json, seed, wdt, &family);
            if (s) s = kb_wrap(s, "%s", config);
        }
        free(json);
    } else
        s = kiln_write_seeded_model(dir, &c, seed, wdt);
    if (s) return cli_fail("make-model", s);
    printf("model: %s (%s, %s weights, seed %llu)\n", dir, family, kiln_dtype_name(wdt), (unsigned long long)seed);
    if (inputs && write_inputs(dir, inputs, (int)B, H, W, T_given ? (int)T : 0)) return 1;
    if (cond) {
        if ((s = cli_write_seeded_cond(cond, &c, (int)T, seed + 100))) return cli_fail("make-model", s);
        printf("cond: %s (%ld tokens, prompt and negative)\n", cond, T);
    }
    return 0;
}
