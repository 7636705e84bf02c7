#!/usr/bin/env bash
# The whole SD3 pipeline, prompt to PNG, kiln against diffusers'
# StableDiffusion3Pipeline (PyTorch bf16, eager) on the same SD3.5-medium-shaped
# pipeline folder, the same prompt, seed, size, steps, guidance and threads; with
# --class flux, a FLUX.1-schnell-shaped FluxPipeline (CLIP-L, T5-XXL 4 of 24 layers,
# the transformer at its real width with 2 double and 4 single blocks, FLUX.1's VAE;
# default 4 steps, no guidance) against diffusers' FluxPipeline:
#
#   bench/pipeline_bench.sh [--class sd3|flux] [--rounds 3] [--calls 3] [--threads 2] [--size 512]
#                           [--steps 8] [--guidance 7] [--skip-torch]
#
# Once (kept under build/bench-pipeline): bench/pipeline_torch.py write seeds the
# pipeline folder (CLIP-L full, CLIP-G 4 of 32 layers, T5-XXL 4 of 24, the
# SD3.5-medium transformer with 4 of 24 blocks, SD3's real VAE; bf16
# safetensors, diffusers' layout); `kiln cache build` converts every component
# and `kiln compile` publishes their packages (CFG, --size).
# Then each round, the order of kiln and diffusers alternating between rounds:
#   warm  one process makes the image --calls times: kiln build/bench_pipeline
#         (bench/pipeline_bench.c: kiln_pipeline_open once, then generate +
#         decode + PNG), diffusers pipeline_torch.py warm (from_pretrained once,
#         then pipe(...) + PNG); the first call is the warm-up, the warm image is
#         the median of the others
#   cold  a fresh process makes one image, timed whole from outside (wall clock
#         of the process): `kiln generate PIPELINE ... --timings` on the caches
#         and packages, and pipeline_torch.py cold (python start, imports,
#         from_pretrained, first call). The files are read once before (a cold
#         process on a warm page cache: the disk is not what is measured).
# Prints the medians over the rounds, each round's kiln/diffusers ratio and
# their median (a shared host's speed drifts between rounds), kiln's cold
# against its own warm, and per-component times (encode_prompt, each step,
# sampling, VAE decode, load) of both.
#
# Needs a built kiln (make build: build/kiln, build/bench_pipeline) and
# bench/.venv (bench/requirements.txt). A round takes several minutes on 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 CALLS=3 THREADS=2 SIZE=512 STEPS= GUIDANCE= SKIP_TORCH=0 CLASS=sd3
PROMPT="a photograph of an astronaut riding a horse on the moon" SEED=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;; --calls) CALLS=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;; --guidance) GUIDANCE=$2; shift 2 ;;
    --skip-torch) SKIP_TORCH=1; shift ;; --class) CLASS=$2; shift 2 ;;
    *) echo "usage: $0 [--class sd3|flux] [--rounds 3] [--calls 3] [--threads 2] [--size 512] [--steps 8] [--guidance 7] [--skip-torch]" >&2; exit 2 ;;
  esac
done
case "$CLASS" in
  sd3) NAME=sd35m; STEPS=${STEPS:-8}; GUIDANCE=${GUIDANCE:-7}
       DESC="SD3.5-medium-shaped pipeline (CLIP-L, CLIP-G 4/32, T5-XXL 4/24, transformer 4/24 blocks, SD3 VAE)" ;;
  flux) NAME=flux-schnell; STEPS=${STEPS:-4}; GUIDANCE=${GUIDANCE:-0}
       DESC="FLUX.1-schnell-shaped pipeline (CLIP-L, T5-XXL 4/24, transformer at width 3072 with 2/19 double + 4/38 single blocks, FLUX.1 VAE)" ;;
  *) echo "--class $CLASS: sd3 or flux" >&2; exit 2 ;;
esac
[ "$CALLS" -ge 2 ] || { echo "--calls must be at least 2 (the first is the warm-up)" >&2; exit 2; }
PY=bench/.venv/bin/python KILN=build/kiln BENCH=build/bench_pipeline
[ -x $KILN ] && [ -x $BENCH ] || { echo "build kiln first (make build)" >&2; exit 1; }
[ -x $PY ] || { echo "no bench/.venv: python3 -m venv bench/.venv && bench/.venv/bin/pip install -r bench/requirements.txt" >&2; exit 1; }
D=build/bench-pipeline P=build/bench-pipeline/$NAME C=build/bench-pipeline/cache L=build/bench-pipeline/logs-$NAME
mkdir -p $D $L
export OMP_NUM_THREADS=$THREADS KILN_THREADS=$THREADS KILN_LOG=error HF_HUB_OFFLINE=1
ARGS=(--prompt "$PROMPT" --seed $SEED --steps $STEPS --guidance $GUIDANCE)
KEY=(--cache-dir $C --name $NAME)

if [ ! -f $P/model_index.json ]; then
  echo "writing the pipeline folder $P (once)" >&2
  (cd bench && .venv/bin/python pipeline_torch.py write --class $CLASS --out ../$P --threads $THREADS) > $L/write.log 2>&1 \
    || { cat $L/write.log >&2; exit 1; }
