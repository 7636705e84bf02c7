#!/usr/bin/env bash
# Side-by-side benchmark of the ahead-of-time compiler (issue: AOT packages):
# per-forward time of kiln's dynamic package, fixed-shape package, planned
# executor and eager execution (the same fast kernels), compile time and
# package size (regional and whole-graph), and cold start (a fresh process:
# map the cache, open the package, first backbone output) against a warm
# forward; then the same columns for PyTorch's AOTInductor (torch.export
# with a dynamic width, aoti_compile_and_package, a fresh process loading it).
#
#   bench/compile_bench.sh [--layers N] [--latent N] [--context T] [--threads N] [--runs N]
#                          [--rounds N] [--dtype bf16|f32] [--skip-torch]
#
# Needs a built kiln (make build) and, for the PyTorch side, bench/.venv
# (bench/README.md). Model, cache and packages go under build/bench-backbone.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=2 LATENT=64 CONTEXT=333 THREADS=2 RUNS=3 ROUNDS=3 DT=bf16 SKIP_TORCH=0
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) LAYERS=$2; shift 2 ;; --latent) LATENT=$2; shift 2 ;; --context) CONTEXT=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;; --runs) RUNS=$2; shift 2 ;; --rounds) ROUNDS=$2; shift 2 ;;
    --dtype) DT=$2; shift 2 ;; --skip-torch) SKIP_TORCH=1; shift ;;
    *) echo "usage: $0 [--layers N] [--latent N] [--context T] [--threads N] [--runs N] [--rounds N] [--dtype bf16|f32] [--skip-torch]" >&2; exit 2 ;;
  esac
done
PY=bench/.venv/bin/python
. bench/sd3m_model.sh
export OMP_NUM_THREADS=$THREADS KILN_THREADS=$THREADS KILN_LOG=error KILN_CACHE_DIR=$PWD/$DIR/cache
unset KILN_PACKAGE_DIR KILN_EXEC
RES="$DIR/compile-results.txt"; : > "$RES"
W=$((LATENT / 2)); LO=$((W / 2)); HI=$((W + W / 2)); [ $HI -gt 191 ] && HI=191
COMMON=(--dtype $DT --batch 1 --latent ${LATENT}x${LATENT} --context-len $CONTEXT)
$KILN cache build "$DIR/model" --dtype $DT >/dev/null

# compile: regional and whole-graph dynamic packages, a fixed-shape one (fresh folders: real builds)
for kind in regional full fixed; do
  P=$PWD/$DIR/pkg-$DT-$kind; rm -rf "$P"
  args=(--package-dir "$P"); [ $kind = full ] && args+=(--full)
  [ $kind != fixed ] && args+=(--dim w_tok=$LO:$HI)
  out=$($KILN compile "$DIR/model" "${COMMON[@]}" "${args[@]}" 2>/dev/null)
  secs=$(echo "$out" | sed -n 's/.*compile \([0-9.]*\) s.*/\1/p')
  bytes=$(du -sb "$P" | awk '{print $1}')
  echo "compile-$kind $secs $bytes" >> "$RES"
done

