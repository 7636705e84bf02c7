#!/usr/bin/env bash
# Side-by-side Flux backbone benchmark: kiln against diffusers' FluxTransformer2DModel
# (PyTorch eager and torch.compile) on the same seeded weights, inputs and thread count.
#
#   bench/flux_bench.sh [--runs N] [--rounds R] [--threads N] [--double N] [--single N]
#                       [--latent N] [--context T] [--modes 'eager compile'] [--dtypes 'bf16 f32']
#                       [--quant 'int8 fp8'] [--skip-torch]
#
# The model is Flux.1-dev-shaped at the real width (3072: 24 heads of 128, joint
# dim 4096, guidance embedding) with --double double-stream and --single
# single-stream blocks (default 2 and 4); the default latent 64x64 is a 512x512
# image (1024 image tokens) beside 512 text tokens. Each round runs every
# implementation once (median of --runs forwards); the table gives the median
# over the rounds and kiln bf16's time over each implementation's (below 1, kiln
# is faster). kiln's cold start (a fresh process: the weight cache
# mapped, the package opened, the first forward) is measured against its warm forward;
# the one dynamic package (h_tok, w_tok 32..64: 512^2 to 1024^2 images) also runs a
# 1024^2 forward; --quant rows are kiln with int8 / fp8 block weights, their outputs'
# relative L2 against kiln bf16's in the notes.
#
# Needs a built kiln (make build) and, for the PyTorch side, bench/.venv
# (bench/README.md). Writes its model and inputs under build/bench-flux.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 ROUNDS=1 THREADS=2 DOUBLE=2 SINGLE=4 LATENT=64 CONTEXT=512 SKIP_TORCH=0 MODES="eager compile" DTYPES="bf16 f32"
QUANT="int8 fp8"
usage="usage: $0 [--runs N] [--rounds R] [--threads N] [--double N] [--single N] [--latent N] [--context T] [--modes 'eager compile'] [--dtypes 'bf16 f32'] [--quant 'int8 fp8'] [--skip-torch]"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;; --rounds) ROUNDS=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    --double) DOUBLE=$2; shift 2 ;; --single) SINGLE=$2; shift 2 ;; --latent) LATENT=$2; shift 2 ;;
    --context) CONTEXT=$2; shift 2 ;; --skip-torch) SKIP_TORCH=1; shift ;;
    --modes) MODES=$2; shift 2 ;; --dtypes) DTYPES=$2; shift 2 ;; --quant) QUANT=$2; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
KILN=${KILN:-$PWD/build/kiln}
PY=bench/.venv/bin/python
[ -x "$KILN" ] || { echo "flux_bench: no $KILN: run make build first" >&2; exit 1; }
[ $SKIP_TORCH = 1 ] || [ -x $PY ] || { echo "flux_bench: no $PY: see bench/README.md (or --skip-torch)" >&2; exit 1; }
DIR=build/bench-flux/flux-${DOUBLE}d${SINGLE}s
mkdir -p "$DIR"
cat > "$DIR/config.json" <<JSON
{"_class_name":"FluxTransformer2DModel","patch_size":1,"in_channels":64,"out_channels":null,"num_layers":$DOUBLE,
 "num_single_layers":$SINGLE,"attention_head_dim":128,"num_attention_heads":24,"joint_attention_dim":4096,
 "pooled_projection_dim":768,"guidance_embeds":true,"axes_dims_rope":[16,56,56]}
JSON
IN="$DIR/in-${LATENT}-${CONTEXT}.safetensors"
if [ ! -f "$DIR/model/config.json" ] || [ ! -f "$IN" ]; then
  $KILN make-model "$DIR/model" --force --config "$DIR/config.json" --weights bf16 \
     --inputs "$IN" --latent ${LATENT}x${LATENT} --context $CONTEXT >/dev/null
fi
export OMP_NUM_THREADS=$THREADS KILN_THREADS=$THREADS KILN_LOG=error
CACHE="$DIR/cache" RES="$DIR/results.txt"; : > "$RES"
kiln_run() { # name dtype [extra args]: the median forward in ms of a warm process, output kiln-NAME.safetensors
  local name=$1 dt=$2; shift 2
  $KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/kiln-$name.safetensors" --dtype $dt --cache-dir "$CACHE" \
     --repeat $RUNS "$@" | awk '/median/ {print $3}'
}
# the cache and a dynamic package over 512^2 .. 1024^2 images (32..64 tokens a side) first, timed
t0=$(date +%s.%N)
$KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/scratch.safetensors" --dtype bf16 --cache-dir "$CACHE" >/dev/null
t1=$(date +%s.%N)
$KILN compile "$DIR/model" --dtype bf16 --cache-dir "$CACHE" --dim h_tok=32:64,w_tok=32:64 \
   --latent ${LATENT}x${LATENT} --context-len $CONTEXT --log error >/dev/null
t2=$(date +%s.%N)
echo "convert_s $(echo "$t1 - $t0" | bc) 0" >> "$RES"
echo "compile_s $(echo "$t2 - $t1" | bc) 0" >> "$RES"
# the same package at 1024x1024 (a 128x128 latent, 4096 image tokens): one forward, its time
IN2="$DIR/in-128-${CONTEXT}.safetensors"
[ -f "$IN2" ] || $KILN make-model "$DIR/model" --inputs-only --inputs "$IN2" --latent 128x128 --context $CONTEXT >/dev/null
ex=$(KILN_TIMINGS=1 $KILN forward "$DIR/model" --inputs "$IN2" --output "$DIR/scratch.safetensors" --dtype bf16 \
     --cache-dir "$CACHE" 2>&1 | awk '$1 == "forward" && NF >= 3 {print $2 * 1000, $NF}' | tail -1)
