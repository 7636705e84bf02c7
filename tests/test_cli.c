/* test_cli.c - the kiln command end to end: --help everywhere, info,
 * forward and generate against the goldens, and clear errors for bad use. */
#include "base/base.h"
#include "golden_util.h"
#include "cli_util.h"

#include <sys/wait.h>

/* run kiln with a shell line of arguments (cli_util.h) */
#define run run_kiln
#define bin kiln_bin
#define CHECK_RUN(...) CHECK_RUN_WITH(run_kiln, __VA_ARGS__)

TEST(help_everywhere) {
    CHECK_RUN(0, "commands:", "--help");
    CHECK_RUN(2, "unknown command", "frobnicate");
    const char *cmds[] = {"info", "forward", "generate", "demo"};
    for (int i = 0; i < 4; i++) CHECK_RUN(0, "usage: kiln", "%s --help", cmds[i]);
    CHECK_RUN(2, "MODEL is required", "info");
    CHECK_RUN(2, "--inputs and --output are required", "forward %s", golden_path("sd3-tiny", NULL));
    CHECK_RUN(2, "unknown option --bogus", "generate model --bogus");
    CHECK_RUN(2, "--steps", "generate m --cond c --output o --steps zero");
    CHECK_RUN(2, "HEIGHTxWIDTH", "generate m --cond c --output o --latent 12");
    CHECK_RUN(2, "needs a value", "forward m --inputs");
}

TEST(info_reports_the_model) {
    CHECK_RUN(0, "dual attention", "info %s", golden_path("sd35-tiny", NULL));
    CHECK_RUN(0, "BF16 x", "info %s", golden_path("sd35-tiny", NULL));
    CHECK_RUN(0, "4 joint blocks", "info %s", golden_path("sd3-tiny", NULL));
    CHECK_RUN(0, "kernels:        bf16: ", "info %s", golden_path("sd3-tiny", NULL)); /* which kernels run here */
    CHECK_RUN(1, "no such file or folder", "info /nonexistent");
}

/* --backend: the check backend runs the reference kernels, so its output is
 * the reference's bit for bit (packages and all); unknown names and a
 * conflict with --reference are refused */
TEST(backend_option) {
    char dir[256];
    test_tmpdir(dir, sizeof dir, "cli-backend");
    const char *m = golden_path("sd3-tiny", NULL), *io = golden_path("sd3-tiny", "io.safetensors");
    CHECK_RUN(0, "forward:", "forward %s --reference --exec eager --inputs %s --output %s/ref.safetensors", m, io, dir);
    CHECK_RUN(0, "forward:", "forward %s --backend check --exec eager --inputs %s --output %s/chk.safetensors", m, io, dir);
    CHECK_RUN(0, "published", "compile %s --backend check --package-dir %s/pk --latent 32x32 --context-len 154 "
                             "--dim batch=1:4,ctx_len=1:200", m, dir);
    CHECK_RUN(0, "forward:", "forward %s --backend check --exec dynamic --package-dir %s/pk --inputs %s "
                             "--output %s/pkg.safetensors", m, dir, io, dir);
    CHECK_RUN(0, "forward:", "forward %s --reference --exec dynamic --package-dir %s/pk --inputs %s "
                             "--output %s/refpkg.safetensors", m, dir, io, dir);
    const char *names[2][2] = {{"ref", "chk"}, {"refpkg", "pkg"}};
    for (int k = 0; k < 2; k++) {
        char a[400], b[400];
        snprintf(a, sizeof a, "%s/%s.safetensors", dir, names[k][0]);
        snprintf(b, sizeof b, "%s/%s.safetensors", dir, names[k][1]);
        st_file *fa = NULL, *fb = NULL;
        CHECK_OK(st_open(a, &fa));
        CHECK_OK(st_open(b, &fb));
        if (fa && fb) {
            size_t n1, n2;
            float *x = golden_tensor(fa, "sample", &n1), *y = golden_tensor(fb, "sample", &n2);
            CHECK_MSG(n1 == n2 && !memcmp(x, y, sizeof(float) * n1), "--backend check (%s) differs from --reference",
                      names[k][1]);
            free(x), free(y);
        }
        st_close(fa), st_close(fb);
    }
    CHECK_RUN(2, "--backend gpu: unknown (the backends: cpu, reference, check)", "forward %s --backend gpu --inputs %s "
              "--output %s/x.safetensors", m, io, dir);
    CHECK_RUN(1, "the reference kernels and the check backend were both asked for", "forward %s --reference --backend "
              "check --inputs %s --output %s/x.safetensors", m, io, dir);
    CHECK_RUN(1, "the check kernels compute in F32 only, not BF16", "forward %s --backend check --dtype bf16 --inputs %s "
              "--output %s/x.safetensors", m, io, dir);
    test_rmrf(dir);
}

