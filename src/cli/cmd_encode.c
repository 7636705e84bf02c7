/* cmd_encode.c - kiln encode PIPELINE --prompt TEXT ... --output FILE: the
 * conditioning of an SD3 pipeline folder, as diffusers' encode_prompt gives
 * it, under its names; the file kiln generate takes with --cond. */
#include "base/base.h"
#include "cli.h"
#include "pipeline/pipeline_files.h"
#include "pipeline/prompts.h"

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
           "  --prompts-file FILE        one prompt per line (a batch), or per line a JSON object as kiln\n"
           "                             generate reads it: its prompt, negative_prompt and images_per_prompt\n"
           "                             apply (seed, steps, guidance and size are generate's)\n"
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
    if (cli_check_st_output("encode", output)) return 1; /* before any work */
    /* the prompts file as kiln generate reads it (pipeline/prompts.h): each
     * prompt with its own negative prompt and image count */
    kp_prompt *reqs = NULL, one_req = {.prompt = (char *)prompt, .negative = NULL, .seed = -1};
    int nreq = 1, rc = 1, sampler_keys = 0;
    const char **all = NULL;
    float *pe = NULL, *pp = NULL, *ne = NULL, *np = NULL, *rows[4] = {NULL, NULL, NULL, NULL};
    kiln_sd3_text *t = NULL;
    if (pfile) {
        kiln_status ps = kp_prompts_read(pfile, &reqs, &nreq);
        if (ps) {
            rc = cli_fail("encode", ps);
            goto done;
        }
    }
    kp_prompt *q = pfile ? reqs : &one_req;
    long n = 0; /* rows: images, over every prompt */
    for (int r = 0; r < nreq; r++) {
        n += q[r].images ? q[r].images : ipp;
        sampler_keys |= q[r].seed >= 0 || q[r].steps || q[r].width || q[r].height || q[r].has_guidance;
        if (n > 1024) {
            cli_error("encode", "%s: more than 1024 rows (prompts x images per prompt) by prompt %d: at most 1024",
                      pfile ? pfile : "--prompt", r + 1);
            goto done;
        }
    }
    if (sampler_keys)
        fprintf(stderr, "encode: %s: seed, steps, guidance, width and height are kiln generate's settings; encode "
                "uses each line's prompt, negative_prompt and images_per_prompt\n", pfile);
    /* a FluxPipeline folder: its conditioning is not SD3's (nothing converts first) */
    char *ip = pipe && kb_is_dir(pipe) ? kb_path_join(pipe, "model_index.json") : NULL, *itext = NULL;
    size_t ilen = 0;
    kp_index ix;
    int flux = ip && kb_is_file(ip) && !kb_read_file(ip, &itext, &ilen) && !kp_index_parse(itext, ilen, ip, &ix) &&
               !strcmp(ix.cls, "FluxPipeline");
    kb_clear_error();
    free(ip);
    free(itext);
    if (flux) {
        rc = cli_error("encode", "%s is a FluxPipeline folder: kiln encode writes SD3's conditioning (for kiln generate "
                       "TRANSFORMER --cond); a Flux pipeline encodes inside kiln generate PIPELINE, whose --tensor-output "
                       "keeps its prompt_embeds and pooled_prompt_embeds", pipe);
        goto done;
    }
    char name[128];
    kiln_load_opts o = cli_load_opts(pipe, &com, name, sizeof name);
    kiln_status s = kiln_sd3_text_open_file(pipe, com.tokenizers, &o, &t); /* a folder, or an all-in-one file */
    if (s) {
        rc = cli_fail("encode", s);
        goto done;
    }
    int64_t pes[3], pps[2], nes[3], nps[2];
    /* every prompt and negative prompt once, in one encoder batch [prompts |
     * negatives] as kiln generate PIPELINE encodes them (each encoder's
     * weights read once; two batches only past kiln_sd3_encode's 1024
     * rows); then each prompt's row repeated for its images: a row does not
     * depend on its batch, so these are the rows a batch of them gives */
    int one_batch = 2 * nreq <= 1024;
    double t0 = kb_now();
    if (!(all = malloc(sizeof(char *) * (size_t)(2 * nreq)))) s = kb_fail(KILN_ERR_NOMEM, "out of memory");
    for (int k = 0; all && k < nreq; k++) {
        all[k] = q[k].prompt;
        all[nreq + k] = q[k].negative ? q[k].negative : neg;
    }
    if (!s && one_batch) {
        s = kiln_sd3_encode(t, all, 2 * nreq, 1, (int)msl, &pe, pes, &pp, pps);
        if (!s) { /* the second half: views into pe / pp, not freed apart */
            pes[0] = pps[0] = nes[0] = nps[0] = nreq;
            memcpy(nes + 1, pes + 1, sizeof(int64_t) * 2);
            nps[1] = pps[1];
            ne = pe + (size_t)(pes[0] * pes[1] * pes[2]);
            np = pp + (size_t)(pps[0] * pps[1]);
        }
    } else if (!s) {
        s = kiln_sd3_encode(t, all, nreq, 1, (int)msl, &pe, pes, &pp, pps);
        if (!s) s = kiln_sd3_encode(t, all + nreq, nreq, 1, (int)msl, &ne, nes, &np, nps);
    }
    size_t esz = s ? 0 : (size_t)(pes[1] * pes[2]), psz = s ? 0 : (size_t)pps[1];
    const float *src[4] = {pe, pp, ne, np};
    size_t per[4] = {esz, psz, esz, psz};
    for (int k = 0; !s && k < 4; k++) {
        if (!(rows[k] = malloc(sizeof(float) * per[k] * (size_t)n))) {
            s = kb_fail(KILN_ERR_NOMEM, "out of memory for %ld rows", n);
            break;
        }
        for (int r = 0, at = 0; r < nreq; r++)
            for (long j = 0; j < (q[r].images ? q[r].images : ipp); j++, at++)
                memcpy(rows[k] + (size_t)at * per[k], src[k] + (size_t)r * per[k], sizeof(float) * per[k]);
    }
    if (!s) {
        kiln_tensor w[4] = {{"prompt_embeds", KILN_F32, 3, {n, pes[1], pes[2]}, rows[0]},
                            {"pooled_prompt_embeds", KILN_F32, 2, {n, pps[1]}, rows[1]},
                            {"negative_prompt_embeds", KILN_F32, 3, {n, nes[1], nes[2]}, rows[2]},
                            {"negative_pooled_prompt_embeds", KILN_F32, 2, {n, nps[1]}, rows[3]}};
        s = kiln_tensors_write(output, 4, w);
    }
    if (s) rc = cli_fail("encode", s);
    else {
        fprintf(stderr, "encode: %d prompt%s, %ld row%s -> prompt_embeds [%ld, %lld, %lld], pooled [%ld, %lld] in %.1f ms -> %s\n",
                nreq, nreq == 1 ? "" : "s", n, n == 1 ? "" : "s", n, (long long)pes[1], (long long)pes[2], n,
                (long long)pps[1], (kb_now() - t0) * 1e3, output);
        rc = 0;
    }
    if (!one_batch) {
        free(ne);
        free(np);
    }
done:
    free(all);
    free(pe);
    free(pp);
    for (int k = 0; k < 4; k++) free(rows[k]);
    kiln_sd3_text_free(t);
    if (pfile) kp_prompts_free(reqs, nreq);
    cli_common_finish(&com);
    return rc;
}
