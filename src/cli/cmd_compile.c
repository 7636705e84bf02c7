/* cmd_compile.c - kiln compile MODEL [--dim name=min:max ...]: export the
 * backbone with symbolic dimensions and build a weightless package. */
#include "arch/arch.h"
#include "base/base.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_usage[] =
    "kiln compile MODEL [--dim NAME=MIN:MAX | NAME=VALUE ...] [--batch B] [--latent HxW] [--context-len T]\n"
    "                   [--capture] [--full] [--package-dir DIR] [--quant int8|fp8 [--max-error E] [--force]] [options]\n"
    "       kiln compile PIPELINE [--batch IMAGES] [--width W --height H] [--guidance G] [options]";

static int help(void) {
    printf("usage: %s\n\n"
           "Export the backbone once with symbolic dimensions, generate C for it, build it with\n"
           "KILN_CC (default cc) into a weightless package (shared object + manifest) and publish it\n"
           "under the package folder. Later `kiln forward` / `kiln generate` runs in any process use\n"
           "it when the request's shape is inside its ranges (see docs/package.md).\n"
           "A pipeline folder (model_index.json), or an all-in-one file with --tokenizers DIR, is\n"
           "compiled for a request: one sampler step of --batch images (default 1) at --width x\n"
           "--height (default the pipeline's) with guidance --guidance (default 7: CFG) runs with every\n"
           "component compiling a fixed-shape package for each shape it sees, so `kiln generate PIPELINE`\n"
           "requests of that shape start from packages.\n\n"
           "dimensions (symbols), by model family:\n", k_usage);
    for (int f = 0; f < ka_count(); f++) {
        const ka_arch *a = ka_at(f);
        printf("  %s (%s):\n", a->name, a->title);
        for (int i = 0; i < a->nsym; i++) printf("    %-9s %s\n", a->sym[i], a->sym_doc[i] ? a->sym_doc[i] : "");
    }
    printf("  --dim NAME=MIN:MAX   make a symbol dynamic over a range (repeatable, or comma-separated)\n"
           "  --dim NAME=VALUE     fix a symbol\n"
           "  Symbols not named are fixed at the example request's value.\n\n"
           "the example request of an SD3 backbone (default: batch 2, latent 64x64 or the largest\n"
           "the position table allows, 333 context tokens; other families: --batch and --dim):\n"
           "  --batch B  --latent HxW  --context-len T\n"
           "  --capture  run the example eagerly first and publish only if the package reproduces it\n\n"
           "  --full     emit the whole graph as one function (default: regional, each distinct\n"
           "             transformer block kind emitted once and called for every layer)\n\n"
           "quantized backbones (--quant int8|fp8): the quality gate (as `kiln quality`) runs first\n"
           "against the unquantized model, and a package is published only when the final latents\n"
           "differ by at most --max-error (default 0.03 relative L2); --force publishes anyway.\n\n%s",
           cli_common_help);
    return 0;
}

