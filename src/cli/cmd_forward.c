/* cmd_forward.c - kiln forward MODEL --inputs FILE --output FILE: one call
 * of any model, its inputs read from FILE by the names the model's family
 * gives them (kiln_run), every output written to the output file; an SD3
 * backbone keeps its own checks (a single timestep for every row). */
#include "base/base.h"
#include "cli.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

static const char k_usage[] = "kiln forward MODEL --inputs FILE --output FILE [--repeat N] [options]";

static int help(void) {
    printf("usage: %s\n\n"
           "One call of a model. FILE (safetensors, like the goldens' io.safetensors) holds the\n"
           "model's inputs by name; the output file gets every output by name, in F32. Other\n"
           "tensors in FILE are ignored. Integer inputs (token ids) are taken as their values.\n\n"
           "An SD3 backbone (family sd3) takes:\n"
           "  hidden_states          [B, C, H, W]   latent\n"
           "  encoder_hidden_states  [B, T, joint_attention_dim]\n"
           "  pooled_projections     [B, pooled_projection_dim]\n"
           "  timestep               [B]            0..1000 (a single value is used for every batch row)\n"
           "and gives `sample` [B, out_channels, H, W]. `kiln info MODEL` lists any model's inputs\n"
           "and outputs.\n\n"
           "  --repeat N      after one warm-up call, run N more and print\n"
           "                  `forward: median X ms over N runs` (the benchmark line) and\n"
           "                  `weights: B bytes in memory, Q quantized linear weights of QB bytes`\n%s",
           k_usage, cli_common_help);
    return 0;
}

/* --repeat: n more calls after the first; the median and what the weights hold */
static kiln_status repeat_calls(kiln_model *m, long repeat, kiln_status (*call)(void *), void *user) {
    double *ms = malloc(sizeof(double) * (size_t)repeat);
    if (!ms) return kb_fail(KILN_ERR_NOMEM, "out of memory");
    uint64_t sent0 = kiln_dist_bytes_sent();
    kiln_status s = KILN_OK;
    for (long k = 0; k < repeat && !s; k++) {
        double t1 = kb_now();
        s = call(user);
        ms[k] = (kb_now() - t1) * 1e3;
    }
    if (s) {
        free(ms);
        return s;
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
    return KILN_OK;
}

typedef struct sd3_call {
    kiln_model *m;
    const kiln_forward_args *a;
    float *out;
} sd3_call;
static kiln_status call_sd3(void *u) {
    sd3_call *c = u;
    return kiln_forward(c->m, c->a, c->out);
}

typedef struct named_call {
    kiln_model *m;
    kiln_tensor *in;
    size_t n_in;
    kiln_output *out;
    size_t n_out;
} named_call;
static kiln_status call_named(void *u) {
    named_call *c = u;
    return kiln_run(c->m, c->in, c->n_in, c->out, c->n_out);
}

/* Any family: every input by name (F32, F16, BF16 as values; integers, such
 * as token ids, exactly below 2^24), every output written by name. */
static int forward_named(kiln_model *m, const char *inputs, const char *output, long repeat) {
    kiln_tensor *file = NULL, in[8], *w = NULL;
    size_t nf = 0;
    int n_in = kiln_model_n_inputs(m), n_out = kiln_model_n_outputs(m), rc = 1;
    float *conv[8] = {0};
    kiln_output *out = calloc((size_t)n_out, sizeof *out);
    if (!out || n_in > 8) {
        free(out);
        return cli_error("forward", "out of memory");
    }
    kiln_status s = kiln_tensors_read(inputs, &file, &nf);
    if (s) {
        free(out);
        return cli_fail("forward", s);
    }
    for (int k = 0; k < n_in; k++) {
        const char *name = kiln_model_input_name(m, k);
        const kiln_tensor *t = kiln_tensors_find(file, nf, name);
        if (!t) {
            cli_error("forward", "%s: no tensor named %s (the %s model's inputs are read by name; `kiln info` lists them)",
                      inputs, name, kiln_model_family(m));
            goto done;
        }
        in[k] = *t;
        if (t->dtype == KILN_I64) { /* ids: their values as F32, exact below 2^24 */
            size_t n = 1;
            for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
            if (!(conv[k] = malloc(sizeof(float) * (n ? n : 1)))) {
                cli_error("forward", "out of memory");
                goto done;
            }
            const int64_t *v = t->data;
            for (size_t i = 0; i < n; i++) {
                if (v[i] < -(1 << 24) || v[i] > (1 << 24)) {
                    cli_error("forward", "%s: %s[%zu] = %lld is beyond what kiln takes as a value (|x| <= 2^24)", inputs,
                              name, i, (long long)v[i]);
                    goto done;
                }
                conv[k][i] = (float)v[i];
            }
            in[k].dtype = KILN_F32;
            in[k].data = conv[k];
        }
    }
    for (int k = 0; k < n_out; k++) out[k].name = kiln_model_output_name(m, k);
    if ((s = kiln_run(m, in, (size_t)n_in, out, (size_t)n_out))) { /* the shapes */
        rc = cli_fail("forward", kb_wrap(s, "%s", inputs));
        goto done;
    }
    for (int k = 0; k < n_out; k++) {
        size_t n = 1;
        for (int d = 0; d < out[k].ndim; d++) n *= (size_t)out[k].shape[d];
        out[k].capacity = n;
        if (!(out[k].data = malloc(sizeof(float) * n))) {
            cli_error("forward", "out of memory for output %s", out[k].name);
            goto done;
        }
    }
    named_call c = {m, in, (size_t)n_in, out, (size_t)n_out};
    double t0 = kb_now();
    if ((s = call_named(&c)) || (repeat > 0 && (s = repeat_calls(m, repeat, call_named, &c)))) {
        rc = cli_fail("forward", s);
        goto done;
    }
    double dt = kb_now() - t0;
    if (!(w = calloc((size_t)n_out, sizeof *w))) {
        cli_error("forward", "out of memory");
        goto done;
    }
    for (int k = 0; k < n_out; k++) {
        w[k] = (kiln_tensor){out[k].name, KILN_F32, out[k].ndim, {0}, out[k].data};
        memcpy(w[k].shape, out[k].shape, sizeof w[k].shape);
    }
    if (kiln_dist_rank() == 0 && (s = kiln_tensors_write(output, (size_t)n_out, w))) {
        rc = cli_fail("forward", s);
        goto done;
    }
    if (kiln_dist_rank() == 0)
        fprintf(stderr, "forward: %d output%s in %.1f ms -> %s\n", n_out, n_out == 1 ? "" : "s", dt * 1e3, output);
    rc = 0;
done:
    for (int k = 0; k < 8; k++) free(conv[k]);
    for (int k = 0; k < n_out; k++) free(out[k].data);
    free(out);
    free(w);
    kiln_tensors_free(file);
    return rc;
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
    if (cli_check_st_output("forward", output)) return 1; /* before any work */

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
    if (!c) { /* not an SD3 backbone: by the family's names */
        rc = forward_named(m, inputs, output, repeat);
        goto done;
    }
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
    sd3_call call = {m, &a, out};
    if (repeat > 0 && (s = repeat_calls(m, repeat, call_sd3, &call))) {
        rc = cli_fail("forward", s);
        goto done;
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