# per-forward time, alternating the executors round by round (the machine is noisy)
for r in $(seq $ROUNDS); do
  for ex in dynamic:regional dynamic:full fixed:fixed planned:regional eager:regional; do
    step=${ex%%:*} pk=${ex##*:}
    ms=$($KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/c-$step.safetensors" --dtype $DT \
         --exec $step --package-dir "$PWD/$DIR/pkg-$DT-$pk" --repeat $RUNS 2>/dev/null | sed -n 's/.*median \([0-9.]*\) ms.*/\1/p')
    echo "fwd-$step-$pk $ms" >> "$RES"
  done
  # cold start: a fresh process maps the cache, opens the package, makes the first output
  for ex in dynamic:regional eager:regional; do
    step=${ex%%:*} pk=${ex##*:}
    t0=$(date +%s.%N)
    $KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/cold.safetensors" --dtype $DT --exec $step \
        --package-dir "$PWD/$DIR/pkg-$DT-$pk" >/dev/null 2>&1
    t1=$(date +%s.%N)
    echo "cold-$step $(echo "($t1 - $t0) * 1000" | bc -l)" >> "$RES"
  done
done
# the packages run the planned executor's graph (the same passes): bitwise equal to it;
# eager runs the model's ops unfused with f32 activations: equal within bf16 rounding
for step in dynamic fixed; do
  cmp -s "$DIR/c-$step.safetensors" "$DIR/c-planned.safetensors" && echo "same-$step 1" >> "$RES" || echo "same-$step 0" >> "$RES"
done
python3 - "$DIR/c-planned.safetensors" "$DIR/c-eager.safetensors" >> "$RES" <<'PY'
import array, json, math, struct, sys
def f32(path):  # the one f32 tensor of a kiln forward output
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    meta = [v for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"][0]
    a, b = meta["data_offsets"]
    return array.array("f", raw[8 + n + a:8 + n + b])
x, y = f32(sys.argv[1]), f32(sys.argv[2])
print("planned-vs-eager", math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)) / max(sum(q * q for q in y), 1e-30)))
PY

if [ $SKIP_TORCH = 0 ]; then
  $PY bench/torch_bench.py --model "$DIR/model" --inputs "$IN" --dtype $DT --mode aoti --threads $THREADS \
      --runs $RUNS --json 2>/dev/null | tail -1 > "$DIR/aoti-$DT.json" || echo '{}' > "$DIR/aoti-$DT.json"
fi
python3 - "$RES" "$DIR/aoti-$DT.json" "$LAYERS" "$LATENT" "$CONTEXT" "$THREADS" "$DT" "$LO" "$HI" $SKIP_TORCH <<'PY'
import json, statistics, sys
from collections import defaultdict
vals = defaultdict(list)
for line in open(sys.argv[1]):
    k, *v = line.split()
    vals[k].append([float(x) for x in v])
med = lambda k: statistics.median(v[0] for v in vals[k]) if k in vals else float("nan")
L, lat, T, thr, dt, lo, hi, skip = sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8], sys.argv[9], sys.argv[10] == "1"
print(f"config: SD3-medium blocks, {L} layers, latent {lat}x{lat} ({(int(lat)//2)**2} image tokens), {T} context tokens, "
      f"batch 1, {dt}, {thr} threads; dynamic packages: w_tok in [{lo}, {hi}]; medians over the rounds\n")
eager = med("fwd-eager-regional")
print("| kiln executor | ms per forward | eager / this |")
print("|---|---|---|")
for k, label in [("fwd-dynamic-regional", "dynamic package (regional)"), ("fwd-dynamic-full", "dynamic package (whole graph)"),
                 ("fwd-fixed-fixed", "fixed-shape package"), ("fwd-planned-regional", "planned executor"),
                 ("fwd-eager-regional", "eager (op by op)")]:
    print(f"| {label} | {med(k):.1f} | {eager / med(k):.2f}x |")
print(f"\ndynamic / fixed-shape: {med('fwd-dynamic-regional') / med('fwd-fixed-fixed'):.3f}; outputs bitwise equal to the planned executor: "
      + ", ".join(f"{s} {'yes' if vals.get('same-'+s, [[0]])[0][0] else 'NO'}" for s in ("dynamic", "fixed"))
      + f"; planned vs eager (op by op, f32 activations): relative L2 {med('planned-vs-eager'):.2g}")
print("\n| package | compile s | size |")
print("|---|---|---|")
for k in ("regional", "full", "fixed"):
    v = vals.get("compile-" + k, [[float("nan"), 0]])[0]
    print(f"| kiln {k} | {v[0]:.2f} | {v[1]/1024:.0f} KiB |")
warm = med("fwd-dynamic-regional")
print(f"\ncold start (fresh process to first output): package {med('cold-dynamic'):.0f} ms = {med('cold-dynamic')/warm:.2f}x a warm "
      f"forward ({warm:.0f} ms); eager {med('cold-eager'):.0f} ms")
if not skip:
    try:
        a = json.load(open(sys.argv[2]))
        print(f"\nPyTorch AOTInductor ({a.get('dynamic_dim', '?')}, torch {a.get('torch', '?')}): warm {a['median_ms']:.1f} ms per forward, "
              f"export+compile {a['compile_s']:.1f} s, package {a['package_mb']:.1f} MB, cold start {a.get('cold_start_s', float('nan'))*1e3:.0f} ms "
              f"= {a.get('cold_start_s', float('nan'))*1e3/a['median_ms']:.2f}x its warm forward")
        print(f"kiln dynamic package / AOTInductor: forward {warm / a['median_ms']:.2f}x the time, compile "
              f"{vals['compile-regional'][0][0] / a['compile_s']:.3f}x, cold start {med('cold-dynamic') / (a.get('cold_start_s', float('nan'))*1e3):.3f}x")
    except Exception as e:
        print(f"\nPyTorch AOTInductor: no result ({e})")
PY