TEST(forward_matches_golden) {
    char dir[256];
    test_tmpdir(dir, sizeof dir, "cli-fwd");
    const char *cases[] = {"sd3-tiny", "sd35-tiny", "sd3-wide"};
    for (int i = 0; i < 3; i++) {
        CHECK_RUN(0, "forward:", "forward %s --dtype f32 --inputs %s --output %s/out.safetensors", golden_path(cases[i], NULL),
                  golden_path(cases[i], "io.safetensors"), dir);
        char path[400];
        snprintf(path, sizeof path, "%s/out.safetensors", dir);
        st_file *got = NULL, *io = NULL;
        CHECK_OK(st_open(path, &got));
        CHECK_OK(st_open(golden_path(cases[i], "io.safetensors"), &io));
        if (got && io) {
            size_t n1, n2;
            float *a = golden_tensor(got, "sample", &n1), *b = golden_tensor(io, "sample", &n2);
            double err = n1 == n2 ? rel_l2(a, b, n1) : 1;
            CHECK_MSG(err <= 1e-5, "%s: error %g", cases[i], err);
            free(a);
            free(b);
        }
        st_close(got);
        st_close(io);
    }
    /* inputs that do not fit the model: named */
    CHECK_RUN(1, "hidden_states has 4 channels, the model takes 8", "forward %s --inputs %s --output %s/x.safetensors",
              golden_path("sd3-wide", NULL), golden_path("sd3-tiny", "io.safetensors"), dir);
    CHECK_RUN(1, "no tensor named hidden_states", "forward %s --inputs %s --output %s/x.safetensors",
              golden_path("sd3-tiny", NULL), golden_path("sd3-tiny", "diffusion_pytorch_model.safetensors"), dir);
    CHECK_RUN(1, "is not a safetensors file (it looks like JSON text", "forward %s --inputs %s --output %s/x.safetensors",
              golden_path("sd3-tiny", NULL), golden_path("sd3-tiny", "config.json"), dir);
    test_rmrf(dir);
}

/* The sampler golden through `kiln generate`, conditioning under the
 * pipeline's names and the golden's noise from a file. */
