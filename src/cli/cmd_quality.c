/* cmd_quality.c - kiln quality MODEL --quant SCHEME: the quality gate */
#include "base/base.h"
#include "arch/arch.h"
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char k_usage[] =
    "kiln quality MODEL --quant int8|fp8 [--latent HxW[,HxW...]] [--steps N] [--guidance G]\n"
    "                    [--seed N] [--cond FILE | --context T] [--max-error E] [options]";

static int help(void) {
    printf("usage: %s\n\n"
           "The quality gate of a quantized backbone: the same sampler request (same noise, same\n"
           "conditioning) runs through MODEL unquantized (--dtype, default bf16) and quantized\n"
           "(--quant), at each latent size, and every step's latents are compared. Prints the\n"
           "relative L2 error and PSNR of the final latents and the worst step per size, then\n"
           "PASS or FAIL against the gate; exits 1 on FAIL. A model of another family (Flux, a\n"
           "text encoder) runs one forward of its family's seeded example instead (no sampling).\n\n"
           "  --quant SCHEME     int8 or fp8 (required); --quant-layers as elsewhere\n"
           "  --latent LIST      latent sizes, e.g. 32x32,32x48 (the default, within the model's range)\n"
           "  --steps N          sampler steps (default 8)\n"
           "  --guidance G       guidance scale (default 5; CFG, batch 2)\n"
           "  --seed N           noise seed, and the conditioning's when --cond is not given (default 1)\n"
           "  --cond FILE        conditioning as for kiln generate (default: seeded, --context tokens)\n"
           "  --context T        tokens of the seeded conditioning (default 77)\n"
           "  --max-error E      the gate: final-latent relative L2 error (default %g)\n%s",
           k_usage, KILN_QUALITY_MAX_REL_L2, cli_common_help);
    return 0;
}

static int parse_sizes(const char *s, kiln_quality_opts *o) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    o->n_sizes = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_sizes == KILN_QUALITY_MAX_SIZES) {
            cli_error("quality", "--latent %s: at most %d sizes", s, KILN_QUALITY_MAX_SIZES);
            return -1;
        }
        if (cli_parse_hw("quality", "--latent", t, &o->latent_h[o->n_sizes], &o->latent_w[o->n_sizes])) return -1;
        o->n_sizes++;
    }
    if (!o->n_sizes) {
        cli_error("quality", "--latent %s: expected sizes like 32x32,32x48", s);
        return -1;
    }
    return 0;
}

