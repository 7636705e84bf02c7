#!/usr/bin/env python3
"""Seeds of the file harnesses of tests/fuzz (run from the repository root):
small valid inputs built from tests/data, so a fuzzer starts past every
magic and version check:

corpus/tokenizer_files/  route byte + files joined by "@@KILN-FILE@@":
                         CLIP tokenizer.json and vocab.json + merges.txt cut
                         to the bytes and a few hundred merges; T5
                         tokenizer.json with a cut vocabulary (one with the
                         real precompiled_charsmap, one without); a small
                         hand-made spiece.model; each with the case's
                         tokenizer_config.json and special_tokens_map.json
corpus/shard_index/      weight maps naming the harness's shards (and a few
                         names that must be refused)
corpus/pipeline_files/   the test pipelines' model_index.json and
                         scheduler_config.json, and variants
corpus/single_file/      an all-in-one file: every component prefix, the
                         shapes config inference reads, every dimension cut
corpus/trust_key/        keys of 32 and 64 bytes, with trailing newlines
"""
import json, os, struct

G = "tests/data/goldens"
OUT = "tests/fuzz/corpus"
SEP = b"\n@@KILN-FILE@@\n"


def put(sub, name, data):
    d = os.path.join(OUT, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(p):
    with open(p, "rb") as f:
        return f.read()


# ---- tokenizer files ----
def clip_small(folder):
    t = json.loads(read(f"{G}/tokenizers/{folder}/tokenizer.json"))
    vocab, merges = t["model"]["vocab"], t["model"]["merges"][:300]
    keep = {}
    byte_chars = [k for k, v in vocab.items() if v < 512]  # the byte tokens and their </w> forms
    for k in byte_chars:
        keep[k] = vocab[k]
    for m in merges:
        a, b = m.split(" ") if isinstance(m, str) else m
        for k in (a, b, a + b):
            if k in vocab:
                keep[k] = vocab[k]
    for a in t["added_tokens"]:
        keep[a["content"]] = a["id"]
    t["model"]["vocab"] = keep
    t["model"]["merges"] = merges
    cfg = read(f"{G}/tokenizers/{folder}/tokenizer_config.json")
    smap = read(f"{G}/tokenizers/{folder}/special_tokens_map.json")
    tj = json.dumps(t, ensure_ascii=False).encode()
    put("tokenizer_files", f"clip-{folder}-json", bytes([0]) + tj + SEP + cfg + SEP + smap)
    mtxt = "#version: 0.2\n" + "\n".join(m if isinstance(m, str) else " ".join(m) for m in merges) + "\n"
    vj = json.dumps(keep, ensure_ascii=False).encode()
    put("tokenizer_files", f"clip-{folder}-vocab-merges", bytes([1]) + vj + SEP + mtxt.encode() + SEP + cfg + SEP + smap)


def t5_small():
    t = json.loads(read(f"{G}/tokenizers/tokenizer_3/tokenizer.json"))
    t["model"]["vocab"] = t["model"]["vocab"][:400]
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < 400]
    cfg = read(f"{G}/tokenizers/tokenizer_3/tokenizer_config.json")
    smap = read(f"{G}/tokenizers/tokenizer_3/special_tokens_map.json")
    put("tokenizer_files", "t5-json-charsmap", bytes([0]) + json.dumps(t, ensure_ascii=False).encode() + SEP + cfg + SEP + smap)
    t["normalizer"] = None
    put("tokenizer_files", "t5-json-no-normalizer", bytes([0]) + json.dumps(t, ensure_ascii=False).encode())


def varint(n):
    b = bytearray()
    while True:
        c = n & 0x7F
        n >>= 7
        b.append(c | (0x80 if n else 0))
        if not n:
            return bytes(b)


def field(num, wt, payload):
    key = varint(num << 3 | wt)
    if wt == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def spiece_small():
    pieces = [("<pad>", 0.0, 3), ("</s>", 0.0, 3), ("<unk>", 0.0, 2), ("\u2581", -2.0, 1), ("a", -3.0, 1),
              ("\u2581a", -2.5, 1), ("b", -4.0, 1), ("\u2581cat", -5.0, 1), ("c", -4.5, 1), ("t", -4.2, 1)]
    m = b""
    for p, s, ty in pieces:
        sp = field(1, 2, p.encode()) + field(2, 5, struct.pack("<f", s)) + field(3, 0, varint(ty))
        m += field(1, 2, sp)
    m += field(2, 2, field(3, 0, varint(1)) + field(40, 0, varint(2)))  # Unigram, unk_id 2
    put("tokenizer_files", "t5-spiece-small", bytes([2]) + m + SEP + b'{"extra_ids": 3}')


# ---- shard index ----
def shard_index():
    good = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                           "c": "model-00002-of-00002.safetensors"}, "metadata": {"total_size": 24}}
    put("shard_index", "good", json.dumps(good))
    put("shard_index", "one-shard", json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    for i, bad in enumerate(["../outside/other.safetensors", "/etc/passwd", "link.safetensors", "notes.safetensors",
                             "model-00003-of-00002.safetensors", ".."]):
        put("shard_index", f"refused-{i}", json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "x": bad}}))


