"""vae_tiled_reference.py - diffusers' tiled VAE decode of sd3-pipeline-tiny's
decoder input, the reference test_vae_tiled.c holds kiln's tiled decode to
(issue 27: "matches diffusers' tiled decode of the same case within 1e-5").

The shared goldens hold no tiled decode, so this makes one: the case's vae/
(AutoencoderKL, 2 blocks, f = 2) in float64 on CPU, enable_tiling() with
tile_sample_min_size / tile_latent_min_size set as kiln's --vae-tile SIZE
sets them (SIZE and SIZE / f), on
  tiled16   decoder_input [1, 16, 16, 24], 16 px tiles (3 x 4 tiles, edge tiles smaller)
  tiled32   decoder_input, 32 px tiles (2 x 2)
  tiled88   input48 [1, 16, 48, 48] (decoder_input 3x nearest-upsampled: row y * 16 // 48,
            column x * 24 // 48, as the test builds it), 88 px tiles (2 x 2)
  untiled48 input48 decoded untiled
Run with a Python that has torch, diffusers and safetensors:
  python bench/vae_tiled_reference.py [tests/data]
writes tests/data/vae-tiled/reference.safetensors (float32 of the float64 results)."""
import sys

import torch
from diffusers import AutoencoderKL
from safetensors.torch import load_file, save_file

data = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
case = f"{data}/goldens/sd3-pipeline-tiny"
vae = AutoencoderKL.from_pretrained(f"{case}/vae").to(torch.float64).eval()
z = load_file(f"{case}/io.safetensors")["decoder_input"].to(torch.float64)
f = 2 ** (len(vae.config.block_out_channels) - 1)
ys = torch.arange(48) * 16 // 48
xs = torch.arange(48) * 24 // 48
z48 = z[:, :, ys][:, :, :, xs].contiguous()


def decode(x, tile):
    if tile:
        vae.enable_tiling()
        vae.tile_sample_min_size = tile
        vae.tile_latent_min_size = tile // f
    else:
        vae.disable_tiling()
    with torch.no_grad():
        return vae.decode(x).sample


out = {
    "tiled16": decode(z, 16),
    "tiled32": decode(z, 32),
    "input48": z48,
    "tiled88": decode(z48, 88),
    "untiled48": decode(z48, 0),
}
save_file({k: v.to(torch.float32).contiguous() for k, v in out.items()}, f"{data}/vae-tiled/reference.safetensors")
for k, v in out.items():
    print(k, list(v.shape))
