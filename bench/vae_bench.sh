#!/usr/bin/env bash
# Side-by-side VAE decoder benchmark: kiln against diffusers' AutoencoderKL
# (PyTorch eager and torch.compile) on the same seeded weights, latents and
# thread count, at the real SD3 VAE dimensions (block_out_channels [128, 256,
# 512, 512], layers_per_block 2, 16 latent channels, 32 groups, no quant convs):
#
#   bench/vae_bench.sh [--rounds R] [--threads N] [--size 128] [--modes 'eager compile']
#                      [--dtypes 'bf16 f32'] [--kiln-dtypes 'bf16 f32'] [--skip-torch] [--skip-rss]
#                      [--rss-size 256] [--rss-memory 1G]
#
# The weights are written once (bench/vae_torch.py write: diffusers' own init
# under a fixed seed, stored bf16, a folder both load) under build/bench-vae,
# with seeded latents. Per kiln dtype, a fresh cache: one process converts (the
# miss, on a 16x16 latent); then every round a fresh process loads the hit and
# times one decode of a --size latent (x8 pixels: 128 -> 1024x1024), batch 1;
# the diffusers runs (one decode each; torch.compile after one untimed
# compiling decode) alternate with kiln's in each round (the host's speed
# drifts). 1024x1024 decodes take minutes on 2 vCPUs: keep --rounds small.
# Prints the medians over the rounds and kiln bf16's time / each per round;
# the bf16 accuracy: every round-1 sample's relative L2 against diffusers
# eager f32's; and (unless --skip-rss) the peak RSS (/usr/bin/time -v) of a
# --rss-size latent (256 -> 2048x2048) decoded by kiln bf16 with tiling auto
# within --rss-memory.
#
# Needs a built kiln (make build: build/bench_vae) and bench/.venv
# (bench/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 THREADS=2 SIZE=128 MODES="eager compile" DTYPES="bf16 f32" KDTYPES="bf16 f32" SKIP_TORCH=0 SKIP_RSS=0
RSS_SIZE=256 RSS_MEMORY=1G
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;; --size) SIZE=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;; --dtypes) DTYPES=$2; shift 2 ;; --kiln-dtypes) KDTYPES=$2; shift 2 ;;
    --skip-torch) SKIP_TORCH=1; shift ;; --skip-rss) SKIP_RSS=1; shift ;;
    --rss-size) RSS_SIZE=$2; shift 2 ;; --rss-memory) RSS_MEMORY=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds R] [--threads N] [--size 128] [--modes 'eager compile'] [--dtypes 'bf16 f32'] [--kiln-dtypes 'bf16 f32'] [--skip-torch] [--skip-rss] [--rss-size 256] [--rss-memory 1G]" >&2; exit 2 ;;
  esac
done
PY=bench/.venv/bin/python BENCH=build/bench_vae
[ -x $BENCH ] || { echo "build kiln first (make build)" >&2; exit 1; }
[ $SKIP_TORCH = 1 ] || [ -x $PY ] || { echo "no bench/.venv: python3 -m venv bench/.venv && bench/.venv/bin/pip install -r bench/requirements.txt" >&2; exit 1; }
DIR=build/bench-vae M=build/bench-vae/model
mkdir -p $DIR
export OMP_NUM_THREADS=$THREADS KILN_THREADS=$THREADS KILN_LOG=error HF_HUB_OFFLINE=1
RES=$DIR/results.txt; : > $RES
rm -f $DIR/kiln-*.safetensors $DIR/torch-*.safetensors  # a sample of an earlier run is no reference
json() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(str(d[k]) for k in sys.argv[1:]))' "$@"; }
for s in 16 $SIZE $RSS_SIZE; do
  [ -f $M/latents-$s.safetensors ] || { $PY bench/vae_torch.py write --out $M --sizes 16,$SIZE,$RSS_SIZE >/dev/null 2>&1; break; }
done
[ -f $M/diffusion_pytorch_model.safetensors ] || { echo "could not write $M (bench/vae_torch.py write)" >&2; exit 1; }
Z=$M/latents-$SIZE.safetensors

for dt in $KDTYPES; do
  rm -rf $DIR/cache-$dt
  read -r origin load <<< "$($BENCH --model $M --latents $M/latents-16.safetensors --cache-dir $DIR/cache-$dt \
      --name vae --dtype $dt | json origin load_ms)"
  echo "kiln-$dt-miss-load $load 0" >> $RES