fi
echo "kiln cache build (a hit does nothing) and kiln compile (once)" >&2
$KILN cache build $P "${KEY[@]}" > $L/cache-build.log 2>&1 || { cat $L/cache-build.log >&2; exit 1; }
if [ ! -f $D/compiled-$NAME-$SIZE ]; then
  $KILN compile $P "${KEY[@]}" --width $SIZE --height $SIZE --guidance $GUIDANCE > $L/compile.log 2>&1 \
    || { cat $L/compile.log >&2; exit 1; }
  touch $D/compiled-$NAME-$SIZE
fi

RES=$D/results-$NAME.txt; : > $RES
add() { echo "$1 $2 $3" >> $RES; }  # name value round
now() { date +%s.%N; }
warm_files() { find "$@" -type f -exec cat {} + > /dev/null; }  # a warm page cache: the disk is not measured
# one JSON line's fields: the warm calls (all but the first) as medians, the first, and the parts
jfields() {  # jfields FILE PREFIX ROUND
  python3 - "$@" >> $RES <<'PY'
import json, statistics, sys
f, pre, rnd = sys.argv[1:]
d = json.loads(open(f).read().strip().splitlines()[-1])
calls = d["calls"]
warm = calls[1:] if len(calls) > 1 else calls
med = lambda k: statistics.median(c[k] for c in warm)
print(f"{pre}-warm {med('total_ms')} {rnd}")
print(f"{pre}-first-call {calls[0]['total_ms']} {rnd}")
for k in ("encode_ms", "sampling_ms", "decode_ms"):
    print(f"{pre}-warm-{k[:-3]} {med(k)} {rnd}")
print(f"{pre}-warm-step {statistics.median(s for c in warm for s in c['steps_ms'])} {rnd}")
print(f"{pre}-first-call-step1 {calls[0]['steps_ms'][0]} {rnd}")
for k in ("open_ms", "load_ms", "imports_ms"):
    if k in d:
        print(f"{pre}-{k[:-3]} {d[k]} {rnd}")
PY
}

kiln_warm() {
  warm_files $C
  rm -f $L/kiln-warm-ledger-$1.txt  # bench_pipeline appends
  $BENCH --pipeline $P "${KEY[@]}" "${ARGS[@]}" --size $SIZE --runs $CALLS --output $D/kiln-warm.png \
    --ledger $L/kiln-warm-ledger-$1.txt > $L/kiln-warm-$1.json 2> $L/kiln-warm-$1.err \
    || { cat $L/kiln-warm-$1.err >&2; exit 1; }
  jfields $L/kiln-warm-$1.json kiln $1
}
torch_warm() {
  warm_files $P
  (cd bench && .venv/bin/python pipeline_torch.py warm --pipeline ../$P "${ARGS[@]}" --size $SIZE --runs $CALLS \
    --threads $THREADS --output ../$D/torch-warm.png) > $L/torch-warm-$1.json 2> $L/torch-warm-$1.err \
    || { cat $L/torch-warm-$1.err >&2; exit 1; }
  jfields $L/torch-warm-$1.json torch $1
}
kiln_cold() {
  warm_files $C
  local t0 t1; t0=$(now)
  $KILN generate $P "${KEY[@]}" "${ARGS[@]}" --width $SIZE --height $SIZE --timings --output $D/kiln-cold.png \
    > $L/kiln-cold-$1.out 2> $L/kiln-cold-$1.err || { cat $L/kiln-cold-$1.err >&2; exit 1; }
  t1=$(now)
  add kiln-cold "$(python3 -c "print(($t1 - $t0) * 1e3)")" $1
  python3 - $L/kiln-cold-$1.err $1 >> $RES <<'PY'
import re, sys
text, rnd = open(sys.argv[1]).read(), sys.argv[2]
rows = {m.group(1).strip(): float(m.group(2)) * 1e3
        for m in re.finditer(r"^(\S[^\n]*?)\s+(\d+\.\d+)\s+\d+\s+\S+\s+\S+\s", text, re.M)}
steps = [float(s) * 1e3 for s in re.findall(r"step \d+/\d+\s+sigma \S+\s+(\S+) s", text)]
for k, name in (("encode_prompt", "encode"), ("sampler_step", "sampling"), ("vae decode", "decode")):
    print(f"kiln-cold-{name} {rows.get(k, 0)} {rnd}")
print(f"kiln-cold-load {sum(v for k, v in rows.items() if k.startswith('load '))} {rnd}")
print(f"kiln-cold-step1 {steps[0]} {rnd}")  # the step lines time the step alone (the encode has its own line)
m = re.search(r"pipeline ready in (\S+) s", text)
print(f"kiln-cold-open {float(m.group(1)) * 1e3 if m else 0} {rnd}")
PY
}
torch_cold() {
  warm_files $P
  local t0 t1; t0=$(now)
  (cd bench && .venv/bin/python pipeline_torch.py cold --pipeline ../$P "${ARGS[@]}" --size $SIZE --threads $THREADS \
    --output ../$D/torch-cold.png) > $L/torch-cold-$1.json 2> $L/torch-cold-$1.err \
    || { cat $L/torch-cold-$1.err >&2; exit 1; }
  t1=$(now)
  add torch-cold "$(python3 -c "print(($t1 - $t0) * 1e3)")" $1
  python3 - $L/torch-cold-$1.json $1 >> $RES <<'PY'
import json, sys
d, rnd = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]), sys.argv[2]
c = d["calls"][0]
for k in ("imports_ms", "load_ms"):
    print(f"torch-cold-{k[:-3]} {d[k]} {rnd}")
