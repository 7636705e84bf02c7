#!/usr/bin/env bash
# Quantized backbones side by side: bf16, int8 and fp8 on the backbone bench's
# model (SD3-medium blocks, bench/backbone_bench.sh), in one run: per-forward
# time (median of --repeat forwards, rounds alternating the schemes), weight
# memory, and the quality numbers (kiln quality) next to them.
#
#   bench/quant_bench.sh [--rounds R] [--runs N] [--threads N] [--layers N] [--latent N] [--context T]
#                        [--quality-steps S] [--quality-latent LIST]
#
# Needs a built kiln (make build). Writes under build/bench-backbone (shared
# with backbone_bench.sh) and keeps a weight cache in build/bench-quant-cache.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 RUNS=5 THREADS=2 LAYERS=2 LATENT=64 CONTEXT=333 QSTEPS=8 QLATENT=32x32,32x48
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;; --runs) RUNS=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;; --latent) LATENT=$2; shift 2 ;; --context) CONTEXT=$2; shift 2 ;;
    --quality-steps) QSTEPS=$2; shift 2 ;; --quality-latent) QLATENT=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds R] [--runs N] [--threads N] [--layers N] [--latent N] [--context T] [--quality-steps S] [--quality-latent LIST]" >&2; exit 2 ;;
  esac
done
. bench/sd3m_model.sh   # the model, its inputs: DIR, IN, KILN
export OMP_NUM_THREADS=$THREADS KILN_THREADS=$THREADS KILN_LOG=error KILN_CACHE_DIR=$PWD/build/bench-quant-cache
RES="$DIR/quant-results.txt"; : > "$RES"
SCHEMES=(none int8 fp8)
for q in "${SCHEMES[@]}"; do  # build each scheme's cache once (not timed)
  $KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/quant-$q.safetensors" --quant $q >/dev/null 2>&1
done
for r in $(seq 1 $ROUNDS); do
  # rotate the order every round so no scheme always runs first
  for k in 0 1 2; do
    q=${SCHEMES[$(( (k + r) % 3 ))]}
    out=$($KILN forward "$DIR/model" --inputs "$IN" --output "$DIR/quant-$q.safetensors" --quant $q --repeat $RUNS)
    ms=$(echo "$out" | awk '/^forward: median/ {print $3}')
    wb=$(echo "$out" | awk '/^weights:/ {print $2, $6, $11}')
    echo "time $r $q $ms $wb" >> "$RES"
  done
done
for q in int8 fp8; do
  $KILN quality "$DIR/model" --quant $q --steps $QSTEPS --latent $QLATENT --context 77 > "$DIR/quality-$q.txt" || true
  line=$(grep '^quality: \(PASS\|FAIL\)' "$DIR/quality-$q.txt")
  echo "quality $q $(echo "$line" | sed -E 's/.*error ([^ ]+) .*PSNR ([^ ]+) dB, worst step ([^)]+)\)/\1 \2 \3/') $(echo "$line" | awk '{print $2}' | tr -d :)" >> "$RES"
done
python3 - "$RES" "$DIR" "$LAYERS" "$LATENT" "$CONTEXT" "$THREADS" "$RUNS" "$ROUNDS" "$QSTEPS" "$QLATENT" <<'PY'
import sys, json, struct, statistics as st, math
res, d = sys.argv[1], sys.argv[2]
L, lat, T, thr, runs, rounds, qsteps = (int(x) for x in sys.argv[3:10]); qlat = sys.argv[10]
times, wbytes, qual = {}, {}, {}
for line in open(res):
    f = line.split()
    if f[0] == "time":
        times.setdefault(f[2], {})[int(f[1])] = float(f[3]); wbytes[f[2]] = (int(f[4]), int(f[5]), int(f[6]))
    elif f[0] == "quality":
        qual[f[1]] = f[2:]
def load(path):  # the one F32 tensor kiln forward writes
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    t = [v for k, v in h.items() if k != "__metadata__"][0]; s, e = t["data_offsets"]
    return struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
ref = load(f"{d}/quant-none.safetensors")
def rel(a, b):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(y * y for y in b))
print(f"config: SD3-medium blocks, {L} layers, latent {lat}x{lat}, {T} context tokens, batch 1, {thr} threads; "
      f"{rounds} rounds x median of {runs} forwards, schemes rotated each round")
print(f"quality: kiln quality, {qsteps} steps, guidance 5, latents {qlat}, seeded conditioning (77 tokens)\n")
# the layers a scheme quantizes, as bf16: everything else is the same in every scheme
q = "int8" if "int8" in wbytes else "fp8"
layer_bf16 = wbytes["none"][0] - (wbytes[q][0] - wbytes[q][2])
print("| scheme | forward ms (median of rounds) | bf16 time / this (median of per-round ratios) | all weights MB | quantized layers MB (vs bf16) | forward rel L2 vs bf16 | final-latent rel L2 | PSNR dB | worst step rel L2 | gate 3% |")
print("|---|---|---|---|---|---|---|---|---|---|")
for q in ["none", "int8", "fp8"]:
    ms = st.median(times[q].values())
    ratios = [times["none"][r] / times[q][r] for r in times[q]]
    fe = 0.0 if q == "none" else rel(load(f"{d}/quant-{q}.safetensors"), ref)
    qq = qual.get(q, ["-", "-", "-", "-"])
    name = "bf16" if q == "none" else q
    print(f"| {name} | {ms:.1f} | {st.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)}) | "
          f"{wbytes[q][0] / 1e6:.1f} | {(wbytes[q][2] if q != 'none' else layer_bf16) / 1e6:.1f} ({(wbytes[q][2] if q != 'none' else layer_bf16) / layer_bf16:.2f}x, {wbytes[q][1] if q != 'none' else 0} weights) | {fe:.3g} | {qq[0]} | {qq[1]} | {qq[2]} | {qq[3] if q != 'none' else '-'} |")
PY
