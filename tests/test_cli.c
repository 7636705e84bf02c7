/* test_cli.c - the kiln command end to end: --help everywhere, info,
 * forward and generate against the goldens, and clear errors for bad use. */
#include "base/base.h"
#include "golden_util.h"

#include <sys/wait.h>

static const char *bin(void) {
    const char *b = getenv("KILN_BIN");
    return b ? b : "build/kiln";
}

/* Run a shell command line with $K replaced by the kiln binary; captures
 * stdout+stderr into out (malloc'd); returns the exit status. */
static int run(char **out, const char *fmt, ...) {
    char cmd[12288], line[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", bin(), line);
    FILE *p = popen(cmd, "r");
    if (!p) exit(2);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define CHECK_RUN(want_rc, substr, ...)                                                  \
    do {                                                                                 \
        char *o_ = NULL;                                                                 \
        int rc_ = run(&o_, __VA_ARGS__);                                                 \
        CHECK_MSG(rc_ == (want_rc), "exit %d (want %d): %s", rc_, (want_rc), o_);        \
        CHECK_MSG(strstr(o_, (substr)) != NULL, "output lacks \"%s\": %s", (substr), o_); \
        free(o_);                                                                        \
    } while (0)

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
    CHECK_RUN(1, "header length", "forward %s --inputs %s --output %s/x.safetensors",
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
 * simulated by capping oneDNN's ISA) is refused with the reason, not run */
TEST(int8_needs_vnni) {
    const char *model = golden_path("sd3-tiny", NULL);
    char io[1100], dir[600];
    snprintf(io, sizeof io, "%s/io.safetensors", model);
    test_tmpdir(dir, sizeof dir, "cli-int8");
    setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
    CHECK_RUN(1, "--quant int8 needs a CPU with AVX-512 VNNI or AMX-INT8",
              "forward %s --inputs %s --output %s/o.safetensors --quant int8", model, io, dir);
    unsetenv("ONEDNN_MAX_CPU_ISA");
    test_rmrf(dir);
}

int main(void) {
    RUN(help_everywhere);
    RUN(info_reports_the_model);
    RUN(forward_matches_golden);
    RUN(generate_matches_golden);
    RUN(demo_runs);
    RUN(cache_commands);
    RUN(int8_needs_vnni);
    return TEST_SUMMARY();
}