TEST(generate_matches_golden) {
    char dir[256], cond[400], noise[400], out[400], png[400];
    test_tmpdir(dir, sizeof dir, "cli-gen");
    snprintf(cond, sizeof cond, "%s/cond.safetensors", dir);
    snprintf(noise, sizeof noise, "%s/noise.safetensors", dir);
    snprintf(out, sizeof out, "%s/latents.safetensors", dir);
    snprintf(png, sizeof png, "%s/latents.png", dir);
    st_file *io = NULL;
    CHECK_OK(st_open(golden_path("sampler-sd3-tiny", "io.safetensors"), &io));
    if (!io) return;
    const char *from[] = {"cond_embeds", "cond_pooled", "uncond_embeds", "uncond_pooled"};
    const char *to[] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                        "negative_pooled_prompt_embeds"};
    st_tensor t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = *golden_info(io, from[i]);
        t[i].name = to[i];
    }
    CHECK_OK(st_write(cond, t, 4, NULL, 0));
    CHECK_OK(st_write(noise, golden_info(io, "noise"), 1, NULL, 0));
    CHECK_RUN(0, "step 4/4", "generate %s --dtype f32 --cond %s --noise %s --steps 4 --shift 3 --guidance 5 --output %s",
              golden_path("sampler-sd3-tiny", NULL), cond, noise, out);
    st_file *got = NULL;
    CHECK_OK(st_open(out, &got));
    if (got) {
        size_t n1, n2;
        float *a = golden_tensor(got, "latents", &n1), *b = golden_tensor(io, "latents", &n2);
        double err = n1 == n2 ? rel_l2(a, b, n1) : 1;
        CHECK_MSG(err <= 1e-5, "latents error %g", err);
        free(a);
        free(b);
        st_close(got);
    }
    CHECK(kb_is_file(png));
    /* seeded noise: the same seed gives the same latents */
    CHECK_RUN(0, "preview", "generate %s --cond %s --seed 9 --latent 16x24 --steps 2 --output %s/s1.safetensors",
              golden_path("sampler-sd3-tiny", NULL), cond, dir);
    CHECK_RUN(0, "sampler_step", "generate %s --cond %s --seed 9 --latent 16x24 --steps 2 --output %s/s2.safetensors --quiet --timings",
              golden_path("sampler-sd3-tiny", NULL), cond, dir);
    char p1[400], p2[400], *a, *b;
    size_t la, lb;
    snprintf(p1, sizeof p1, "%s/s1.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/s2.safetensors", dir);
    if (!kb_read_file(p1, &a, &la) && !kb_read_file(p2, &b, &lb)) {
        CHECK(la == lb && !memcmp(a, b, la));
        free(a);
        free(b);
    }
    /* errors name what is wrong */
    CHECK_OK(st_write(cond, t, 2, NULL, 0)); /* the prompt alone */
    CHECK_RUN(1, "negative_prompt_embeds", "generate %s --cond %s --output %s/x.safetensors",
              golden_path("sampler-sd3-tiny", NULL), cond, dir);
    CHECK_RUN(0, "preview", "generate %s --cond %s --guidance 1 --steps 1 --output %s/x.safetensors",
              golden_path("sampler-sd3-tiny", NULL), cond, dir);
    CHECK_RUN(1, "pos_embed_max_size", "generate %s --cond %s --guidance 1 --latent 16x400 --output %s/x.safetensors",
              golden_path("sampler-sd3-tiny", NULL), cond, dir);
    CHECK_RUN(1, "disagrees", "generate %s --cond %s --guidance 1 --noise %s --latent 16x32 --output %s/x.safetensors",
              golden_path("sampler-sd3-tiny", NULL), cond, noise, dir);
    st_close(io);
    test_rmrf(dir);
}

TEST(demo_runs) {
    char dir[256];
    test_tmpdir(dir, sizeof dir, "cli-demo");
    CHECK_RUN(0, "weights: miss", "demo --dir %s --steps 2", dir);
    CHECK_RUN(0, "weights: hit", "demo --dir %s --steps 1", dir);
    CHECK_RUN(0, "already there", "demo --dir %s --steps 1", dir);
    char p[400];
    snprintf(p, sizeof p, "%s/demo-32x48.png", dir);
    CHECK(kb_is_file(p));
    test_rmrf(dir);
}

