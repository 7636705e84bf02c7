/* cmd_info.c - kiln info MODEL */
#include "base/base.h"
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char k_usage[] = "kiln info MODEL [--config FILE]";

int cmd_info(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            printf("usage: %s\n\nPrints the architecture, parameter count, weight dtypes and size on "
                   "disk of MODEL\n(a diffusers folder or a single safetensors checkpoint).\n\n"
                   "  --config FILE   config.json for a single-file checkpoint whose heads cannot be inferred\n",
                   k_usage);
            return 0;
        }
        if ((r = cli_common_opt("info", argc, argv, &i, &com))) {
            if (r < 0) return 2;
            continue;
        }
        if (argv[i][0] == '-') return cli_usage_error("info", k_usage, "unknown option %s", argv[i]);
        if (model) return cli_usage_error("info", k_usage, "more than one MODEL given");
        model = argv[i];
    }
    if (!model) return cli_usage_error("info", k_usage, "MODEL is required");
    kiln_model *m;
    kiln_open_opts o = {.config_path = com.config, .reference = 1}; /* no packing: info only reads */
    kiln_status s = kiln_model_open(model, &o, &m);
    if (s) return cli_fail("info", s);
    const kiln_config *c = kiln_model_config(m);
    kiln_model_info inf;
    kiln_model_get_info(m, &inf);
    char size[32];
    printf("model:          %s\n", model);
    printf("layout:         %s\n", inf.layout);
    printf("family:         %s\n", kiln_model_family(m));
    if (c) { /* an SD3 backbone: what its config says */
        printf("architecture:   SD3Transformer2DModel (MMDiT%s%s)\n", c->qk_norm_rms ? ", RMS qk-norm" : "",
               c->dual_attention_mask ? ", dual attention" : "");
        printf("layers:         %d joint blocks", c->num_layers);
        if (c->dual_attention_mask) {
            printf(" (attn2 in");
            for (int i = 0; i < c->num_layers; i++)
                if (c->dual_attention_mask >> i & 1) printf(" %d", i);
            printf(")");
        }
        printf("\nwidth:          %d = %d heads x %d\n", c->num_attention_heads * c->attention_head_dim,
               c->num_attention_heads, c->attention_head_dim);
        printf("patch:          %d, in %d / out %d channels, position table %dx%d patches\n",
               c->patch_size, c->in_channels, c->out_channels, c->pos_embed_max_size, c->pos_embed_max_size);
        printf("conditioning:   context %d -> %d, pooled %d\n", c->joint_attention_dim,
               c->caption_projection_dim, c->pooled_projection_dim);
        printf("latent range:   up to %dx%d (multiples of %d)\n", c->pos_embed_max_size * c->patch_size,
               c->pos_embed_max_size * c->patch_size, c->patch_size);
    } else { /* any other family: its config as it writes it */
        char *js = kiln_model_config_json(m);
        printf("config:         %s\n", js ? js : "?");
        free(js);
    }
    printf("inputs:        ");
    for (int i = 0; i < kiln_model_n_inputs(m); i++) printf("%s %s", i ? "," : "", kiln_model_input_name(m, i));
    printf("\noutputs:       ");
    for (int i = 0; i < kiln_model_n_outputs(m); i++) printf("%s %s", i ? "," : "", kiln_model_output_name(m, i));
    printf("\nquant layers:   %s (the --quant default)\n", kiln_family_quant_layers(kiln_model_family(m)));
    printf("parameters:     %lld (%.2f M) in %lld tensors\n", (long long)inf.n_params,
           (double)inf.n_params / 1e6, (long long)inf.n_tensors);
    printf("dtypes:        ");
    for (int t = 1; t < KILN_DTYPE_COUNT; t++)
        if (inf.n_by_dtype[t]) printf(" %s x %lld", kiln_dtype_name((kiln_dtype)t), (long long)inf.n_by_dtype[t]);
    printf("\nsize on disk:   %s\n", kb_human_bytes((double)inf.bytes_on_disk, size, sizeof size));
    printf("kernels:        bf16: %s\n                f32: %s\n", kiln_kernels(KILN_BF16), kiln_kernels(KILN_F32));
    kiln_model_free(m);
    cli_common_finish(&com);
    return 0;
}
