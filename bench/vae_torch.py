#!/usr/bin/env python3
"""diffusers side of bench/vae_bench.sh (the VAE decoder, CPU).

  write: an AutoencoderKL at SD3's real dimensions (block_out_channels
         [128, 256, 512, 512], layers_per_block 2, 16 latent channels, 32
         groups, no quant convs), diffusers' own init under a fixed seed, stored
         bf16 (config.json + diffusion_pytorch_model.safetensors, a folder kiln
         and diffusers both load), and seeded latents [1, 16, h, w] per --sizes
         (latents-H.safetensors, key "latents", in the VAE's space: fed to
         vae.decode as they are, kiln's --no-scale)
  time:  vae.decode(latents).sample, eager or torch.compile, bf16 or f32; one
         JSON line with the median ms; --output saves the sample (f32),
         --compare FILE... gives each kiln sample's relative L2 against this one

  vae_torch.py write --out DIR [--sizes 128,256] [--seed S]
  vae_torch.py time --model DIR --latents FILE [--dtype bf16|f32] [--mode eager|compile]
                    [--threads 2] [--runs 1] [--warmup 1] [--output FILE] [--compare FILE ...]
"""

import argparse
import json
import os
import statistics
import sys
import time


def write(a):
    import torch
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file
    torch.manual_seed(a.seed)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                        layers_per_block=2, latent_channels=16, norm_num_groups=32, sample_size=1024,
                        scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
                        use_post_quant_conv=False)
    vae.to(torch.bfloat16).save_pretrained(a.out, safe_serialization=True)
    g = torch.Generator().manual_seed(a.seed + 1)
    for s in (int(x) for x in a.sizes.split(",")):
        z = torch.randn((1, 16, s, s), generator=g, dtype=torch.float32)
        save_file({"latents": z}, os.path.join(a.out, f"latents-{s}.safetensors"))
    print(f"wrote {a.out} ({sum(p.numel() for p in vae.parameters()) / 1e6:.1f} M parameters)")


def time_it(a):
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch
    from diffusers import AutoencoderKL
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(a.threads)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    vae = AutoencoderKL.from_pretrained(a.model, torch_dtype=dt).eval()
    z = load_file(a.latents)["latents"].to(dt)
    dec = vae.decode
    if a.mode == "compile":
        dec = torch.compile(vae.decode)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(a.warmup):
            dec(z)
        first = (time.perf_counter() - t0) * 1e3
        ms = []
        for _ in range(a.runs):
            t1 = time.perf_counter()
            out = dec(z).sample
            ms.append((time.perf_counter() - t1) * 1e3)
    res = {"median_ms": statistics.median(ms), "warmup_ms": first, "runs": a.runs, "torch": torch.__version__}
    t = out.double()
    if a.output:
        save_file({"sample": out.float().contiguous()}, a.output)
    for f in a.compare or []:
        k = load_file(f)["sample"].double()
        res["rel_l2:" + os.path.basename(f)] = float((k - t).norm() / t.norm())
    print(json.dumps(res))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--out", required=True)
    w.add_argument("--sizes", default="128,256", help="latent sides to write (default 128,256)")
    w.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("time")
    t.add_argument("--model", required=True)
    t.add_argument("--latents", required=True)
    t.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    t.add_argument("--mode", choices=("eager", "compile"), default="eager")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--runs", type=int, default=1)
    t.add_argument("--warmup", type=int, default=1, help="untimed decodes first (compile: at least 1)")
    t.add_argument("--output", help="save this run's sample (f32) here")
    t.add_argument("--compare", nargs="*", help="kiln samples (safetensors, key sample): relative L2 each")
    a = p.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    if a.cmd == "write":
        write(a)
    else:
        time_it(a)


if __name__ == "__main__":
    sys.exit(main())
