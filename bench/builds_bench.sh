#!/usr/bin/env bash
# Two builds of kiln side by side on kiln's own benchmarks, for a change that
# must not make anything slower (a refactor): the backbone (SD3-medium
# blocks, 2 layers, 64x64 latent, 333 context tokens; planned and from a
# dynamic package; bf16 and f32), the tiny T5 and CLIP encoders, the tiny
# VAE decode and the tiny pipeline's whole call (per-op overheads show
# there), and a cache hit. Rounds alternate the builds' order, since a
# shared host's speed drifts; prints each build's median over the rounds
# and their ratio. Needs both builds' kiln and bench_* binaries
# (make -C BUILD kiln_cli bench_encoder bench_vae bench_pipeline bench_cache_hit).
#
#   bench/builds_bench.sh OLD_BUILD NEW_BUILD [ROUNDS]     e.g. /tmp/old/build build 5
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: builds_bench.sh OLD_BUILD NEW_BUILD [ROUNDS]} NEW=${2:?usage: builds_bench.sh OLD_BUILD NEW_BUILD [ROUNDS]}
R=${3:-5} D=tests/data/goldens
export OMP_NUM_THREADS=2 KILN_THREADS=2 KILN_LOG=error KILN_CACHE_DIR=
LAYERS=2 LATENT=64 CONTEXT=333
KILN=$NEW/kiln
. bench/sd3m_model.sh # DIR, IN
W=$(mktemp -d "${TMPDIR:-/tmp}/kiln-builds-XXXXXX")
trap 'rm -rf "$W"' EXIT
python3 - "$D/vae-sd3-tiny/io.safetensors" "$W/latents.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
t = h["decode_input"]; f.seek(8 + n + t["data_offsets"][0]); data = f.read(t["data_offsets"][1] - t["data_offsets"][0])
hb = json.dumps({"latents": {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [0, len(data)]}}).encode()
hb += b" " * ((8 - len(hb) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + data)
PY
json() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
for v in old new; do # each build's packages and caches, made once
  B=$([ $v = old ] && echo "$OLD" || echo "$NEW")
  for dt in bf16 f32; do
    "$B/kiln" compile "$DIR/model" --dtype $dt --package-dir "$W/pk-$v" --latent ${LATENT}x${LATENT} --context-len $CONTEXT \
      --dim batch=1:2 >/dev/null
  done
  "$B/bench_encoder" --model $D/t5-tiny --inputs $D/t5-tiny/io.safetensors --cache-dir "$W/c-$v" --name t5 --runs 1 >/dev/null
  "$B/bench_encoder" --model $D/clip-l-tiny --inputs $D/clip-l-tiny/io.safetensors --cache-dir "$W/c-$v" --name cl --runs 1 >/dev/null
  "$B/bench_vae" --model $D/vae-sd3-tiny --latents "$W/latents.safetensors" --cache-dir "$W/c-$v" --name vae --runs 1 >/dev/null
  "$B/bench_pipeline" --pipeline $D/sd3-pipeline-tiny --cache-dir "$W/c-$v" --name pipe --runs 1 --steps 2 --size 64 \
    --output "$W/p.png" >/dev/null
done
RES=$W/results.txt
for r in $(seq "$R"); do
  order="old new"; [ $((r % 2)) = 0 ] && order="new old"
  for v in $order; do
    B=$([ $v = old ] && echo "$OLD" || echo "$NEW")
    for dt in bf16 f32; do
      for ex in planned dynamic; do
        ms=$("$B/kiln" forward "$DIR/model" --inputs "$IN" --output "$W/o.safetensors" --dtype $dt --repeat 5 --exec $ex \
             --package-dir "$W/pk-$v" | awk '/median/ {print $3}')
        echo "backbone-$ex-$dt $v $ms" >> "$RES"
      done
    done
    echo "t5-tiny-encode $v $("$B/bench_encoder" --model $D/t5-tiny --inputs $D/t5-tiny/io.safetensors --cache-dir "$W/c-$v" --name t5 --runs 200 | json median_ms)" >> "$RES"
    echo "clip-l-tiny-encode $v $("$B/bench_encoder" --model $D/clip-l-tiny --inputs $D/clip-l-tiny/io.safetensors --cache-dir "$W/c-$v" --name cl --runs 400 | json median_ms)" >> "$RES"
    echo "vae-tiny-decode $v $("$B/bench_vae" --model $D/vae-sd3-tiny --latents "$W/latents.safetensors" --cache-dir "$W/c-$v" --name vae --runs 1000 | json median_ms)" >> "$RES"
    echo "pipeline-tiny-call $v $("$B/bench_pipeline" --pipeline $D/sd3-pipeline-tiny --cache-dir "$W/c-$v" --name pipe --runs 9 --steps 4 --size 64 --output "$W/p.png" | python3 -c "import json,sys,statistics; print(statistics.median(c['total_ms'] for c in json.loads(sys.stdin.read().strip().splitlines()[-1])['calls']))")" >> "$RES"
    echo "cache-hit $v $("$B/bench_cache_hit" --runs 100 | tail -1 | sed 's/.*median \([0-9.]*\) ms.*/\1/')" >> "$RES"
  done
done
python3 - "$RES" "$OLD" "$NEW" <<'PY'
import statistics, sys
from collections import defaultdict
d = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1]):
    k, v, ms = line.split()
    d[k][v].append(float(ms))
rounds = len(next(iter(d.values()))["old"])
print("%-24s %10s %10s %8s   (ms, medians of %d rounds; old %s, new %s)" % ("workload", "old", "new", "new/old", rounds, sys.argv[2], sys.argv[3]))
for k in d:
    o, n = statistics.median(d[k]["old"]), statistics.median(d[k]["new"])
    print("%-24s %10.3f %10.3f %8.3f" % (k, o, n, n / o))
PY
