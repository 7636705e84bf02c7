"""Helpers the PyTorch sides of the benchmarks share (torch_bench.py, encoder_torch.py,
pipeline_torch.py) and the per-round summaries of the shell scripts.

Import it from a script in bench/ (`import bench_util`): Python puts the script's folder
first on sys.path. Nothing here imports torch at module level, so a summary that only
reads numbers (`ratios`, `median`) runs without the venv.
"""

import os
import resource
import statistics
import time


def setup_env(threads):
    """What must be in place before torch / diffusers / transformers are imported:
    offline hub, no telemetry, quiet diffusers, the OpenMP pool size."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ["OMP_NUM_THREADS"] = str(threads)


def setup_torch(threads):
    """Import torch with `threads` intra-op threads and one inter-op thread."""
    import logging
    import torch
    # "No CUDA runtime is found, using CUDA_HOME=..." when inductor builds C++ on a
    # machine without a GPU: harmless noise for a CPU benchmark.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (can only be set once per process)
    return torch


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def peak_rss_mb_own():
    """Peak RSS of this process image only. Linux carries ru_maxrss across fork+exec (the
    parent's high-water mark at fork), so a child reads VmHWM instead."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return peak_rss_mb()


def timed_calls(fn, n):
    """n calls of fn(): (each call's ms, the last call's result)."""
    times, out = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def rel_l2(out, ref):
    """Relative L2 error of out against ref, in float64 (None when the shapes differ)."""
    import torch
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if o.shape != r.shape:
        return None
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


def median(xs):
    return statistics.median(xs)


def ratios(num, den):
    """Per-round ratios num[r] / den[r] over the rounds both have (dicts round -> value),
    in round order, and their median: a shared host's speed drifts between rounds, so
    the median of paired ratios is steadier than a ratio of medians. (list, median or None)"""
    rs = [num[r] / den[r] for r in sorted(num, key=lambda k: int(k)) if r in den and den[r]]
    return rs, (statistics.median(rs) if rs else None)
