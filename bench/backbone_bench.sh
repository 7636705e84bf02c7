#!/usr/bin/env bash
# Side-by-side backbone benchmark: kiln against diffusers' SD3Transformer2DModel
# (PyTorch eager and torch.compile) on the same weights, inputs and thread count.
#
#   bench/backbone_bench.sh [--runs N] [--rounds R] [--threads N] [--layers N] [--latent N] [--context T]
#                           [--modes 'eager compile'] [--dtypes 'bf16 f32'] [--skip-torch]
#
# Each round runs every implementation once (median of --runs forwards); the
# rounds alternate them, since the host's speed drifts, and the table gives
# the median over the rounds and each round's ratio to kiln bf16. On a shared
# host whose speed swings between rounds, the last column takes the median
# ratio over the quiet rounds only: those in which kiln bf16 and that
# implementation both ran within 15% of their own fastest round (the same
# rule for both sides; many short rounds, e.g. --modes eager --dtypes bf16
# --rounds 20, give it more of them).
#
# Needs a built kiln (make build) and, for the PyTorch side, bench/.venv
# (see bench/README.md). Writes its model and inputs under build/bench-backbone.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=5 ROUNDS=1 THREADS=2 LAYERS=2 LATENT=64 CONTEXT=333 SKIP_TORCH=0 MODES="eager compile" DTYPES="bf16 f32"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;; --rounds) ROUNDS=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;; --layers) LAYERS=$2; shift 2 ;;
    --latent) LATENT=$2; shift 2 ;; --context) CONTEXT=$2; shift 2 ;; --skip-torch) SKIP_TORCH=1; shift ;;
    --modes) MODES=$2; shift 2 ;; --dtypes) DTYPES=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--rounds R] [--threads N] [--layers N] [--latent N] [--context T] [--modes 'eager compile'] [--dtypes 'bf16 f32'] [--skip-torch]" >&2; exit 2 ;;
  esac
done
PY=bench/.venv/bin/python
. bench/sd3m_model.sh
export OMP_NUM_THREADS=$THREADS KILN_THREADS=$THREADS KILN_LOG=error
RES="$DIR/results.txt"; : > "$RES"

for round in $(seq $ROUNDS); do
  for dt in bf16 $(echo " $DTYPES " | sed 's/ bf16 / /'); do
    line=$($KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/kiln-$dt.safetensors" --dtype $dt --repeat $RUNS | grep median)
    ms=$(echo "$line" | awk '{print $3}')
    echo "kiln-$dt $ms $round" >> "$RES"
  done
  if [ $SKIP_TORCH = 0 ]; then
    for mode in $MODES; do for dt in $DTYPES; do
      ms=$($PY bench/torch_bench.py --model "$DIR/model" --inputs "$IN" --dtype $dt --mode $mode --threads $THREADS \
           --runs $RUNS --json --output "$DIR/torch-$mode-$dt.safetensors" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["median_ms"])')
      echo "torch-$mode-$dt $ms $round" >> "$RES"
    done; done
  fi
done
python3 - "$RES" "$LAYERS" "$LATENT" "$CONTEXT" "$THREADS" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(dict)  # name -> round -> ms
for line in open(sys.argv[1]):
    if line.strip():
        name, ms, rnd = line.split()
        runs[name][rnd] = float(ms)
L, lat, T, thr = (int(x) for x in sys.argv[2:6])
D, N, C, p = 1536, (lat // 2) ** 2, 16, 2
flop = L * (24 * N * D * D + 4 * (N + T) ** 2 * D) + (L - 1) * 24 * T * D * D + 6 * T * D * D
flop += 2 * N * C * p * p * D * 2
rounds = sorted(runs.get("kiln-bf16", {}), key=int)
print(f"config: SD3-medium blocks, {L} layers, latent {lat}x{lat} ({N} image tokens), {T} context tokens, batch 1, {thr} threads")
print(f"work: {flop/1e9:.1f} GFLOP per forward; {len(rounds)} round(s), medians over the rounds\n")
print("| implementation | median ms | GFLOP/s | kiln bf16 time / this | per round | in quiet rounds |")
print("|---|---|---|---|---|---|")
kb = runs.get("kiln-bf16", {})
for name, by in runs.items():
    ms = statistics.median(by.values())
    ratios = [kb[r] / by[r] for r in rounds if r in by]
    ratio = statistics.median(ratios) if ratios else float("nan")
    per = ", ".join(f"{x:.2f}" for x in ratios)
    both = [r for r in rounds if r in by]
    quiet = [r for r in both if kb[r] <= 1.15 * min(kb[x] for x in both) and by[r] <= 1.15 * min(by[x] for x in both)] if both else []
    q = f"{statistics.median(kb[r] / by[r] for r in quiet):.2f}x ({len(quiet)} of {len(both)})" if quiet else "-"
    print(f"| {name} | {ms:.1f} | {flop / ms / 1e6:.0f} | {ratio:.2f}x | {per} | {q} |")
PY