int cmd_compile(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    kiln_compile_opts o = kiln_compile_defaults();
    const char *model = NULL, *v;
    char dims[512] = "";
    long pw = 0, ph = 0;
    double guidance = 7.0; /* a pipeline request: CFG (batch 2) as diffusers' default */
    for (int i = 1; i < argc; i++) {
        int r;
        long n;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if (cli_flag(argv, i, "--full")) {
            o.whole_graph = 1;
            continue;
        }
        if (cli_flag(argv, i, "--capture")) {
            o.capture = 1;
            continue;
        }
        if (cli_flag(argv, i, "--force")) {
            o.force = 1;
            continue;
        }
        if ((r = cli_opt("compile", argc, argv, &i, "--max-error", &v))) {
            if (r < 0 || cli_parse_double("compile", "--max-error", v, &o.max_rel_l2)) return 2;
            if (o.max_rel_l2 <= 0) return cli_usage_error("compile", k_usage, "--max-error %s: must be positive", v);
            continue;
        }
        if ((r = cli_common_opt("compile", argc, argv, &i, &com))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("compile", argc, argv, &i, "--dim", &v))) {
            if (r < 0) return 2;
            size_t len = strlen(dims);
            if (len + strlen(v) + 2 > sizeof dims) return cli_usage_error("compile", k_usage, "too many --dim options");
            snprintf(dims + len, sizeof dims - len, "%s%s", len ? "," : "", v);
            continue;
        }
        if ((r = cli_opt("compile", argc, argv, &i, "--batch", &v))) {
            if (r < 0 || cli_parse_int("compile", "--batch", v, 1, 64, &n)) return 2;
            o.batch = (int)n;
            continue;
        }
        if ((r = cli_opt("compile", argc, argv, &i, "--context-len", &v))) {
            if (r < 0 || cli_parse_int("compile", "--context-len", v, 1, 100000, &n)) return 2;
            o.context_len = (int)n;
            continue;
        }
        if ((r = cli_opt("compile", argc, argv, &i, "--width", &v))) {
            if (r < 0 || cli_parse_int("compile", "--width", v, 1, 1 << 20, &pw)) return 2;
            continue;
        }
        if ((r = cli_opt("compile", argc, argv, &i, "--height", &v))) {
            if (r < 0 || cli_parse_int("compile", "--height", v, 1, 1 << 20, &ph)) return 2;
            continue;
        }
        if ((r = cli_opt("compile", argc, argv, &i, "--guidance", &v))) {
            if (r < 0 || cli_parse_double("compile", "--guidance", v, &guidance)) return 2;
            continue;
        }
        if ((r = cli_opt("compile", argc, argv, &i, "--latent", &v))) {
            if (r < 0 || cli_parse_hw("compile", "--latent", v, &o.height, &o.width)) return 2;
            continue;
        }
        if (argv[i][0] == '-') return cli_usage_error("compile", k_usage, "unknown option %s", argv[i]);
        if (model) return cli_usage_error("compile", k_usage, "more than one MODEL given");
        model = argv[i];
    }
    if (!model) return cli_usage_error("compile", k_usage, "MODEL is required");
    if (cli_is_pipeline(model, &com)) { /* a folder or an all-in-one file: every component, for the shapes of a request */
        if (*dims || o.height || o.context_len || com.quant)
            return cli_usage_error("compile", k_usage, "a pipeline is compiled for a request: --batch (images), --width, "
                                   "--height, --guidance; not --dim, --latent, --context-len or --quant");
        int rc = cli_pipeline_compile(model, &com, o.batch ? o.batch : 1, (int)pw, (int)ph, guidance);
        cli_common_finish(&com);
        return rc;
    }
    o.dims = dims;
    o.package_dir = com.package_dir;
    kiln_model *m = NULL, *base = NULL;
    kiln_status s = cli_load_model(model, &com, &m);
    if (s) return cli_fail("compile", s);
    if (com.quant != KILN_QUANT_NONE && !o.force) { /* the quality gate's reference: the same model unquantized */
        cli_common bc = com;
        bc.quant = KILN_QUANT_NONE;
        if ((s = cli_load_model(model, &bc, &base))) {
            kiln_model_free(m);
            return cli_fail("compile", s);
        }
        o.quality_base = base;
        if (kb_log_level() >= KILN_LOG_WARN)
            fprintf(stderr, "compile: quality gate: %s against the unquantized model...\n", kiln_quant_name(com.quant));
    }
    if (kb_log_level() >= KILN_LOG_WARN) fprintf(stderr, "compile: exporting, planning and building (dims: %s)...\n", *dims ? dims : "all fixed");
    kiln_compile_result res;
    s = kiln_compile(m, &o, &res);
    kiln_model_free(m);
    kiln_model_free(base);
    cli_common_finish(&com);
    if (s) return cli_fail("compile", s);
    char so[32], arena[32];
    printf("%s %s\n", res.reused ? "reused" : "published", res.path);
    printf("  %d nodes, %d block kind%s for %d layers, shared object %s, arena %s\n", res.nodes, res.block_kinds,
           res.block_kinds == 1 ? "" : "s", res.regions, kb_human_bytes((double)res.so_bytes, so, sizeof so),
           kb_human_bytes((double)res.arena_bytes, arena, sizeof arena));
    printf("  compile %.2f s (C compiler %.2f s)", res.seconds, res.cc_seconds);
    if (o.capture) printf(", captured example reproduced (relative L2 %.2g)", res.capture_rel_err);
    if (res.quality_rel_l2 >= 0) printf(", quality gate passed (final latents %.2f%% from unquantized)", 100 * res.quality_rel_l2);
    printf("\n");
    return 0;
}
