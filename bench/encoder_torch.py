#!/usr/bin/env python3
"""transformers side of bench/encoder_bench.sh (text encoders, CPU).

  write: seeded weights for one encoder as a transformers folder (config.json +
         model.safetensors, bf16) that kiln and transformers both load, and an
         input_ids file [1, T]
  time:  T5EncoderModel / CLIPTextModelWithProjection from that folder, eager or
         torch.compile (optionally frozen), in bf16 or f32; one JSON line with the median ms

  encoder_torch.py write --family t5|clip-g --out DIR [--layers N] [--tokens T] [--seed S]
  encoder_torch.py time --model DIR --inputs FILE [--dtype bf16|f32] [--mode eager|compile|compile-frozen]
                        [--threads 2] [--runs 3] [--compare KILN_OUTPUT]
"""

import argparse
import json
import os
import statistics
import sys
import time

from bench_util import rel_l2, setup_env, setup_torch, timed_calls


def configs(family, layers):
    if family == "t5":  # T5-XXL v1.1's width (SD3's text_encoder_3), fewer layers
        from transformers import T5Config
        return T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=layers, num_heads=64,
                        relative_attention_num_buckets=32, relative_attention_max_distance=128,
                        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
                        tie_word_embeddings=False, architectures=["T5EncoderModel"])
    from transformers import CLIPTextConfig  # CLIP-G (SD3's text_encoder_2), its real size
    return CLIPTextConfig(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=layers,
                          num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu",
                          projection_dim=1280, bos_token_id=0, eos_token_id=2, pad_token_id=1,
                          architectures=["CLIPTextModelWithProjection"])


def write(a):
    import torch
    from safetensors.torch import save_file
    torch.manual_seed(a.seed)
    cfg = configs(a.family, a.layers)
    if a.family == "t5":
        from transformers import T5EncoderModel as M
    else:
        from transformers import CLIPTextModelWithProjection as M
    model = M(cfg).to(torch.bfloat16)
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size="100GB")
    g = torch.Generator().manual_seed(a.seed + 1)
    T = a.tokens if a.family == "t5" else 77
    hi = 32000 if a.family == "t5" else 49000
    ids = torch.randint(3, hi, (1, T), generator=g, dtype=torch.int64)
    if a.family == "t5":
        ids[0, T // 2] = 1  # </s>, padding after it as SD3 pads
        ids[0, T // 2 + 1:] = 0
    else:
        ids[0, 0] = 0  # <|startoftext|> ... <|endoftext|> (eos 2), padding after
        ids[0, 20] = 2
        ids[0, 21:] = 2
    save_file({"input_ids": ids}, os.path.join(a.out, "inputs.safetensors"))
    print(f"wrote {a.out} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters)")


def time_it(a):
    setup_env(a.threads)
    torch = setup_torch(a.threads)
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    if "T5EncoderModel" in cfg.get("architectures", []):
        from transformers import T5EncoderModel as M
    else:
        from transformers import CLIPTextModelWithProjection as M
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = M.from_pretrained(a.model, dtype=dt, attn_implementation="eager").eval()
    ids = load_file(a.inputs)["input_ids"]
    fwd = model
    if a.mode.startswith("compile"):
        if a.mode == "compile-frozen":
            import torch._inductor.config as ic
            ic.freezing = True
        fwd = torch.compile(model)
    with torch.inference_mode():
        warm, _ = timed_calls(lambda: fwd(input_ids=ids), 1 if a.mode == "eager" else 2)
        ms, out = timed_calls(lambda: fwd(input_ids=ids), a.runs)
    h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    res = {"median_ms": statistics.median(ms), "warmup_ms": sum(warm), "runs": a.runs, "torch": torch.__version__}
    if a.compare:
        res["kiln_rel_l2"] = rel_l2(load_file(a.compare)["last_hidden_state"], h)
    print(json.dumps(res))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--family", choices=("t5", "clip-g"), required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--layers", type=int, default=None)
    w.add_argument("--tokens", type=int, default=256)
    w.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("time")
    t.add_argument("--model", required=True)
    t.add_argument("--inputs", required=True)
    t.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    t.add_argument("--mode", choices=("eager", "compile", "compile-frozen"), default="eager",
                   help="compile-frozen: torch.compile with inductor's freezing (weights as constants, "
                   "oneDNN weight prepacking)")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--runs", type=int, default=3)
    t.add_argument("--compare", help="a kiln forward output file: its last_hidden_state's relative L2 "
                   "against this run's goes into the JSON line")
    a = p.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    if a.cmd == "write":
        if a.layers is None:
            a.layers = 4 if a.family == "t5" else 32
        write(a)
    else:
        time_it(a)


if __name__ == "__main__":
    sys.exit(main())
