#!/usr/bin/env bash
# Parallel modes side by side: 1 rank x 2 threads against 2 ranks x 1 thread
# (mpirun -np 2) for tensor, sequence and CFG parallel and FSDP, on the
# backbone benchmark's config (SD3-medium blocks; bench/backbone_bench.sh),
# plus the bytes rank 0 sends per forward. Runs alternate (single, parallel,
# single, ...) and the medians of --rounds rounds are reported side by side.
#
#   bench/dist_bench.sh [--rounds N] [--runs N] [--layers N] [--latent N] [--context T] [--dtype bf16|f32]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 RUNS=3 LAYERS=2 LATENT=64 CONTEXT=333 DTYPE=bf16 MODES="tp sp cfgp sp+fsdp"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;; --runs) RUNS=$2; shift 2 ;; --layers) LAYERS=$2; shift 2 ;;
    --latent) LATENT=$2; shift 2 ;; --context) CONTEXT=$2; shift 2 ;; --dtype) DTYPE=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--runs N] [--layers N] [--latent N] [--context T] [--dtype bf16|f32] [--modes 'tp sp cfgp sp+fsdp']" >&2; exit 2 ;;
  esac
done
. bench/sd3m_model.sh   # the model, its inputs: DIR, IN, KILN
# CFG parallel splits a batch of 2 (uncond, cond): the same inputs twice
IN2="$DIR/in2-${LATENT}-${CONTEXT}.safetensors"
[ -f "$IN2" ] || python3 - "$IN" "$IN2" <<'PY'
import json, struct, sys
src = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", src[:8])[0]; hdr = json.loads(src[8:8 + n]); data = src[8 + n:]
out, blobs, off = {}, [], 0
for k, v in hdr.items():
    if k == "__metadata__": continue
    b = data[v["data_offsets"][0]:v["data_offsets"][1]]
    if v["shape"] and v["shape"][0] == 1: b = b + b; v = dict(v, shape=[2] + v["shape"][1:])
    out[k] = dict(dtype=v["dtype"], shape=v["shape"], data_offsets=[off, off + len(b)]); blobs.append(b); off += len(b)
h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
CACHE=build/bench-dist-cache
export KILN_LOG=error OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
one() { # inputs -> "ms"
  OMP_NUM_THREADS=2 KILN_THREADS=2 $KILN forward "$DIR/model" --inputs "$1" --output "$DIR/one.safetensors" \
    --dtype $DTYPE --cache-dir $CACHE --repeat $RUNS | awk '/median/ {print $3}'
}
two() { # inputs, flags -> "ms bytes"
  OMP_NUM_THREADS=1 KILN_THREADS=1 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS -x KILN_THREADS -x KILN_LOG \
    $KILN forward "$DIR/model" --inputs "$1" --output "$DIR/two.safetensors" --dtype $DTYPE --cache-dir $CACHE \
    --repeat $RUNS $2 | awk '/median/ {for (i = 1; i <= NF; i++) if ($i == "sent") b = $(i + 1); print $3, b}'
}
RES=$DIR/dist-results.txt; : > "$RES"
for mode in $MODES; do
  case $mode in
    tp) flags="--tp 2"; in=$IN ;; sp) flags="--sp 2"; in=$IN ;; cfgp) flags="--cfgp 2"; in=$IN2 ;;
    sp+fsdp) flags="--sp 2 --fsdp"; in=$IN ;; tp+fsdp) flags="--tp 2 --fsdp"; in=$IN ;;
  esac
  one "$in" >/dev/null; two "$in" "$flags" >/dev/null   # warm the caches
  for r in $(seq $ROUNDS); do echo "$mode one $(one "$in")" >> "$RES"; echo "$mode two $(two "$in" "$flags")" >> "$RES"; done
done
python3 - "$RES" "$LAYERS" "$LATENT" "$CONTEXT" "$DTYPE" "$ROUNDS" "$RUNS" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
L, lat, T, dt, R, N = sys.argv[2:8]
print(f"config: SD3-medium blocks, {L} layers, latent {lat}x{lat}, {T} context tokens, {dt}; medians of {R} alternating rounds x {N} runs")
print("| mode | batch | 1 rank x 2 threads ms | 2 ranks x 1 thread ms | 1 rank time / 2 ranks time | rank 0 sends per forward |")
print("|---|---|---|---|---|---|")
for mode in dict.fromkeys(r[0] for r in rows):
    one = [float(r[2]) for r in rows if r[0] == mode and r[1] == "one"]
    two = [float(r[2]) for r in rows if r[0] == mode and r[1] == "two"]
    b = [int(r[3]) for r in rows if r[0] == mode and r[1] == "two" and len(r) > 3]
    a, c = st.median(one), st.median(two)
    print(f"| {mode} | {2 if mode == 'cfgp' else 1} | {a:.1f} | {c:.1f} | {a / c:.2f}x | {b[0] / 2**20:.1f} MiB |" if b else f"| {mode} | | {a:.1f} | {c:.1f} | {a/c:.2f}x | ? |")
PY