TEST(cache_commands) {
    char dir[256], file[600];
    test_tmpdir(dir, sizeof dir, "cli-cache");
    const char *model = golden_path("sd3-tiny", NULL);
    CHECK_RUN(1, "no cache root", "cache ls");
    CHECK_RUN(2, "a subcommand is required", "cache");
    CHECK_RUN(0, "usage: kiln cache", "cache --help");
    CHECK_RUN(0, "miss: ", "cache build %s --cache-dir %s/c", model, dir);
    CHECK_RUN(0, "hit: ", "cache build %s --cache-dir %s/c", model, dir);
    char keyp[200], ok[220];
    /* the default name carries a hash of the model's absolute path: sd3-tiny-3f2a91 */
    snprintf(keyp, sizeof keyp, "/transformer/%s", default_key_prefix());
    snprintf(ok, sizeof ok, "ok       sd3-tiny-");
    CHECK_RUN(0, keyp, "cache ls --cache-dir %s/c", dir);
    CHECK_RUN(0, ok, "cache verify --cache-dir %s/c", dir);
    /* forward through the cache: the ledger shows the hit */
    CHECK_RUN(0, "hit", "forward %s --inputs %s --output %s/o.safetensors --cache-dir %s/c --timings", model,
              golden_path("sd3-tiny", "io.safetensors"), dir, dir);
    /* a flipped byte: verify says so and exits 1 */
    char *out = NULL;
    run(&out, "cache ls --cache-dir %s/c", dir);
    char *key = out ? strstr(out, "sd3-tiny-") : NULL;
    if (key) {
        *strchr(key, '\n') = 0;
        if (strchr(key, ' ')) *strchr(key, ' ') = 0; /* "KEY  <- source" */
        snprintf(file, sizeof file, "%s/c/%s/weights.bin", dir, key);
        FILE *f = fopen(file, "r+b");
        if (f) {
            fseek(f, 4096, SEEK_SET);
            int c = fgetc(f);
            fseek(f, 4096, SEEK_SET);
            fputc(c ^ 1, f);
            fclose(f);
        }
        CHECK_RUN(1, "CORRUPT", "cache verify --cache-dir %s/c %s", dir, key);
        /* a cache found corrupt is never served again (issue 42): removed, the next load rebuilds it */
        CHECK(!kb_is_file(file));
        CHECK_RUN(0, "miss", "forward %s --inputs %s --output %s/o.safetensors --cache-dir %s/c --timings", model,
                  golden_path("sd3-tiny", "io.safetensors"), dir, dir);
        CHECK_RUN(0, "ok ", "cache verify --cache-dir %s/c %s", dir, key);
        CHECK_RUN(1, "no cache named", "cache rm --cache-dir %s/c sd3-tiny/transformer/nope", dir);
        CHECK_RUN(0, "removed", "cache rm --cache-dir %s/c %s", dir, key);
    }
    free(out);
    CHECK_RUN(0, "miss", "cache build %s --cache-dir %s/c --name other", model, dir);
    CHECK_RUN(2, "--max-size", "cache gc --cache-dir %s/c", dir);
    CHECK_RUN(0, "removed 1 cache", "cache gc --cache-dir %s/c --max-size 1K", dir);
    CHECK_RUN(0, "0 caches", "cache ls --cache-dir %s/c", dir);
    /* a checkpoint that is not there */
    CHECK_RUN(1, "no such file or folder", "forward %s/nothing-here --inputs %s --output %s/o.safetensors --cache-dir %s/c", dir,
              golden_path("sd3-tiny", "io.safetensors"), dir, dir);
    test_rmrf(dir);
}

/* int8 on a CPU whose int8 products would saturate (no AVX-512 VNNI, no AMX:
 * the avx2 class, KILN_MAX_ISA=avx2) is refused with the reason, not run */
TEST(int8_needs_vnni) {
    const char *model = golden_path("sd3-tiny", NULL);
    char io[1100], dir[600];
    snprintf(io, sizeof io, "%s/io.safetensors", model);
    test_tmpdir(dir, sizeof dir, "cli-int8");
    setenv("KILN_MAX_ISA", "avx2", 1);
    CHECK_RUN(1, "--quant int8: int8 weights need a CPU with AVX-512 VNNI or AMX-INT8",
              "forward %s --inputs %s --output %s/o.safetensors --quant int8", model, io, dir);
    unsetenv("KILN_MAX_ISA");
    test_rmrf(dir);
}

/* Copy the tensors of src to dst with float value at index `at` of tensor
 * `name` replaced by v (name NULL: unchanged); names renamed by from/to. */