print(f"torch-cold-first-call {c['total_ms']} {rnd}")
for k in ("encode_ms", "sampling_ms", "decode_ms"):
    print(f"torch-cold-{k[:-3]} {c[k]} {rnd}")
print(f"torch-cold-step1 {c['steps_ms'][0]} {rnd}")
PY
}

for round in $(seq $ROUNDS); do
  add load-average "$(cut -d' ' -f1 /proc/loadavg)" $round
  echo "round $round/$ROUNDS ($(date -u +%H:%M:%S), load average $(cut -d' ' -f1 /proc/loadavg))" >&2
  if [ $SKIP_TORCH = 1 ]; then kiln_warm $round; kiln_cold $round
  elif [ $((round % 2)) = 1 ]; then kiln_warm $round; torch_warm $round; kiln_cold $round; torch_cold $round
  else torch_warm $round; kiln_warm $round; torch_cold $round; kiln_cold $round; fi
done

python3 - "$RES" "$ROUNDS" "$CALLS" "$THREADS" "$SIZE" "$STEPS" "$GUIDANCE" "$DESC" "$CLASS" <<'PY'
import sys
from collections import defaultdict
sys.path.insert(0, "bench")
from bench_util import median, ratios
res, rounds, calls, thr, size, steps, g, desc, cls = sys.argv[1:]
by = defaultdict(dict)  # name -> round -> value
for line in open(res):
    if line.strip():
        name, v, rnd = line.split()
        by[name][rnd] = float(v)
s = lambda name: median(by[name].values()) / 1e3 if by.get(name) else float("nan")
per = lambda r: ", ".join(f"{x:.2f}" for x in r)
print(f"\n{desc}, "
      f"{size}x{size}, {steps} steps, {'CFG ' + g if cls == 'sd3' else 'no CFG'}, {thr} threads, bf16; {rounds} rounds, warm = median of calls 2..{calls} "
      f"of one process; load average at each round's start: {per(by['load-average'][r] for r in sorted(by['load-average'], key=int))}")
print("\n| | kiln s | diffusers s | kiln / diffusers (median of rounds) | per round | target |")
print("|---|---|---|---|---|---|")
for what, k, t, target in (("warm image", "kiln-warm", "torch-warm", "<= 0.5x"),
                           ("cold first image (process wall clock)", "kiln-cold", "torch-cold", "<= 0.4x")):
    r, m = ratios(by[k], by.get(t, {}))
    print(f"| {what} | {s(k):.1f} | {s(t):.1f} | {m if m is None else f'{m:.2f}x'} | {per(r)} | {target} |")
r, m = ratios(by["kiln-cold"], by["kiln-warm"])
print(f"\nkiln cold / kiln warm: {m:.2f}x (per round {per(r)}; target <= 1.3x)")
print("\nPer component, seconds (medians over the rounds; a step is " + ("one CFG batch of 2):" if cls == "sd3" else "one backbone call):"))
print("| part | kiln warm | diffusers warm | kiln cold | diffusers cold |")
print("|---|---|---|---|---|")
for part, kw, tw, kc, tc in (
        ("imports", None, None, None, "torch-cold-imports"),
        ("load (open / from_pretrained)", "kiln-open", "torch-load", "kiln-cold-open", "torch-cold-load"),
        ("encode_prompt" + (" (prompt and \"\")" if cls == "sd3" else ""), "kiln-warm-encode", "torch-warm-encode", "kiln-cold-encode", "torch-cold-encode"),
        ("first step", None, None, "kiln-cold-step1", "torch-cold-step1"),
        ("a step (median)", "kiln-warm-step", "torch-warm-step", None, None),
        (f"sampling ({steps} steps)", "kiln-warm-sampling", "torch-warm-sampling", "kiln-cold-sampling", "torch-cold-sampling"),
        ("VAE decode", "kiln-warm-decode", "torch-warm-decode", "kiln-cold-decode", "torch-cold-decode"),
        ("whole image", "kiln-warm", "torch-warm", "kiln-cold", "torch-cold")):
    cell = lambda k: f"{s(k):.2f}" if k and by.get(k) else "-"
    print(f"| {part} | {cell(kw)} | {cell(tw)} | {cell(kc)} | {cell(tc)} |")
print(f"\nfirst call of the warm process: kiln {s('kiln-first-call'):.1f} s, diffusers {s('torch-first-call'):.1f} s "
      f"(its first step: kiln {s('kiln-first-call-step1'):.2f} s, diffusers {s('torch-first-call-step1'):.2f} s)")
PY
