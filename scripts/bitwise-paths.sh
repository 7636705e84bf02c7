#!/usr/bin/env bash
# Run every golden case (the backbones, SD3's and Flux's, the text encoders, the
# VAE, the whole pipelines) through every execution path and precision and
# write the outputs under OUT, so a refactor that must not change a bit can be
# checked: run it before and after, then `cmp` the two folders (or pass
# --compare BEFORE to do it here).
#   scripts/bitwise-paths.sh KILN_BIN OUT [--compare BEFORE]
set -euo pipefail
KILN=${1:?usage: bitwise-paths.sh KILN_BIN OUT [--compare BEFORE]}
OUT=${2:?usage: bitwise-paths.sh KILN_BIN OUT [--compare BEFORE]}
BEFORE=""
[ "${3:-}" = "--compare" ] && BEFORE=${4:?--compare needs a folder}
DATA=$(cd "$(dirname "$0")/../tests/data/goldens" && pwd)
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export KILN_LOG=error KILN_THREADS=2 OMP_NUM_THREADS=2 XDG_CONFIG_HOME="$WORK/config" KILN_CACHE_DIR= KILN_PACKAGE_DIR=
run() { # name, then kiln arguments
    local name=$1
    shift
    "$KILN" "$@" --output "$OUT/$name.safetensors" >/dev/null
}
shape() { # case -> "B H W T" from its io.safetensors header
    python3 - "$1" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
x, c = h["hidden_states"]["shape"], h["encoder_hidden_states"]["shape"]
print(x[0], x[2], x[3], c[1])
PY
}
for c in sd3-tiny sd35-tiny sd3-wide; do
    M=$DATA/$c
    read -r B H W T <<<"$(shape "$M/io.safetensors")"
    IO=$M/io.safetensors
    for dt in f32 bf16; do
        run "$c-$dt-eager" forward "$M" --inputs "$IO" --dtype $dt --exec eager
        run "$c-$dt-planned" forward "$M" --inputs "$IO" --dtype $dt --exec planned
        # dynamic: a package compiled over a width range; fixed: compiled on demand
        PK=$WORK/pk-$c-$dt
        "$KILN" compile "$M" --dtype $dt --package-dir "$PK" --latent ${H}x${W} --context-len $T \
            --dim batch=1:4,ctx_len=1:400 >/dev/null
        run "$c-$dt-dynamic" forward "$M" --inputs "$IO" --dtype $dt --package-dir "$PK" --exec dynamic
        PF=$WORK/pf-$c-$dt
        "$KILN" compile "$M" --dtype $dt --package-dir "$PF" --batch $B --latent ${H}x${W} --context-len $T >/dev/null
        run "$c-$dt-fixed" forward "$M" --inputs "$IO" --dtype $dt --package-dir "$PF" --exec fixed
    done
    run "$c-reference" forward "$M" --inputs "$IO" --reference --exec eager
    for q in int8 fp8; do
        run "$c-$q-planned" forward "$M" --inputs "$IO" --quant $q --exec planned
        run "$c-$q-eager" forward "$M" --inputs "$IO" --quant $q --exec eager
    done
done
# the Flux backbones (their inputs named as the family takes them: the case's unpacked latents)
for c in flux-tiny flux-schnell-tiny; do
    M=$DATA/$c
    "$KILN" make-model "$M" --inputs-only --inputs "$WORK/$c-in.safetensors" --latent 8x12 --context 7 --batch 2 >/dev/null
    for dt in f32 bf16; do
        for ex in eager planned; do
            run "$c-$dt-$ex" forward "$M" --inputs "$WORK/$c-in.safetensors" --dtype $dt --exec $ex
        done
    done
done
# the text encoders and the VAE decoder, on each dtype and executor
for c in clip-l-tiny clip-g-tiny t5-tiny; do
    for dt in f32 bf16; do
        for ex in eager planned; do
            run "$c-$dt-$ex" forward "$DATA/$c" --inputs "$DATA/$c/io.safetensors" --dtype $dt --exec $ex
        done
    done
done
for dt in f32 bf16; do
    for ex in eager planned; do
        "$KILN" decode "$DATA/vae-sd3-tiny" --latents "$DATA/vae-sd3-tiny/io.safetensors" --key decode_input --no-scale \
            --dtype $dt --exec $ex --tensor-output "$OUT/vae-decode-$dt-$ex.safetensors" \
            --output "$WORK/vae-$dt-$ex.png" >/dev/null 2>&1
        # the whole pipeline, prompt to image, with the case's noise: every intermediate
        P=$DATA/sd3-pipeline-tiny
        "$KILN" generate "$P" --prompt "a photo of a cat" --negative-prompt "blurry" --steps 3 --guidance 5 \
            --noise "$P/io.safetensors" --dtype $dt --exec $ex --quiet \
            --tensor-output "$OUT/pipeline-$dt-$ex.safetensors" --output "$WORK/pipe-$dt-$ex.png" >/dev/null 2>&1
        F=$DATA/flux-pipeline-tiny
        "$KILN" generate "$F" --prompt "a tiny astronaut hatching from an egg on the moon" --steps 3 --seed 5 \
            --max-sequence-length 32 --width 48 --height 32 --dtype $dt --exec $ex --quiet \
            --tensor-output "$OUT/flux-pipeline-$dt-$ex.safetensors" --output "$WORK/flux-$dt-$ex.png" >/dev/null 2>&1
    done
done
# parallel runs (when this build has MPI)
if command -v mpirun >/dev/null; then
    M=$DATA/sd3-tiny
    MPI="mpirun --allow-run-as-root --oversubscribe -np 2"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    for par in "--tp 2" "--sp 2" "--cfgp 2"; do
        tag=$(echo "$par" | tr -d ' -')
        for ex in planned eager; do
            $MPI "$KILN" forward "$M" --inputs "$M/io.safetensors" --dtype f32 $par --exec $ex \
                --cache-dir "$WORK/cache-$tag" --output "$OUT/sd3-tiny-mpi-$tag-$ex.safetensors" >/dev/null
        done
    done
    $MPI "$KILN" forward "$M" --inputs "$M/io.safetensors" --dtype f32 --tp 2 --fsdp --exec planned \
        --cache-dir "$WORK/cache-fsdp" --output "$OUT/sd3-tiny-mpi-fsdp-planned.safetensors" >/dev/null
fi
n=$(ls "$OUT" | wc -l)
echo "bitwise-paths: $n outputs in $OUT"
if [ -n "$BEFORE" ]; then
    bad=0
    for f in "$BEFORE"/*.safetensors; do
        b=$(basename "$f")
        if ! cmp -s "$f" "$OUT/$b"; then echo "DIFFERS: $b"; bad=$((bad + 1)); fi
    done
    echo "bitwise-paths: $bad of $(ls "$BEFORE" | wc -l) outputs differ from $BEFORE"
    [ $bad -eq 0 ]
fi