static void copy_with(const char *src, const char *dst, const char *name, size_t at, float v, const char *const *from,
                      const char *const *to, size_t nren) {
    st_file *f = NULL;
    CHECK_OK(st_open(src, &f));
    if (!f) return;
    size_t n = st_count(f);
    st_tensor *t = calloc(n, sizeof *t);
    float **bufs = calloc(n, sizeof *bufs);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *x = st_at(f, i);
        const char *nm = x->name;
        int keep = nren == 0;
        for (size_t r = 0; r < nren; r++)
            if (!strcmp(nm, from[r])) nm = to[r], keep = 1;
        if (!keep) continue;
        t[k] = *x;
        t[k].name = nm;
        if (name && !strcmp(nm, name)) {
            size_t cnt;
            bufs[k] = golden_tensor(f, x->name, &cnt);
            if (at < cnt) bufs[k][at] = v;
            t[k].dtype = KILN_F32;
            t[k].data = bufs[k];
            t[k].nbytes = cnt * sizeof(float);
        }
        k++;
    }
    CHECK_OK(st_write(dst, t, k, NULL, 0));
    for (size_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(t);
    st_close(f);
}

static const char *const k_from[] = {"cond_embeds", "cond_pooled", "uncond_embeds", "uncond_pooled", "noise"};
static const char *const k_to[] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                                   "negative_pooled_prompt_embeds", "noise"};

/* NaN in, error out, and no output file: forward, generate (conditioning and
 * noise from files), and a step whose latent overflows. */
