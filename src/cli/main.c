/* main.c - the kiln command: dispatch to subcommands. */
#include "cli.h"

#include <signal.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *summary;
} k_cmds[] = {
    {"info", cmd_info, "architecture, parameter count, dtypes and size of a model"},
    {"forward", cmd_forward, "one backbone call on tensors from a safetensors file"},
    {"generate", cmd_generate, "flow-matching sampling with classifier-free guidance"},
    {"cache", cmd_cache, "build, list, verify, remove and garbage-collect weight caches"},
    {"compile", cmd_compile, "compile the backbone into a weightless package with dynamic dimensions"},
    {"package", cmd_package, "list, verify and remove compiled packages"},
    {"quality", cmd_quality, "the quality gate of a quantized backbone: bf16 vs int8/fp8 on one sampler request"},
    {"encode", cmd_encode, "a pipeline's prompt conditioning (SD3 encode_prompt: CLIP-L, CLIP-G, T5) for kiln generate"},
    {"decode", cmd_decode, "latents to PNG images through a VAE (tiled when memory is short)"},
    {"encode-image", cmd_encode_image, "a PNG to the pipeline's latents through the VAE's encoder"},
    {"tokenize", cmd_tokenize, "token ids of a prompt from a pipeline's CLIP / T5 tokenizers, padded as the pipeline pads"},
    {"make-model", cmd_make, "write a seeded model of any SD3 config (and inputs) for trials and benchmarks"},
    {"demo", cmd_demo, "make an embedded tiny model, generate at two widths, show timings"},
};

static void usage(FILE *f) {
    fprintf(f,
            "kiln %s - fast cold starts for diffusion transformers (SD3 / SD3.5 MMDiT) on CPU\n\n"
            "usage: kiln COMMAND [options]   (kiln COMMAND --help for each)\n\ncommands:\n",
            KILN_VERSION);
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", k_cmds[i].name, k_cmds[i].summary);
    fprintf(f,
            "\nMODEL is a diffusers model folder (config.json + diffusion_pytorch_model"
            ".safetensors[.index.json])\nor a single safetensors checkpoint (diffusers or original "
            "SD3 names).\n\nenvironment: KILN_THREADS (kernel threads), KILN_LOG "
            "(quiet|error|warn|info|debug),\n             KILN_TIMINGS=1 (print the timing ledger at exit), KILN_CACHE_DIR (weight cache root),\n             KILN_PACKAGE_DIR (compiled packages), KILN_EXEC (execution chain), KILN_CC (C compiler),\n             KILN_F16=0 (no fp16 kernels), KILN_ATTENTION=strips (no fused attention)\n");
}

int main(int argc, char **argv) {
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
    if (!strcmp(argv[1], "--version")) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kiln: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
