#!/usr/bin/env python3
"""Regenerate the seed corpora of tests/fuzz from tests/data (run from the
repository root). Seeds stay small (a fuzzer mutates small inputs far
faster), so weight files are not copied whole:

corpus/safetensors/
  <case>-io.safetensors        the goldens' input/output files, as they are
  <case>-weights-small         each golden's weight header (every diffusers
                               name, dtype) with every dimension cut to <= 2
                               and the data rewritten to fit: a valid file
  <case>-weights-header-only   the real header with no data (offsets past
                               the end: the error paths)
  sd3-single-file-small        original SD3 names (fused qkv, adaLN) of a
                               1-layer model, for the renames and splits
  hand-*                       empty header, metadata only, every dtype,
                               empty tensors
corpus/config/
  <case>.json                  the goldens' config.json files
"""
import json, os, struct

ROOT = "tests/data/goldens"
OUT = "tests/fuzz/corpus"
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
         "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def pack(tensors, meta=None):
    """tensors: list of (name, dtype, shape); data bytes are a counter."""
    hdr, off, data = {}, 0, bytearray()
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = SIZES.get(dt, 1)
        for d in shape:
            n *= d
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        data += bytes((off + i) & 0x7F for i in range(n))  # no NaN bit patterns
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data)


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, f.read(n)


def write(name, blob):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(blob)


def main():
    st = os.path.join(OUT, "safetensors")
    cf = os.path.join(OUT, "config")
    os.makedirs(st, exist_ok=True)
    os.makedirs(cf, exist_ok=True)
    for case in sorted(os.listdir(ROOT)):
        d = os.path.join(ROOT, case)
        if not all(os.path.isfile(os.path.join(d, f)) for f in
                   ("io.safetensors", "config.json", "diffusion_pytorch_model.safetensors")):
            continue  # the backbone cases only (the encoders' weights are model.safetensors)
        with open(os.path.join(d, "io.safetensors"), "rb") as f:
            write(f"safetensors/{case}-io.safetensors", f.read())
        with open(os.path.join(d, "config.json"), "rb") as f:
            write(f"config/{case}.json", f.read())
        n, h = header(os.path.join(d, "diffusion_pytorch_model.safetensors"))
        write(f"safetensors/{case}-weights-header-only", struct.pack("<Q", n) + h)
        meta = json.loads(h)
        ts = [(k, v["dtype"], [min(x, 2) for x in v["shape"]])
              for k, v in meta.items() if k != "__metadata__"]
        write(f"safetensors/{case}-weights-small", pack(ts, {"format": "pt"}))
    p = "model.diffusion_model."
    single = [(p + "x_embedder.proj.weight", "F32", [2, 1, 1, 1]),
              (p + "x_embedder.proj.bias", "F32", [2]),
              (p + "pos_embed", "F32", [1, 4, 2])]
    for blk in ("x_block", "context_block"):
        b = p + "joint_blocks.0." + blk + "."
        single += [(b + "attn.qkv.weight", "F32", [6, 2]), (b + "attn.qkv.bias", "F32", [6]),
                   (b + "attn.proj.weight", "F32", [2, 2]),
                   (b + "adaLN_modulation.1.weight", "F32", [12, 2]),
                   (b + "adaLN_modulation.1.bias", "F32", [12]),
                   (b + "mlp.fc1.weight", "F32", [8, 2]), (b + "mlp.fc2.weight", "F32", [2, 8])]
    single += [(p + "final_layer.adaLN_modulation.1.weight", "F32", [4, 2]),
               (p + "final_layer.linear.weight", "F32", [2, 2])]
    write("safetensors/sd3-single-file-small", pack(single))
    # Black Forest Labs' Flux names: fused qkv, linear1 (q, k, v, MLP: 1:1:1:4), the final modulation, guidance_in
    write("safetensors/flux-bfl-names", pack([
        (p + "img_in.weight", "F32", [4, 8]), (p + "double_blocks.0.img_attn.qkv.weight", "F32", [12, 4]),
        (p + "single_blocks.0.linear1.weight", "F32", [28, 4]), (p + "single_blocks.0.linear1.bias", "F32", [28]),
        (p + "final_layer.adaLN_modulation.1.weight", "F32", [8, 4]),
        (p + "guidance_in.in_layer.weight", "F32", [4, 256])]))
    write("safetensors/hand-empty", pack([]))
    write("safetensors/hand-metadata-only", pack([], {"format": "pt", "k": "v"}))
    write("safetensors/hand-every-dtype",
          pack([("t_" + dt.lower(), dt, [2, 1]) for dt in SIZES]))
    write("safetensors/hand-empty-tensors",
          pack([("a", "F32", [0]), ("b", "F16", [3, 0]), ("c", "BF16", []), ("d", "F32", [1])]))


if __name__ == "__main__":
    main()
