#!/bin/sh
# make_package_seeds.sh KILN - the package manifest harness's seeds from the
# code as it is: compiles the sd35-tiny and sd3-tiny cases four ways (fixed,
# a dynamic width, every symbol dynamic, the whole graph as one function)
# and copies their manifests to tests/fuzz/corpus/package_manifest/real-*.json;
# the hand-made small*.json get the current format and ABI numbers.
# test_compile fails when a seed no longer parses (a new ABI or format):
# then run this from the repository root, e.g. sh tests/fuzz/make_package_seeds.sh build/kiln
set -eu
KILN=${1:-build/kiln}
OUT=tests/fuzz/corpus/package_manifest
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-seeds-XXXXXX")
trap 'rm -rf "$T"' EXIT
export KILN_PACKAGE_KEY_FILE= XDG_CONFIG_HOME="$T/config" KILN_CACHE_DIR=
i=0
for args in "tests/data/goldens/sd35-tiny --latent 16x16" \
            "tests/data/goldens/sd35-tiny --dim w_tok=4:12 --latent 16x16" \
            "tests/data/goldens/sd3-tiny --dim batch=1:4,h_tok=4:12,w_tok=4:12,ctx_len=8:80 --latent 16x16" \
            "tests/data/goldens/sd3-tiny --full --latent 16x16"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    "$KILN" compile $args --dtype f32 --package-dir "$T/p$i" --quiet >/dev/null
    m=$(find "$T/p$i" -name manifest.json | head -1)
    [ -n "$m" ] || { echo "no manifest from: compile $args" >&2; exit 1; }
    cp "$m" "$OUT/real-$i.json"
done
abi=$(sed -n 's/.*"abi":[[:space:]]*\([0-9]*\).*/\1/p' "$OUT/real-1.json" | head -1)
fv=$(sed -n 's/.*"format_version":[[:space:]]*\([0-9]*\).*/\1/p' "$OUT/real-1.json" | head -1)
for f in "$OUT"/small*.json; do
    sed -i "s/\"abi\":[[:space:]]*[0-9]*/\"abi\": $abi/; s/\"format_version\":[[:space:]]*[0-9]*/\"format_version\": $fv/" "$f"
done
echo "package manifest seeds: format $fv, ABI $abi, in $OUT"
