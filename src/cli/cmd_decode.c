/* cmd_decode.c - kiln decode VAE_OR_PIPELINE --latents FILE --output out.png:
 * a VAE decode of latents into PNG images (one per batch entry), as
 * diffusers' pipelines end: latents / scaling_factor + shift_factor (from
 * the VAE's config), vae.decode, VaeImageProcessor.postprocess; tiled as
 * AutoencoderKL.tiled_decode when the untiled decode would pass a memory
 * budget. */
#include "base/base.h"
#include "cli.h"
#include "format/safetensors.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char k_usage[] =
    "kiln decode VAE_OR_PIPELINE --latents FILE [--key latents] --output out.png [--tensor-output FILE]\n"
    "                            [--no-scale] [--vae-tile auto|off|SIZE] [--vae-memory BYTES] [options]";

static int help(void) {
    printf("usage: %s\n\n"
           "Decode latents [B, C, h, w] with a diffusers AutoencoderKL (a vae/ folder, or a pipeline folder\n"
           "holding one) into 8-bit RGB PNGs exactly as diffusers' VaeImageProcessor.postprocess: out.png,\n"
           "or out-0.png, out-1.png ... when B > 1. Each PNG carries the \"parameters\" text (size, model,\n"
           "kiln version). The latents are the pipeline's: divided by the VAE config's scaling_factor and\n"
           "shifted by its shift_factor before decoding, unless --no-scale (they are in the VAE's space).\n\n"
           "  --latents FILE          a safetensors file holding the latents\n"
           "  --key NAME              the tensor in it (default latents)\n"
           "  --output out.png        the image (the batch: out-I.png)\n"
           "  --tensor-output FILE    also write the decoder's float image under `sample` [B, 3, H, W]\n"
           "  --no-scale              the latents are fed as they are\n"
           "  --vae-tile MODE         auto (default: tile when the untiled decode's activations pass the\n"
           "                          budget), off, or a tile size in pixels (a multiple of 4 x the VAE's\n"
           "                          factor; diffusers' enable_tiling uses the config's sample_size)\n"
           "  --vae-memory BYTES      the budget of auto (K, M, G suffixes; default a quarter of RAM)\n%s",
           k_usage, cli_common_help);
    return 0;
}

int cmd_decode(int argc, char **argv) {
    cli_common com = cli_common_defaults();
    const char *vae_path = NULL, *latents = NULL, *key = "latents", *output = NULL, *tout = NULL, *v;
    kiln_vae_opts vo = kiln_vae_defaults();
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if (cli_flag(argv, i, "--no-scale")) {
            vo.no_scale = 1;
            continue;
        }
        if ((r = cli_common_opt("decode", argc, argv, &i, &com)) || (r = cli_opt("decode", argc, argv, &i, "--latents", &latents)) ||
            (r = cli_opt("decode", argc, argv, &i, "--key", &key)) || (r = cli_opt("decode", argc, argv, &i, "--output", &output)) ||
            (r = cli_opt("decode", argc, argv, &i, "--tensor-output", &tout))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("decode", argc, argv, &i, "--vae-tile", &v))) {
            if (r < 0) return 2;
            if (kiln_vae_parse_tile(v, &vo)) return cli_usage_error("decode", k_usage, "%s", kiln_last_error());
            continue;
        }
        if ((r = cli_opt("decode", argc, argv, &i, "--vae-memory", &v))) {
            if (r < 0) return 2;
            if (kiln_vae_parse_memory(v, &vo)) return cli_usage_error("decode", k_usage, "%s", kiln_last_error());
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("decode", k_usage, "unknown option %s", argv[i]);
        if (vae_path) return cli_usage_error("decode", k_usage, "more than one VAE_OR_PIPELINE given");
        vae_path = argv[i];
    }
    if (!vae_path || !latents || !output)
        return cli_usage_error("decode", k_usage, "VAE_OR_PIPELINE, --latents and --output are required");
    /* every output checked before any work */
    if (cli_check_png_output("decode", output) || (tout && cli_check_output("decode", tout))) return 1;
    int rc = 1;
    st_file *f = NULL;
    kiln_model *m = NULL;
    float *z = NULL, *sample = NULL;
    cli_outputs outs = {0};
    kiln_status s = st_open(latents, &f);
    if (s) {
        rc = cli_fail("decode", s);
        goto done;
    }
    int64_t shape[4];
    if (!(z = cli_tensor("decode", f, key, 4, shape))) goto done;
    char name[128];
    kiln_load_opts lo = cli_load_opts(vae_path, &com, name, sizeof name);
    if ((s = kiln_vae_open(vae_path, &lo, "vae-decoder", &m))) {
        rc = cli_fail("decode", s);
        goto done;
    }
    kiln_vae_plan plan;
    if ((s = kiln_vae_plan_for(m, shape, &vo, &plan))) {
        rc = cli_fail("decode", s);
        goto done;
    }
    int64_t H = 0, W = 0;
    {
        kiln_tensor in = {.name = "latent", .dtype = KILN_F32, .ndim = 4, .shape = {1, shape[1], shape[2], shape[3]}, .data = z};
        kiln_output o = {.name = "sample"};
        if ((s = kiln_run(m, &in, 1, &o, 1))) { /* shapes only */
            rc = cli_fail("decode", s);
            goto done;
        }
        H = o.shape[2], W = o.shape[3];
    }
    if (tout && !(sample = malloc(sizeof(float) * (size_t)shape[0] * 3 * (size_t)H * (size_t)W))) {
        cli_error("decode", "out of memory for the float image");
        goto done;
    }
    const char *base = strrchr(vae_path, '/');
    kiln_image_info info = {.model = base && base[1] ? base + 1 : vae_path};
    double t0 = kb_now();
    /* every image or none (outputs.c): written under temporary names, renamed when all are */
    if (cli_outputs_begin(&outs, output, (int)shape[0])) {
        cli_error("decode", "out of memory");
        goto done;
    }
    if ((s = kiln_vae_write_png(m, z, shape, &vo, outs.tmp_base, &info, sample, &plan))) {
        rc = cli_fail("decode", s);
        goto done;
    }
    if (tout) {
        kiln_tensor t = {"sample", KILN_F32, 4, {shape[0], 3, H, W}, sample};
        if ((s = kiln_tensors_write(tout, 1, &t))) { /* nothing half-written: the PNGs go too (done:) */
            rc = cli_fail("decode", s);
            goto done;
        }
    }
    if (cli_outputs_commit(&outs, "decode", 0)) goto done;
    char tiles[96] = "untiled";
    if (plan.tiled) snprintf(tiles, sizeof tiles, "%d tiles of %d px", plan.tiles, plan.tile_size);
    char *first = kiln_image_path(output, 0, shape[0]);
    fprintf(stderr, "decode: latents [%lld, %lld, %lld, %lld]%s -> %lld image%s %lldx%lld (%s) in %.1f ms -> %s%s%s%s\n",
            (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3], vo.no_scale ? " (no scale)" : "",
            (long long)shape[0], shape[0] == 1 ? "" : "s", (long long)H, (long long)W, tiles, (kb_now() - t0) * 1e3,
            first ? first : output, shape[0] > 1 ? " ..." : "", tout ? ", " : "", tout ? tout : "");
    free(first);
    rc = 0;
done:
    cli_outputs_abort(&outs);
    free(z);
    free(sample);
    kiln_model_free(m);
    if (f) st_close(f);
    cli_common_finish(&com);
    return rc;
}
