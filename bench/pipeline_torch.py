#!/usr/bin/env python3
"""diffusers side of bench/pipeline_bench.sh (the whole SD3 or Flux pipeline, CPU).

  write: an SD3.5-medium-shaped StableDiffusion3Pipeline folder with seeded weights,
         stored bf16 in diffusers' layout (model_index.json + one folder a component),
         which kiln and diffusers both load:
           text_encoder    CLIP-L, its real size (12 layers, 768 wide, 12 heads, projection 768)
           text_encoder_2  CLIP-G at its real width (1280, 20 heads, projection 1280), --clip-g-layers of 32 (4)
           text_encoder_3  T5-XXL at its real width (d_model 4096, 64 heads, d_kv 64, d_ff 10240, vocab
                           32128), --t5-layers of 24 (4)
           transformer     SD3.5-medium's SD3Transformer2DModel config (1536 wide = 24 heads x 64,
                           qk_norm rms_norm, pos_embed_max_size 384, sample_size 128, patch 2, 16
                           channels, joint 4096, pooled 2048) with --blocks of 24 blocks (4); the real
                           model's first 13 blocks are dual-attention, so here all but the last
                           (which is context_pre_only, as the real one's last)
           vae             SD3's AutoencoderKL (block_out_channels 128/256/512/512, 16 latent
                           channels, scaling 1.5305, shift 0.0609), no quant convs
           scheduler       FlowMatchEulerDiscreteScheduler, shift 3.0
           tokenizer*      copied from the sd3-pipeline-tiny case (the real CLIP and T5 vocabularies)
         With --class flux, a FLUX.1-schnell-shaped FluxPipeline folder instead:
           text_encoder    CLIP-L (CLIPTextModel), its real size
           text_encoder_2  T5-XXL at its real width, --t5-layers of 24 (4)
           transformer     FluxTransformer2DModel at the real width (3072 = 24 heads x 128, joint
                           4096, pooled 768, axes (16, 56, 56), no guidance embedding) with
                           --blocks / 2 double blocks of 19 (2) and --blocks single blocks of 38 (4)
           vae             FLUX.1's AutoencoderKL (128/256/512/512, 16 latent channels, scaling
                           0.3611, shift 0.1159)
           scheduler       schnell's: FlowMatchEulerDiscreteScheduler, shift 1.0, no dynamic shifting
           tokenizer*      copied from the flux-pipeline-tiny case
         Weights: transformers' and diffusers' own init under a fixed seed.
  warm:  one process: from_pretrained once, then --runs pipeline calls; one JSON line with each
         call's ms and its parts (encode_prompt, each transformer call, vae.decode).
  cold:  a fresh process's imports + from_pretrained + first call (+ the PNG written), each part
         timed; the shell times the whole process from outside.

  pipeline_torch.py write --out DIR [--class sd3|flux] [--tokenizers DIR] [--blocks 4] [--clip-g-layers 4]
                    [--t5-layers 4] [--seed 0]
  pipeline_torch.py warm|cold --pipeline DIR [--prompt P] [--seed S] [--size 512] [--steps 8]
                    [--guidance 7.0] [--threads 2] [--runs 3] [--output out.png]
"""

import time

T_START = time.perf_counter()  # before the imports a cold process pays

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402

from bench_util import peak_rss_mb, setup_env, setup_torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "..", "tests", "data", "goldens", "sd3-pipeline-tiny")
TINY_FLUX = os.path.join(HERE, "..", "tests", "data", "goldens", "flux-pipeline-tiny")


def clip_l_config(CLIPTextConfig, cls):
    """CLIP-L at its real size (12 layers, 768 wide, 12 heads, projection 768) as class cls"""
    return CLIPTextConfig(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768, bos_token_id=0, eos_token_id=2,
        pad_token_id=1, architectures=[cls])


def t5_xxl_config(T5Config, layers):
    """T5-XXL at its real width (d_model 4096, 64 heads, d_kv 64, d_ff 10240, vocab 32128), layers of 24"""
    return T5Config(
        vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=layers, num_heads=64,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
        is_encoder_decoder=False, use_cache=False, tie_word_embeddings=False, architectures=["T5EncoderModel"])


