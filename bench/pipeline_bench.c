/* pipeline_bench.c - kiln's warm side of bench/pipeline_bench.sh: one
 * process opens a diffusers pipeline folder (StableDiffusion3Pipeline,
 * FluxPipeline; its class's defaults, --guidance over them) once (every
 * component through the weight cache under --name, as `kiln generate
 * PIPELINE --name NAME` opens it) and makes the same image --runs times:
 * encode the prompt and "" (CFG), sample, decode with the VAE, write the PNG.
 * Public API only (kiln generate has no --repeat).
 *
 *   bench_pipeline --pipeline DIR --cache-dir DIR --name NAME [--prompt P] [--size PX]
 *                  [--steps N] [--guidance G] [--seed S] [--runs N] [--output out.png]
 *                  [--dtype bf16|f32] [--ledger FILE]
 *
 * Prints one JSON line: open_ms (the pipeline: tokenizers, the five
 * components' cache hits), then per call total_ms and its parts from the
 * timing ledger (reset before each call): encode_ms ("encode_prompt"), each
 * step's ms (the on_step callback's intervals; the first one less the
 * encode), sampling_ms (the "sampler_step" rows), decode_ms ("vae decode"),
 * png_ms, and the backbone's execution path. --ledger FILE appends each
 * call's whole ledger (kiln_timings_print) to FILE. */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STEPS 1000

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_pipeline --pipeline DIR --cache-dir DIR --name NAME [--prompt P] [--size PX] "
                    "[--steps N] [--guidance G] [--seed S] [--runs N] [--output out.png] [--dtype bf16|f32] "
                    "[--ledger FILE]\n");
    return 2;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_pipeline: %s: %s\n", what, kiln_last_error());
    return 1;
}

typedef struct {
    double t[MAX_STEPS + 1]; /* t[0] the call's start, t[i] the end of step i */
    int n;
} steps;

static void on_step(void *user, int step, int total, double sigma, const float *latent) {
    (void)total, (void)sigma, (void)latent;
    steps *s = user;
    if (step >= 1 && step <= MAX_STEPS) {
        s->t[step] = now();
        s->n = step;
    }
}

/* the seconds of ledger row `cat` (0 when absent): kiln_timings_print's
 * table, "category seconds count ..." (a category may hold spaces, so the
 * first number after its name is taken) */
static double ledger_seconds(const char *table, const char *cat) {
    size_t l = strlen(cat);
    for (const char *p = table; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, cat, l) && p[l] == ' ') {
            const char *q = p + l;
            while (*q == ' ') q++;
            if (*q >= '0' && *q <= '9') return atof(q);
        }
    return 0;
}