echo "kiln-bf16-1024px ${ex%% *} 0 ${ex##* }" >> "$RES"
for q in $QUANT; do # quantized (a cache of its own), its output against kiln bf16's
  $KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/kiln-$q.safetensors" --quant $q --cache-dir "$CACHE" >/dev/null
done
for round in $(seq $ROUNDS); do
  for dt in bf16 $(echo " $DTYPES " | sed 's/ bf16 / /'); do
    echo "kiln-$dt $(kiln_run $dt $dt) $round" >> "$RES"
  done
  for q in $QUANT; do
    echo "kiln-$q $(kiln_run $q bf16 --quant $q) $round" >> "$RES"
  done
  # cold: a fresh process maps the cache, opens the package and runs one forward
  c0=$(date +%s.%N)
  $KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/scratch.safetensors" --dtype bf16 --cache-dir "$CACHE" >/dev/null
  c1=$(date +%s.%N)
  echo "kiln-bf16-cold $(echo "($c1 - $c0) * 1000" | bc) $round" >> "$RES"
  if [ $SKIP_TORCH = 0 ]; then
    for mode in $MODES; do for dt in $DTYPES; do
      js=$($PY bench/flux_torch.py --model "$DIR/model" --inputs "$IN" --dtype $dt --mode $mode --threads $THREADS \
           --runs $RUNS --reference "$DIR/kiln-bf16.safetensors" | tail -1)
      echo "torch-$mode-$dt $(echo "$js" | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])') $round" >> "$RES"
      echo "$js" > "$DIR/torch-$mode-$dt.json"
    done; done
  fi
done
PYR=python3; [ -x $PY ] && PYR=$PY
$PYR - "$RES" "$DOUBLE" "$SINGLE" "$LATENT" "$CONTEXT" "$THREADS" "$DIR" <<'PY'
import json, os, statistics, sys
from collections import defaultdict
runs = defaultdict(dict)
notes = {}
for line in open(sys.argv[1]):
    if line.strip():
        name, ms, rnd, *rest = line.split()
        runs[name][rnd] = float(ms)
        if rest:
            notes[name] = " ".join(rest)
nd, ns, lat, T, thr = (int(x) for x in sys.argv[2:7])
d = sys.argv[7]
D, N, F = 3072, (lat // 2) ** 2, 12288
S = N + T
# double block: img+txt qkv (3 D^2 each), out (D^2 each), MLP (2 D F each), attention 4 S^2 D;
# single block: q,k,v + MLP in (3 D^2 + D F), out over [attn, mlp] ((D + F) D), attention
dbl = 2 * S * (4 * D * D + 2 * D * F) + 4 * S * S * D
sgl = 2 * S * (3 * D * D + D * F + (D + F) * D) + 4 * S * S * D
flop = nd * dbl + ns * sgl
print(f"config: Flux.1-dev-shaped blocks at width {D} (24 heads of 128), {nd} double + {ns} single, latent {lat}x{lat} "
      f"({N} image tokens) + {T} text tokens, batch 1, {thr} threads")
print(f"work: {flop/1e9:.0f} GFLOP per forward (the blocks' GEMMs and attention); "
      f"cache build {runs['convert_s']['0']:.1f} s, package compile (h_tok, w_tok 32..64) {runs['compile_s']['0']:.1f} s\n")
print("| implementation | median ms | GFLOP/s | kiln bf16 time / this | per round |")
print("|---|---|---|---|---|")
kb = runs.get("kiln-bf16", {})
for name, by in runs.items():
    if name in ("convert_s", "compile_s", "kiln-bf16-1024px"):
        continue
    ms = statistics.median(by.values())
    rs = [kb[r] / by[r] for r in sorted(by) if r in kb]
    per = ", ".join(f"{x:.2f}" for x in rs)
    print(f"| {name} | {ms:.0f} | {flop / ms / 1e6:.0f} | {statistics.median(rs):.2f}x | {per} |")
if "kiln-bf16-1024px" in runs:
    ms = runs["kiln-bf16-1024px"]["0"]
    N2 = 64 * 64
    S2 = N2 + T
    flop2 = nd * (2 * S2 * (4 * D * D + 2 * D * F) + 4 * S2 * S2 * D) + ns * (2 * S2 * (3 * D * D + D * F + (D + F) * D) + 4 * S2 * S2 * D)
    print(f"\nthe same package at 1024x1024 ({N2} image tokens): {ms:.0f} ms, {flop2 / ms / 1e6:.0f} GFLOP/s, "
          f"ran by {notes.get('kiln-bf16-1024px', '?')}")
def rel(a, b):
    try:
        from safetensors.numpy import load_file
        import numpy as np
        x = load_file(a)["sample"].astype(np.float64); y = load_file(b)["sample"].astype(np.float64)
        return float(np.linalg.norm(x - y) / np.linalg.norm(y))
    except Exception as e:  # no numpy / safetensors in this python
        return f"n/a ({type(e).__name__})"
for q in ("int8", "fp8"):
    p = os.path.join(d, f"kiln-{q}.safetensors")
    if os.path.exists(p):
        print(f"\nkiln {q}: output vs kiln bf16 relative L2 {rel(p, os.path.join(d, 'kiln-bf16.safetensors'))}", end="")
for f in sorted(os.listdir(d)):
    if f.startswith("torch-") and f.endswith(".json"):
        j = json.load(open(os.path.join(d, f)))
        extra = f", compile {j['compile_s']:.0f} s" if j.get("compile_s") else ""
        print(f"\n{j['impl']}: torch {j['torch']}, diffusers {j['diffusers']}, output vs kiln bf16 relative L2 "
              f"{j.get('rel_l2_vs_kiln')}{extra}", end="")
print()
PY
