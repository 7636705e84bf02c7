/* cmd_forward.c - kiln forward MODEL --inputs FILE --output FILE */
#include "base/base.h"
#include "cli.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

static const char k_usage[] = "kiln forward MODEL --inputs FILE --output FILE [--repeat N] [options]";

static int help(void) {
    printf("usage: %s\n\n"
           "One backbone call. FILE (safetensors) holds, like the goldens' io.safetensors:\n"
           "  hidden_states          [B, C, H, W]   latent\n"
           "  encoder_hidden_states  [B, T, joint_attention_dim]\n"
           "  pooled_projections     [B, pooled_projection_dim]\n"
           "  timestep               [B]            0..1000 (a single value is used for every batch row)\n"
           "The output file gets `sample` [B, out_channels, H, W] in F32.\n\n"
           "  --repeat N      after one warm-up call, run N more and print\n"
           "                  `forward: median X ms over N runs` (the benchmark line) and\n"
           "                  `weights: B bytes in memory, Q quantized linear weights of QB bytes`\n%s",
           k_usage, cli_common_help);
    return 0;
}

int cmd_forward(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    const char *model = NULL, *inputs = NULL, *output = NULL, *rep = NULL;
    long repeat = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if ((r = cli_common_opt("forward", argc, argv, &i, &com)) ||
            (r = cli_opt("forward", argc, argv, &i, "--inputs", &inputs)) ||
            (r = cli_opt("forward", argc, argv, &i, "--output", &output))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("forward", argc, argv, &i, "--repeat", &rep))) {
            if (r < 0 || cli_parse_int("forward", "--repeat", rep, 1, 100000, &repeat)) return 2;
            continue;
        }
        if (argv[i][0] == '-') return cli_usage_error("forward", k_usage, "unknown option %s", argv[i]);
        if (model) return cli_usage_error("forward", k_usage, "more than one MODEL given");
        model = argv[i];
    }
    if (!model || !inputs || !output)
        return cli_usage_error("forward", k_usage, "MODEL, --inputs and --output are required");
    if (cli_check_output("forward", output)) return 1; /* before any work */

    st_file *in = NULL;
    kiln_model *m = NULL;
    float *hs = NULL, *ctx = NULL, *pooled = NULL, *t = NULL, *ts = NULL, *out = NULL;
    int rc = 1;
    kiln_status s = st_open(inputs, &in);
    if (s) {
        rc = cli_fail("forward", s);
        goto done;
    }
    if ((s = cli_load_model(model, &com, &m))) {
        rc = cli_fail("forward", s);
        goto done;
    }
    const kiln_config *c = kiln_model_config(m);
    int64_t sh[4], sc[3], sp[2], st[1];
    if (!(hs = cli_tensor("forward", in, "hidden_states", 4, sh)) ||
        !(ctx = cli_tensor("forward", in, "encoder_hidden_states", 3, sc)) ||
        !(pooled = cli_tensor("forward", in, "pooled_projections", 2, sp)))
        goto done;
    const st_tensor *tt = st_find(in, "timestep");
    if (!tt) {
        cli_error("forward", "%s: no tensor named timestep", inputs);
        goto done;
    }
    int64_t B = sh[0], nt = st_numel(tt);
    if (tt->ndim > 1 || (nt != B && nt != 1)) {
        cli_error("forward", "%s: timestep must be [B] = [%lld] or a single value", inputs, (long long)B);
        goto done;
    }
    if (!(t = cli_tensor("forward", in, "timestep", tt->ndim, st))) goto done;
    if (sh[1] != c->in_channels) {
        cli_error("forward", "%s: hidden_states has %lld channels, the model takes %d", inputs,
                  (long long)sh[1], c->in_channels);
        goto done;
    }
    if (sc[0] != B || sc[2] != c->joint_attention_dim) {
        cli_error("forward", "%s: encoder_hidden_states is [%lld, %lld, %lld], expected [%lld, T, %d]",
                  inputs, (long long)sc[0], (long long)sc[1], (long long)sc[2], (long long)B,
                  c->joint_attention_dim);
        goto done;
    }
    if (sp[0] != B || sp[1] != c->pooled_projection_dim) {
        cli_error("forward", "%s: pooled_projections is [%lld, %lld], expected [%lld, %d]", inputs,
                  (long long)sp[0], (long long)sp[1], (long long)B, c->pooled_projection_dim);
        goto done;
    }
    /* every size checked before the output is allocated or a size is cast to int */
    if ((s = km_check_sizes(c, B, sh[2], sh[3], sc[1], NULL))) {
        rc = cli_fail("forward", kb_wrap(s, "%s", inputs));
        goto done;
    }
    ts = malloc(sizeof(float) * (size_t)B);
    int64_t so[4] = {B, c->out_channels, sh[2], sh[3]};
    out = malloc(sizeof(float) * (size_t)(so[0] * so[1] * so[2] * so[3]));
    if (!ts || !out) {
        cli_error("forward", "out of memory");
        goto done;
    }
    for (int64_t b = 0; b < B; b++) ts[b] = t[nt == 1 ? 0 : b];
    kiln_forward_args a = {(int)B, (int)sh[2], (int)sh[3], (int)sc[1], hs, ctx, pooled, ts};
    double t0 = kb_now();
    if ((s = kiln_forward(m, &a, out))) {
        rc = cli_fail("forward", s);
        goto done;
    }
    double dt = kb_now() - t0;
    if (repeat > 0) {
        double *ms = malloc(sizeof(double) * (size_t)repeat);
        uint64_t sent0 = kiln_dist_bytes_sent();
        for (long k = 0; ms && k < repeat && !s; k++) {
            double t1 = kb_now();
            s = kiln_forward(m, &a, out);
            ms[k] = (kb_now() - t1) * 1e3;
        }
        if (s || !ms) {
            free(ms);
            rc = s ? cli_fail("forward", s) : cli_error("forward", "out of memory");
            goto done;
        }
        for (long x = 1; x < repeat; x++) /* insertion sort: a few runs */
            for (long y = x; y > 0 && ms[y - 1] > ms[y]; y--) {
                double t = ms[y];
                ms[y] = ms[y - 1];
                ms[y - 1] = t;
            }
        double med = repeat % 2 ? ms[repeat / 2] : 0.5 * (ms[repeat / 2 - 1] + ms[repeat / 2]);
        uint64_t sent = (kiln_dist_bytes_sent() - sent0) / (uint64_t)repeat;
        if (kiln_dist_rank() == 0) {
            printf("forward: median %.3f ms over %ld runs", med, repeat);
            if (kiln_dist_size() > 1) printf(", %d ranks, rank 0 sent %llu bytes per forward", kiln_dist_size(), (unsigned long long)sent);
            printf("\n");
        }
        kiln_model_info info;
        if (kiln_dist_rank() == 0 && !kiln_model_get_info(m, &info))
            printf("weights: %lld bytes in memory, %lld quantized linear weights of %lld bytes\n",
                   (long long)info.weight_bytes, (long long)info.n_quantized, (long long)info.quantized_bytes);
        free(ms);
    }
    if (kiln_dist_rank() == 0 && (s = cli_write_f32(output, "sample", out, 4, so))) { /* a mesh: rank 0 writes */
        rc = cli_fail("forward", s);
        goto done;
    }
    if (kiln_dist_rank() == 0)
        fprintf(stderr, "forward: [%lld, %lld, %lld, %lld] in %.1f ms -> %s\n", (long long)so[0],
            (long long)so[1], (long long)so[2], (long long)so[3], dt * 1e3, output);
    rc = 0;
done:
    free(hs);
    free(ctx);
    free(pooled);
    free(t);
    free(ts);
    free(out);
    kiln_model_free(m);
    st_close(in);
    cli_common_finish(&com);
    return rc;
}
