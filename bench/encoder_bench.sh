#!/usr/bin/env bash
# Side-by-side text-encoder benchmark: kiln against transformers (PyTorch eager
# and torch.compile) on the same seeded weights, inputs and thread count:
#   t5      T5EncoderModel at T5-XXL's width (d_model 4096, 64 heads, d_kv 64,
#           d_ff 10240, gated GELU), --t5-layers layers (4), 256 tokens
#   clip-g  CLIPTextModelWithProjection at CLIP-G's real size (32 layers,
#           1280 wide, 20 heads, 77 tokens)
#
#   bench/encoder_bench.sh [--runs N] [--rounds R] [--threads N] [--t5-layers N] [--models 't5 clip-g']
#                          [--modes 'eager compile'] [--dtypes 'bf16 f32'] [--skip-torch] [--omp-wait POLICY]
#
# The weights are written once (bench/encoder_torch.py write: transformers'
# own init under a fixed seed, stored bf16, a folder both load) under
# build/bench-encoder. Per model and kiln dtype, a fresh cache: one process
# converts (the miss), then every round a fresh process loads the hit and
# times its first encode (cold process, warm page cache) and the median of
# --runs more (warm); the
# transformers runs alternate with kiln's in each round (the host's speed
# drifts). Prints the medians over the rounds, kiln bf16 / this per round,
# the hit's load time, and cold first encode / warm encode (wall clock, and
# the process's CPU time, which other tenants' time slices do not inflate;
# with 2 threads it includes OpenMP's spinning at barriers); checks that kiln
# and transformers agree (relative L2 of last_hidden_state, same dtype).
#
# --omp-wait passive|active: OMP_WAIT_POLICY for both sides (kiln and torch
# both run on libgomp). Unset by default (libgomp spins at barriers). On a
# host whose CPUs are oversubscribed, a spinning thread holds a vCPU the
# thread it waits for needs: warm CLIP-G bf16 took 4.0-6.7 s with the
# default, 0.25-0.30 s with passive, at a load of 14-19 on 2 vCPUs
# (docs/PERFORMANCE.md).
#
# Needs a built kiln (make build: build/kiln, build/bench_encoder) and
# bench/.venv (bench/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 ROUNDS=3 THREADS=2 T5_LAYERS=4 MODELS="t5 clip-g" MODES="eager compile" DTYPES="bf16 f32" SKIP_TORCH=0 OMP_WAIT=
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;; --rounds) ROUNDS=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    --t5-layers) T5_LAYERS=$2; shift 2 ;; --models) MODELS=$2; shift 2 ;; --modes) MODES=$2; shift 2 ;;
    --dtypes) DTYPES=$2; shift 2 ;; --skip-torch) SKIP_TORCH=1; shift ;; --omp-wait) OMP_WAIT=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--rounds R] [--threads N] [--t5-layers N] [--models 't5 clip-g'] [--modes 'eager compile'] [--dtypes 'bf16 f32'] [--skip-torch] [--omp-wait passive|active]" >&2; exit 2 ;;
  esac
done
PY=bench/.venv/bin/python KILN=build/kiln BENCH=build/bench_encoder
[ -x $KILN ] && [ -x $BENCH ] || { echo "build kiln first (make build)" >&2; exit 1; }
[ -x $PY ] || { echo "no bench/.venv: python3 -m venv bench/.venv && bench/.venv/bin/pip install -r bench/requirements.txt" >&2; exit 1; }
DIR=build/bench-encoder
mkdir -p $DIR
export OMP_NUM_THREADS=$THREADS KILN_THREADS=$THREADS KILN_LOG=error HF_HUB_OFFLINE=1
case "$OMP_WAIT" in
  "") ;; passive|active) export OMP_WAIT_POLICY=$OMP_WAIT ;;
  *) echo "--omp-wait: passive or active, not $OMP_WAIT" >&2; exit 2 ;;
esac
RES=$DIR/results.txt; : > $RES
json() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(" ".join(str(d[k]) for k in sys.argv[1:]))' "$@"; }