int cmd_quality(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    kiln_quality_opts q = kiln_quality_defaults();
    const char *model = NULL, *cond_path = NULL, *v;
    int quant_given = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        long n;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if (!strncmp(argv[i], "--quant", 7) && strncmp(argv[i], "--quant-layers", 14)) quant_given = 1;
        if ((r = cli_common_opt("quality", argc, argv, &i, &com)) ||
            (r = cli_opt("quality", argc, argv, &i, "--cond", &cond_path))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("quality", argc, argv, &i, "--latent", &v))) {
            if (r < 0 || parse_sizes(v, &q)) return 2;
            continue;
        }
        if ((r = cli_opt("quality", argc, argv, &i, "--steps", &v))) {
            if (r < 0 || cli_parse_int("quality", "--steps", v, 1, 1000, &n)) return 2;
            q.steps = (int)n;
            continue;
        }
        if ((r = cli_opt("quality", argc, argv, &i, "--context", &v))) {
            if (r < 0 || cli_parse_int("quality", "--context", v, 1, 100000, &n)) return 2;
            q.context_len = (int)n;
            continue;
        }
        if ((r = cli_opt("quality", argc, argv, &i, "--guidance", &v))) {
            if (r < 0 || cli_parse_double("quality", "--guidance", v, &q.guidance)) return 2;
            continue;
        }
        if ((r = cli_opt("quality", argc, argv, &i, "--max-error", &v))) {
            if (r < 0 || cli_parse_double("quality", "--max-error", v, &q.max_rel_l2)) return 2;
            if (q.max_rel_l2 <= 0) return cli_usage_error("quality", k_usage, "--max-error %s: must be positive", v);
            continue;
        }
        if ((r = cli_opt("quality", argc, argv, &i, "--seed", &v))) {
            if (r < 0 || cli_parse_u64("quality", "--seed", v, &q.seed)) return 2;
            continue;
        }
        if (argv[i][0] == '-') return cli_usage_error("quality", k_usage, "unknown option %s", argv[i]);
        if (model) return cli_usage_error("quality", k_usage, "more than one MODEL given");
        model = argv[i];
    }
    if (!model) return cli_usage_error("quality", k_usage, "MODEL is required");
    if (!quant_given || com.quant == KILN_QUANT_NONE)
        return cli_usage_error("quality", k_usage, "--quant int8 or --quant fp8 is required (the scheme to check)");

    kiln_model *mb = NULL, *mq = NULL;
    st_file *cf = NULL;
    float *ce = NULL, *cp = NULL, *ue = NULL, *up = NULL;
    int rc = 1;
    cli_common base = com;
    base.quant = KILN_QUANT_NONE;
    /* an SD3 backbone samples; another family (Flux) compares one forward of
     * its example; a family --quant quantizes nothing of (the VAE) is refused
     * before anything converts */
    const char *fam = cli_config_family(model, &com);
    const ka_arch *fa = fam ? ka_find(fam) : NULL;
    kiln_status s = KILN_OK;
    if (fa && !fa->quant_layers)
        s = kb_fail(KILN_ERR_INVALID_ARG, "%s is a %s model (%s); --quant quantizes none of its layers: kiln quality gates "
                    "an SD3 or Flux transformer or a text encoder", model, fam, fa->title);
    if (!s) s = cli_load_model(model, &base, &mb);
    int sampled = !s && !strcmp(kiln_model_family(mb), "sd3");
    if (!s && !sampled && cond_path)
        s = kb_fail(KILN_ERR_INVALID_ARG, "--cond is for an SD3 backbone (sampled); %s is a %s model, checked on one "
                    "forward of its example", model, kiln_model_family(mb));
    if (!s) s = cli_load_model(model, &com, &mq);
    if (s) {
        rc = cli_fail("quality", s);
        goto done;
    }
    if (cond_path) {
        int64_t sh[3], sp[2];
        if ((s = st_open(cond_path, &cf))) {
            rc = cli_fail("quality", s);
            goto done;
        }
        if (!(ce = cli_tensor("quality", cf, "prompt_embeds", 3, sh)) ||
            !(cp = cli_tensor("quality", cf, "pooled_prompt_embeds", 2, sp)) ||
            !(ue = cli_tensor("quality", cf, "negative_prompt_embeds", 3, sh)) ||
            !(up = cli_tensor("quality", cf, "negative_pooled_prompt_embeds", 2, sp)))
            goto done;
        const kiln_config *c = kiln_model_config(mb);
        if (sh[2] != c->joint_attention_dim || sp[1] != c->pooled_projection_dim) {
            cli_error("quality", "%s: conditioning is [1, %lld, %lld] / [1, %lld]; the model takes [1, T, %d] / [1, %d]",
                      cond_path, (long long)sh[1], (long long)sh[2], (long long)sp[1], c->joint_attention_dim,
                      c->pooled_projection_dim);
            goto done;
        }
        q.context_len = (int)sh[1];
        q.cond = ce, q.cond_pooled = cp, q.uncond = ue, q.uncond_pooled = up;
    }
    kiln_model_info ib, iq;
    kiln_model_get_info(mb, &ib);
    kiln_model_get_info(mq, &iq);
    const char *bname = com.dtype == KILN_F32 ? "f32" : "bf16", *qname = kiln_quant_name(com.quant);
    if (sampled)
        printf("quality: %s against %s (%lld linear weights quantized); weights %s %.2f MB, %s %.2f MB; %d steps, "
               "guidance %g, seed %llu\n", qname, bname, (long long)iq.n_quantized, bname, ib.weight_bytes / 1e6, qname,
               iq.weight_bytes / 1e6, q.steps, q.guidance, (unsigned long long)q.seed);
    else
        printf("quality: %s against %s (%lld linear weights quantized); weights %s %.2f MB, %s %.2f MB; one forward of "
               "the %s family's example\n", qname, bname, (long long)iq.n_quantized, bname, ib.weight_bytes / 1e6, qname,
               iq.weight_bytes / 1e6, kiln_model_family(mb));
    kiln_quality_report rep;
    if ((s = kiln_quality_check(mb, mq, &q, &rep))) {
        rc = cli_fail("quality", s);
        goto done;
    }
    if (!sampled) {
        printf("quality: %s: output relative L2 error %.3g %s the gate %g\n", rep.pass ? "PASS" : "FAIL", rep.rel_l2,
               rep.pass ? "within" : "above", rep.max_rel_l2);
        rc = rep.pass ? 0 : 1;
        goto done;
    }
    printf("| latent | final rel L2 | final PSNR dB | worst step rel L2 (step) |\n|---|---|---|---|\n");
    for (int i = 0; i < rep.n; i++)
        printf("| %dx%d | %.3g | %.1f | %.3g (%d) |\n", rep.c[i].latent_h, rep.c[i].latent_w, rep.c[i].rel_l2,
               rep.c[i].psnr_db, rep.c[i].worst_step_rel_l2, rep.c[i].worst_step);
    printf("quality: %s: final-latent relative L2 error %.3g %s the gate %g (PSNR %.1f dB, worst step %.3g)\n",
           rep.pass ? "PASS" : "FAIL", rep.rel_l2, rep.pass ? "within" : "above", rep.max_rel_l2, rep.psnr_db,
           rep.worst_step_rel_l2);
    rc = rep.pass ? 0 : 1;
done:
    free(ce);
    free(cp);
    free(ue);
    free(up);
    st_close(cf);
    kiln_model_free(mb);
    kiln_model_free(mq);
    cli_common_finish(&com);
    return rc;
}