/* the ledger so far, as text (malloc'd) */
static char *ledger_text(void) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    kiln_timings_print(f);
    long n = ftell(f);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    rewind(f);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *cache = NULL, *name = NULL, *out = NULL, *dt = "bf16", *ledger = NULL;
    const char *prompt = "a photograph of an astronaut riding a horse";
    int size = 512, nsteps = 8, runs = 3;
    double guidance = -1; /* the class's default unless given */
    unsigned long long seed = 0;
    if (argc % 2 == 0) return usage(); /* every option takes a value */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--pipeline")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--cache-dir")) cache = argv[i + 1];
        else if (!strcmp(argv[i], "--name")) name = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt")) prompt = argv[i + 1];
        else if (!strcmp(argv[i], "--size")) size = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) nsteps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--guidance")) guidance = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--output")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dt = argv[i + 1];
        else if (!strcmp(argv[i], "--ledger")) ledger = argv[i + 1];
        else return usage();
    }
    if (!dir || !cache || !name || runs < 1 || runs > 1000 || nsteps < 1 || nsteps > MAX_STEPS || size < 1 ||
        (strcmp(dt, "bf16") && strcmp(dt, "f32")))
        return usage();
    kiln_load_opts lo = kiln_load_defaults();
    lo.model_name = name;
    lo.cache_root = cache;
    lo.dtype = strcmp(dt, "f32") ? KILN_BF16 : KILN_F32;
    kiln_pipeline *p = NULL;
    double t0 = now();
    if (kiln_pipeline_open(dir, &lo, &p)) return fail(dir);
    double open_ms = (now() - t0) * 1e3;
    char *open_ledger = ledger_text();
    FILE *lf = ledger ? fopen(ledger, "a") : NULL;
    if (ledger && !lf) {
        fprintf(stderr, "bench_pipeline: %s: cannot open for appending\n", ledger);
        return 1;
    }
    if (lf) fprintf(lf, "== open %.1f ms\n%s", open_ms, open_ledger ? open_ledger : "");
    printf("{\"open_ms\": %.1f, \"open_ledger\": {\"load text_encoder\": %.1f, \"load text_encoder_2\": %.1f, "
           "\"load text_encoder_3\": %.1f, \"load transformer\": %.1f, \"load vae\": %.1f}, \"dtype\": \"%s\", "
           "\"threads\": %d, \"calls\": [",
           open_ms, 1e3 * ledger_seconds(open_ledger, "load text_encoder"),
           1e3 * ledger_seconds(open_ledger, "load text_encoder_2"),
           1e3 * ledger_seconds(open_ledger, "load text_encoder_3"),
           1e3 * ledger_seconds(open_ledger, "load transformer"), 1e3 * ledger_seconds(open_ledger, "load vae"), dt,
           kiln_get_threads());
    free(open_ledger);
    const char *prompts[1] = {prompt};
    int rc = 0;
    for (int r = 0; r < runs && !rc; r++) {
        kiln_timings_reset();
        steps st = {{0}, 0};
        kiln_pipeline_opts po = kiln_pipeline_defaults_of(p);
        po.prompts = prompts;
        po.n_prompts = 1;
        po.height = po.width = size;
        po.steps = nsteps;
        if (guidance >= 0) po.guidance = guidance;
        po.seed = seed;
        po.on_step = on_step;
        po.user = &st;
        float *lat = NULL;
        int64_t sh[4];
        double c0 = now();
        st.t[0] = c0;
        if (kiln_pipeline_generate(p, &po, &lat, sh)) {
            rc = fail("generate");
            break;
        }
        double c1 = now();
        int64_t H = sh[2] * kiln_pipeline_vae_scale(p), W = sh[3] * kiln_pipeline_vae_scale(p);
        uint8_t *rgb = malloc((size_t)(sh[0] * H * W * 3));
        kiln_vae_opts vo = kiln_vae_defaults();
        if (!rgb || kiln_vae_decode_rgb(kiln_pipeline_vae(p), lat, sh, &vo, rgb, NULL, NULL)) {
            free(rgb);
            free(lat);
            rc = fail("decode");
            break;
        }
        double c2 = now();
        int cfg = !strcmp(kiln_pipeline_class(p), "StableDiffusion3Pipeline") && po.guidance > 1;
        kiln_image_info info = {.prompt = prompt, .negative_prompt = cfg ? "" : NULL, .steps = nsteps,
                                .guidance = po.guidance, .has_seed = 1, .seed = seed, .sampler = "Euler (flow matching)"};
        if (out && kiln_image_write_png(out, rgb, (int)H, (int)W, &info)) rc = fail(out);
        double c3 = now();
        free(rgb);
        free(lat);
        char *lt = ledger_text();
        double enc = ledger_seconds(lt, "encode_prompt");
        if (lf) fprintf(lf, "== call %d %.1f ms\n%s", r, (c3 - c0) * 1e3, lt ? lt : "");
        printf("%s{\"total_ms\": %.1f, \"encode_ms\": %.1f, \"sampling_ms\": %.1f, \"decode_ms\": %.1f, "
               "\"png_ms\": %.1f, \"generate_ms\": %.1f, \"forward_ms\": %.1f, \"steps_ms\": [",
               r ? ", " : "", (c3 - c0) * 1e3, enc * 1e3, ledger_seconds(lt, "sampler_step") * 1e3,
               ledger_seconds(lt, "vae decode") * 1e3, (c3 - c2) * 1e3, (c1 - c0) * 1e3,
               ledger_seconds(lt, "forward") * 1e3);
        for (int i = 1; i <= st.n; i++)
            printf("%s%.1f", i > 1 ? ", " : "", (st.t[i] - st.t[i - 1] - (i == 1 ? enc : 0)) * 1e3);
        printf("], \"backbone\": \"%s\"}", kiln_model_last_exec(kiln_pipeline_transformer(p)));
        free(lt);
    }
    printf("]}\n");
    if (lf) fclose(lf);
    kiln_pipeline_free(p);
    return rc;
}
