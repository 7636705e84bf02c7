#!/usr/bin/env python3
"""PyTorch / diffusers side of kiln's side-by-side benchmarks.

Times one SD3Transformer2DModel forward (the backbone) on the CPU, from a
diffusers model folder and a safetensors file of inputs, in one of three modes:

  eager    the diffusers module as is
  compile  torch.compile(model) (inductor, C++/OpenMP codegen for the CPU)
  aoti     torch.export (latent width dynamic) + AOTInductor package, loaded
           and run in a fresh Python process

See bench/README.md. Needs torch, diffusers, safetensors, numpy
(bench/requirements.txt); kiln's own build and tests never need this.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

from bench_util import peak_rss_mb, peak_rss_mb_own, rel_l2, setup_torch, timed_calls

INPUT_KEYS = ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep")
DEFAULT_WARMUP = {"eager": 1, "compile": 2, "aoti": 1}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Time SD3Transformer2DModel forwards with PyTorch on the CPU.")
    p.add_argument("--model", help="diffusers model folder (config.json + "
                   "diffusion_pytorch_model.safetensors)")
    p.add_argument("--inputs", required=True, help="safetensors file with hidden_states "
                   "[B,C,H,W], encoder_hidden_states [B,T,J], pooled_projections [B,P], "
                   "timestep [B]; an optional 'sample' is compared against the output")
    p.add_argument("--dtype", choices=("bf16", "f32"), default="bf16",
                   help="compute dtype of weights and activations (default bf16)")
    p.add_argument("--mode", choices=("eager", "compile", "aoti"), default="eager",
                   help="eager module, torch.compile (inductor), or torch.export + "
                   "AOTInductor package run in a fresh process (default eager)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--runs", type=int, default=5, help="timed forwards (default 5)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed forwards first (default: eager 1, compile 2, aoti 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--output", help="save the output 'sample' (float32) to this safetensors file")
    p.add_argument("--freezing", action="store_true",
                   help="compile/aoti: set torch._inductor.config.freezing (weights become "
                   "constants, oneDNN weight prepacking); off by default")
    p.add_argument("--package", help="aoti: where to write the .pt2 package "
                   "(default: a temporary file, removed afterwards)")
    p.add_argument("--inductor-cache", help="compile/aoti: TORCHINDUCTOR_CACHE_DIR to use; "
                   "default a fresh temporary one, so compile_s is a cold compile")
    p.add_argument("--debug", action="store_true", help="print full tracebacks on failure")
    # internal: the fresh process that loads and runs an AOTInductor package
    p.add_argument("--_aoti-child", dest="aoti_child", help=argparse.SUPPRESS)
    p.add_argument("--_patch", dest="patch", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--_spawn-time", dest="spawn_time", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.aoti_child is None and not a.model:
        p.error("--model is required")
    if a.threads < 1 or a.runs < 1:
        p.error("--threads and --runs must be >= 1")
    if a.warmup is None:
        a.warmup = DEFAULT_WARMUP[a.mode]
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


def fail(msg, code=2):
    print(f"torch_bench: {msg}", file=sys.stderr)
    sys.exit(code)


def setup_env(args):
    """Environment that must be in place before torch/diffusers are imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    # OpenMP pool size for code inductor generates and for the aoti child.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    tmp = None
    if args.mode in ("compile", "aoti") and args.aoti_child is None:
        if args.inductor_cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.inductor_cache
        else:
            tmp = tempfile.mkdtemp(prefix="torch_bench_inductor_")
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
    return tmp


def load_inputs(path, dtype):
    import torch
    from safetensors.torch import load_file
    try:
        t = load_file(path)
    except Exception as e:  # noqa: BLE001
        fail(f"{path}: cannot read as safetensors: {type(e).__name__}: {e}")
    missing = [k for k in INPUT_KEYS if k not in t]
    if missing:
        fail(f"{path}: missing tensor(s) {', '.join(missing)}")
    hs, ctx, pooled, ts = (t[k] for k in INPUT_KEYS)
    if hs.dim() != 4 or ctx.dim() != 3 or pooled.dim() != 2 or ts.dim() != 1:
        fail(f"{path}: expected hidden_states [B,C,H,W], encoder_hidden_states [B,T,J], "
             f"pooled_projections [B,P], timestep [B]; got {list(hs.shape)}, "
             f"{list(ctx.shape)}, {list(pooled.shape)}, {list(ts.shape)}")
    B = hs.shape[0]
    if not (ctx.shape[0] == pooled.shape[0] == ts.shape[0] == B):
        fail(f"{path}: batch sizes differ")
    inputs = {
        "hidden_states": hs.to(dtype).contiguous(),
        "encoder_hidden_states": ctx.to(dtype).contiguous(),
        "pooled_projections": pooled.to(dtype).contiguous(),
        # Kept float32, like the diffusers SD3 pipeline (scheduler timesteps are
        # float32) and kiln's API: the sinusoidal embedding is computed in float32
        # anyway, and bf16 would round e.g. 999 to 1000.
        "timestep": ts.to(torch.float32).contiguous(),
    }
    ref = t.get("sample")
    return inputs, ref


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.4g}") if abs(x) < 1e-3 else round(x, 3)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def save_output(path, out):
    import torch
    from safetensors.torch import save_file
    save_file({"sample": out.detach().to(torch.float32).contiguous()}, path)