for model in $MODELS; do
  if [ $model = t5 ]; then layers=$T5_LAYERS comp=text_encoder_3; else layers=32 comp=text_encoder_2; fi
  M=$DIR/$model-$layers
  [ -f $M/model.safetensors ] || $PY bench/encoder_torch.py write --family $model --layers $layers --out $M >/dev/null 2>&1
  for dt in bf16 $(echo " $DTYPES " | sed 's/ bf16 / /'); do
    rm -rf $DIR/cache-$model-$dt
    read -r origin load <<< "$($BENCH --model $M --inputs $M/inputs.safetensors --cache-dir $DIR/cache-$model-$dt \
        --name $model --component $comp --dtype $dt --runs 1 | json origin load_ms)"
    echo "$model kiln-$dt-miss-load $load 0" >> $RES
    $KILN forward $M --inputs $M/inputs.safetensors --output $DIR/kiln-$model-$dt.safetensors --dtype $dt \
        --cache-dir $DIR/cache-$model-$dt --name $model --component $comp >/dev/null
  done
  for round in $(seq $ROUNDS); do
    echo "$model host-load $(cut -d' ' -f1 /proc/loadavg) $round" >> $RES
    for dt in bf16 $(echo " $DTYPES " | sed 's/ bf16 / /'); do
      # a cold process on a warm page cache: the cache's files read once first (the
      # torch runs between rounds may have pushed them out; that would time the disk)
      find $DIR/cache-$model-$dt -type f -exec cat {} + > /dev/null
      read -r origin load first med cfirst cmed <<< "$($BENCH --model $M --inputs $M/inputs.safetensors --cache-dir $DIR/cache-$model-$dt \
          --name $model --component $comp --dtype $dt --runs $RUNS | json origin load_ms first_ms median_ms first_cpu_ms median_cpu_ms)"
      [ "$origin" = hit ] || { echo "kiln $model $dt: expected a cache hit, got $origin" >&2; exit 1; }
      echo "$model kiln-$dt $med $round" >> $RES
      echo "$model kiln-$dt-hit-load $load $round" >> $RES
      echo "$model kiln-$dt-first $first $round" >> $RES
      echo "$model kiln-$dt-cpu-first $cfirst $round" >> $RES
      echo "$model kiln-$dt-cpu-warm $cmed $round" >> $RES
    done
    if [ $SKIP_TORCH = 0 ]; then
      for mode in $MODES; do for dt in $DTYPES; do
        [ $mode = compile ] && [ $round -gt 1 ] && [ $ROUNDS -gt 1 ] && [ $dt = f32 ] && continue  # compile f32: one round (minutes each)
        read -r med err <<< "$($PY bench/encoder_torch.py time --model $M --inputs $M/inputs.safetensors --dtype $dt \
            --mode $mode --threads $THREADS --runs $RUNS --compare $DIR/kiln-$model-$dt.safetensors 2>/dev/null | json median_ms kiln_rel_l2)" \
          || { echo "transformers $mode $dt failed on $model" >&2; continue; }
        echo "$model torch-$mode-$dt $med $round" >> $RES
        echo "$model agree-$mode-$dt $err $round" >> $RES
      done; done
    fi
  done
done
python3 - "$RES" "$T5_LAYERS" "$THREADS" "${OMP_WAIT_POLICY:-default (spin)}" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(lambda: defaultdict(dict))  # model -> name -> round -> value
for line in open(sys.argv[1]):
    if line.strip():
        model, name, v, rnd = line.split()
        runs[model][name][rnd] = float(v)
L, thr = int(sys.argv[2]), int(sys.argv[3])
print(f"OMP_WAIT_POLICY: {sys.argv[4]}")
desc = {"t5": f"T5 encoder, T5-XXL width (4096, 64 heads, d_ff 10240), {L} layers, 256 tokens",
        "clip-g": "CLIP-G text encoder (32 layers, 1280, 20 heads), 77 tokens"}
flop = {"t5": 2 * 256 * L * (4 * 4096 * 4096 + 3 * 4096 * 10240) + 4 * L * 256 * 256 * 4096,
        "clip-g": 2 * 77 * 32 * 12 * 1280 * 1280 + 4 * 32 * 77 * 77 * 1280}
for model, by in runs.items():
    print(f"\n{desc.get(model, model)}, batch 1, {thr} threads: {flop[model] / 1e9:.0f} GFLOP per encode; "
          "host load average at each round: " + ", ".join(f"{v:.1f}" for v in by.get("host-load", {}).values()))
    print("| implementation | median ms | GFLOP/s | kiln bf16 time / this | per round |")
    print("|---|---|---|---|---|")
    kb = by.get("kiln-bf16", {})
    for name, r in by.items():
        if "-load" in name or "-first" in name or "-cpu-" in name or name.startswith("agree") or name == "host-load":
            continue
        ms = statistics.median(r.values())
        ratios = [kb[x] / r[x] for x in sorted(r, key=int) if x in kb]
        print(f"| {name} | {ms:.1f} | {flop[model] / ms / 1e6:.0f} | {statistics.median(ratios):.2f}x | "
              + ", ".join(f"{x:.2f}" for x in ratios) + " |")
    for dt in ("bf16", "f32"):
        if f"kiln-{dt}" not in by:
            continue
        w, f = by[f"kiln-{dt}"], by[f"kiln-{dt}-first"]
        cold = [f[x] / w[x] for x in sorted(w, key=int)]
        cf, cw = by[f"kiln-{dt}-cpu-first"], by[f"kiln-{dt}-cpu-warm"]
        ccold = [cf[x] / cw[x] for x in sorted(cw, key=int)]
        hit = statistics.median(by[f"kiln-{dt}-hit-load"].values())
        miss = statistics.median(by[f"kiln-{dt}-miss-load"].values())
        print(f"kiln {dt}: cache miss (convert + publish) {miss:.0f} ms, hit (map, ready) {hit:.2f} ms; "
              f"cold first encode / warm {statistics.median(cold):.2f}x (" + ", ".join(f"{x:.2f}" for x in cold) + "); "
              f"in process CPU time {statistics.median(ccold):.2f}x (" + ", ".join(f"{x:.2f}" for x in ccold) + ")")
    for name, r in by.items():
        if name.startswith("agree"):
            print(f"kiln vs transformers ({name[6:]}): last_hidden_state relative L2 {max(r.values()):.2g}")
PY