# ---- pipeline files ----
def pipeline_files():
    for case in ("sd3-pipeline-tiny", "flux-pipeline-tiny"):
        for i, f in enumerate(("model_index.json", "scheduler/scheduler_config.json")):
            p = f"{G}/{case}/{f}"
            if os.path.exists(p):
                put("pipeline_files", f"{case}-{os.path.basename(f)}", bytes([i]) + read(p))
    put("pipeline_files", "scheduler-karras", bytes([1]) + b'{"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0, "use_karras_sigmas": true}')
    # a fuzzer's finding: an integer field past int64 with dynamic shifting off (fixed: read only with it on)
    put("pipeline_files", "scheduler-huge-seq-len", bytes([1]) + b'{"base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 3333333333333333333333333333334096, "max_shift": 1.15}')
    put("pipeline_files", "index-bad-name", bytes([0]) + b'{"_class_name": "StableDiffusion3Pipeline", "../vae": ["diffusers", "AutoencoderKL"]}')


# ---- an all-in-one file ----
def pack(tensors):
    hdr, off, data = {}, 0, bytearray()
    for name, shape in tensors:
        n = 2
        for d in shape:
            n *= d
        hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        data += bytes(n)
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data)


def single_file():
    clip = lambda p, d, proj: [(p + "text_model.embeddings.token_embedding.weight", [8, d]),
                               (p + "text_model.embeddings.position_embedding.weight", [4, d]),
                               (p + "text_model.encoder.layers.0.mlp.fc1.weight", [2 * d, d])] + \
                              ([(p + "text_projection.weight", [d, d])] if proj else [])
    t = [("model.diffusion_model.x_embedder.proj.weight", [4, 4, 2, 2]),
         ("model.diffusion_model.pos_embed", [1, 16, 4]),
         ("model.diffusion_model.context_embedder.weight", [4, 8]),
         ("model.diffusion_model.y_embedder.mlp.0.weight", [4, 8]),
         ("model.diffusion_model.t_embedder.mlp.0.weight", [4, 256]),
         ("model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight", [12, 4]),
         ("model.diffusion_model.final_layer.linear.weight", [16, 4])]
    t += clip("text_encoders.clip_l.transformer.", 4, True) + clip("text_encoders.clip_g.transformer.", 8, True)
    p = "text_encoders.t5xxl.transformer."
    t += [(p + "shared.weight", [8, 4]), (p + "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", [4, 2]),
          (p + "encoder.block.0.layer.0.SelfAttention.q.weight", [4, 4]),
          (p + "encoder.block.0.layer.1.DenseReluDense.wo.weight", [4, 8])]
    t += [("first_stage_model.decoder.conv_in.weight", [8, 4, 3, 3]), ("first_stage_model.decoder.conv_out.weight", [3, 8, 3, 3])]
    put("single_file", "all-parts", pack(t))
    put("single_file", "transformer-and-vae", pack(t[:7] + t[-2:]))
    # ComfyUI's Flux layout: BFL transformer names (double_blocks marks it; guidance_in: dev), CLIP-L, T5, vae.*
    f = "model.diffusion_model."
    fx = [(f + "img_in.weight", [8, 16]), (f + "txt_in.weight", [8, 8]), (f + "vector_in.in_layer.weight", [8, 4]),
          (f + "time_in.in_layer.weight", [8, 256]), (f + "guidance_in.in_layer.weight", [8, 256]),
          (f + "double_blocks.0.img_attn.qkv.weight", [24, 8]), (f + "double_blocks.0.img_attn.norm.query_norm.scale", [4]),
          (f + "single_blocks.0.linear1.weight", [56, 8]), (f + "final_layer.linear.weight", [16, 8])]
    fx += clip("text_encoders.clip_l.transformer.", 4, False)
    fx += [(p + "shared.weight", [8, 4]), (p + "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", [4, 2]),
           (p + "encoder.block.0.layer.0.SelfAttention.q.weight", [4, 4])]
    fx += [("vae.decoder.conv_in.weight", [8, 4, 3, 3]), ("vae.decoder.conv_out.weight", [3, 8, 3, 3])]
    put("single_file", "flux-all-parts", pack(fx))
    put("single_file", "flux-schnell", pack([x for x in fx if "guidance_in" not in x[0]]))


def trust_key():
    put("trust_key", "hex64", b"0123456789abcdef" * 4 + b"\n")
    put("trust_key", "raw32", bytes(range(1, 33)))
    put("trust_key", "short", b"tooshort\n")


if __name__ == "__main__":
    for folder in ("tokenizer", "tokenizer_2"):
        clip_small(folder)
    t5_small()
    spiece_small()
    shard_index()
    pipeline_files()
    single_file()
    trust_key()