class Backbone:
    """nn.Module wrapper with a plain tensor signature (for export and compile)."""

    @staticmethod
    def make(model):
        import torch

        class _Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep):
                return self.m(hidden_states=hidden_states,
                              encoder_hidden_states=encoder_hidden_states,
                              pooled_projections=pooled_projections,
                              timestep=timestep, return_dict=False)[0]

        return _Wrap(model).eval()


def load_model(args, torch_dtype):
    from diffusers import SD3Transformer2DModel
    for f in ("config.json", "diffusion_pytorch_model.safetensors"):
        if not os.path.exists(os.path.join(args.model, f)):
            fail(f"{args.model}: no {f}")
    t0 = time.perf_counter()
    # low_cpu_mem_usage=False: the path taken anyway without `accelerate` (not needed
    # here); saying so silences diffusers' warning about it.
    model = SD3Transformer2DModel.from_pretrained(args.model, torch_dtype=torch_dtype,
                                                  local_files_only=True,
                                                  low_cpu_mem_usage=False)
    # diffusers 0.42 without `accelerate` (low_cpu_mem_usage=False) leaves the loaded
    # tensors in the file's dtype despite torch_dtype; cast whatever was left behind.
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    if not keep and any(t.is_floating_point() and t.dtype != torch_dtype
                        for t in list(model.parameters()) + list(model.buffers())):
        model = model.to(torch_dtype)
    model.eval()
    return model, time.perf_counter() - t0


def aoti_export_and_package(args, torch, wrapped, inputs, patch, max_tokens, pkg_path, res):
    """torch.export with a dynamic latent width, then AOTInductor-compile to pkg_path.
    Returns (export_s, compile_s). Raises on failure."""
    from torch.export import Dim
    W = inputs["hidden_states"].shape[3]
    if W % patch:
        raise ValueError(f"latent width {W} is not a multiple of patch_size {patch}")

    def spec(dim):
        return {"hidden_states": {3: dim}, "encoder_hidden_states": None,
                "pooled_projections": None, "timestep": None}

    # W = patch * w_tok, w_tok (the width in tokens) in [2, pos_embed_max_size - 1]: at
    # exactly pos_embed_max_size the position-table crop is a no-op slice and export
    # specializes on it. With patch_size 1 export cannot prove the crop's bounds for odd
    # widths (floor division) and raises a constraint violation; then fall back to an
    # automatic dynamic W (Dim.DYNAMIC), whose range export infers from its guards.
    w_tok = Dim("w_tok", min=2, max=max_tokens - 1)
    attempts = [(f"W = {patch}*w_tok" if patch > 1 else "W = w_tok",
                 patch * w_tok if patch > 1 else w_tok),
                ("W = Dim.DYNAMIC", Dim.DYNAMIC)]
    res["stage"] = "torch.export"
    t0 = time.perf_counter()
    for i, (desc, dim) in enumerate(attempts):
        try:
            with torch.no_grad():
                ep = torch.export.export(wrapped, args=(), kwargs=dict(inputs),
                                         dynamic_shapes=spec(dim), strict=False)
            break
        except Exception as e:  # noqa: BLE001
            if i + 1 == len(attempts) or "Constraints violated" not in str(e):
                raise
            print(f"torch_bench: export with {desc} failed (constraint violation), "
                  f"retrying with {attempts[i + 1][0]}", file=sys.stderr)
    export_s = time.perf_counter() - t0
    res["dynamic_dim"] = desc
    res["dynamic_range"] = {str(k): [int(v.lower), int(v.upper)]
                            for k, v in ep.range_constraints.items()}
    res["stage"] = "torch._inductor.aoti_compile_and_package"
    t0 = time.perf_counter()
    inductor_configs = {"freezing": True} if args.freezing else {}
    torch._inductor.aoti_compile_and_package(ep, package_path=pkg_path,
                                             inductor_configs=inductor_configs)
    compile_s = time.perf_counter() - t0
    del res["stage"]
    return export_s, compile_s


