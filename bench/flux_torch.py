#!/usr/bin/env python3
"""PyTorch / diffusers side of kiln's Flux backbone benchmark (bench/flux_bench.sh).

Times one FluxTransformer2DModel forward on the CPU from a diffusers model
folder and a `kiln make-model --inputs` file (latents [B,16,H,W] unpacked,
encoder_hidden_states, pooled_projections, timestep, guidance for dev),
packed and given ids as FluxPipeline does it, in eager or torch.compile mode.
Prints one JSON object (median_ms, compile_s, the output's relative L2 error
against --reference, a kiln output). Needs bench/requirements.txt; kiln's
build and tests never do.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import peak_rss_mb, rel_l2, setup_env, setup_torch, timed_calls  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Time FluxTransformer2DModel forwards with PyTorch on the CPU.")
    p.add_argument("--model", required=True, help="diffusers FluxTransformer2DModel folder")
    p.add_argument("--inputs", required=True, help="kiln make-model --inputs file of a Flux config")
    p.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    p.add_argument("--mode", choices=("eager", "compile"), default="eager")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=None, help="default: eager 1, compile 2")
    p.add_argument("--reference", help="a kiln output file ('sample' [B,16,H,W]) to compare against")
    a = p.parse_args(argv)
    if a.warmup is None:
        a.warmup = 1 if a.mode == "eager" else 2
    if a.threads < 1 or a.runs < 1 or a.warmup < 0:
        p.error("--threads and --runs must be >= 1, --warmup >= 0")
    return a


def pack(torch, lat):
    """FluxPipeline._pack_latents: [B,C,H,W] -> [B,(H/2)(W/2),C*4], features (c, py, px)."""
    B, C, H, W = lat.shape
    x = lat.view(B, C, H // 2, 2, W // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, (H // 2) * (W // 2), C * 4)


def unpack(torch, x, H, W):
    """FluxPipeline._unpack_latents: the inverse of pack."""
    B, N, F = x.shape
    C = F // 4
    x = x.view(B, H // 2, W // 2, C, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, C, H, W)


def main(argv=None):
    args = parse_args(argv)
    setup_env(args.threads)
    tmp = None
    if args.mode == "compile":
        tmp = tempfile.mkdtemp(prefix="flux_torch_inductor_")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp  # a cold compile
    torch = setup_torch(args.threads)
    import diffusers
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import load_file
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    t = load_file(args.inputs)
    lat = t["latents"]
    B, C, H, W = lat.shape
    T = t["encoder_hidden_states"].shape[1]
    t0 = time.perf_counter()
    model = FluxTransformer2DModel.from_pretrained(args.model, torch_dtype=dt, local_files_only=True,
                                                   low_cpu_mem_usage=False)
    if any(p.dtype != dt for p in model.parameters()):
        model = model.to(dt)
    model.eval()
    load_s = time.perf_counter() - t0
    img_ids = torch.zeros(H // 2, W // 2, 3)
    img_ids[..., 1] += torch.arange(H // 2)[:, None]
    img_ids[..., 2] += torch.arange(W // 2)[None, :]
    kw = dict(hidden_states=pack(torch, lat).to(dt), encoder_hidden_states=t["encoder_hidden_states"].to(dt),
              pooled_projections=t["pooled_projections"].to(dt), timestep=t["timestep"].to(dt),
              img_ids=img_ids.reshape(-1, 3), txt_ids=torch.zeros(T, 3), return_dict=False)
    if "guidance" in t:
        kw["guidance"] = t["guidance"].to(torch.float32)
    fn = model if args.mode == "eager" else torch.compile(model)
    res = {"impl": f"torch-{args.mode}-{args.dtype}", "torch": torch.__version__, "diffusers": diffusers.__version__,
           "threads": args.threads, "load_s": load_s, "shape": [B, C, H, W], "context_tokens": int(T)}
    with torch.inference_mode():
        call = lambda: fn(**kw)[0]  # noqa: E731
        t1 = time.perf_counter()
        warm, _ = timed_calls(call, args.warmup)
        if args.mode == "compile":
            res["compile_s"] = time.perf_counter() - t1 - (warm[-1] / 1e3 if len(warm) > 1 else 0)
        runs, out = timed_calls(call, args.runs)
    res.update(warmup_ms=warm, runs=runs, median_ms=sorted(runs)[len(runs) // 2], peak_rss_mb=peak_rss_mb())
    if args.reference:
        ref = load_file(args.reference)["sample"]
        res["rel_l2_vs_kiln"] = rel_l2(unpack(torch, out.float(), H, W), ref)
    if tmp:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
