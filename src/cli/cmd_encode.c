/* cmd_encode.c - kiln encode PIPELINE --prompt TEXT ... --output FILE: the
 * conditioning of an SD3 pipeline folder, as diffusers' encode_prompt gives
 * it, under its names; the file kiln generate takes with --cond. */
#include "base/base.h"
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char k_usage[] =
    "kiln encode PIPELINE|FILE [--tokenizers DIR] (--prompt TEXT | --prompts-file FILE) [--negative-prompt TEXT] [--images-per-prompt N]\n"
    "                     [--max-sequence-length N] --output FILE [options]";

static int help(void) {
    printf("usage: %s\n\n"
           "The conditioning of an SD3 / SD3.5 pipeline folder (tokenizer*/, text_encoder*/), exactly as\n"
           "diffusers' StableDiffusion3Pipeline.encode_prompt returns it: CLIP-L and CLIP-G penultimate\n"
           "hidden states joined on features and zero-padded to T5's width, then T5's states\n"
           "(zeros without text_encoder_3), and both CLIP projections as the pooled embedding.\n"
           "The output file holds\n"
           "  prompt_embeds                  [B, 77 + max_sequence_length, T5 width]\n"
           "  pooled_prompt_embeds           [B, P_L + P_G]\n"
           "  negative_prompt_embeds         (the negative prompt, \"\" when none is given)\n"
           "  negative_pooled_prompt_embeds\n"
           "with B = prompts x images per prompt; it feeds `kiln generate TRANSFORMER --cond FILE`.\n"
           "Each encoder goes through the weight cache (component text_encoder, text_encoder_2,\n"
           "text_encoder_3 under --name) and compiled packages like any model.\n"
           "An all-in-one single file (text_encoders.clip_l/clip_g/t5xxl.* inside) takes --tokenizers DIR\n"
           "(docs/cli.md).\n\n"
           "  --prompt TEXT              one prompt (UTF-8)\n"
           "  --prompts-file FILE        one prompt per line (a batch)\n"
           "  --negative-prompt TEXT     for classifier-free guidance (default \"\")\n"
           "  --images-per-prompt N      each prompt's rows repeated N times (default 1)\n"
           "  --max-sequence-length N    T5 tokens (default 256, at most 512)\n%s",
           k_usage, cli_common_help);
    return 0;
}

int cmd_encode(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    const char *pipe = NULL, *prompt = NULL, *pfile = NULL, *neg = "", *output = NULL, *v;
    long ipp = 1, msl = 256;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if ((r = cli_common_opt("encode", argc, argv, &i, &com)) || (r = cli_opt("encode", argc, argv, &i, "--prompt", &prompt)) ||
            (r = cli_opt("encode", argc, argv, &i, "--prompts-file", &pfile)) ||
            (r = cli_opt("encode", argc, argv, &i, "--negative-prompt", &neg)) ||
            (r = cli_opt("encode", argc, argv, &i, "--output", &output))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("encode", argc, argv, &i, "--images-per-prompt", &v))) {
            if (r < 0 || cli_parse_int("encode", "--images-per-prompt", v, 1, 1024, &ipp)) return 2;
            continue;
        }
        if ((r = cli_opt("encode", argc, argv, &i, "--max-sequence-length", &v))) {
            if (r < 0 || cli_parse_int("encode", "--max-sequence-length", v, 1, 512, &msl)) return 2;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("encode", k_usage, "unknown option %s", argv[i]);
        if (pipe) return cli_usage_error("encode", k_usage, "more than one PIPELINE given");
        pipe = argv[i];
    }
    if (!pipe || !output || (!prompt) == (!pfile))
        return cli_usage_error("encode", k_usage, "PIPELINE, --output and one of --prompt or --prompts-file are required");
    if (cli_check_output("encode", output)) return 1; /* before any work */
    char *text = NULL, **lines = NULL;
    const char *one[1] = {prompt};
    const char *const *prompts = one;
    int n = 1, rc = 1;
    if (pfile) {
        if ((rc = cli_read_lines("encode", pfile, &text, &lines, &n))) goto done;
        rc = 1;
        prompts = (const char *const *)lines;
    }
    if ((long)n * ipp > 1024) {
        cli_error("encode", "%d prompts x %ld images per prompt: a batch of at most 1024", n, ipp);
        goto done;
    }
    char name[128];
    kiln_load_opts o = cli_load_opts(pipe, &com, name, sizeof name);
    kiln_sd3_text *t = NULL;
    kiln_status s = kiln_sd3_text_open_file(pipe, com.tokenizers, &o, &t); /* a folder, or an all-in-one file */
    if (s) {
        rc = cli_fail("encode", s);
        goto done;
    }
    float *pe = NULL, *pp = NULL, *ne = NULL, *np = NULL;
    int64_t pes[3], pps[2], nes[3], nps[2];
    /* the prompts and their negative prompts in one encoder batch, rows
     * [prompts x ipp | negatives x ipp], as kiln generate PIPELINE encodes
     * them (each encoder's weights read once); two batches only where one
     * would pass kiln_sd3_encode's 1024 rows */
    int one_batch = 2L * n * ipp <= 1024;
    const char **all = malloc(sizeof(char *) * (size_t)(2 * n));
    double t0 = kb_now();
    if (!all) s = KILN_ERR_NOMEM;
    for (int k = 0; all && k < n; k++) {
        all[k] = prompts[k];
        all[n + k] = neg;
    }
    if (!s && one_batch) {
        s = kiln_sd3_encode(t, all, 2 * n, (int)ipp, (int)msl, &pe, pes, &pp, pps);
        if (!s) { /* the second half: views into pe / pp, not freed apart */
            pes[0] = pps[0] = nes[0] = nps[0] = (int64_t)n * ipp;
            memcpy(nes + 1, pes + 1, sizeof(int64_t) * 2);
            nps[1] = pps[1];
            ne = pe + (size_t)(pes[0] * pes[1] * pes[2]);
            np = pp + (size_t)(pps[0] * pps[1]);
        }
    } else if (!s) {
        s = kiln_sd3_encode(t, all, n, (int)ipp, (int)msl, &pe, pes, &pp, pps);
        if (!s) s = kiln_sd3_encode(t, all + n, n, (int)ipp, (int)msl, &ne, nes, &np, nps);
    }
    if (!s) {
        kiln_tensor w[4] = {{"prompt_embeds", KILN_F32, 3, {pes[0], pes[1], pes[2]}, pe},
                            {"pooled_prompt_embeds", KILN_F32, 2, {pps[0], pps[1]}, pp},
                            {"negative_prompt_embeds", KILN_F32, 3, {nes[0], nes[1], nes[2]}, ne},
                            {"negative_pooled_prompt_embeds", KILN_F32, 2, {nps[0], nps[1]}, np}};
        s = kiln_tensors_write(output, 4, w);
    }
    if (s) rc = cli_fail("encode", s);
    else {
        fprintf(stderr, "encode: %d prompt%s x %ld -> prompt_embeds [%lld, %lld, %lld], pooled [%lld, %lld] in %.1f ms -> %s\n",
                n, n == 1 ? "" : "s", ipp, (long long)pes[0], (long long)pes[1], (long long)pes[2], (long long)pps[0],
                (long long)pps[1], (kb_now() - t0) * 1e3, output);
        rc = 0;
    }
    free(all);
    free(pe);
    free(pp);
    if (!one_batch) {
        free(ne);
        free(np);
    }
    kiln_sd3_text_free(t);
done:
    free(lines);
    free(text);
    cli_common_finish(&com);
    return rc;
}