def run_aoti_child(args):
    """Runs in a fresh process: load the package, time the first output and warm forwards."""
    torch = setup_torch(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    inputs, ref = load_inputs(args.inputs, dtype)
    res = {"baseline_rss_mb": peak_rss_mb_own()}
    with torch.inference_mode():
        t0 = time.perf_counter()
        runner = torch._inductor.aoti_load_package(args.aoti_child)
        res["load_s"] = time.perf_counter() - t0
        call = lambda: runner(**inputs)
        t1 = time.perf_counter()
        out = call()
        t_first = time.time()
        res["first_ms"] = (time.perf_counter() - t1) * 1e3
        res["load_first_s"] = time.perf_counter() - t0
        if args.spawn_time is not None:
            res["cold_start_s"] = t_first - args.spawn_time
        warm, _ = timed_calls(call, max(args.warmup - 1, 0))
        runs, out = timed_calls(call, args.runs)
        if isinstance(out, (list, tuple)):
            out = out[0]
        # The package must accept another latent width (the dynamic dim): one untimed
        # forward with the width shrunk by one token.
        hs = inputs["hidden_states"]
        w2 = hs.shape[3] - args.patch
        if w2 >= 2 * args.patch:
            try:
                o2 = runner(**dict(inputs, hidden_states=hs[..., :w2].contiguous()))
                o2 = o2[0] if isinstance(o2, (list, tuple)) else o2
                res["other_width_ok"] = list(o2.shape) == list(hs.shape[:1]) + [
                    out.shape[1], hs.shape[2], w2]
            except Exception as e:  # noqa: BLE001
                res["other_width_ok"] = False
                res["other_width_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    res.update(warmup_ms=[res["first_ms"]] + warm, runs=runs,
               peak_rss_mb=peak_rss_mb_own(), out_shape=list(out.shape))
    if ref is not None:
        res["rel_l2"] = rel_l2(out, ref)
    if args.output:
        save_output(args.output, out)
    print("AOTI_CHILD_RESULT " + json.dumps(res), flush=True)


def main(argv=None):
    args = parse_args(argv)
    tmp_cache = setup_env(args)
    if args.aoti_child is not None:
        return run_aoti_child(args)
    try:
        return bench(args)
    finally:
        if tmp_cache:
            import shutil
            shutil.rmtree(tmp_cache, ignore_errors=True)


def bench(args):
    torch = setup_torch(args.threads)
    import diffusers
    from diffusers import SD3Transformer2DModel  # noqa: F401  (import cost into the baseline)
    torch_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    baseline_rss = peak_rss_mb()  # after importing torch + diffusers, before the model
    inputs, ref = load_inputs(args.inputs, torch_dtype)
    model, load_s = load_model(args, torch_dtype)
    cfg = model.config
    hs = inputs["hidden_states"]
    res = {
        "impl": f"torch-{args.mode}-{args.dtype}",
        "median_ms": None,
        "runs": None,
        "compile_s": None,
        "threads": args.threads,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "peak_rss_mb": None,
        "baseline_rss_mb": baseline_rss,
        "load_s": load_s,
        "shape": {"hidden_states": list(hs.shape),
                  "context_tokens": int(inputs["encoder_hidden_states"].shape[1]),
                  "num_layers": int(cfg.num_layers)},
    }
    if args.mode in ("compile", "aoti"):
        res["freezing"] = bool(args.freezing)
    wrapped = Backbone.make(model)

    if args.mode == "eager":
        with torch.inference_mode():
            call = lambda: wrapped(**inputs)
            warm, _ = timed_calls(call, args.warmup)
            runs, out = timed_calls(call, args.runs)
        res["warmup_ms"] = warm

    elif args.mode == "compile":
        if args.freezing:
            import torch._inductor.config as icfg
            icfg.freezing = True
        compiled = torch.compile(wrapped, backend="inductor")
        with torch.inference_mode():
            call = lambda: compiled(**inputs)
            try:
                t0 = time.perf_counter()
                out = call()  # compiles
                res["compile_s"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001
                if args.debug:
                    traceback.print_exc()
                fail(f"torch.compile failed with torch {torch.__version__}: "
                     f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                     + ("" if args.debug else " (rerun with --debug for the traceback)"))
            warm, _ = timed_calls(call, max(args.warmup - 1, 0))
            runs, out = timed_calls(call, args.runs)
        # compile_s is the first call's wall time: tracing + inductor codegen + the C++
        # compiler + one forward.
        res["warmup_ms"] = [res["compile_s"] * 1e3] + warm

    else:  # aoti
        patch = int(cfg.patch_size)
        max_tok = int(cfg.pos_embed_max_size or 192)
        own_pkg = args.package is None
        if own_pkg:
            fd, pkg = tempfile.mkstemp(prefix="torch_bench_", suffix=".pt2")
            os.close(fd)
            os.unlink(pkg)
        else:
            pkg = os.path.abspath(args.package)
        try:
            try:
                export_s, comp_s = aoti_export_and_package(args, torch, wrapped, inputs,
                                                           patch, max_tok, pkg, res)
            except Exception as e:  # noqa: BLE001
                if args.debug:
                    traceback.print_exc()
                msg = str(e).strip().splitlines()
                fail(f"aoti failed in {res.get('stage', 'export')} with torch {torch.__version__}: "
                     f"{type(e).__name__}: {msg[0] if msg else ''}"
                     + ("" if args.debug else " (rerun with --debug for the traceback)"))
            res["export_s"] = export_s
            res["compile_s"] = export_s + comp_s
            res["package_mb"] = os.path.getsize(pkg) / 2**20
            res["compile_peak_rss_mb"] = peak_rss_mb()
            del wrapped, model
            cmd = [sys.executable, os.path.abspath(__file__), "--_aoti-child", pkg,
                   "--inputs", args.inputs, "--dtype", args.dtype, "--mode", "aoti",
                   "--threads", str(args.threads), "--runs", str(args.runs),
                   "--warmup", str(args.warmup), "--_patch", str(patch)]
            if args.output:
                cmd += ["--output", args.output]
            cmd += ["--_spawn-time", repr(time.time())]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
            child = None
            for line in proc.stdout.splitlines():
                if line.startswith("AOTI_CHILD_RESULT "):
                    child = json.loads(line[len("AOTI_CHILD_RESULT "):])
            if proc.returncode != 0 or child is None:
                tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
                fail(f"aoti: running the package in a fresh process failed "
                     f"(exit {proc.returncode}) with torch {torch.__version__}:\n{tail}")
        finally:
            if own_pkg and os.path.exists(pkg):
                os.unlink(pkg)
        runs = child["runs"]
        res["warmup_ms"] = child["warmup_ms"]
        for k in ("load_s", "first_ms", "load_first_s", "cold_start_s", "rel_l2",
                  "other_width_ok", "other_width_error"):
            if k in child:
                res["aoti_" + k if k == "load_s" else k] = child[k]
        # RSS of the fresh process that ran the package (the exporting one is in
        # compile_peak_rss_mb)
        res["peak_rss_mb"] = child["peak_rss_mb"]
        res["baseline_rss_mb"] = child["baseline_rss_mb"]
        out = None

    res["runs"] = runs
    res["median_ms"] = statistics.median(runs)
    if args.mode != "aoti":
        res["peak_rss_mb"] = peak_rss_mb()
        if ref is not None:
            res["rel_l2"] = rel_l2(out, ref)
        if args.output:
            save_output(args.output, out)

    res = _round(res)
    if args.json:
        print(json.dumps(res))
    else:
        line = (f"{res['impl']}: median {res['median_ms']:.2f} ms over {len(runs)} runs "
                f"(min {min(runs):.2f}, max {max(runs):.2f}), threads {args.threads}, "
                f"latent {'x'.join(map(str, hs.shape))}, "
                f"{res['shape']['context_tokens']} ctx tokens, "
                f"peak RSS {res['peak_rss_mb']:.0f} MB, torch {torch.__version__}")
        if res["compile_s"] is not None:
            line += f", compile {res['compile_s']:.1f} s"
        if args.mode == "aoti":
            line += (f", package {res['package_mb']:.1f} MB, fresh process: load "
                     f"{res['aoti_load_s']:.2f} s, first forward {res['first_ms']:.1f} ms")
            if "cold_start_s" in res:
                line += f", spawn-to-first-output {res['cold_start_s']:.2f} s"
        if res.get("rel_l2") is not None:
            line += f", rel L2 vs sample {res['rel_l2']:.3e}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
