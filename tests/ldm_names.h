/* ldm_names.h - the original (LDM / Black Forest Labs) names of a diffusers
 * AutoencoderKL's tensors, for tests that write all-in-one files the way
 * ComfyUI and A1111 save them (test_single_file.c, test_flux.c). */
#ifndef KILN_TEST_LDM_NAMES_H
#define KILN_TEST_LDM_NAMES_H

#include <stdio.h>
#include <string.h>

/* a diffusers VAE name d as LDM's under prefix ("first_stage_model." in SD3's
 * files, "vae." in ComfyUI's Flux ones; n_up: the decoder's up blocks);
 * conv1x1: the weight is a Linear stored there as a 1x1 convolution */
static void ldm_name(const char *prefix, const char *d, int n_up, char *out, size_t cap, int *conv1x1) {
    char buf[96];
    snprintf(buf, sizeof buf, "%s", d);
    *conv1x1 = 0;
    char part[16];
    snprintf(part, sizeof part, "%.7s", buf); /* encoder / decoder */
    const char *s = buf + 8;
    int i, j;
    char rest[80];
    if (sscanf(s, "down_blocks.%d.resnets.%d.%79s", &i, &j, rest) == 3 ||
        sscanf(s, "up_blocks.%d.resnets.%d.%79s", &i, &j, rest) == 3) {
        int up = s[0] == 'u';
        if (!strncmp(rest, "conv_shortcut", 13)) {
            char t[80];
            snprintf(t, sizeof t, "nin_shortcut%s", rest + 13);
            snprintf(rest, sizeof rest, "%s", t);
        }
        snprintf(out, cap, "%s%s.%s.%d.block.%d.%s", prefix, part, up ? "up" : "down", up ? n_up - 1 - i : i, j,
                 rest);
    } else if (sscanf(s, "down_blocks.%d.downsamplers.0.conv.%79s", &i, rest) == 2) {
        snprintf(out, cap, "%s%s.down.%d.downsample.conv.%s", prefix, part, i, rest);
    } else if (sscanf(s, "up_blocks.%d.upsamplers.0.conv.%79s", &i, rest) == 2) {
        snprintf(out, cap, "%s%s.up.%d.upsample.conv.%s", prefix, part, n_up - 1 - i, rest);
    } else if (sscanf(s, "mid_block.resnets.%d.%79s", &i, rest) == 2) {
        snprintf(out, cap, "%s%s.mid.block_%d.%s", prefix, part, i + 1, rest);
    } else if (!strncmp(s, "mid_block.attentions.0.", 23)) {
        const char *a = s + 23;
        static const char *const m[][2] = {{"group_norm.", "norm."}, {"to_q.", "q."}, {"to_k.", "k."},
                                           {"to_v.", "v."}, {"to_out.0.", "proj_out."}};
        for (size_t k = 0; k < 5; k++)
            if (!strncmp(a, m[k][0], strlen(m[k][0]))) {
                snprintf(out, cap, "%s%s.mid.attn_1.%s%s", prefix, part, m[k][1], a + strlen(m[k][0]));
                *conv1x1 = k > 0 && strstr(a, "weight") != NULL;
            }
    } else if (!strncmp(s, "conv_norm_out.", 14)) {
        snprintf(out, cap, "%s%s.norm_out.%s", prefix, part, s + 14);
    } else {
        snprintf(out, cap, "%s%s", prefix, d); /* conv_in, conv_out, quant convs */
    }
}

#endif