TEST(nonfinite_inputs_write_nothing) {
    char dir[256], in[400], out[400], png[400], cond[400];
    test_tmpdir(dir, sizeof dir, "cli-nan");
    snprintf(in, sizeof in, "%s/io.safetensors", dir);
    snprintf(cond, sizeof cond, "%s/cond.safetensors", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    snprintf(png, sizeof png, "%s/out.png", dir);
    const char *tiny = golden_path("sd3-tiny", NULL);
    copy_with(golden_path("sd3-tiny", "io.safetensors"), in, "hidden_states", 17, NAN, NULL, NULL, 0);
    CHECK_RUN(1, "io.safetensors: tensor hidden_states holds NaN at index 17 (inputs must be finite)",
              "forward %s --inputs %s --output %s", tiny, in, out);
    CHECK(!kb_is_file(out));
    copy_with(golden_path("sd3-tiny", "io.safetensors"), in, "timestep", 1, INFINITY, NULL, NULL, 0);
    CHECK_RUN(1, "tensor timestep holds +Inf at index 1", "forward %s --inputs %s --output %s", tiny, in, out);
    CHECK(!kb_is_file(out));

    const char *sampler = golden_path("sampler-sd3-tiny", NULL), *io = golden_path("sampler-sd3-tiny", "io.safetensors");
    copy_with(io, cond, "prompt_embeds", 3, NAN, k_from, k_to, 4);
    CHECK_RUN(1, "tensor prompt_embeds holds NaN at index 3", "generate %s --cond %s --steps 2 --output %s", sampler,
              cond, out);
    CHECK(!kb_is_file(out) && !kb_is_file(png));
    copy_with(io, cond, "negative_pooled_prompt_embeds", 9, -INFINITY, k_from, k_to, 4);
    CHECK_RUN(1, "tensor negative_pooled_prompt_embeds holds -Inf at index 9",
              "generate %s --cond %s --steps 2 --output %s", sampler, cond, out);
    CHECK(!kb_is_file(out) && !kb_is_file(png));
    char noise[400];
    snprintf(noise, sizeof noise, "%s/noise.safetensors", dir);
    copy_with(io, noise, "noise", 100, NAN, k_from + 4, k_to + 4, 1);
    copy_with(io, cond, NULL, 0, 0, k_from, k_to, 4);
    CHECK_RUN(1, "tensor noise holds NaN at index 100", "generate %s --cond %s --noise %s --steps 2 --output %s",
              sampler, cond, noise, out);
    CHECK(!kb_is_file(out) && !kb_is_file(png));
    /* finite inputs, a guidance so large that step 1 overflows the latent */
    CHECK_RUN(1, "step 1 of 2 gave a non-finite latent (", "generate %s --cond %s --steps 2 --guidance 1e300 --output %s",
              sampler, cond, out);
    CHECK(!kb_is_file(out) && !kb_is_file(png));
    CHECK_RUN(0, "preview", "generate %s --cond %s --steps 1 --output %s", sampler, cond, out); /* the same, sane */
    CHECK(kb_is_file(out) && kb_is_file(png));
    test_rmrf(dir);
}

/* Sizes fail at once with the limit named; --threads is capped; a long
 * --name is told its length. */
TEST(limits_are_named) {
    char dir[256], cond[400], out[400], name[260];
    test_tmpdir(dir, sizeof dir, "cli-limits");
    snprintf(cond, sizeof cond, "%s/cond.safetensors", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    const char *sampler = golden_path("sampler-sd3-tiny", NULL);
    copy_with(golden_path("sampler-sd3-tiny", "io.safetensors"), cond, NULL, 0, 0, k_from, k_to, 4);
    /* 16 x 65536 x 65536 floats of noise would be 256 GiB: refused before any allocation */
    double t0 = kb_now();
    char *o = NULL;
    int rc = run(&o, "generate %s --cond %s --latent 65536x65536 --output %s", sampler, cond, out);
    CHECK_MSG(rc == 1 && strstr(o, "larger than the position table") && strstr(o, "at most") &&
                  !strstr(o, "out of memory"),
              "exit %d: %s", rc, o);
    CHECK_MSG(kb_now() - t0 < 60, "took %.1f s", kb_now() - t0);
    free(o);
    CHECK(!kb_is_file(out));
    /* a context longer than the limit (guidance 1: the prompt alone) */
    {
        size_t T = 65537, J = 32;
        float *big = calloc(T * J, sizeof(float)), pooled[64] = {0};
        st_tensor t[2] = {{.name = "prompt_embeds", .dtype = KILN_F32, .ndim = 3, .shape = {1, (int64_t)T, (int64_t)J},
                           .data = big, .nbytes = T * J * 4},
                          {.name = "pooled_prompt_embeds", .dtype = KILN_F32, .ndim = 2, .shape = {1, 64},
                           .data = pooled, .nbytes = sizeof pooled}};
        char longc[400];
        snprintf(longc, sizeof longc, "%s/long.safetensors", dir);
        CHECK_OK(st_write(longc, t, 2, NULL, 0));
        free(big);
        CHECK_RUN(1, "prompt_embeds has 65537 tokens; the context length must be between 1 and 65536",
                  "generate %s --cond %s --guidance 1 --output %s", sampler, longc, out);
        CHECK(!kb_is_file(out));
    }
    /* --threads far past the cores: capped with a warning, and it runs */
    const char *tiny = golden_path("sd3-tiny", NULL);
    CHECK_RUN(0, "warning: --threads 4096 is more than 4 per online core",
              "forward %s --threads 4096 --inputs %s --output %s", tiny, golden_path("sd3-tiny", "io.safetensors"), out);
    /* a 250-character model name: its length is the problem, and the message says so */
    memset(name, 'a', 250);
    name[250] = 0;
    CHECK_RUN(1, "is 250 characters long; a cache folder name has at most 100",
              "cache build %s --cache-dir %s/c --name %s", tiny, dir, name);
    test_rmrf(dir);
}

int main(void) {
    RUN(help_everywhere);
    RUN(info_reports_the_model);
    RUN(forward_matches_golden);
    RUN(backend_option);
    RUN(generate_matches_golden);
    RUN(demo_runs);
    RUN(cache_commands);
    RUN(int8_needs_vnni);
    RUN(nonfinite_inputs_write_nothing);
    RUN(limits_are_named);
    return TEST_SUMMARY();
}
