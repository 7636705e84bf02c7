/* main.c - the kiln command: dispatch to subcommands. */
#include "cli.h"
#include "base/base.h"
#include "kernels/kernels.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *summary;
} k_cmds[] = {
    {"info", cmd_info, "a model's architecture, parameters, dtypes and size; a pipeline's components and cache state"},
    {"forward", cmd_forward, "one backbone call on tensors from a safetensors file"},
    {"generate", cmd_generate, "prompt to PNG through a pipeline, or a transformer sampled on given conditioning (CFG)"},
    {"cache", cmd_cache, "build (a model, or every pipeline component), list, verify, remove, garbage-collect caches"},
    {"compile", cmd_compile, "a model into a weightless package with dynamic dimensions, or every pipeline component"},
    {"package", cmd_package, "list, verify and remove compiled packages"},
    {"quality", cmd_quality, "the quality gate of a quantized backbone: bf16 vs int8/fp8 on one sampler request"},
    {"encode", cmd_encode, "a pipeline's prompt conditioning (SD3 encode_prompt: CLIP-L, CLIP-G, T5) for kiln generate"},
    {"decode", cmd_decode, "latents to PNG images through a VAE (tiled when memory is short)"},
    {"encode-image", cmd_encode_image, "a PNG to the pipeline's latents through the VAE's encoder"},
    {"tokenize", cmd_tokenize, "token ids of a prompt from a pipeline's CLIP / T5 tokenizers, padded as the pipeline pads"},
    {"make-model", cmd_make, "write a seeded model of any config kiln runs (SD3, CLIP, T5, VAE) for trials and benchmarks"},
    {"demo", cmd_demo, "an embedded tiny model at two widths, then a tiny pipeline prompt to PNG, cold and warm"},
};

static void usage(FILE *f) {
    fprintf(f,
            "kiln %s - SD3 / SD3.5 from prompt to PNG on the CPU, with fast cold starts (weight cache, packages)\n\n"
            "usage: kiln COMMAND [options]   (kiln COMMAND --help for each)\n\ncommands:\n",
            KILN_VERSION);
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-12s %s\n", k_cmds[i].name, k_cmds[i].summary);
    fprintf(f,
            "\nPIPELINE is a diffusers pipeline folder (model_index.json: StableDiffusion3Pipeline, SD3 / SD3.5)\n"
            "or an all-in-one safetensors file with --tokenizers DIR. MODEL is one component: a diffusers model\n"
            "folder (config.json + diffusion_pytorch_model.safetensors[.index.json]) or a single safetensors\n"
            "checkpoint (diffusers or original SD3 names). docs/cli.md has every command and option.\n\n"
            "environment: KILN_THREADS (kernel threads), KILN_LOG "
            "(quiet|error|warn|info|debug),\n             KILN_TIMINGS=1 (print the timing ledger at exit), KILN_CACHE_DIR (weight cache root),\n             KILN_PACKAGE_DIR (compiled packages), KILN_EXEC (execution chain), KILN_CC (C compiler),\n             KILN_F16=0 (no fp16 kernels), KILN_ATTENTION=strips (no fused attention),\n             KILN_MAX_ISA=avx2|avx512|avx512_bf16|avx512_fp16|amx (run a lower CPU class's kernels)\n");
}

/* OpenMP's idle threads spin for about 300,000 polls (GOMP_SPINCOUNT's
 * default) before they sleep: on a machine whose cores another process
 * shares, they burn its time slices waiting. libgomp reads the setting once,
 * when it loads (before main), so kiln sets GOMP_SPINCOUNT=10000 and runs
 * itself again (~6 ms) unless the user chose (OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT set). Measured on a 2-core Zen 5 (docs/PERFORMANCE.md): the
 * same 4-step backbone run 1.02x slower on a quiet machine, 1.21x faster
 * with one busy process beside it. */
static void spin_less(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    /* the binary by its own path, so the process keeps its name ("kiln" in
     * ps, pgrep and /proc/PID/comm; "/proc/self/exe" would make it "exe") */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || setenv("GOMP_SPINCOUNT", "10000", 1) != 0) return;
    self[n] = 0;
    execv(self, argv); /* returns only when it fails: then run as we are */
    unsetenv("GOMP_SPINCOUNT");
}

/* Levenshtein distance of two short words (longer ones: far) */
static int edits(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 32 || m > 32) return 99;
    int d[33][33];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[n][m];
}

int main(int argc, char **argv) {
    spin_less(argv);
    kb_log(KILN_LOG_DEBUG, "OpenMP idle threads: GOMP_SPINCOUNT=%s, OMP_WAIT_POLICY=%s",
           getenv("GOMP_SPINCOUNT") ? getenv("GOMP_SPINCOUNT") : "(unset)",
           getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(unset)");
    /* over the file size limit (ulimit -f) a write fails with EFBIG and a
     * message, instead of SIGXFSZ killing kiln without one */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (kk_cpu_cap_error()) {
        fprintf(stderr, "kiln: KILN_MAX_ISA=%s %s\n", getenv("KILN_MAX_ISA"), kk_cpu_cap_error());
        return 2;
    }
    if (!strcmp(argv[1], "--version")) {
        kk_class c = kk_cpu_class(), hw = kk_cpu_hw_class();
        printf("kiln %s\nCPU class %s", KILN_VERSION, kk_class_name(c));
        if (c != hw) printf(" (this CPU's is %s; capped by KILN_MAX_ISA or ONEDNN_MAX_CPU_ISA)", kk_class_name(hw));
        printf("\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].run(argc - 1, argv + 1);
    /* the nearest command by edit distance, or the one it starts, as a hint */
    const char *best = NULL;
    int bd = 3;
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++) {
        int d = strncmp(k_cmds[i].name, argv[1], strlen(argv[1])) == 0 && strlen(argv[1]) >= 2 ? 1 : edits(argv[1], k_cmds[i].name);
        if (d < bd) bd = d, best = k_cmds[i].name;
    }
    if (best) fprintf(stderr, "kiln: unknown command '%s'; did you mean '%s'?\n\n", argv[1], best);
    else fprintf(stderr, "kiln: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