def vae_16(AutoencoderKL, scaling, shift):
    """the 16-channel AutoencoderKL of SD3 and FLUX.1 (128/256/512/512), with its latent scale and shift"""
    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
        act_fn="silu", latent_channels=16, norm_num_groups=32, sample_size=1024, scaling_factor=scaling,
        shift_factor=shift, use_quant_conv=False, use_post_quant_conv=False, force_upcast=True,
        mid_block_add_attention=True)


def save(pipe, out, tok, names):
    """pipe saved at out, whole or not at all, with the case's tokenizer folders as they are (kiln reads them)"""
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.save_pretrained(tmp, safe_serialization=True)
    for k in names:
        shutil.rmtree(os.path.join(tmp, k))
        shutil.copytree(os.path.join(tok, k), os.path.join(tmp, k))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)  # a folder is whole or absent: an interrupted write is redone


def write_flux(a):
    torch = setup_torch(a.threads)
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast
    torch.manual_seed(a.seed)
    bf = torch.bfloat16
    clip_l = CLIPTextModel(clip_l_config(CLIPTextConfig, "CLIPTextModel")).to(bf).eval()
    t5 = T5EncoderModel(t5_xxl_config(T5Config, a.t5_layers)).to(bf).eval()
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=a.blocks // 2, num_single_layers=a.blocks, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=False,
        axes_dims_rope=(16, 56, 56)).to(bf).eval()
    vae = vae_16(AutoencoderKL, 0.3611, 0.1159).to(bf).eval()
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False,
                                            base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                            max_image_seq_len=4096)
    tok = a.tokenizers if a.tokenizers != TINY else TINY_FLUX
    pipe = FluxPipeline(transformer=transformer, scheduler=sched, vae=vae, text_encoder=clip_l,
                        tokenizer=CLIPTokenizer.from_pretrained(os.path.join(tok, "tokenizer")), text_encoder_2=t5,
                        tokenizer_2=T5TokenizerFast.from_pretrained(os.path.join(tok, "tokenizer_2")))
    save(pipe, a.out, tok, ("tokenizer", "tokenizer_2"))
    n = {k: sum(p.numel() for p in m.parameters()) / 1e6
         for k, m in (("clip_l", clip_l), ("t5", t5), ("transformer", transformer), ("vae", vae))}
    print(json.dumps({"wrote": a.out, "class": "FluxPipeline", "mparams": {k: round(v, 1) for k, v in n.items()}}))


def write(a):
    torch = setup_torch(a.threads)
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from diffusers import StableDiffusion3Pipeline
    from transformers import (CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer, T5Config,
                              T5EncoderModel, T5TokenizerFast)
    torch.manual_seed(a.seed)
    bf = torch.bfloat16
    clip_l = CLIPTextModelWithProjection(clip_l_config(CLIPTextConfig, "CLIPTextModelWithProjection")).to(bf).eval()
    clip_g = CLIPTextModelWithProjection(CLIPTextConfig(
        vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=a.clip_g_layers,
        num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu", projection_dim=1280,
        bos_token_id=0, eos_token_id=2, pad_token_id=1, architectures=["CLIPTextModelWithProjection"])).to(bf).eval()
    t5 = T5EncoderModel(t5_xxl_config(T5Config, a.t5_layers)).to(bf).eval()
    transformer = SD3Transformer2DModel(
        sample_size=128, patch_size=2, in_channels=16, num_layers=a.blocks, attention_head_dim=64,
        num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
        out_channels=16, pos_embed_max_size=384, dual_attention_layers=tuple(range(a.blocks - 1)),
        qk_norm="rms_norm").to(bf).eval()
    vae = vae_16(AutoencoderKL, 1.5305, 0.0609).to(bf).eval()
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    tok = a.tokenizers
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=sched, vae=vae, text_encoder=clip_l,
        tokenizer=CLIPTokenizer.from_pretrained(os.path.join(tok, "tokenizer")), text_encoder_2=clip_g,
        tokenizer_2=CLIPTokenizer.from_pretrained(os.path.join(tok, "tokenizer_2")), text_encoder_3=t5,
        tokenizer_3=T5TokenizerFast.from_pretrained(os.path.join(tok, "tokenizer_3")))
    save(pipe, a.out, tok, ("tokenizer", "tokenizer_2", "tokenizer_3"))
    n = {k: sum(p.numel() for p in m.parameters()) / 1e6
         for k, m in (("clip_l", clip_l), ("clip_g", clip_g), ("t5", t5), ("transformer", transformer), ("vae", vae))}
    print(json.dumps({"wrote": a.out, "mparams": {k: round(v, 1) for k, v in n.items()}}))