done
for round in $(seq $ROUNDS); do
  for dt in $KDTYPES; do
    find $DIR/cache-$dt -type f -exec cat {} + > /dev/null  # a warm page cache: time the decode, not the disk
    out=; [ $round = 1 ] && out="--output $DIR/kiln-$dt.safetensors"
    read -r origin load med <<< "$($BENCH --model $M --latents $Z --cache-dir $DIR/cache-$dt --name vae --dtype $dt \
        $out | json origin load_ms median_ms)"
    [ "$origin" = hit ] || { echo "kiln $dt: expected a cache hit, got $origin" >&2; exit 1; }
    echo "kiln-$dt $med $round" >> $RES
    echo "kiln-$dt-hit-load $load $round" >> $RES
  done
  if [ $SKIP_TORCH = 0 ]; then
    for mode in $MODES; do for dt in $DTYPES; do
      [ $mode = compile ] && [ $round -gt 1 ] && [ $dt = f32 ] && continue  # compile f32: one round (minutes each)
      out=; [ $round = 1 ] && out="--output $DIR/torch-$mode-$dt.safetensors"
      warm=0; [ $mode = compile ] && warm=1
      med=$($PY bench/vae_torch.py time --model $M --latents $Z --dtype $dt --mode $mode --threads $THREADS \
          --warmup $warm $out 2>/dev/null | json median_ms) || { echo "diffusers $mode $dt failed" >&2; continue; }
      echo "torch-$mode-$dt $med $round" >> $RES
    done; done
  fi
done
if [ $SKIP_TORCH = 0 ] && [ -f $DIR/torch-eager-f32.safetensors ]; then
  for f in $DIR/kiln-*.safetensors $DIR/torch-*.safetensors; do
    [ $f = $DIR/torch-eager-f32.safetensors ] && continue
    err=$($PY - $DIR/torch-eager-f32.safetensors $f <<'PY'
import sys
from safetensors.torch import load_file
r = load_file(sys.argv[1])["sample"].double(); k = load_file(sys.argv[2])["sample"].double()
print(float((k - r).norm() / r.norm()))
PY
)
    echo "agree-$(basename $f .safetensors) $err 1" >> $RES
  done
fi
if [ $SKIP_RSS = 0 ]; then
  /usr/bin/time -v $BENCH --model $M --latents $M/latents-$RSS_SIZE.safetensors --cache-dir $DIR/cache-bf16 --name vae \
      --dtype bf16 --tile auto --memory $RSS_MEMORY > $DIR/rss.json 2> $DIR/rss.txt
  kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' $DIR/rss.txt)
  read -r med tiles ts <<< "$(json median_ms tiles tile_size < $DIR/rss.json)"
  echo "rss-kb $kb 1" >> $RES; echo "rss-ms $med 1" >> $RES; echo "rss-tiles $tiles 1" >> $RES; echo "rss-tile-size $ts 1" >> $RES
fi
python3 - "$RES" "$SIZE" "$THREADS" "$RSS_SIZE" "$RSS_MEMORY" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(dict)  # name -> round -> value
for line in open(sys.argv[1]):
    if line.strip():
        name, v, rnd = line.split()
        runs[name][rnd] = float(v)
S, thr, R, mem = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
print(f"\nSD3 VAE decoder (AutoencoderKL [128,256,512,512], 2 layers, 16 latent channels), latent {S}x{S} "
      f"-> {8 * S}x{8 * S} px, batch 1, {thr} threads")
print("| implementation | median s | kiln bf16 time / this | per round |")
print("|---|---|---|---|")
kb = runs.get("kiln-bf16", {})
for name, r in runs.items():
    if not (name.startswith("kiln-") or name.startswith("torch-")) or "-load" in name:
        continue
    ratios = [kb[x] / r[x] for x in sorted(r, key=int) if x in kb]
    rat = f"{statistics.median(ratios):.2f}x" if ratios else "-"
    print(f"| {name} | {statistics.median(r.values()) / 1e3:.1f} | {rat} | " + ", ".join(f"{x:.2f}" for x in ratios) + " |")
for dt in ("bf16", "f32"):
    if f"kiln-{dt}-hit-load" in runs:
        print(f"kiln {dt}: cache miss (convert + publish) {runs[f'kiln-{dt}-miss-load']['0']:.0f} ms, "
              f"hit (map, ready) {statistics.median(runs[f'kiln-{dt}-hit-load'].values()):.2f} ms")
for name, r in runs.items():
    if name.startswith("agree-"):
        print(f"{name[6:]} against diffusers eager f32: sample relative L2 {r['1']:.3g}")
if "rss-kb" in runs:
    print(f"kiln bf16, latent {R}x{R} -> {8 * R}x{8 * R} px, tiling auto within {mem}: "
          f"{int(runs['rss-tiles']['1'])} tiles of {int(runs['rss-tile-size']['1'])} px, "
          f"{runs['rss-ms']['1'] / 1e3:.1f} s, peak RSS {runs['rss-kb']['1'] / 1024 ** 2:.2f} GiB")
PY
