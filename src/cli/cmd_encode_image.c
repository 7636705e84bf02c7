/* cmd_encode_image.c - kiln encode-image VAE_OR_PIPELINE --image in.png
 * --output latents.safetensors: an RGB PNG through the VAE's encoder into
 * the pipeline's latents (img2img's start): VaeImageProcessor.preprocess
 * (2 u / 255 - 1, no resize), the mean of latent_dist, (x - shift_factor) *
 * scaling_factor from the VAE's config; key `latents` [1, C, H/f, W/f]. */
#include "base/base.h"
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char k_usage[] =
    "kiln encode-image VAE_OR_PIPELINE --image in.png --output latents.safetensors [--no-scale] [options]";

static int help(void) {
    printf("usage: %s\n\n"
           "Encode an 8-bit PNG (RGB; gray and palette expanded, alpha dropped, 16-bit reduced to its high\n"
           "byte) with a diffusers AutoencoderKL's encoder (a vae/ folder, or a pipeline folder holding\n"
           "one): its pixels to [-1, 1], the mean of latent_dist, then (x - shift_factor) * scaling_factor\n"
           "from the VAE's config (--no-scale: the mean as it is). Height and width must be multiples of\n"
           "the VAE's factor (8 for SD3 / Flux); kiln does not resize. The output holds `latents`\n"
           "[1, C, H/f, W/f].\n\n"
           "  --image FILE      the PNG\n"
           "  --output FILE     the safetensors file to write\n"
           "  --no-scale        write the latent_dist mean unscaled\n%s",
           k_usage, cli_common_help);
    return 0;
}

int cmd_encode_image(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    const char *vae_path = NULL, *image = NULL, *output = NULL;
    int no_scale = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if (cli_flag(argv, i, "--no-scale")) {
            no_scale = 1;
            continue;
        }
        if ((r = cli_common_opt("encode-image", argc, argv, &i, &com)) ||
            (r = cli_opt("encode-image", argc, argv, &i, "--image", &image)) ||
            (r = cli_opt("encode-image", argc, argv, &i, "--output", &output))) {
            if (r < 0) return 2;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("encode-image", k_usage, "unknown option %s", argv[i]);
        if (vae_path) return cli_usage_error("encode-image", k_usage, "more than one VAE_OR_PIPELINE given");
        vae_path = argv[i];
    }
    if (!vae_path || !image || !output)
        return cli_usage_error("encode-image", k_usage, "VAE_OR_PIPELINE, --image and --output are required");
    if (cli_check_st_output("encode-image", output)) return 1; /* before any work */
    int rc = 1, h = 0, w = 0;
    uint8_t *rgb = NULL;
    float *lat = NULL;
    kiln_model *m = NULL;
    int64_t shape[4];
    double t0 = kb_now();
    kiln_status s = kiln_png_read(image, &rgb, &h, &w);
    char name[128];
    kiln_load_opts lo = cli_load_opts(vae_path, &com, name, sizeof name);
    if (!s) s = kiln_vae_open(vae_path, &lo, "vae-encoder", &m);
    if (!s) s = kiln_vae_encode_rgb(m, rgb, h, w, no_scale, &lat, shape);
    if (!s) {
        kiln_tensor t = {"latents", KILN_F32, 4, {shape[0], shape[1], shape[2], shape[3]}, lat};
        s = kiln_tensors_write(output, 1, &t);
    }
    if (s) {
        rc = cli_fail("encode-image", s);
    } else {
        fprintf(stderr, "encode-image: %s %dx%d -> latents [%lld, %lld, %lld, %lld]%s in %.1f ms -> %s\n", image, h, w,
                (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
                no_scale ? " (no scale)" : "", (kb_now() - t0) * 1e3, output);
        rc = 0;
    }
    free(rgb);
    free(lat);
    kiln_model_free(m);
    cli_common_finish(&com);
    return rc;
}