class Parts:
    """Wall time of each part of a pipeline call: encode_prompt, every transformer forward
    (one a step: CFG runs uncond and cond as one batch of 2), vae.decode."""

    def __init__(self, pipe):
        self.rows = {"encode_ms": 0.0, "steps_ms": [], "decode_ms": 0.0}
        self._t = None
        enc, dec = pipe.encode_prompt, pipe.vae.decode

        def encode(*args, **kw):
            t0 = time.perf_counter()
            r = enc(*args, **kw)
            self.rows["encode_ms"] += (time.perf_counter() - t0) * 1e3
            return r

        def decode(*args, **kw):
            t0 = time.perf_counter()
            r = dec(*args, **kw)
            self.rows["decode_ms"] += (time.perf_counter() - t0) * 1e3
            return r

        pipe.encode_prompt, pipe.vae.decode = encode, decode  # __call__ looks both up on the instance
        pipe.transformer.register_forward_pre_hook(lambda m, i: setattr(self, "_t", time.perf_counter()))
        pipe.transformer.register_forward_hook(
            lambda m, i, o: self.rows["steps_ms"].append((time.perf_counter() - self._t) * 1e3))

    def take(self):
        r = self.rows
        r["sampling_ms"] = sum(r["steps_ms"])
        self.rows = {"encode_ms": 0.0, "steps_ms": [], "decode_ms": 0.0}
        return r


def run(a):
    setup_env(a.threads)
    t0 = time.perf_counter()
    torch = setup_torch(a.threads)
    import diffusers
    imports_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cls = json.load(open(os.path.join(a.pipeline, "model_index.json")))["_class_name"]
    if cls not in ("StableDiffusion3Pipeline", "FluxPipeline"):
        sys.exit(f"pipeline_torch.py: {a.pipeline}: class {cls}, not StableDiffusion3Pipeline or FluxPipeline")
    pipe = getattr(diffusers, cls).from_pretrained(a.pipeline, torch_dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - t0
    parts = Parts(pipe)
    res = {"mode": a.cmd, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "imports_ms": imports_s * 1e3, "load_ms": load_s * 1e3, "calls": []}
    n = 1 if a.cmd == "cold" else a.runs
    with torch.inference_mode():
        for i in range(n):
            t0 = time.perf_counter()
            # (FluxPipeline: the guidance is the distilled guidance's, unused by schnell; no negative prompt)
            img = pipe(prompt=a.prompt, height=a.size, width=a.size, num_inference_steps=a.steps,
                       guidance_scale=a.guidance, max_sequence_length=256,
                       generator=torch.Generator().manual_seed(a.seed)).images[0]
            if a.output:
                img.save(a.output)
            call = {"total_ms": (time.perf_counter() - t0) * 1e3}
            call.update(parts.take())
            res["calls"].append(call)
    res["since_start_ms"] = (time.perf_counter() - T_START) * 1e3  # imports + load + first call, inside Python
    res["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(res))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--out", required=True)
    w.add_argument("--class", dest="cls", choices=("sd3", "flux"), default="sd3")
    w.add_argument("--tokenizers", default=TINY, help="a pipeline folder whose tokenizer* folders are copied")
    w.add_argument("--blocks", type=int, default=4)
    w.add_argument("--clip-g-layers", type=int, default=4)
    w.add_argument("--t5-layers", type=int, default=4)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--threads", type=int, default=2)
    for name in ("warm", "cold"):
        t = sub.add_parser(name)
        t.add_argument("--pipeline", required=True)
        t.add_argument("--prompt", default="a photograph of an astronaut riding a horse")
        t.add_argument("--seed", type=int, default=0)
        t.add_argument("--size", type=int, default=512)
        t.add_argument("--steps", type=int, default=8)
        t.add_argument("--guidance", type=float, default=7.0)
        t.add_argument("--threads", type=int, default=2)
        t.add_argument("--runs", type=int, default=3)
        t.add_argument("--output", help="save each image here (PNG), as kiln writes one")
    a = p.parse_args()
    if a.cmd == "write":
        setup_env(a.threads)
        (write_flux if a.cls == "flux" else write)(a)
    else:
        run(a)


if __name__ == "__main__":
    sys.exit(main())
